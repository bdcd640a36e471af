"""One beam-search step over lowered tables, at a static step or at a traced
one (a `lax.switch` over the static steps, as the exported modules run it);
the final ranking of the beams (`finalize`) is `jax_support.beam_result`'s.

The exact semantics are in `static_compiler.backend.decode`'s docstring.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend import kernels
from static_compiler.backend.decode import prior as prior_lib
from static_compiler.backend.decode import selection
from static_compiler.backend.decode.candidates import (
    StepCandidates,
    candidate_width,
    full_child_live,
    listed_child_live,
    packed_step_candidates,
    pad_candidates,
    step_candidates,
    switch_steps,
    switched,
    switched_step_candidates,
)
from static_compiler.backend.decode.live import (
    LiveMask,
    check_live_mask,
    group_live,
    is_ranked,
    pack_live,
)
from static_compiler.backend.decode.logprobs import LogProbs, scored
from static_compiler.backend.decode.prior import LivePrior
from static_compiler.backend.decode.programs import bounded_jit
from static_compiler.backend.decode.selection import select_beams
from static_compiler.backend.kernels import PackedRun, group_run, pack_run, packed_entries
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.beam_result import finalize, finalize_complete, length_normalized  # noqa: F401
from static_compiler.lowered.plan import Plan
from static_compiler.support.arguments import check_int, check_rows, is_int
from static_compiler.support.decode_state import (
    PAD_TOKEN,
    SENTINEL_SCORE,
    BeamState,
    check_logits,
    check_step,
    check_tokens_per_beam,
)


def init_beam_state(plan: Plan, batch_size: int, beam_size: int, start_tokens=0) -> BeamState:
    """All beams at the root; only beam 0 of each row is valid (it alone
    expands at step 0). start_tokens: int, or int32 (batch_size,) one per row:
    the model's `last_tokens` at step 0."""
    B, M, T = batch_size, beam_size, plan.max_length
    first = jnp.arange(M)[None, :] == 0
    valid = jnp.broadcast_to(first, (B, M))
    start = jnp.asarray(start_tokens, jnp.int32)
    return BeamState(
        tokens=jnp.full((B, M, T), PAD_TOKEN, jnp.int32),
        scores=jnp.where(valid, 0.0, SENTINEL_SCORE).astype(jnp.float32),
        node=jnp.zeros((B, M), jnp.int32),
        valid=valid,
        finished=jnp.zeros((B, M), bool),
        lengths=jnp.zeros((B, M), jnp.int32),
        last_tokens=jnp.broadcast_to(start[:, None] if start.ndim else start, (B, M)),
        parent=jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32), (B, M)),
    )


def take_beams(x, parent):
    """x (B, M, ...) reordered along beams by parent (B, M)."""
    return kernels.take_rows(x, parent)


def pick_candidates(x, parent, col):
    """x (B, M', K) -> (B, M): x[b, parent[b, m], col[b, m]], one gather."""
    B, Mp, K = x.shape
    return kernels.take_last(x.reshape(B, Mp * K), parent * K + col)


def apply_choice(plan: Plan, state: BeamState, cand: StepCandidates, parent, col, score, valid,
                  step: int) -> BeamState:
    """New beam state after each beam (B, M) chose candidate `col` of beam `parent`."""
    pick = lambda x: pick_candidates(x, parent, col)
    token, nxt = pick(cand.tokens), pick(cand.next)
    if plan.end_token is None:  # no end or carried-over columns: nothing to gather
        ends = stays = jnp.zeros(parent.shape, bool)
    else:
        ends, stays = pick(cand.ends), pick(cand.stays)
    finished = valid & (ends | stays)
    history = take_beams(state.tokens, parent)
    # One dynamic-update-slice (0 <= step < T); `.at[:, :, step].set` at a
    # traced step normalizes the index and scatters: three kernels more.
    history = lax.dynamic_update_slice_in_dim(
        history, jnp.where(valid & ~stays, token, PAD_TOKEN)[..., None], step, axis=2)
    history = jnp.where(valid[..., None], history, PAD_TOKEN)
    grows = valid & ~ends & ~stays
    lengths = jnp.where(valid, take_beams(state.lengths, parent) + grows.astype(jnp.int32), 0)
    fill = 0 if plan.end_token is None else plan.end_token
    return BeamState(
        tokens=history,
        scores=jnp.where(valid, score, SENTINEL_SCORE).astype(jnp.float32),
        node=jnp.where(valid & ~finished, nxt, 0),
        valid=valid,
        finished=finished,
        lengths=lengths,
        last_tokens=jnp.where(grows, token, fill).astype(jnp.int32),
        parent=parent.astype(jnp.int32),
    )


def beam_step(plan: Plan, tables, state: BeamState, logits, step,
              tokens_per_beam=None, subset: Optional[LiveMask] = None,
              live_beams: Optional[int] = None, beam_size: Optional[int] = None) -> BeamState:
    """One beam-search step: the `BeamState` (B, beam_size) after it.

    step: an int in [0, plan.max_length) (a Python or numpy int): a program
    specialised for that step, the layers' own kernels at that step; or a
    traced int32 scalar (any jax integer scalar): one program for every
    step, a `lax.switch` over the runs of `step_segments` as the exported
    modules run it (`beam_step_switch`); a traced step outside [0,
    max_length) appends nothing: the state comes back as it was, with
    parent the identity (so reordering the model's cache by it changes
    nothing). Both give bit-identical states.
    logits: float (B, M, V) for the beams of `state` (fed `state.last_tokens`).
    tokens_per_beam: the most children a beam may contribute. None: no cap;
    a sequence of max_length entries (each None or an int >= 1): the cap of
    each step, for either kind of step; an int: the cap at a static step,
    and from step 1 on with a traced step (as `beam_search` takes it: step 0
    expands the start beam to its top beam_size children; see
    `check_tokens_per_beam`).
    subset: a `LiveMask` (per-row item subsets), or None.
    live_beams: static promise that only beams [0, live_beams) of `state`
    can be valid (see `live_beam_bounds`); the others are not expanded, which
    saves their log_softmax, candidates and top-k. A static step only.
    beam_size: the beams the new state keeps (a beam schedule's width at
    this step); None: M, as many as `state` has."""
    step = check_step(step, plan.max_length, "beam_step", traced=True)
    B, M = state.node.shape
    check_live_mask(plan, subset, B, "beam_step")
    width = M if beam_size is None else check_rows(B, beam_size)[1]
    if not isinstance(step, int):
        if live_beams is not None:
            raise DecodeInputError(f"beam_step: live_beams={live_beams!r} needs a static step "
                                   "(an int); a traced step expands every beam")
        return beam_step_switch(plan, tables, state, logits, step, tokens_per_beam, subset,
                                width)
    if tokens_per_beam is None or is_int(tokens_per_beam):
        cap = check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
    else:
        cap = check_tokens_per_beam(tokens_per_beam, plan.max_length)[step]
    return run_step(plan, tables, state, logits, (step,), step, cap, live_beams, subset, width)


def run_step(plan: Plan, tables, state: BeamState, logits, steps: tuple[int, ...], step,
             tokens_per_beam: Optional[int], live_beams: Optional[int], subset=None,
             beam_size: Optional[int] = None, prior: Optional[LivePrior] = None) -> BeamState:
    """One beam-search step at `step`, one of the static `steps` that share
    one cap and live-beam bound. With several steps, `step` is a traced int32
    scalar and the candidates come from `run_candidates` (a packed run's one
    gather, or a `lax.switch` over the steps' own kernels), padded to the
    widest of the steps; everything else (log-probs, selection, the new
    state) is one program for all of them, so a loop over the steps compiles
    it once. tables, subset: as `run_inputs` gives them for `steps`;
    beam_size: the beams the new state keeps (None: the state's M); prior:
    item priors (`decode.prior`): candidates ranked with the best prior
    below them, every child of a mixed layer listed (its per-beam cut
    ranks by log-probability alone)."""
    B, M = state.node.shape
    where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    logits = check_logits(logits, (B, M), plan.vocab_size, f"beam_step ({where})")
    if live_beams is not None and live_beams < M:
        state = jax.tree_util.tree_map(lambda x: x[:, :live_beams], state)
        logits = logits[:, :live_beams]
    M = M if beam_size is None else beam_size  # the beams kept
    keep = M if tokens_per_beam is None else min(tokens_per_beam, M)
    logprobs = LogProbs.of(logits)
    listed = listed_selection(plan, steps, subset, prior, tokens_per_beam, state.node.shape[1], M)
    cand = run_candidates(plan, tables, steps, step, state.node, state.valid, state.finished,
                          logprobs, scores=None if prior else state.scores,
                          keep=None if prior else keep, subset=subset, child_subset=not listed)
    if listed:
        return _listed_step(plan, state, cand, steps, step, subset, tokens_per_beam, M)
    base = scored(cand.valid, cand.logprob, state.scores)
    rank = base if prior is None else \
        prior_lib.ranked(plan, prior, step, base, cand, state.node)
    top, parent, col, real = select_beams(rank, M, tokens_per_beam)
    valid = real & pick_candidates(cand.valid, parent, col)
    if prior is not None:
        done = False if plan.end_token is None else \
            pick_candidates(cand.ends | cand.stays, parent, col)
        top = prior_lib.kept_scores(plan, step, top, pick_candidates(base, parent, col), done)
    return apply_choice(plan, state, cand, parent, col, top, valid, step)


def listed_selection(plan: Plan, steps: tuple[int, ...], subset, prior, tokens_per_beam,
                     expanded: int, beam_size: int) -> bool:
    """Whether `run_step` selects over a ranked subset from a list
    (`_listed_step`): a ranked subset (`ranked.RankedMask`; `LiveMask`
    bits are one gather a candidate: nothing to save), no item priors (a
    candidate ranks by the best prior below it in the subset), a per-beam
    cap that cannot bind (a beam's best children would change with the
    subset), no mixed layer among `steps` (it lists each beam's best
    children in the subset: `mixed_children`), `selection.LIST_SPREAD`
    times more candidates than the longest list (`selection.LIST_FACTORS`
    x beam_size; `expanded` beams expanded), and steps past 0 (step 0
    reads `RankedMask.first`, one gather a candidate, and is a run of its
    own over a ranked subset: `step_segments`' first_alone). Elsewhere the
    step reads every candidate's liveness, as before."""
    if not is_ranked(subset) or prior is not None:
        return False
    width = max(candidate_width(plan, t, beam_size) for t in steps)
    if tokens_per_beam is not None and tokens_per_beam < min(width, beam_size):
        return False
    if 0 in steps or any(t < plan.depth and plan.steps[t].light_k for t in steps):
        return False
    return expanded * width >= selection.LIST_SPREAD * max(selection.LIST_FACTORS) * beam_size


def _listed_step(plan: Plan, state: BeamState, cand: StepCandidates, steps: tuple[int, ...],
                 step, subset, tokens_per_beam: Optional[int], beam_size: int) -> BeamState:
    """`run_step`'s step over a ranked subset (`listed_selection`): the
    candidates `cand` listed and scored by structure alone (the end token
    read in the subset: one read a beam), each batch row's best
    `selection.LIST_FACTORS` x beam_size ranked in order and their
    children's liveness read (`listed_child_live`); when a sample says a
    list would hold too few live candidates, or some row's list holds
    fewer than beam_size, every candidate's liveness read
    (`full_child_live`) and the selection made as `run_step` makes it
    (`select_listed`: one program, the branch taken runs). The same state
    bit for bit: a live candidate's score is the same, the winners the
    same (`select_listed`'s argument), and a winner is valid exactly when
    its score is above SENTINEL_SCORE (valid scores never go below
    MIN_VALID_SCORE)."""
    base = scored(cand.valid, cand.logprob, state.scores)
    index = None if len(steps) == 1 else jnp.asarray(step, jnp.int32) - steps[0]

    def live_at(parent, col):
        return listed_child_live(plan, subset, steps, index, cand, state.node, parent, col)

    def full():
        live = full_child_live(plan, subset, steps, index, cand, state.node)
        return tuple(select_beams(jnp.where(live, base, SENTINEL_SCORE), beam_size,
                                  tokens_per_beam)[:3])

    (top, parent, col, real), _ = selection.select_listed(base, beam_size, live_at, full)
    return apply_choice(plan, state, cand, parent, col, top, real & (top > SENTINEL_SCORE), step)


def run_inputs(plan: Plan, tables, subset: Optional[LiveMask], steps: tuple[int, ...],
               stack_limit: Optional[int] = None):
    """(tables, subset) as `run_candidates` reads them for the run `steps`:
    when the run has several steps and their tables are small, the tables
    packed into one `PackedRun` and the subset's bits packed alike
    (`pack_live`), so one gather program serves every step (a driver packs
    them once, outside its loop); else, when some of its steps share a
    kernel (same `StepPlan` and table shapes, as the long tail of a long
    set does), the run's `GroupedRun` and the subset's bits grouped alike
    (`group_live`), so the step's switch has a branch per distinct kernel,
    not per step; else both as they are. The bounds are read when tracing
    (`kernels.PACK_MAX_ENTRIES`; `stack_limit`, by default
    `kernels.STACK_MAX_ENTRIES`, per group; tests lower them to compare
    the ways). A ranked subset (`ranked.RankedMask`) is neither packed nor
    grouped: its reads take the whole set's ranges at any step, so the run
    keeps the layers' own tables too (a `lax.switch` over its steps)."""
    if len(steps) > 1 and not is_ranked(subset):
        entries = packed_entries(plan, tables, steps)
        if entries is not None and entries <= kernels.PACK_MAX_ENTRIES:
            return (pack_run(plan, tables, steps),
                    None if subset is None else pack_live(plan, subset, steps))
        grouped = group_run(plan, tables, steps, stack_limit)
        if grouped is not None:
            return grouped, None if subset is None else group_live(plan, subset, grouped.steps)
    return tables, subset


def run_candidates(plan: Plan, tables, steps: tuple[int, ...], step, node, valid, finished,
                   logprobs, scores=None, keep: Optional[int] = None,
                   subset=None, child_subset: bool = True) -> StepCandidates:
    """`step_candidates` at `step`, one of the static `steps` of a run, padded
    to the run's widest list (`pad_candidates`) so the rest of the step is
    one program. With several steps `step` is traced: `tables` is then the
    run's `PackedRun` (see `run_inputs`), or a `lax.switch` runs that
    step's kernel: over the run's `GroupedRun` groups (steps of one shape
    share a kernel, reading their stacked tables), or over the steps, on
    the layers' own tables (`switch_steps`). child_subset: as
    `step_candidates` takes it (False: a ranked subset's children listed by
    structure alone, never packed or grouped)."""
    width = max(candidate_width(plan, t, keep) for t in steps)
    if isinstance(tables, PackedRun):
        index = jnp.asarray(step, jnp.int32) - steps[0]
        return pad_candidates(packed_step_candidates(plan, tables, index, node, valid, finished,
                                                     logprobs, subset), width)
    if len(steps) == 1:
        return pad_candidates(step_candidates(plan, tables, node, valid, finished, logprobs,
                                              steps[0], scores=scores, keep=keep, subset=subset,
                                              child_subset=child_subset), width)

    index = jnp.asarray(step, jnp.int32) - steps[0]
    if switched(plan, steps, scores):
        return pad_candidates(switched_step_candidates(plan, tables, steps, index, node, valid,
                                                       finished, logprobs, subset, child_subset),
                              width)

    def at(t, tables, subset, node, valid, finished, logprobs, scores):
        return pad_candidates(step_candidates(plan, tables, node, valid, finished, logprobs, t,
                                              scores=scores, keep=keep, subset=subset,
                                              child_subset=child_subset), width)

    return switch_steps(tables, subset, steps, index, at, node, valid, finished, logprobs, scores)


def switch_over_steps(plan: Plan, step_fn: Callable, step, *operands):
    """``step_fn(t, *operands)`` for a traced int32 scalar `step`: a lax.switch
    over the programs of every static t in [0, plan.max_length) (a step
    outside runs the nearest one: callers keep its result only where
    `step_in_range`), so one exported module serves every step."""
    branches = [functools.partial(step_fn, t) for t in range(plan.max_length)]
    index = jnp.clip(jnp.asarray(step, jnp.int32), 0, plan.max_length - 1)
    return lax.switch(index, branches, *operands)


def switch_over_groups(plan: Plan, step_fn: Callable, step, tables, subset, *operands):
    """``step_fn(t, tables, subset, *operands)`` for a traced int32 scalar
    `step`, as `switch_over_steps` runs it (a step outside [0, max_length)
    runs the nearest one), but steps with the same plan and table shapes
    share a branch (`kernels.group_run`, stacks as small as packed runs:
    they are built on every call), which reads `tables[t]` and the subset's
    bits at its first step t as views of the step's own (`switch_steps`):
    `step_fn` indexes them at t only, and takes the subset unchecked."""
    steps = tuple(range(plan.max_length))
    index = jnp.clip(jnp.asarray(step, jnp.int32), 0, plan.max_length - 1)
    grouped = None if is_ranked(subset) else group_run(plan, tables, steps,
                                                         kernels.PACK_MAX_ENTRIES)
    if grouped is not None:
        tables, subset = grouped, None if subset is None else group_live(plan, subset,
                                                                          grouped.steps)
    return switch_steps(tables, subset, steps, index, step_fn, *operands)


def step_in_range(plan: Plan, step):
    """bool scalar: a traced `step` is in [0, plan.max_length)."""
    step = jnp.asarray(step, jnp.int32)
    return (step >= 0) & (step < plan.max_length)


def beam_step_switch(plan: Plan, tables, state: BeamState, logits, step,
                     tokens_per_beam=None, subset: Optional[LiveMask] = None,
                     beam_size: Optional[int] = None,
                     prior: Optional[LivePrior] = None) -> BeamState:
    """`beam_step` at a traced int32 `step` (`beam_step` dispatches here; the
    exported modules call it directly): a step outside [0, max_length)
    appends nothing (the state as it was, parent the identity).
    tokens_per_beam as `beam_search` takes it (see `check_tokens_per_beam`).
    A `lax.switch` over the runs of `step_segments`: each run compiles one
    step program (with an inner switch for its layers' candidate gathers),
    not one per step. subset: a `LiveMask` (per-row item subsets), or None.
    beam_size: the beams the new state keeps (None: the state's M); a
    served artifact exports one module per (M, beam_size) its beam
    schedules step through. A step outside the range appends nothing, and
    needs beam_size == M (a state of another width cannot be the same).
    prior: item priors (`decode.prior.LivePrior`), as `run_step` takes them."""
    caps = check_tokens_per_beam(tokens_per_beam, plan.max_length)
    M = state.node.shape[1]
    width = M if beam_size is None else beam_size
    # step 0 a run of its own with any subset: in a run with the steps after it, it read
    # its candidates through the run's tables and cost a dense step (1e7: 1.5-1.75 ms
    # a call alone against 0.90-0.92); no model is compiled here, so the run costs one
    # more branch's compile only (`search._segments` keeps it merged: a model per run)
    runs = step_segments(plan, caps, (None,) * plan.max_length, width, tables, first_alone=True)
    in_range = step_in_range(plan, step)
    step = jnp.clip(jnp.asarray(step, jnp.int32), 0, plan.max_length - 1)
    starts = jnp.asarray([run[0] for run in runs[1:]], jnp.int32)
    index = jnp.sum(step >= starts).astype(jnp.int32)
    branches = [functools.partial(_run_branch, plan, caps, run, width) for run in runs]
    new = lax.switch(index, branches, tables, state, logits, step, subset, prior)
    if width != M:
        return new
    same = state._replace(parent=jnp.broadcast_to(
        lax.iota(jnp.int32, state.parent.shape[-1]), state.parent.shape))
    return BeamState(*(jnp.where(in_range, a, b) for a, b in zip(new, same)))


def _run_branch(plan, caps, run, width, tables, state, logits, step, subset, prior):
    # Built on every call here, not once per loop: stacks as small as packed runs.
    tabs, sub = run_inputs(plan, tables, subset, run, kernels.PACK_MAX_ENTRIES)
    return run_step(plan, tabs, state, logits, run, step if len(run) > 1 else run[0],
                    caps[run[0]], None, sub, width, prior)


MAX_PADDING = (2, 8)
"""A step joins a run of steps compiled as one loop only while the run's
widest candidate list is at most 2x + 8 of the step's own: padding costs
selection work, a run saves a compiled copy of the step."""


def step_segments(plan: Plan, caps: tuple, live: tuple, beam_size,
                  tables=None, first_alone: bool = False) -> tuple[tuple[int, ...], ...]:
    """The steps 0..max_length-1 cut into runs of consecutive steps that can
    share one step program (a run of two or more compiles as one loop, not
    an unrolled chain, and the model inside it once). beam_size: an int, or
    the widths of a beam schedule (`arguments.check_beam_schedule`): a step
    that changes the beams' width is a run of its own (a loop keeps its
    state's shape).
    Steps share a run when they have the same cap and width and either

    * `tables` is given and the run stays packable (`run_inputs`): its steps
      read one packed table whatever their widths, and the run expands the
      most beams any of its steps may hold (`run_live_bound`); or
    * they have the same live-beam bound and candidate widths within
      `MAX_PADDING` of each other (their own kernels, under a lax.switch).

    first_alone: step 0 a run of its own: always in a stepped `beam_step`
    (`beam_step_switch`: depth 0 holds one state, and alone the step reads
    its own small tables, not the run's), and in a search over a ranked
    subset (`first_alone_for`: step 0 reads one bit a candidate and the
    steps after it select from a list, `listed_selection`; in one run both
    selections would be compiled into the program and switched between at
    every step). A search keeps step 0 in its run otherwise: a run compiles
    the model once more.
    """
    factor, extra = MAX_PADDING
    beams = (beam_size,) * (plan.max_length + 1) if is_int(beam_size) else tuple(beam_size)
    runs = []  # [cap, live bounds, steps, widths, packed entries or None]
    for t in range(plan.max_length):
        keep = beams[t + 1] if caps[t] is None else min(caps[t], beams[t + 1])
        width = candidate_width(plan, t, keep)
        entries = None if tables is None else kernels.step_entries(plan, tables, t)
        same_width = bool(runs) and all(beams[u] == beams[u + 1] == beams[t]
                                        for u in runs[-1][2] + [t])
        if same_width and runs[-1][0] == caps[t] and not (first_alone and t == 1):
            cap, bounds, steps, widths, packed = runs[-1]
            if packed is not None and entries is not None and \
                    packed + entries <= kernels.PACK_MAX_ENTRIES:
                runs[-1] = (cap, bounds + [live[t]], steps + [t], widths + [width],
                            packed + entries)
                continue
            if len(set(bounds + [live[t]])) == 1 and \
                    max(widths + [width]) <= factor * min(widths + [width]) + extra:
                merged = None if packed is None or entries is None else packed + entries
                runs[-1] = (cap, bounds + [live[t]], steps + [t], widths + [width], merged)
                continue
        runs.append((caps[t], [live[t]], [t], [width], entries))
    return tuple(tuple(run[2]) for run in runs)


def first_alone_for(subset) -> bool:
    """`step_segments`' first_alone for a search over `subset`: a ranked
    subset's (`ranked.RankedMask`; a stepped `beam_step` has it always)."""
    return is_ranked(subset)


def run_live_bound(live: tuple, steps: tuple[int, ...]) -> Optional[int]:
    """The live-beam bound of a run: the largest of its steps' (None: none)."""
    bounds = [live[t] for t in steps]
    return None if None in bounds else max(bounds)


def beam_step_program(tables, state: BeamState, logits, step, live, *, plan: Plan, caps: tuple,
                      beam_size: Optional[int] = None, prior: Optional[LivePrior] = None):
    """`beam_step_switch` as one program per plan, caps, output width and
    shapes, logits as float32 and the step as an int32 scalar: what a
    served artifact's beam_step module runs (the compiled set's
    `beam_step`). beam_size: the beams kept (None: the state's); prior:
    item priors (`decode.prior.LivePrior`)."""
    logits, step = program_inputs(logits, step)
    return _beam_step_program(tables, state, logits, step, live, prior, plan=plan, caps=caps,
                              beam_size=beam_size)


def program_inputs(logits, step):
    """(logits float32, step int32 scalar) as a step program takes them,
    with no eager device op where they already are: float32 logits (numpy
    or jax) and an integer step go to the program as its arguments (each
    eager conversion is a dispatch of its own: together ~50-100 us of a
    Python-stepped call's ~0.3-0.4 ms on the host); others are converted
    (traced values too)."""
    if getattr(logits, "dtype", None) != np.float32:
        logits = jnp.asarray(logits).astype(jnp.float32)
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        step = np.int32(step)
    elif getattr(step, "dtype", None) != np.int32:
        step = jnp.asarray(step, jnp.int32)
    return logits, step


@bounded_jit(static_argnames=("plan", "caps", "beam_size"), group_by="plan")
def _beam_step_program(tables, state: BeamState, logits, step, live, prior, *, plan,
                       caps: tuple, beam_size):
    return beam_step_switch(plan, tables, state, logits, step, caps, live, beam_size, prior)
