"""The static decoding plan and the queries every decoder asks of it.

The plan is hashable (it is a static argument of every jitted entry point,
and the torch backend's kernels branch on it); the tables it describes
(`lowered.tables`) are plain arrays passed as arguments, so one compiled
program serves every constraint set whose tables have the same shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from static_compiler.ir import LayoutKind


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Static facts about one decoding step (one IR layer); light_k and
    wide_slots are the mixed layout's (0 when off, see `ir.Layout`)."""

    kind: LayoutKind
    k: int
    num_states: int
    num_next_states: int
    explicit_targets: bool
    has_accepting: bool
    token_dtype: str
    state_dtype: str
    light_k: int = 0
    wide_slots: int = 0

    def __post_init__(self):
        # Plans read back from a manifest name their kind as a plain string.
        object.__setattr__(self, "kind", LayoutKind(self.kind))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static decoding plan: one `StepPlan` per layer.

    Attributes:
      vocab_size: V.
      steps: StepPlan per layer; len(steps) is the automaton depth.
      end_token: None for fixed-length sets. With an end token, decoding runs
        one more step than the depth, in which finished states can only end.
    """

    vocab_size: int
    steps: tuple
    end_token: Optional[int] = None

    @property
    def depth(self) -> int:
        return len(self.steps)

    @property
    def max_length(self) -> int:
        """Tokens in a decoded sequence, including the end token if any."""
        return self.depth + (0 if self.end_token is None else 1)


class PlanFacts:
    """The facts of a set every decoder states, read from its `plan`: a
    mixin of `CompiledConstraints` and the torch backend's
    `TorchConstraints`."""

    plan: Plan

    @property
    def vocab_size(self) -> int:
        """V: tokens lie in [0, V)."""
        return self.plan.vocab_size

    @property
    def max_length(self) -> int:
        """Length of decoded token arrays (depth, plus one for the end token)."""
        return self.plan.max_length

    @property
    def end_token(self) -> Optional[int]:
        """The token ending variable-length sequences (None: fixed length)."""
        return self.plan.end_token


def num_candidates(step: StepPlan, vocab_size: int) -> int:
    """K, the static candidate count of `step`."""
    return {LayoutKind.DENSE_ROWS: vocab_size, LayoutKind.UNARY: 1}.get(step.kind, step.k)


def candidate_columns(plan: Plan, step: int) -> int:
    """K at `step`: candidates per beam, end-token and carried-over columns included."""
    end = plan.end_token is not None
    if step >= plan.depth:
        return 2
    sp = plan.steps[step]
    return num_candidates(sp, plan.vocab_size) + int(end and sp.has_accepting) + int(end)


def live_beam_bounds(plan: Plan, beam_size, caps: Sequence[Optional[int]]
                     ) -> tuple[int, ...]:
    """Static bound per step on the beams that can be valid in a search
    whose beam 0 alone starts valid: 1 at step 0, then at most the previous
    bound times the candidates each beam keeps, and at most the beams the
    step before kept (beam_size: an int, or the widths of
    `arguments.check_beam_schedule`, max_length + 1 of them; caps: the
    per-step cap on a beam's
    children, None for none, as `arguments.check_tokens_per_beam` gives
    them). Valid beams come first, so beams past the bound need no work;
    every front door's beam search passes it to its steps."""
    widths = (beam_size,) * (plan.max_length + 1) if isinstance(beam_size, int) \
        else tuple(beam_size)
    bounds, live = [], 1
    for step in range(plan.max_length):
        bounds.append(live)
        kept = candidate_columns(plan, step)
        live = min(widths[step + 1],
                   live * (kept if caps[step] is None else min(kept, caps[step])))
    return tuple(bounds)


def state_counts(plan: Plan) -> tuple[int, ...]:
    """States per depth 0..depth as the tables hold them (padded to a
    reserved capacity): the sizes of item subsets' bit rows."""
    return tuple(s.num_states for s in plan.steps) + (plan.steps[-1].num_next_states,)



def prior_offsets(plan: Plan) -> tuple[tuple[int, ...], Optional[tuple[int, ...]]]:
    """(children, own) per step t = 0..max_length - 1: where depth t + 1
    (step t's children; 0 at the extra step of a set with an end token)
    and, with an end token, depth t's own terms (the end token's
    candidates) start in an item prior's row (`rules.priors.Prior.best`:
    the tables' state counts, depth after depth, the look-ahead's depths
    1..depth then the own terms' 0..depth); own is None without an end
    token."""
    counts = state_counts(plan)
    starts = [0]
    for count in counts[1:] + (counts if plan.end_token is not None else ()):
        starts.append(starts[-1] + count)
    children = tuple(starts[:plan.depth]) + (0,) * (plan.max_length - plan.depth)
    own = None if plan.end_token is None else tuple(starts[plan.depth:plan.depth + plan.max_length])
    return children, own


def prior_size(plan: Plan) -> int:
    """Entries of an item prior's row (`prior_offsets`)."""
    counts = state_counts(plan)
    return sum(counts[1:]) + (sum(counts) if plan.end_token is not None else 0)


SLOT_MIN_FILL = 0.5
"""A dense_rows step's children get slot bits when at least this share of
its (state, token) slots hold an edge, so slot bits cost at most 1 /
SLOT_MIN_FILL bits per child; sparser dense steps keep per-state bits."""


def slot_step(kind: str, num_states: int, num_next_states: int, vocab_size: int) -> bool:
    """Whether the children of a step of layout `kind` (num_states states,
    num_next_states children, as its tables hold them) get slot bits."""
    return kind == "dense_rows" and num_next_states >= SLOT_MIN_FILL * num_states * vocab_size


def slot_steps(plan: Plan) -> tuple[int, ...]:
    """The steps whose children an item subset holds as slot bits: dense
    rows at least half full (`slot_step`)."""
    return tuple(t for t, s in enumerate(plan.steps)
                 if slot_step(s.kind.value, s.num_states, s.num_next_states, plan.vocab_size))


def tables_nbytes(tables) -> int:
    """Total bytes of all tables."""
    return sum(arr.nbytes for layer in tables for arr in layer.values())
