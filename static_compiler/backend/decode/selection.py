"""Beam selection: the best `beam_size` candidates of each batch row, with
per-beam pruning to `tokens_per_beam` and deterministic ties (lower parent
beam, then lower slot); `select_listed`, the same selection where a
candidate's validity is costly to read (a ranked subset's liveness): read
only for the best few."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.kernels import take_last
from static_compiler.backend.selection_kernels import first_true, top_k, top_prefix, top_prefix_fits
from static_compiler.support.decode_state import SENTINEL_SCORE


class Selection(NamedTuple):
    """The winners of one step, per batch row (B, beam_size), best first:
    score float32; parent int32 in [0, M'), the beam the winner extends; col
    int32 in [0, K), its candidate column; real bool, False for places beyond
    the M' * K candidates (those have parent 0, col 0 and SENTINEL_SCORE)."""

    score: Any
    parent: Any
    col: Any
    real: Any


def select_beams(scores, beam_size: int, tokens_per_beam: Optional[int] = None) -> Selection:
    """The best `beam_size` candidates of each batch row.

    scores: float32 (B, M', K), invalid candidates at SENTINEL_SCORE. Each
    beam is first pruned to its best `tokens_per_beam` candidates (if set and
    < K); ties go to the lower parent beam, then the lower slot.

    Returns a `Selection` (B, beam_size); places stay unreal only when M' *
    K < beam_size.

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


def _select_checked(scores, beam_size: int, tokens_per_beam: int,
                    list_factor: int = 4) -> Selection:
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
    top, flat = top_k(scores.reshape(B, M * K), R)
    parent = lax.div(flat, jnp.int32(K))  # flat >= 0: no sign fix-up (jnp's // adds kernels)
    # rank[b, r] = entries of the same beam before r (a triangular count, not
    # a cumsum: XLA CPU lowers cumsum to a quadratic reduce-window).
    before = lax.iota(jnp.int32, R)[None, :] < lax.iota(jnp.int32, R)[:, None]
    rank = jnp.sum((parent[:, :, None] == parent[:, None, :]) & before, axis=-1)
    kept = rank < tokens_per_beam
    # Positions of the first beam_size kept entries, in list order (when kept
    # holds that many).
    pos, enough = first_true(kept, beam_size)
    at = lambda x: take_last(x, pos)
    fast = (at(top), at(parent), lax.rem(at(flat), jnp.int32(K)))
    # Every place is real on both paths (M * tokens_per_beam >= beam_size), so
    # `real` stays out of the cond (a constant, not a kernel inside a branch).
    assert M * tokens_per_beam >= beam_size, (M, tokens_per_beam, beam_size)
    picked = lax.cond(jnp.all(enough), lambda: fast,
                      lambda: _select_pruned(scores, beam_size, tokens_per_beam)[:3])
    return Selection(*picked, jnp.ones((B, beam_size), bool))


LIST_FACTORS = (8, 16)
"""`select_listed` reads the liveness of a batch row's best R = f x
beam_size candidates, f the first of these whose list is expected to
hold enough live ones. Measured on the JAX door (batch 3, 70 beams, 10 %
per-row subsets): ~22 % of the depth-2 children are live at 1e7
Semantic IDs (8: ~120 live in a list of 560), ~11 % at 1e6 (16); the
top-k of (3, 143k) random scores (`selection_kernels.top_k`, by group maxima on
CPU) costs ~0.2 ms for 70, ~1.15 ms for 560 (XLA's TopK call: 0.65 and
1.4 ms), ~2.2 ms for 1120, ~7 ms for 2240 (more than reading every
candidate); a threshold's prefix of ~560 (`top_prefix`) 0.43-0.6 ms.
Read when tracing (tests change it)."""

LIST_MARGIN = 1.4
"""A list is tried only when its expected live candidates (its size times
the live fraction of a sample) reach LIST_MARGIN x beam_size in every
row; below, the selection reads every candidate at once (a sparse
subset: no list to pay for). Tests set it to 0 (always the first list)."""

LIST_SPREAD = 4
"""Lists are used only at steps whose candidates outnumber the longest
list LIST_SPREAD times (a dense step's V children a beam): elsewhere a
full read costs about as little, and each list adds to the step's
program (`step.listed_selection`)."""

LIST_TIES = 8
"""`select_listed` lists by `top_k`, not `top_prefix`, when some row's
valid samples hold more than 1 / LIST_TIES as many equal pairs (in sorted
order) as samples: a zeros model's dense step, every child of a beam tied,
would overflow the threshold's prefix, and XLA's TopK is fast on ties
(the top 560 of a tied (3, 143,360): 0.32-0.37 ms)."""

LIST_SAMPLES = 256
"""Candidates per row whose liveness estimates the live fraction (evenly
spaced over the row's flat candidates; the valid ones count)."""


def list_capacity(R: int) -> int:
    """`top_prefix`'s capacity for a list of R: 7/4 R in multiples of 128
    (1,024 for 560: 400-580 entries found at the JAX door's step 1)."""
    return -(-R * 7 // 4 // 128) * 128


def select_listed(scores, beam_size: int, live_at: Callable, fallback: Callable,
                  list_sizes: Optional[tuple] = None) -> tuple[Selection, Any]:
    """`select_beams(where(live, scores, SENTINEL_SCORE), beam_size)` (no
    per-beam pruning) for a liveness `live` read only for each batch row's
    best R candidates (and a sample), or in full where a list would not do.

    scores: float32 (B, M', K), candidates invalid by structure at
    SENTINEL_SCORE; live_at(parent, col) -> bool (B, n): the liveness of
    the candidates (parent, col) int32 (B, n) (read only where valid);
    fallback() -> (score, parent, col) (B, beam_size): `select_beams` over
    the live scores computed in full. list_sizes: the list lengths R to
    choose from, each in [beam_size, M' * K) (default `LIST_FACTORS` x
    beam_size, those below M' * K).
    Returns (the `Selection`, bool scalar: whether a list decided).

    How: the live fraction of `LIST_SAMPLES` valid-or-not candidates per
    row picks the shortest list expected to hold `LIST_MARGIN` x beam_size
    live ones in every row (none: the fallback at once); its candidates'
    liveness is read, and the fallback runs (`lax.cond`: one program, the
    branch taken runs) when some row's list holds fewer than beam_size.
    On rows `top_prefix` fits, a list of R is `top_prefix`'s (capacity
    `list_capacity(R)`: a prefix of the order in index order, about R
    entries, unranked) and its beam_size best live are taken by a top-k;
    unless the sample ties (`LIST_TIES`): then the R best by `top_k`.

    Exact: the list is the first R candidates in the selection's order
    (score desc, parent asc, slot asc: `lax.top_k` keeps lower flat
    indices first among ties). A live valid candidate keeps its score
    and an invalid or dead one drops to SENTINEL_SCORE, so the full
    path's winners are the first beam_size live valid candidates in that
    order; any outside the list comes after every listed one, so when the
    list holds beam_size of them they are the answer, in list order (and
    every place is real: M' * K > R >= beam_size). A threshold's prefix
    decides only when whole (a prefix of that order) and holding
    beam_size live valid ones; in index order, its top-k ranks it in the
    selection's order (ties to the lower flat index)."""
    B, M, K = scores.shape
    N = M * K
    sizes = tuple(f * beam_size for f in LIST_FACTORS if f * beam_size < N) \
        if list_sizes is None else tuple(list_sizes)
    assert sizes and all(beam_size <= R < N for R in sizes), (beam_size, sizes, M, K)
    flat_scores = scores.reshape(B, N)
    # The live fraction of an even sample of each row's candidates.
    S = min(N, LIST_SAMPLES)
    sample = np.arange(S, dtype=np.int64) * N // S
    at_sample = jnp.broadcast_to(jnp.asarray(sample.astype(np.int32)), (B, S))
    sampled = take_last(flat_scores, at_sample)
    valid = sampled > SENTINEL_SCORE
    live = valid & live_at(lax.div(at_sample, jnp.int32(K)), lax.rem(at_sample, jnp.int32(K)))
    valid_n = jnp.sum(valid, axis=-1).astype(jnp.float32)
    live_n = jnp.sum(live, axis=-1).astype(jnp.float32)
    # Which list: the first whose expected live count is enough in every row.
    enough = [jnp.all(live_n * R >= LIST_MARGIN * beam_size * valid_n) for R in sizes]
    choice = sum(jnp.logical_not(e).astype(jnp.int32) for e in enough)
    by_threshold = top_prefix_fits(N)
    if by_threshold:
        # Lists by a threshold, unless the sample shows many ties (a zeros
        # model: the threshold's entries would overflow; `top_k` is fast there).
        # (an integer sort of the sample's bits, 0.02 ms; pairwise equality took 0.07)
        invalid = lax.bitcast_convert_type(jnp.float32(SENTINEL_SCORE), jnp.int32)
        bits = jnp.sort(lax.bitcast_convert_type(sampled, jnp.int32), axis=-1)
        tied = (bits[:, 1:] == bits[:, :-1]) & (bits[:, 1:] != invalid)
        many_tied = jnp.any(jnp.sum(tied, axis=-1) * LIST_TIES > valid_n)

    def best(R: int, capacity: int):
        # The R best by `top_k`, in the selection's order; the rest unreal.
        _, at = top_k(flat_scores, R)
        return (jnp.pad(at, ((0, 0), (0, capacity - R))),
                jnp.broadcast_to(lax.iota(jnp.int32, capacity) < R, (B, capacity)),
                jnp.ones((B,), bool))

    def listed(R: int):
        if by_threshold:
            # A prefix of the selection's order: the threshold's (in index order,
            # about 0.7-1 x R entries), or where the sample ties the R best.
            C = list_capacity(R)
            at, real, whole = lax.cond(many_tied, functools.partial(best, R, C),
                                       lambda: top_prefix(flat_scores, C))
        else:
            at, real, whole = best(R, R)  # (read alone: no padding to the longest to read)
        top = take_last(flat_scores, at)
        parent = lax.div(at, jnp.int32(K))  # at >= 0: no sign fix-up
        col = lax.rem(at, jnp.int32(K))
        ok = real & (top > SENTINEL_SCORE) & live_at(parent, col)
        if by_threshold:
            # Its first beam_size live entries in order (float keys: XLA's fast TopK).
            top, pos = lax.top_k(jnp.where(ok, top, SENTINEL_SCORE), beam_size)
            found = whole & (jnp.sum(ok, axis=-1, dtype=jnp.int32) >= beam_size)
        else:
            # The first beam_size live entries, in list order (when there are that many).
            pos, found = first_true(ok, beam_size)
            top = take_last(top, pos)
        at = lambda x: take_last(x, pos)  # noqa: E731
        return top, at(parent), at(col), jnp.all(found)

    def unlisted():
        none = jnp.zeros((B, beam_size), jnp.int32)
        return (jnp.full((B, beam_size), SENTINEL_SCORE, jnp.float32), none, none,
                jnp.zeros((), bool))

    *picked, decided = lax.switch(choice, [functools.partial(listed, R) for R in sizes]
                                  + [unlisted])
    picked = lax.cond(decided, lambda: tuple(picked), fallback)
    return Selection(*picked, jnp.ones((B, beam_size), bool)), decided  # (every place real)


def _select_pruned(scores, beam_size: int, tokens_per_beam: Optional[int]) -> Selection:
    """`select_beams` by a per-beam top-k (when tokens_per_beam < K), then a
    flat top-k over the survivors."""
    B, M, K = scores.shape
    slot = None  # each survivor's column, when a per-beam top-k reordered them
    if tokens_per_beam is not None and tokens_per_beam < K:
        # lax.top_k keeps lower indices first among equal scores: lower token id.
        scores, slot = lax.top_k(scores, tokens_per_beam)
        K = tokens_per_beam
    flat_scores = scores.reshape(B, M * K)
    if M * K < beam_size:
        flat_scores = jnp.pad(flat_scores, ((0, 0), (0, beam_size - M * K)),
                              constant_values=SENTINEL_SCORE)
    top, flat = top_k(flat_scores, beam_size)
    real = flat < M * K
    # flat >= 0: lax.div / rem need no sign fix-up (jnp's // and % add kernels).
    parent = jnp.where(real, lax.div(flat, jnp.int32(K)), 0)
    col = lax.rem(flat, jnp.int32(K)) if slot is None else \
        take_last(slot.reshape(B, M * K), jnp.minimum(flat, M * K - 1))
    return Selection(top, parent, jnp.where(real, col, 0), real)
