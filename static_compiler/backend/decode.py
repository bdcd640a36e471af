"""Constrained decoding over lowered tables: beam search, greedy, sampling and
a logits-processor pair (`mask` / `advance`) for custom loops.

Everything here is pure jax with static shapes, usable eagerly and inside a
user's own `jax.jit`; the plan is static, the tables are arguments.

Beam-search semantics (tested bit-for-bit against a numpy oracle):

* log-probabilities are ``log_softmax`` of the logits over the full
  vocabulary; a NaN logit is an invalid token; +inf logits share all the
  probability; tokens whose log-probability is -inf are invalid;
* step 0 expands beam 0 of each batch row only (all beams start at the root);
* each live beam expands to its valid children (or its top
  ``tokens_per_beam`` of them); the top ``beam_size`` candidates per row
  survive, sorted by score descending, ties broken by lower parent beam, then
  lower token id (the end token's candidate comes after a beam's other
  children);
* with an end token, a beam in an accepting state may take the end token and
  is then finished: it keeps its score, stops expanding, and competes with
  live beams for the ``beam_size`` places; decoding runs ``depth + 1`` steps;
* beams that cannot be filled (fewer valid sequences than beams) have
  ``valid=False``, score `SENTINEL_SCORE` and tokens `PAD_TOKEN` throughout;
* a valid candidate's score is ``max(parent score + log-prob,
  MIN_VALID_SCORE)`` in float32: huge negative finite logits (or a float32
  overflow of the sum) never push a valid sequence below an invalid one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.kernels import (Candidates, accepts, entries, expand, num_candidates,
                                             row_bounds, slice_rows)
from static_compiler.backend.lowering import Plan
from static_compiler.errors import DecodeInputError

SENTINEL_SCORE = -1e30
"""Score of invalid candidates and beams: finite, so no -inf arithmetic."""

MIN_VALID_SCORE = -1e29
"""Floor of a valid score: above SENTINEL_SCORE, so valid beams rank first."""

PAD_TOKEN = -1
"""Token written where a beam holds no sequence, and after the end token."""


class BeamState(NamedTuple):
    """Beam-search state carried between steps (B = batch, M = beams, T = max length).

    tokens: int32 (B, M, T) decoded tokens so far, PAD_TOKEN elsewhere.
    scores: float32 (B, M) summed log-probabilities, SENTINEL_SCORE if not valid.
    node: int32 (B, M) automaton state at the current depth (0 when not live).
    valid: bool (B, M) the beam holds a real (live or finished) sequence.
    finished: bool (B, M) the beam has taken the end token.
    lengths: int32 (B, M) tokens before the end token.
    last_tokens: int32 (B, M) token to feed the model at the next step.
    parent: int32 (B, M) beam each beam came from at the last step; reorder
      per-beam model state (KV caches) with it.
    """

    tokens: Any
    scores: Any
    node: Any
    valid: Any
    finished: Any
    lengths: Any
    last_tokens: Any
    parent: Any


class DecodeResult(NamedTuple):
    """tokens int32 (B, M, T); scores float32 (B, M) sorted descending per row;
    valid bool (B, M); lengths int32 (B, M) without the end token."""

    tokens: Any
    scores: Any
    valid: Any
    lengths: Any


class ProcessorState(NamedTuple):
    """Per-row state of the logits-processor API: node int32 (B,), valid bool
    (B,) (False once a row took a disallowed token), finished bool (B,)."""

    node: Any
    valid: Any
    finished: Any


class _Candidates(NamedTuple):
    tokens: Any   # int32 (B, M, K)
    next: Any     # int32 (B, M, K)
    valid: Any    # bool (B, M, K)
    logprob: Any  # float32 (B, M, K)
    ends: Any     # bool (B, M, K): the candidate is the end token
    stays: Any    # bool (B, M, K): a finished beam carried unchanged


def _posinf_rows(x, posinf):
    """In rows holding +inf logits (posinf bool (..., 1)), +inf -> 0 and
    everything else -> -inf: the +inf tokens share all the probability."""
    return jnp.where(posinf, jnp.where(x == jnp.inf, 0.0, -jnp.inf), x)


class LogProbs(NamedTuple):
    """`safe_log_softmax` of logits (..., V), normalized only where read.

    A step that reads K << V candidates gathers K logits and normalizes
    those, instead of writing and re-reading a (..., V) array; the values are
    bit-identical to `safe_log_softmax`'s.

    logits: float32 (..., V), NaN replaced by -inf; lse: float32 (..., 1) the
    row's log-sum-exp; posinf: bool (..., 1) the row holds +inf logits."""

    logits: Any
    lse: Any
    posinf: Any

    @classmethod
    def of(cls, logits) -> "LogProbs":
        x = jnp.asarray(logits).astype(jnp.float32)
        x = jnp.where(jnp.isnan(x), -jnp.inf, x)
        posinf = jnp.any(x == jnp.inf, axis=-1, keepdims=True)
        shifted = _posinf_rows(x, posinf)
        # Three reductions as written: a fused max / sum variant rounded
        # differently inside the exported lax.switch step than under jit
        # (tests/test_serving.py checks the two are bit-identical).
        m = jnp.max(shifted, axis=-1, keepdims=True)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        lse = m + jnp.log(jnp.sum(jnp.exp(shifted - m), axis=-1, keepdims=True))
        return cls(x, lse, posinf)

    def _normalize(self, x):
        x = _posinf_rows(x, self.posinf)
        return jnp.where(x == -jnp.inf, -jnp.inf, x - self.lse)

    def all(self):
        """float32 (..., V): every token's log-probability."""
        return self._normalize(self.logits)

    def take(self, tokens):
        """float32 (..., K): the log-probabilities of tokens int (..., K)."""
        return self._normalize(jnp.take_along_axis(self.logits, tokens, axis=-1))

    def take_beams(self, beams, tokens):
        """float32 (B, H, K): log-probabilities of tokens int32 (B, H, K) in
        the rows `beams` int32 (B, H) of logits (B, M, V)."""
        B, M, V = self.logits.shape
        flat = (beams[..., None] * V + tokens).reshape(B, -1)
        x = jnp.take_along_axis(self.logits.reshape(B, M * V), flat, axis=-1).reshape(tokens.shape)
        rows = lambda a: jnp.take_along_axis(a, beams[..., None], axis=1)
        return LogProbs(None, rows(self.lse), rows(self.posinf))._normalize(x)


def safe_log_softmax(logits):
    """log_softmax over the last axis that never yields NaN.

    NaN logits become -inf (invalid); if a row holds +inf logits, those share
    all the probability (log(1/count)) and every other token gets -inf; a row
    with no finite-or-+inf logit is all -inf."""
    return LogProbs.of(logits).all()


def add_logprob(scores, logprob):
    """float32 ``max(scores + logprob, MIN_VALID_SCORE)`` (any broadcastable shapes)."""
    return jnp.maximum(scores + logprob, jnp.float32(MIN_VALID_SCORE))


def check_logits(plan: Plan, logits, batch_shape: tuple, where: str):
    """Raises DecodeInputError unless `logits` is float with shape batch_shape + (V,)."""
    shape = tuple(jnp.shape(logits))
    want = tuple(batch_shape) + (plan.vocab_size,)
    if shape != want:
        raise DecodeInputError(f"{where}: logits have shape {shape}, expected {want} "
                               f"(batch dims {tuple(batch_shape)}, vocab {plan.vocab_size})")
    dtype = jnp.result_type(logits)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise DecodeInputError(f"{where}: logits have dtype {dtype}, expected a float dtype")


def init_beam_state(plan: Plan, batch_size: int, beam_size: int, start_token: int = 0) -> BeamState:
    """All beams at the root; only beam 0 of each row is valid (it alone expands at step 0)."""
    B, M, T = batch_size, beam_size, plan.max_length
    first = jnp.arange(M)[None, :] == 0
    valid = jnp.broadcast_to(first, (B, M))
    return BeamState(
        tokens=jnp.full((B, M, T), PAD_TOKEN, jnp.int32),
        scores=jnp.where(valid, 0.0, SENTINEL_SCORE).astype(jnp.float32),
        node=jnp.zeros((B, M), jnp.int32),
        valid=valid,
        finished=jnp.zeros((B, M), bool),
        lengths=jnp.zeros((B, M), jnp.int32),
        last_tokens=jnp.full((B, M), start_token, jnp.int32),
        parent=jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32), (B, M)),
    )


def _candidates(plan: Plan, tables, node, live, finished, logprobs: Optional[LogProbs],
                step: int, scores=None, keep: Optional[int] = None) -> _Candidates:
    """Candidate transitions of every beam at `step` (static), with scores.

    node, live, finished: (...,) per beam; logprobs: the beams' `LogProbs`,
    or None when only the transitions matter (mask / advance: log-probs 0).
    Beam search passes the beams' scores float32 (B, M) (with logprobs) and
    `keep`, the children a beam may contribute; a mixed-layout step then
    lists each beam's best children only (`_mixed_children`), all others
    every child."""
    shape = jnp.shape(node)
    end = plan.end_token
    cols = []  # (tokens, next, valid, logprob, ends, stays)

    def logprob_of(tokens, dense: bool = False):
        if logprobs is None:
            return jnp.zeros(tokens.shape, jnp.float32)
        return logprobs.all() if dense else logprobs.take(tokens)

    def end_col(valid):
        lp = logprob_of(jnp.full(shape + (1,), end, jnp.int32))
        return (jnp.full(shape + (1,), end, jnp.int32), jnp.zeros(shape + (1,), jnp.int32),
                valid[..., None], lp, jnp.ones(shape + (1,), bool), jnp.zeros(shape + (1,), bool))

    if step < plan.depth:
        sp = plan.steps[step]
        if sp.light_k and scores is not None:
            c, lp = _mixed_children(sp, tables[step], node, live & ~finished, logprobs, scores, keep)
        else:
            c = expand(sp, tables[step], node)
            lp = logprob_of(c.tokens, dense=sp.kind == "dense_rows")
        false = jnp.zeros(c.tokens.shape, bool)
        cols.append((c.tokens, c.next, c.valid, lp, false, false))
        if end is not None and sp.has_accepting:
            cols.append(end_col(accepts(sp, tables[step], node)))
    else:  # the extra step of variable-length sets: final states can only end
        cols.append(end_col(jnp.ones(shape, bool)))
    if end is not None:  # finished beams carry over unchanged
        cols.append((jnp.full(shape + (1,), PAD_TOKEN, jnp.int32), jnp.zeros(shape + (1,), jnp.int32),
                     (live & finished)[..., None], jnp.zeros(shape + (1,), jnp.float32),
                     jnp.zeros(shape + (1,), bool), jnp.ones(shape + (1,), bool)))
    tokens, nxt, valid, lp, ends, stays = (
        parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1) for parts in zip(*cols))
    expanding = (live & ~finished)[..., None]
    valid = valid & (stays | (expanding & (lp > -jnp.inf)))
    return _Candidates(tokens, nxt, valid, lp, ends, stays)


def _scored(valid, lp, scores):
    """float32 (B, M', K): a candidate's beam-search score (its beam's score
    float32 (B, M') plus its log-prob lp), SENTINEL_SCORE where not valid."""
    return jnp.where(valid, add_logprob(scores[..., None], lp), SENTINEL_SCORE)


def _child_scores(valid, expanding, lp, scores):
    """`_scored` of children, valid as `_candidates` makes them: slot valid,
    beam expanding, log-prob above -inf."""
    return _scored(valid & expanding[..., None] & (lp > -jnp.inf), lp, scores)


def _mixed_children(sp, tables, node, expanding, logprobs: LogProbs, scores, keep: int):
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
    entries in token order when light_k <= W; invalid entries are masked."""
    B, M = node.shape
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
            return s, jnp.take_along_axis(cols, pos, axis=-1)
        pad = [(0, 0)] * (s.ndim - 1) + [(0, width - s.shape[-1])]
        return (jnp.pad(s, pad, constant_values=SENTINEL_SCORE),
                jnp.pad(cols, pad, constant_values=sp.k))

    def full():
        c = slice_rows(sp, tables, start, end, sp.k)
        return best(_child_scores(c.valid, expanding, logprobs.take(c.tokens), scores))

    def mixed():
        light = slice_rows(sp, tables, start, jnp.minimum(end, start + kl), kl)
        s_light, c_light = best(_child_scores(light.valid, expanding,
                                              logprobs.take(light.tokens), scores))
        # The first H heavy beams of each row (lower beams first), then fillers.
        _, beams = lax.top_k(jnp.where(heavy, -lax.iota(jnp.int32, M), -M), H)
        at = lambda x: jnp.take_along_axis(x, beams, axis=1)
        used = at(heavy)
        w_start = at(start) + kl
        wide = slice_rows(sp, tables, w_start, jnp.where(used, at(end), w_start), kw)
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


def _take_beams(x, parent):
    """x (B, M, ...) reordered along beams by parent (B, M)."""
    idx = parent.reshape(parent.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _pick(x, parent, col):
    """x (B, M', K) -> (B, M): x[b, parent[b, m], col[b, m]], one gather."""
    B, Mp, K = x.shape
    return jnp.take_along_axis(x.reshape(B, Mp * K), parent * K + col, axis=-1)


def _apply_choice(plan: Plan, state: BeamState, cand: _Candidates, parent, col, score, valid,
                  step: int) -> BeamState:
    """New beam state after each beam (B, M) chose candidate `col` of beam `parent`."""
    pick = lambda x: _pick(x, parent, col)
    token, nxt, ends, stays = pick(cand.tokens), pick(cand.next), pick(cand.ends), pick(cand.stays)
    finished = valid & (ends | stays)
    history = _take_beams(state.tokens, parent)
    history = history.at[:, :, step].set(jnp.where(valid & ~stays, token, PAD_TOKEN))
    history = jnp.where(valid[..., None], history, PAD_TOKEN)
    grows = valid & ~ends & ~stays
    lengths = jnp.where(valid, _take_beams(state.lengths, parent) + grows.astype(jnp.int32), 0)
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


def select_beams(scores, beam_size: int, tokens_per_beam: Optional[int] = None):
    """The best `beam_size` candidates of each batch row.

    scores: float32 (B, M', K), invalid candidates at SENTINEL_SCORE. Each
    beam is first pruned to its best `tokens_per_beam` candidates (if set and
    < K); ties go to the lower parent beam, then the lower slot.

    Returns (top float32 (B, beam_size) descending, parent int32 (B,
    beam_size) in [0, M'), col int32 (B, beam_size) in [0, K), real bool (B,
    beam_size)): real is False for places beyond the M' * K candidates (when
    M' * K < beam_size); those have parent 0, col 0 and SENTINEL_SCORE.

    Cost: when the pruning cannot bind (tokens_per_beam >= K or >=
    beam_size: no beam can hold more than beam_size of the winners) one flat
    top-k. Otherwise a per-beam top-k first, except on CPU, where a per-row
    top-k costs ~3x a flat one over as many entries: there `_select_checked`
    takes one flat top-k and falls back to the per-beam path only when the
    flat list cannot decide."""
    B, M, K = scores.shape
    if tokens_per_beam is None or tokens_per_beam >= min(K, beam_size):
        return _select_pruned(scores, beam_size, None)
    if M * tokens_per_beam < beam_size:  # places stay empty: padding, per-beam path
        return _select_pruned(scores, beam_size, tokens_per_beam)
    return lax.platform_dependent(
        scores, cpu=functools.partial(_select_checked, beam_size=beam_size,
                                      tokens_per_beam=tokens_per_beam),
        default=functools.partial(_select_pruned, beam_size=beam_size,
                                  tokens_per_beam=tokens_per_beam))


def _select_checked(scores, beam_size: int, tokens_per_beam: int, list_factor: int = 4):
    """`select_beams` from one flat top-R list (R = list_factor * beam_size),
    falling back to `_select_pruned` when the list holds fewer than beam_size
    candidates within their beam's best tokens_per_beam.

    Exact: the list is the first R candidates in the order (score desc,
    parent asc, slot asc). A candidate's rank within its beam counts the
    candidates of its beam before it, all of which are in the list; those of
    rank < tokens_per_beam survive pruning, and the first beam_size of them
    are the answer when the list has that many."""
    B, M, K = scores.shape
    R = min(M * K, list_factor * beam_size)
    top, flat = lax.top_k(scores.reshape(B, M * K), R)
    parent = flat // K
    # rank[b, r] = entries of the same beam before r (a triangular count, not
    # a cumsum: XLA CPU lowers cumsum to a quadratic reduce-window).
    before = lax.iota(jnp.int32, R)[None, :] < lax.iota(jnp.int32, R)[:, None]
    rank = jnp.sum((parent[:, :, None] == parent[:, None, :]) & before, axis=-1)
    kept = rank < tokens_per_beam
    # Positions of the first beam_size kept entries, in list order.
    _, pos = lax.top_k(jnp.where(kept, -lax.iota(jnp.int32, R), -R), beam_size)
    at = lambda x: jnp.take_along_axis(x, pos, axis=-1)
    fast = (at(top), at(parent), at(flat) % K, jnp.ones((B, beam_size), bool))
    return lax.cond(jnp.all(jnp.sum(kept, axis=-1) >= beam_size), lambda: fast,
                    lambda: _select_pruned(scores, beam_size, tokens_per_beam))


def _select_pruned(scores, beam_size: int, tokens_per_beam: Optional[int]):
    """`select_beams` by a per-beam top-k (when tokens_per_beam < K), then a
    flat top-k over the survivors."""
    B, M, K = scores.shape
    slot = jnp.broadcast_to(lax.iota(jnp.int32, K), scores.shape)
    if tokens_per_beam is not None and tokens_per_beam < K:
        # lax.top_k keeps lower indices first among equal scores: lower token id.
        scores, slot = lax.top_k(scores, tokens_per_beam)
        K = tokens_per_beam
    flat_scores, flat_slot = scores.reshape(B, M * K), slot.reshape(B, M * K)
    if M * K < beam_size:
        pad = ((0, 0), (0, beam_size - M * K))
        flat_scores = jnp.pad(flat_scores, pad, constant_values=SENTINEL_SCORE)
        flat_slot = jnp.pad(flat_slot, pad)
    top, flat = lax.top_k(flat_scores, beam_size)
    real = flat < M * K
    parent = jnp.where(real, flat // K, 0)
    col = jnp.take_along_axis(flat_slot, flat, axis=-1)
    return top, parent, col, real


def beam_step(plan: Plan, tables, state: BeamState, logits, step: int,
              tokens_per_beam: Optional[int] = None,
              live_beams: Optional[int] = None) -> BeamState:
    """One beam-search step at static `step` (0 <= step < plan.max_length).

    logits: float (B, M, V) for the beams of `state` (fed `state.last_tokens`).
    live_beams: static promise that only beams [0, live_beams) of `state`
    can be valid (see `live_beam_bounds`); the others are not expanded, which
    saves their log_softmax, candidates and top-k."""
    B, M = state.node.shape
    check_logits(plan, logits, (B, M), f"beam_step(step={step})")
    if not 0 <= step < plan.max_length:
        raise DecodeInputError(f"beam_step: step={step} is outside [0, {plan.max_length})")
    if live_beams is not None and live_beams < M:
        state = jax.tree_util.tree_map(lambda x: x[:, :live_beams], state)
        logits = logits[:, :live_beams]
    keep = M if tokens_per_beam is None else min(tokens_per_beam, M)
    cand = _candidates(plan, tables, state.node, state.valid, state.finished,
                       LogProbs.of(logits), step, scores=state.scores, keep=keep)
    scores = _scored(cand.valid, cand.logprob, state.scores)
    top, parent, col, real = select_beams(scores, M, tokens_per_beam)
    valid = real & _pick(cand.valid, parent, col)
    return _apply_choice(plan, state, cand, parent, col, top, valid, step)


def switch_over_steps(plan: Plan, step_fn: Callable, step, *operands):
    """``step_fn(t, *operands)`` for a traced int32 scalar `step`: a lax.switch
    over the programs of every static t in [0, plan.max_length) (a step
    outside is clamped), so one exported module serves every step."""
    branches = [functools.partial(step_fn, t) for t in range(plan.max_length)]
    index = jnp.clip(jnp.asarray(step, jnp.int32), 0, plan.max_length - 1)
    return lax.switch(index, branches, *operands)


def beam_step_switch(plan: Plan, tables, state: BeamState, logits, step,
                     tokens_per_beam: Optional[int] = None) -> BeamState:
    """`beam_step` with a traced `step` (see `switch_over_steps`)."""
    return switch_over_steps(plan, functools.partial(_switch_branch, plan, tokens_per_beam),
                             step, tables, state, logits)


def _switch_branch(plan, tokens_per_beam, step, tables, state, logits):
    return beam_step(plan, tables, state, logits, step, tokens_per_beam)


def length_normalized(scores, lengths, length_penalty: float):
    """GNMT length penalty: score / ((5 + length) / 6) ** length_penalty."""
    if not length_penalty:
        return scores
    return scores / ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** length_penalty


def finalize(state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
    """Final result; with a length penalty, beams are re-ranked by the
    normalized score (valid beams first), and `scores` are the normalized ones."""
    if not length_penalty:
        return DecodeResult(state.tokens, state.scores, state.valid, state.lengths)
    normalized = length_normalized(state.scores, state.lengths, length_penalty)
    ranked = jnp.where(state.valid, jnp.maximum(normalized, jnp.float32(MIN_VALID_SCORE)),
                       SENTINEL_SCORE)
    _, order = lax.top_k(ranked, ranked.shape[-1])
    pick = lambda x: _take_beams(x, order)
    return DecodeResult(pick(state.tokens), pick(ranked), pick(state.valid), pick(state.lengths))


def _check_positive(name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DecodeInputError(f"{name}={value!r}: expected an int >= 1")


def _check_int(name: str, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DecodeInputError(f"{name}={value!r}: expected an int")


def _check_finite(name: str, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise DecodeInputError(f"{name}={value!r}: expected a finite float")


def _reorder_carry(carry, parent, B: int, M: int):
    """Reorders every carry leaf whose leading dims are (B, M) by `parent`."""
    def one(x):
        if hasattr(x, "shape") and len(x.shape) >= 2 and tuple(x.shape[:2]) == (B, M):
            return _take_beams(x, parent)
        return x
    return jax.tree_util.tree_map(one, carry)


def candidate_columns(plan: Plan, step: int) -> int:
    """K at `step`: candidates per beam, end-token and carried-over columns included."""
    end = plan.end_token is not None
    if step >= plan.depth:
        return 2
    sp = plan.steps[step]
    return num_candidates(sp, plan.vocab_size) + int(end and sp.has_accepting) + int(end)


def live_beam_bounds(plan: Plan, beam_size: int, tokens_per_beam: Optional[int] = None) -> tuple:
    """Static bound per step on the beams that can be valid in a search from
    `init_beam_state`: 1 at step 0, then at most the previous bound times the
    candidates each beam keeps. Valid beams come first (valid scores are
    floored at MIN_VALID_SCORE > SENTINEL_SCORE), so beams past the bound
    need no work (`beam_step`'s live_beams); it binds at step 1 (tokens_per_beam
    of beam 0) and on small branch factors."""
    bounds, live = [], 1
    for step in range(plan.max_length):
        bounds.append(live)
        kept = candidate_columns(plan, step)
        live = min(beam_size, live * (kept if tokens_per_beam is None else min(kept, tokens_per_beam)))
    return tuple(bounds)


@functools.partial(jax.jit, static_argnames=("plan", "logits_fn", "batch_size", "beam_size",
                                             "tokens_per_beam", "start_token", "length_penalty"))
def _beam_search(plan, tables, carry, *, logits_fn, batch_size, beam_size, tokens_per_beam,
                 start_token, length_penalty):
    state = init_beam_state(plan, batch_size, beam_size, start_token)
    live = live_beam_bounds(plan, beam_size, tokens_per_beam)
    for step in range(plan.max_length):
        logits, carry = logits_fn(state.last_tokens, step, carry)
        state = beam_step(plan, tables, state, logits, step, tokens_per_beam,
                          live_beams=live[step])
        carry = _reorder_carry(carry, state.parent, batch_size, beam_size)
    return finalize(state, length_penalty)


def beam_search(plan: Plan, tables, logits_fn: Callable, *, batch_size: int, beam_size: int,
                tokens_per_beam: Optional[int] = None, start_token: int = 0, carry=None,
                length_penalty: float = 0.0) -> DecodeResult:
    """Constrained beam search (see module doc for the exact semantics).

    Args:
      logits_fn: ``(last_tokens int32 (B, M), step: int, carry) -> (logits
        float (B, M, V), carry)``. Carry leaves whose leading dims are (B, M)
        are reordered along beams after every step.
      tokens_per_beam: expand each beam to at most this many children.
      length_penalty: GNMT exponent for re-ranking the final beams (0: off).
    """
    _check_positive("batch_size", batch_size)
    _check_positive("beam_size", beam_size)
    _check_positive("tokens_per_beam", tokens_per_beam, allow_none=True)
    _check_int("start_token", start_token)
    _check_finite("length_penalty", length_penalty)
    if not callable(logits_fn):
        raise DecodeInputError(f"logits_fn={logits_fn!r}: expected a callable")
    return _beam_search(plan, tables, carry, logits_fn=logits_fn, batch_size=batch_size,
                        beam_size=beam_size, tokens_per_beam=tokens_per_beam,
                        start_token=int(start_token), length_penalty=float(length_penalty))


@functools.partial(jax.jit, static_argnames=("plan", "logits_fn", "batch_size", "temperature",
                                             "top_k", "start_token"))
def _sample(plan, tables, key, carry, *, logits_fn, batch_size, temperature, top_k, start_token):
    state = init_beam_state(plan, batch_size, 1, start_token)
    for step in range(plan.max_length):
        logits, carry = logits_fn(state.last_tokens, step, carry)
        check_logits(plan, logits, (batch_size, 1), f"sample(step={step})")
        cand = _candidates(plan, tables, state.node, state.valid, state.finished,
                           LogProbs.of(logits), step)
        # Shifted by the best valid log-prob first, so the best weight is 0 and
        # a tiny temperature cannot overflow every weight to -inf.
        best = jnp.max(jnp.where(cand.valid, cand.logprob, -jnp.inf), axis=-1, keepdims=True)
        weights = jnp.where(cand.valid, (cand.logprob - best) / temperature, -jnp.inf)
        if top_k is not None and top_k < weights.shape[-1]:
            kth = lax.top_k(weights, top_k)[0][..., -1:]
            weights = jnp.where(weights >= kth, weights, -jnp.inf)
        key, sub = jax.random.split(key)
        # Stays (finished rows) are the only valid candidate there; their weight 0/T is finite.
        col = jax.random.categorical(sub, jnp.where(jnp.isnan(weights), -jnp.inf, weights), axis=-1)
        col = col.astype(jnp.int32)
        valid = jnp.take_along_axis(cand.valid, col[..., None], axis=-1)[..., 0]
        lp = jnp.take_along_axis(cand.logprob, col[..., None], axis=-1)[..., 0]
        parent = jnp.zeros((batch_size, 1), jnp.int32)
        state = _apply_choice(plan, state, cand, parent, col, add_logprob(state.scores, lp), valid,
                              step)
    return finalize(state)


def sample(plan: Plan, tables, logits_fn: Callable, key, *, batch_size: int,
           temperature: float = 1.0, top_k: Optional[int] = None, start_token: int = 0,
           carry=None) -> DecodeResult:
    """Samples one sequence per batch row from the constrained distribution.

    At each step the valid tokens' log-probabilities (log_softmax over the
    full vocabulary) are divided by `temperature`, optionally restricted to
    the `top_k` best, and one is drawn. Scores are the summed (untempered)
    log-probabilities. logits_fn gets last_tokens (B, 1) and returns (B, 1, V).
    Results have a beam axis of size 1."""
    _check_positive("batch_size", batch_size)
    _check_positive("top_k", top_k, allow_none=True)
    _check_int("start_token", start_token)
    _check_finite("temperature", temperature)
    if not temperature > 0:
        raise DecodeInputError(f"temperature={temperature!r}: expected a finite float > 0")
    if temperature < np.finfo(np.float32).tiny:  # XLA flushes float32 subnormals to 0
        raise DecodeInputError(f"temperature={temperature!r}: expected at least "
                               f"{np.finfo(np.float32).tiny} (the smallest normal float32)")
    if not callable(logits_fn):
        raise DecodeInputError(f"logits_fn={logits_fn!r}: expected a callable")
    return _sample(plan, tables, key, carry, logits_fn=logits_fn, batch_size=batch_size,
                   temperature=float(temperature), top_k=top_k, start_token=int(start_token))


def greedy_decode(plan: Plan, tables, logits_fn: Callable, *, batch_size: int,
                  start_token: int = 0, carry=None) -> DecodeResult:
    """The most likely valid token at every step: beam search with one beam."""
    return beam_search(plan, tables, logits_fn, batch_size=batch_size, beam_size=1,
                       start_token=start_token, carry=carry)


# --------------------------------------------------------------------------
# Logits-processor pair for custom loops


def init_processor_state(batch_size: int) -> ProcessorState:
    _check_positive("batch_size", batch_size)
    return ProcessorState(node=jnp.zeros((batch_size,), jnp.int32),
                          valid=jnp.ones((batch_size,), bool),
                          finished=jnp.zeros((batch_size,), bool))


def _check_step(plan: Plan, step, where: str) -> int:
    """Returns `step` as a Python int; it must be an int (Python or numpy) in [0, max_length)."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) \
            or not 0 <= step < plan.max_length:
        raise DecodeInputError(f"{where}: step={step!r} must be an int in "
                               f"[0, {plan.max_length})")
    return int(step)


def mask(plan: Plan, tables, logits, state: ProcessorState, step: int):
    """logits float (B, V) -> float32 (B, V): logits of allowed tokens kept,
    others (and NaN logits) set to SENTINEL_SCORE. A finished row allows only
    the end token; an invalid row allows nothing."""
    step = _check_step(plan, step, "mask")
    B = state.node.shape[0]
    check_logits(plan, logits, (B,), f"mask(step={step})")
    cand = _candidates(plan, tables, state.node, state.valid, state.finished, None, step)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], cand.tokens.shape)
    tokens = jnp.where(cand.stays, 0 if plan.end_token is None else plan.end_token, cand.tokens)
    tokens = jnp.where(cand.valid, tokens, plan.vocab_size)  # out of range: dropped
    allowed = jnp.zeros((B, plan.vocab_size), bool).at[rows, tokens].set(True, mode="drop")
    x = jnp.asarray(logits).astype(jnp.float32)
    return jnp.where(allowed & ~jnp.isnan(x), x, SENTINEL_SCORE)


def advance(plan: Plan, tables, state: ProcessorState, tokens, step: int) -> ProcessorState:
    """Moves each row along its chosen token int (B,); a token that is not
    allowed marks the row invalid."""
    step = _check_step(plan, step, "advance")
    B = state.node.shape[0]
    if tuple(jnp.shape(tokens)) != (B,) or not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise DecodeInputError(f"advance(step={step}): tokens have shape {jnp.shape(tokens)} dtype "
                               f"{jnp.result_type(tokens)}, expected int of shape ({B},)")
    tokens = jnp.asarray(tokens, jnp.int32)
    cand = _candidates(plan, tables, state.node, state.valid, state.finished, None, step)
    end = -2 if plan.end_token is None else plan.end_token
    hit = cand.valid & jnp.where(cand.stays, tokens[:, None] == end, cand.tokens == tokens[:, None])
    ok = jnp.any(hit, axis=-1)
    nxt = jnp.sum(jnp.where(hit & ~cand.ends & ~cand.stays, cand.next, 0), axis=-1)
    finished = ok & jnp.any(hit & (cand.ends | cand.stays), axis=-1)
    return ProcessorState(node=jnp.where(ok & ~finished, nxt, 0).astype(jnp.int32),
                          valid=ok, finished=finished)


def mask_switch(plan: Plan, tables, logits, state: ProcessorState, step):
    """`mask` with a traced `step` (see `switch_over_steps`)."""
    return switch_over_steps(plan, lambda t, *ops: mask(plan, *ops, t), step, tables, logits, state)


def advance_switch(plan: Plan, tables, state: ProcessorState, tokens, step) -> ProcessorState:
    """`advance` with a traced `step` (see `switch_over_steps`)."""
    return switch_over_steps(plan, lambda t, *ops: advance(plan, *ops, t), step, tables, state,
                             tokens)
