"""The logits-processor pair for custom decoding loops: `mask` keeps the
logits of the tokens each row may take next, `advance` moves each row along
the token it took. One row per sequence (no beams): the engine that calls them
owns the search.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler.backend.decode.candidates import step_candidates
from static_compiler.backend.decode.live import LiveMask, check_live_mask, is_ranked
from static_compiler.backend.decode.programs import bounded_jit, run_compiling_ahead
from static_compiler.backend.decode.step import step_in_range, switch_over_groups
from static_compiler.backend.row_search import few_rows
from static_compiler.errors import DecodeInputError
from static_compiler.lowered.plan import Plan
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    ProcessorState,
    check_logits,
    check_processor_state,
    check_rows,
    check_step,
    check_tokens,
    int32_within,
    padded_columns,
)

SCATTER_MAX_COLUMNS = 16
"""`mask` scatters the allowed logits into a row of SENTINEL_SCORE when a
step lists at most V / SCATTER_MAX_COLUMNS candidates per row; else it
builds the (B, V) allowed flags and selects."""


def init_processor_state(batch_size: int) -> ProcessorState:
    """Every row at the root, valid, not finished."""
    batch_size = check_rows(batch_size)[0]  # (host arrays put on the device: no op compiles)
    return ProcessorState(node=jax.device_put(np.zeros((batch_size,), np.int32)),
                          valid=jax.device_put(np.ones((batch_size,), bool)),
                          finished=jax.device_put(np.zeros((batch_size,), bool)))


def _checked_valid(plan: Plan, state: ProcessorState, step: int):
    """state.valid, and False where a row's state id is not a state at depth
    `step` (a state from another compiled set, or a tampered one): gathers
    clamp ids, so such a row would otherwise read some other state's children
    and stay valid on sequences outside the set."""
    count = plan.steps[step].num_states if step < plan.depth else plan.steps[-1].num_next_states
    node = jnp.asarray(state.node)
    return state.valid & (node >= 0) & (node < count)


def mask(plan: Plan, tables, logits, state: ProcessorState, step, subset=None):
    """logits float (B, V) -> float32 (B, V): logits of allowed tokens kept,
    others (and NaN logits) set to SENTINEL_SCORE. A finished row allows only
    the end token; an invalid row allows nothing.

    step: an int in [0, max_length) (a Python or numpy int): a program
    specialised for that step; or a traced int32 scalar (any jax integer
    scalar): one program for every step, a `lax.switch` over the steps
    (`mask_switch`; past the end, finished rows allow only the end token and
    others nothing). Both give bit-identical logits.
    subset: a `LiveMask` (each row allows only tokens towards its subset's
    items), or None."""
    step = check_step(step, plan.max_length, "mask", traced=True)
    B = state.node.shape[0]
    check_live_mask(plan, subset, B, "mask")
    if not isinstance(step, int):
        if isinstance(step, jax.core.Tracer):
            return mask_switch(plan, tables, logits, state, step, subset)
        x = check_logits(logits, (B,), plan.vocab_size, "mask(step=<traced>)")
        return padded_columns(_switch_program(tables, (_array(x), state), step, subset,
                                              plan=plan, kind="mask"), np.shape(logits)[-1])
    x = check_logits(logits, (B,), plan.vocab_size, f"mask(step={step})")
    return padded_columns(_mask_at(plan, tables, x, state, step, subset), np.shape(logits)[-1])


def _mask_at(plan: Plan, tables, logits, state: ProcessorState, step: int, subset=None):
    """`mask` at a static step, on checked arguments (`tables[step]` and
    the subset's bits at `step` may be a group's views: `switch_over_groups`)."""
    B = state.node.shape[0]
    cand = step_candidates(plan, tables, state.node, _checked_valid(plan, state, step),
                           state.finished, None, step, subset=subset)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], cand.tokens.shape)
    tokens = jnp.where(cand.stays, 0 if plan.end_token is None else plan.end_token, cand.tokens)
    tokens = jnp.where(cand.valid, tokens, plan.vocab_size)  # out of range: dropped
    if SCATTER_MAX_COLUMNS * cand.tokens.shape[-1] <= plan.vocab_size:
        # Few candidates: the allowed logits scattered into a constant row of
        # SENTINEL_SCORE. No elementwise op runs over (B, V) (XLA on CPU
        # splits loops of 1024+ elements across threads: tens of us per op
        # at one row); a token listed twice writes its one logit twice.
        x = jnp.asarray(logits)[rows, jnp.minimum(tokens, plan.vocab_size - 1)]
        x = x.astype(jnp.float32)
        x = jnp.where(jnp.isnan(x), SENTINEL_SCORE, x)
        return jnp.full((B, plan.vocab_size), SENTINEL_SCORE, jnp.float32).at[rows, tokens].set(
            x, mode="drop")
    allowed = jnp.zeros((B, plan.vocab_size), bool).at[rows, tokens].set(True, mode="drop")
    x = jnp.asarray(logits).astype(jnp.float32)
    return jnp.where(allowed & ~jnp.isnan(x), x, SENTINEL_SCORE)


def advance(plan: Plan, tables, state: ProcessorState, tokens, step,
            subset=None) -> ProcessorState:
    """Moves each row along its chosen token int (B,); a token that is not
    allowed (by the set, or by the row's `subset` as in `mask`) marks the row
    invalid.

    step: as in `mask`, an int (a program specialised for that step) or a
    traced int32 scalar (one program for every step, `advance_switch`; past
    the end, a finished row stays finished on the end token and every other
    row becomes invalid)."""
    step = check_step(step, plan.max_length, "advance", traced=True)
    B = state.node.shape[0]
    check_live_mask(plan, subset, B, "advance")
    if not isinstance(step, int):
        if isinstance(step, jax.core.Tracer):
            return advance_switch(plan, tables, state, tokens, step, subset)
        check_tokens(tokens, B, "advance(step=<traced>)")
        return _switch_program(tables, (state, int32_within(tokens, plan.vocab_size)), step,
                               subset, plan=plan, kind="advance")
    check_tokens(tokens, B, f"advance(step={step})")
    return _advance_at(plan, tables, state, int32_within(tokens, plan.vocab_size), step, subset)


def _advance_at(plan: Plan, tables, state: ProcessorState, tokens, step: int,
                subset=None) -> ProcessorState:
    """`advance` at a static step, on checked arguments (see `_mask_at`)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    cand = step_candidates(plan, tables, state.node, _checked_valid(plan, state, step),
                           state.finished, None, step, subset=subset)
    end = -2 if plan.end_token is None else plan.end_token
    hit = cand.valid & jnp.where(cand.stays, tokens[:, None] == end, cand.tokens == tokens[:, None])
    ok = jnp.any(hit, axis=-1)
    nxt = jnp.sum(jnp.where(hit & ~cand.ends & ~cand.stays, cand.next, 0), axis=-1)
    finished = ok & jnp.any(hit & (cand.ends | cand.stays), axis=-1)
    return ProcessorState(node=jnp.where(ok & ~finished, nxt, 0).astype(jnp.int32),
                          valid=ok, finished=finished)


def mask_switch(plan: Plan, tables, logits, state: ProcessorState, step, subset=None):
    """`mask` at a traced `step` (`mask` dispatches here; the exported
    modules call it directly; see `switch_over_groups`); outside [0,
    max_length) nothing can be appended: finished rows allow only the end
    token, other rows nothing."""
    check_step(step, plan.max_length, "mask", traced=True)
    check_live_mask(plan, subset, state.node.shape[0], "mask")
    given, logits = logits, check_logits(logits, (state.node.shape[0],), plan.vocab_size,
                                         "mask(step=<traced>)")
    width = np.shape(given)[-1]
    masked = switch_over_groups(
        plan, lambda t, tabs, sub, x, st: _mask_at(plan, tabs, x, st, t, sub),
        step, tables, subset, logits, state)
    x = jnp.asarray(logits).astype(jnp.float32)
    end_only = jnp.arange(plan.vocab_size) == (-1 if plan.end_token is None else plan.end_token)
    done = (state.valid & state.finished)[:, None] & end_only & ~jnp.isnan(x)
    return padded_columns(jnp.where(step_in_range(plan, step), masked,
                                    jnp.where(done, x, SENTINEL_SCORE)), width)


def advance_switch(plan: Plan, tables, state: ProcessorState, tokens, step,
                   subset=None) -> ProcessorState:
    """`advance` at a traced `step` (`advance` dispatches here; the exported
    modules call it directly; see `switch_over_groups`); outside [0,
    max_length) only a finished row taking the end token stays valid."""
    check_step(step, plan.max_length, "advance", traced=True)
    check_live_mask(plan, subset, state.node.shape[0], "advance")
    check_tokens(tokens, state.node.shape[0], "advance(step=<traced>)")
    tokens = int32_within(tokens, plan.vocab_size)  # before any int32 cast (no wrap)
    moved = switch_over_groups(
        plan, lambda t, tabs, sub, st, tok: _advance_at(plan, tabs, st, tok, t, sub),
        step, tables, subset, state, tokens)
    end = -2 if plan.end_token is None else plan.end_token
    done = state.valid & state.finished & (jnp.asarray(tokens, jnp.int32) == end)
    past = ProcessorState(jnp.zeros_like(state.node), done, done)
    return select_state(step_in_range(plan, step), moved, past)


@bounded_jit(static_argnames=("plan", "kind"))
def _switch_program(tables, operands, step, subset, *, plan: Plan, kind: str):
    """`mask_switch` (kind "mask", operands (logits, state)) or
    `advance_switch` ("advance", (state, tokens)) as one jitted program per
    plan and shapes, for a step given as a device scalar outside any trace:
    run op by op, the switch's branches (closures made per call) would
    compile anew on every call."""
    if kind == "mask":
        return mask_switch(plan, tables, *operands, step, subset)
    return advance_switch(plan, tables, *operands, step, subset)


def select_state(take, new: ProcessorState, old: ProcessorState) -> ProcessorState:
    """Per row (or for all rows, `take` scalar): `new` where `take`, else `old`."""
    return ProcessorState(*(jnp.where(take, a, b) for a, b in zip(new, old)))


class StepProcessor:
    """The processor pair for one batch size, one jitted program per static
    step (`CompiledConstraints.processor`): each call passes only what
    changes (logits, state, tokens) and the tables (and subset bits) of its
    step, not every step's tables, and runs one dispatch; the first call at
    a step compiles its program. Results are bit-identical to `mask` /
    `advance` at that step. Arguments are checked as `mask` / `advance`
    check them (same errors); state must have `batch_size` rows.

    mask(logits, state, step) -> float32 (B, V); advance(state, tokens,
    step) -> ProcessorState; advance_and_mask(state, tokens, step, logits)
    -> (advance(state, tokens, step), mask(logits, that state, step + 1)):
    one dispatch per decoding step in a loop (step + 1 < max_length).

    The programs are shared by every processor of an equal plan (`_step_program`:
    a set's versions after updates that fit), so a new version's processor
    compiles nothing its predecessor compiled. removal: a `LiveMask` of
    ShapeDtypeStructs (`live_mask_spec`) for a processor without a subset
    of a set that expects updates: each program it compiles, it also
    compiles ahead (not run) for those bits, the processor a removal leaves."""

    def __init__(self, plan: Plan, tables, batch_size: int, subset=None, removal=None,
                 counter=None):
        self.plan = plan
        self.counter = counter  # a `compile_events.CompileCounter` the calls count in, or None
        self.batch_size = check_rows(batch_size)[0]
        check_live_mask(plan, subset, self.batch_size, "processor")
        self.subset = subset
        self._removal = removal if subset is None else None
        self._tables = tables
        self._args, self._programs = {}, {}
        self._logits_shape = (self.batch_size, plan.vocab_size)

    @staticmethod
    def checked_batch(batch_size) -> int:
        return check_rows(batch_size)[0]

    def init_processor(self) -> ProcessorState:
        """Every one of this processor's rows at the root, valid, not finished."""
        return init_processor_state(self.batch_size)

    # -- per-step arrays and programs

    def _step_args(self, t: int):
        args = self._args.get(t)
        if args is None:
            args = self._args[t] = self._args_with(self.subset, t)
        return args

    def _args_with(self, live, t: int):
        """Step t's (tables, bits) for the subset bits `live` (a `LiveMask` or None)."""
        tables = self._tables[t] if t < self.plan.depth else {}
        if is_ranked(live):  # (read whole: the set's ranges and the rank bits)
            return tables, live
        bits = None if live is None else (live.live[t] if t < self.plan.depth else None,
                                          live.ends[t], live.rows)
        return tables, bits

    def _run(self, kind: str, t: int, *args):
        """The program (kind, t) on `args`; one compiled here is also
        compiled ahead for the removal's bits (see the class doc)."""
        fn = self._programs.get((kind, t))
        if fn is None:
            fn = self._programs[(kind, t)] = _step_program.jitted(plan=self.plan, kind=kind, t=t)
        ahead = None
        if self._removal is not None:
            steps = 2 if kind == "both" else 1
            ahead = lambda: ([self._args_with(self._removal, t + i) for i in range(steps)]
                             + list(args[steps:]), {})
        if self.counter is None:
            return run_compiling_ahead(fn, ahead, *args)
        with self.counter.counting():
            return run_compiling_ahead(fn, ahead, *args)

    def warm(self, subsets=()) -> None:
        """Compiles every program of this processor (mask at each step,
        advance at each step, advance_and_mask at each step but the last)
        by running each once on dummy inputs (float32 logits, int32
        tokens: a call with other dtypes is another program), and, ahead
        without running them, the same programs for each `LiveMask` of
        `subsets` (`live_mask_spec`'s shapes: the processors of stacked
        subsets of those shapes, shared by plan). Raises DecodeInputError
        unless `subsets` is a sequence of LiveMasks."""
        if isinstance(subsets, (str, bytes)) or not isinstance(subsets, (list, tuple)) or \
                not all(isinstance(live, LiveMask) for live in subsets):
            raise DecodeInputError(f"StepProcessor.warm: subsets={subsets!r:.80}: expected a "
                                   "list of LiveMask (compiled.live_mask_spec's shapes)")
        B, T = self.batch_size, self.plan.max_length
        state, tokens = self.init_processor(), np.zeros((B,), np.int32)
        logits = np.zeros(self._logits_shape, np.float32)
        for t in range(T):
            self.mask(logits, state, t)
            self.advance(state, tokens, t)
            if t + 1 < T:
                self.advance_and_mask(state, tokens, t, logits)
        for live in subsets:
            for t in range(T):
                for kind, steps, rest in (("mask", 1, (logits, state)),
                                          ("advance", 1, (state, tokens)),
                                          ("both", 2, (state, tokens, logits))):
                    if t + steps > T:
                        continue
                    args = [self._args_with(live, t + i) for i in range(steps)] + list(rest)
                    _step_program.jitted(plan=self.plan, kind=kind, t=t).lower(*args).compile()

    # -- checks: the validators of `mask` / `advance`, and this batch size

    def _checked_state(self, state, where: str) -> ProcessorState:
        state = check_processor_state(state, where)
        if tuple(np.shape(state.node)) != (self.batch_size,):
            raise DecodeInputError(f"{where}: state has {np.shape(state.node)[0]} rows: this "
                                   f"processor is for batch_size={self.batch_size}")
        return state

    # -- the pair (lists become arrays: a jitted program would read them as pytrees)

    def mask(self, logits, state: ProcessorState, step):
        step = check_step(step, self.plan.max_length, "mask")
        where = f"mask(step={step})"
        state = self._checked_state(state, where)
        x = _array(check_logits(logits, (self.batch_size,), self.plan.vocab_size, where))
        return padded_columns(self._run("mask", step, self._step_args(step), x, state),
                              np.shape(logits)[-1])

    def advance(self, state: ProcessorState, tokens, step) -> ProcessorState:
        step = check_step(step, self.plan.max_length, "advance")
        where = f"advance(step={step})"
        state = self._checked_state(state, where)
        check_tokens(tokens, self.batch_size, where)
        return self._run("advance", step, self._step_args(step), state,
                         int32_within(tokens, self.plan.vocab_size))

    def advance_and_mask(self, state: ProcessorState, tokens, step, logits):
        step = check_step(step, self.plan.max_length - 1, "advance_and_mask")
        where = f"advance_and_mask(step={step})"
        state = self._checked_state(state, where)
        check_tokens(tokens, self.batch_size, where)
        x = _array(check_logits(logits, (self.batch_size,), self.plan.vocab_size,
                                f"advance_and_mask(step={step}): next step's"))
        moved, masked = self._run("both", step, self._step_args(step), self._step_args(step + 1),
                                  state, int32_within(tokens, self.plan.vocab_size), x)
        return moved, padded_columns(masked, np.shape(logits)[-1])


@bounded_jit(static_argnames=("plan", "kind", "t"), group_by="plan")
def _step_program(*args, plan: Plan, kind: str, t: int):
    """The program `kind` ("mask", "advance" or "both") at step t of sets
    with `plan`: one `BoundedJit` configuration per (plan, kind, t), so every
    processor of an equal plan (a set's versions after updates that fit)
    shares it; the process keeps those of the last `max_programs()` plans."""
    def mask(args, x, st, at=t):
        tabs, sub = _views_at(args, at)
        return _mask_at(plan, tabs, x, st, at, sub)

    def advance(args, st, tok):
        tabs, sub = _views_at(args, t)
        return _advance_at(plan, tabs, st, tok, t, sub)

    def both(args, next_args, st, tok, x):  # advance at t, then mask at t + 1
        moved = advance(args, st, tok)
        return moved, mask(next_args, x, moved, at=t + 1)

    with few_rows():
        return {"mask": mask, "advance": advance, "both": both}[kind](*args)


def _views_at(args, t: int):
    tables, bits = args
    sub = bits if bits is None or is_ranked(bits) else LiveMask({t: bits[0]}, {t: bits[1]},
                                                                bits[2])
    return {t: tables}, sub


def _array(value):
    return value if hasattr(value, "dtype") else np.asarray(value)
