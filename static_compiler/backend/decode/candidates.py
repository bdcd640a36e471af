"""Candidate transitions of every beam at one decoding step, with their
log-probabilities: the children the tables list (one gather per layout, see
`static_compiler.backend.kernels`), the end token where a state accepts, and
finished beams carried over unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
from jax import lax

from static_compiler.backend.decode.live import (
    LiveMask,
    PackedLive,
    child_live,
    dense_child_live,
    end_live,
    grouped_live_view,
    is_ranked,
    packed_child_live,
    packed_end_live,
)
from static_compiler.backend.decode.logprobs import LogProbs, scored
from static_compiler.backend.kernels import (
    Candidates,
    GroupedRun,
    PackedRun,
    accepts,
    entries,
    expand,
    packed_expand,
    row_bounds,
    slice_rows,
    take_last,
    take_rows,
)
from static_compiler.ir import LayoutKind
from static_compiler.lowered.plan import Plan, candidate_columns, num_candidates, slot_steps  # noqa: F401
from static_compiler.support.decode_state import PAD_TOKEN, SENTINEL_SCORE


class StepCandidates(NamedTuple):
    """Every candidate of every beam at one step (K columns per beam).

    tokens int32 (..., K); next int32 (..., K) the state reached; valid bool
    (..., K); logprob float32 (..., K); ends bool (..., K) the candidate is the
    end token; stays bool (..., K) a finished beam carried unchanged."""

    tokens: Any
    next: Any
    valid: Any
    logprob: Any
    ends: Any
    stays: Any


def step_candidates(plan: Plan, tables, node, live, finished, logprobs: Optional[LogProbs],
                step: int, scores=None, keep: Optional[int] = None,
                subset: Optional[LiveMask] = None, child_subset: bool = True) -> StepCandidates:
    """Candidate transitions of every beam at `step` (static), with scores.

    node, live, finished: (...,) per beam; logprobs: the beams' `LogProbs`,
    or None when only the transitions matter (mask / advance: log-probs 0).
    Beam search passes the beams' scores float32 (B, M) (with logprobs) and
    `keep`, the children a beam may contribute; a mixed-layout step then
    lists each beam's best children only (`mixed_children`), all others
    every child. `subset`: only children whose next state is live, and the
    end token only where the state's own item is in it (see `live`);
    child_subset=False: the children listed by structure alone, the end
    token still read in the subset (`listed_child_live` reads the
    children's liveness for the few a selection needs)."""
    end = plan.end_token
    children = subset if child_subset else None

    def logprob_of(tokens, dense: bool = False):
        if logprobs is None:
            return jnp.zeros(tokens.shape, jnp.float32)
        return logprobs.all() if dense else logprobs.take(tokens)

    accepting = None
    if step < plan.depth:
        sp = plan.steps[step]
        in_subset = functools.partial(child_live, children, step)
        if sp.light_k and scores is not None:
            c, lp = mixed_children(sp, tables[step], node, live & ~finished, logprobs, scores, keep,
                                   in_subset)
        else:
            c = expand(sp, tables[step], node)
            # Depth 0 holds one state, the root: at step 0 every beam's
            # children are the same states, read once a batch row.
            at, nxt = (node[:, :1], c.next[:, :1]) if step == 0 and node.ndim == 2 else \
                (node, c.next)
            # (a ranked subset has no slot bits: it counts the children's items, by row)
            live_children = dense_child_live(children, step, at, plan.vocab_size) \
                if step in slot_steps(plan) and not is_ranked(children) else \
                child_live(children, step, nxt, at, _form(sp))
            c = c._replace(valid=c.valid & live_children)
            lp = logprob_of(c.tokens, dense=sp.kind == LayoutKind.DENSE_ROWS)
        if end is not None and sp.has_accepting:
            accepting = accepts(sp, tables[step], node) & end_live(subset, step, node)
    else:  # the extra step of variable-length sets: final states can only end
        c, lp, accepting = None, None, end_live(subset, step, node)
    return _assemble(end, c, lp, accepting, live, finished, logprob_of)


def _form(sp) -> Optional[str]:
    """How a step's children lie (`ranked.child_live`'s form): a dense_rows
    row's V slots, or a csr / near_unary slice of consecutive states
    (implicit targets: every set with items), else None."""
    if sp.kind == LayoutKind.DENSE_ROWS:
        return "dense"
    if sp.kind in (LayoutKind.CSR, LayoutKind.NEAR_UNARY) and not sp.explicit_targets:
        return "consecutive"
    return None


def switched(plan: Plan, steps: tuple[int, ...], scores=None) -> bool:
    """Whether `switched_step_candidates` serves the run `steps`: no step
    reads dense rows (V slots, all log-probs) or, in beam search (`scores`
    given), lists a mixed layer's best children (`mixed_children`)."""
    return all(t >= plan.depth or (plan.steps[t].kind != LayoutKind.DENSE_ROWS and
                                   not (plan.steps[t].light_k and scores is not None))
               for t in steps)


def switch_steps(tables, subset, steps: tuple[int, ...], index, fn, *operands):
    """``fn(t, tables, subset, *operands)`` for the step steps[index] (index
    traced int32) of a run: a `lax.switch` over the steps, each branch
    calling `fn` at its static step; or, when `tables` is the run's
    `GroupedRun` (and `subset` its `GroupedLive` or None), over its groups,
    each calling `fn` at its first step with the tables and subset bits of
    the step at the traced position within the group (`step_tables`,
    `grouped_live_view`): as many branches as distinct kernels, however
    long the run."""
    if not isinstance(tables, GroupedRun):
        return lax.switch(index, [functools.partial(fn, t, tables, subset) for t in steps],
                          *operands)
    groups = tables.steps

    def branch(g, pos, *ops):
        return fn(groups[g][0], tables.step_tables(g, pos),
                  grouped_live_view(subset, groups, g, pos), *ops)

    position = jnp.take(tables.position, index, mode="clip")
    if len(groups) == 1:
        return branch(0, position, *operands)
    return lax.switch(jnp.take(tables.group, index, mode="clip"),
                      [functools.partial(branch, g) for g in range(len(groups))],
                      position, *operands)


def switched_step_candidates(plan: Plan, tables, steps: tuple[int, ...], index, node, live,
                             finished, logprobs: Optional[LogProbs],
                             subset: Optional[LiveMask] = None,
                             child_subset: bool = True) -> StepCandidates:
    """`step_candidates` at step steps[index] (index traced int32) of a run
    that `switched` accepts: a lax.switch over the steps' kernels that only
    gathers each step's children (padded to the run's widest k, past a row's
    end invalid) and accepting flags, returned as one int32 array; the
    log-probs, the end and the carried-over columns are built once after it.
    XLA compiles every op of every branch into kernels of their own, so the
    less a branch does, the faster the run compiles. The valid columns and
    their order are those of `step_candidates`, so the selection decodes the
    same. child_subset: as `step_candidates` takes it."""
    end = plan.end_token
    k = max([1] + [num_candidates(plan.steps[t], plan.vocab_size) for t in steps
                   if t < plan.depth])
    with_end = end is not None and any(t >= plan.depth or plan.steps[t].has_accepting
                                       for t in steps)

    def branch(t, tables, subset, node):
        shape = jnp.shape(node)
        if t < plan.depth:
            sp = plan.steps[t]
            c = expand(sp, tables[t], node)
            pad = [(0, 0)] * len(shape) + [(0, k - c.tokens.shape[-1])]
            cols = [jnp.pad(c.tokens, pad), jnp.pad(c.next, pad),
                    jnp.pad((c.valid & child_live(subset if child_subset else None, t,
                                                  c.next)).astype(jnp.int32), pad)]
            accepting = (accepts(sp, tables[t], node) & end_live(subset, t, node)
                         if sp.has_accepting else jnp.zeros(shape, bool))
        else:  # the extra step of variable-length sets: final states can only end
            cols = [jnp.zeros(shape + (k,), jnp.int32)] * 3
            accepting = end_live(subset, t, node)
        if with_end:
            cols.append(accepting.astype(jnp.int32)[..., None])
        return jnp.concatenate(cols, axis=-1)

    out = switch_steps(tables, subset, steps, index, branch, jnp.asarray(node, jnp.int32))
    tokens, nxt, valid = out[..., :k], out[..., k:2 * k], out[..., 2 * k:3 * k] != 0

    def logprob_of(tokens):
        return jnp.zeros(tokens.shape, jnp.float32) if logprobs is None else logprobs.take(tokens)

    return _assemble(end, Candidates(tokens, nxt, valid), logprob_of(tokens),
                     out[..., 3 * k] != 0 if with_end else None, live, finished, logprob_of)


def listed_child_live(plan: Plan, subset: LiveMask, steps: tuple[int, ...], index,
                      cand: StepCandidates, node, parent, col):
    """bool (B, R): whether the candidates (parent, col) int32 (B, R) of
    `cand` (B, M', K), listed by structure at step steps[index] (index
    traced int32 when the run has several steps; `child_subset=False`),
    are in `subset`: a child where its next state has a selected item
    below it (`child_live`, one read per listed candidate), every other
    column (end token, carried-over beam: read in full already) True.
    node: int32 (B, M'), the beams' states."""
    B = parent.shape[0]
    flat = parent * cand.tokens.shape[-1] + col
    nxt = take_last(cand.next.reshape(B, -1), flat)
    other = take_last((cand.ends | cand.stays).reshape(B, -1), flat)
    beam_node = take_last(node, parent)

    def at(t, nxt, beam_node):
        if t >= plan.depth:  # the extra step of variable-length sets: no children
            return jnp.ones(nxt.shape, bool)
        return child_live(subset, t, nxt, beam_node)

    live = at(steps[0], nxt, beam_node) if len(steps) == 1 else \
        lax.switch(index, [functools.partial(at, t) for t in steps], nxt, beam_node)
    return other | live


def full_child_live(plan: Plan, subset: LiveMask, steps: tuple[int, ...], index,
                    cand: StepCandidates, node):
    """bool (B, M', K): whether every candidate of `cand`, listed by
    structure at step steps[index] (as `listed_child_live` takes them), is
    in `subset`: a step's children (its first `num_candidates` columns,
    in either candidate layout) read as `step_candidates` reads them (the
    step's form: a dense row's V + 1 bounds a beam), every other column
    True. The same answers where valid as reading them while listing."""
    K = cand.next.shape[-1]

    def at(t, nxt, node):
        if t >= plan.depth:
            return jnp.ones(nxt.shape, bool)
        sp = plan.steps[t]
        k = num_candidates(sp, plan.vocab_size)
        live = child_live(subset, t, nxt[..., :k], node, _form(sp))
        return jnp.concatenate([live, jnp.ones(nxt.shape[:-1] + (K - k,), bool)], axis=-1)

    return at(steps[0], cand.next, node) if len(steps) == 1 else \
        lax.switch(index, [functools.partial(at, t) for t in steps], cand.next, node)


def packed_step_candidates(plan: Plan, packed: PackedRun, index, node, live, finished,
                           logprobs: Optional[LogProbs],
                           subset: Optional[PackedLive] = None) -> StepCandidates:
    """`step_candidates` at step `index` (traced int32) of a packed run:
    every step reads `packed.k` slots (past a row's end they are invalid)
    and, with an end token, one end column (valid where the state accepts).
    The valid columns and their order are those of `step_candidates`, so
    the selection decodes the same; a mixed layer lists all its children
    here, and the selection's per-beam cap picks the same best ones."""

    def logprob_of(tokens):
        return jnp.zeros(tokens.shape, jnp.float32) if logprobs is None else logprobs.take(tokens)

    c, accepting = packed_expand(packed, index, node)
    c = c._replace(valid=c.valid & packed_child_live(subset, index, c.next))
    accepting = accepting & packed_end_live(subset, index, node)
    end = plan.end_token
    return _assemble(end, c, logprob_of(c.tokens), None if end is None else accepting, live,
                     finished, logprob_of)


def _assemble(end, children: Optional[Candidates], lp, accepting, live, finished,
              logprob_of) -> StepCandidates:
    """The columns of one step: the children (if any) with their log-probs,
    the end token where `accepting` (None: no end column), and, with an end
    token, finished beams carried over unchanged."""
    shape = jnp.shape(live)
    cols = []  # (tokens, next, valid, logprob, ends, stays)
    if children is not None:
        false = jnp.zeros(children.tokens.shape, bool)
        cols.append((children.tokens, children.next, children.valid, lp, false, false))
    if accepting is not None:
        end_tokens = jnp.full(shape + (1,), end, jnp.int32)
        cols.append((end_tokens, jnp.zeros(shape + (1,), jnp.int32), accepting[..., None],
                     logprob_of(end_tokens), jnp.ones(shape + (1,), bool),
                     jnp.zeros(shape + (1,), bool)))
    if end is not None:  # finished beams carry over unchanged
        cols.append((jnp.full(shape + (1,), PAD_TOKEN, jnp.int32), jnp.zeros(shape + (1,), jnp.int32),
                     (live & finished)[..., None], jnp.zeros(shape + (1,), jnp.float32),
                     jnp.zeros(shape + (1,), bool), jnp.ones(shape + (1,), bool)))
    tokens, nxt, valid, lp, ends, stays = (
        parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1) for parts in zip(*cols))
    expanding = (live & ~finished)[..., None]
    valid = valid & (stays | (expanding & (lp > -jnp.inf)))
    return StepCandidates(tokens, nxt, valid, lp, ends, stays)


def _child_scores(valid, expanding, lp, scores):
    """`scored` of children, valid as `_candidates` makes them: slot valid,
    beam expanding, log-prob above -inf."""
    return scored(valid & expanding[..., None] & (lp > -jnp.inf), lp, scores)


def mixed_children(sp, tables, node, expanding, logprobs: LogProbs, scores, keep: int,
                   in_subset=None):
    """The children of beams (B, M) at a mixed-layout step, each beam's list
    cut to its best W = min(keep, k) children (ties: lower token first).

    Every beam reads light_k entries from its row start; the first
    `wide_slots` beams of each batch row whose state is heavy (more than
    light_k children) also read the other k - light_k entries of their row,
    and their W best children replace their light list. When a row has more
    heavy beams than wide slots, the step instead reads k entries for every
    beam (`lax.cond`: only the branch taken runs). Exact: a beam contributes
    at most `keep` children to the winners (its best ones), and a light
    beam's light_k entries hold all its children.

    Returns (Candidates (B, M, W), logprob float32 (B, M, W)): a beam's
    entries are sorted by score (equal scores by token), or are its light_k
    entries in token order when light_k <= W; invalid entries are masked.
    in_subset: next states (B, ...) -> bool, the children that may be
    listed at all (an item subset's live states); None: all."""
    B, M = node.shape
    sliced = lambda start, end, k: _in_subset(slice_rows(sp, tables, start, end, k), in_subset)
    kl, kw, H = sp.light_k, sp.k - sp.light_k, min(sp.wide_slots, M)
    width = min(keep, sp.k)
    start, end = row_bounds(sp, tables, node)
    heavy = expanding & (end - start > kl)

    def best(s, cols=None):
        """(..., n) scores -> the best `width` (padded with SENTINEL_SCORE),
        with their columns (offsets from the row start)."""
        if cols is None:
            cols = jnp.broadcast_to(lax.iota(jnp.int32, s.shape[-1]), s.shape)
        if s.shape[-1] > width:
            s, pos = lax.top_k(s, width)
            return s, take_last(cols, pos)
        pad = [(0, 0)] * (s.ndim - 1) + [(0, width - s.shape[-1])]
        return (jnp.pad(s, pad, constant_values=SENTINEL_SCORE),
                jnp.pad(cols, pad, constant_values=sp.k))

    def full():
        c = sliced(start, end, sp.k)
        return best(_child_scores(c.valid, expanding, logprobs.take(c.tokens), scores))

    def mixed():
        light = sliced(start, jnp.minimum(end, start + kl), kl)
        s_light, c_light = best(_child_scores(light.valid, expanding,
                                              logprobs.take(light.tokens), scores))
        # The first H heavy beams of each row (lower beams first), then fillers.
        _, beams = lax.top_k(jnp.where(heavy, -lax.iota(jnp.int32, M), -M), H)
        at = lambda x: take_rows(x, beams)
        used = at(heavy)
        w_start = at(start) + kl
        wide = sliced(w_start, jnp.where(used, at(end), w_start), kw)
        s_wide, c_wide = best(_child_scores(wide.valid, used,
                                            logprobs.take_beams(beams, wide.tokens), at(scores)))
        rows = jnp.arange(B)[:, None]
        # Light columns come first: among equal scores, the lower tokens.
        merged_s, merged_c = best(jnp.concatenate([s_light[rows, beams], s_wide], axis=-1),
                                  jnp.concatenate([c_light[rows, beams], c_wide + kl], axis=-1))
        keep_old = ~used[..., None]
        return (s_light.at[rows, beams].set(jnp.where(keep_old, s_light[rows, beams], merged_s)),
                c_light.at[rows, beams].set(jnp.where(keep_old, c_light[rows, beams], merged_c)))

    child_s, col = lax.cond(jnp.all(jnp.sum(heavy, axis=1) <= H), mixed, full)
    tokens, nxt = entries(sp, tables, start[..., None] + col)
    return Candidates(tokens, nxt, child_s > SENTINEL_SCORE), logprobs.take(tokens)


def _in_subset(c: Candidates, in_subset) -> Candidates:
    return c if in_subset is None else c._replace(valid=c.valid & in_subset(c.next))


def candidate_width(plan: Plan, step: int, keep: Optional[int] = None) -> int:
    """Columns of `step_candidates` at `step`; in beam search (`keep` given) a
    mixed layer lists only each beam's best min(keep, k) children."""
    if keep is not None and step < plan.depth and plan.steps[step].light_k:
        sp, end = plan.steps[step], plan.end_token is not None
        return min(keep, sp.k) + int(end and sp.has_accepting) + int(end)
    return candidate_columns(plan, step)


def pad_candidates(cand: StepCandidates, width: int) -> StepCandidates:
    """`cand` with invalid columns appended up to `width`: they score
    SENTINEL_SCORE, come after every real column, and are never chosen while
    a valid candidate remains, so a step padded this way decodes the same."""
    extra = width - cand.tokens.shape[-1]
    if extra <= 0:
        return cand
    pad = lambda x, value: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)],
                                   constant_values=value)
    return StepCandidates(pad(cand.tokens, PAD_TOKEN), pad(cand.next, 0), pad(cand.valid, False),
                          pad(cand.logprob, -jnp.inf), pad(cand.ends, False),
                          pad(cand.stays, False))
