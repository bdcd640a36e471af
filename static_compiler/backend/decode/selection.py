"""Beam selection: the best `beam_size` candidates of each batch row, with
per-beam pruning to `tokens_per_beam` and deterministic ties (lower parent
beam, then lower slot)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
from jax import lax

from static_compiler.backend.kernels import take_last
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
    top, flat = lax.top_k(scores.reshape(B, M * K), R)
    parent = lax.div(flat, jnp.int32(K))  # flat >= 0: no sign fix-up (jnp's // adds kernels)
    # rank[b, r] = entries of the same beam before r (a triangular count, not
    # a cumsum: XLA CPU lowers cumsum to a quadratic reduce-window).
    before = lax.iota(jnp.int32, R)[None, :] < lax.iota(jnp.int32, R)[:, None]
    rank = jnp.sum((parent[:, :, None] == parent[:, None, :]) & before, axis=-1)
    kept = rank < tokens_per_beam
    # Positions of the first beam_size kept entries, in list order; the last
    # of them is an unkept one (-R) exactly when fewer than beam_size are kept.
    order, pos = lax.top_k(jnp.where(kept, -lax.iota(jnp.int32, R), -R), beam_size)
    at = lambda x: take_last(x, pos)
    fast = (at(top), at(parent), lax.rem(at(flat), jnp.int32(K)))
    # Every place is real on both paths (M * tokens_per_beam >= beam_size), so
    # `real` stays out of the cond (a constant, not a kernel inside a branch).
    assert M * tokens_per_beam >= beam_size, (M, tokens_per_beam, beam_size)
    picked = lax.cond(jnp.all(order[:, -1] > -R), lambda: fast,
                      lambda: _select_pruned(scores, beam_size, tokens_per_beam)[:3])
    return Selection(*picked, jnp.ones((B, beam_size), bool))


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
    top, flat = lax.top_k(flat_scores, beam_size)
    real = flat < M * K
    # flat >= 0: lax.div / rem need no sign fix-up (jnp's // and % add kernels).
    parent = jnp.where(real, lax.div(flat, jnp.int32(K)), 0)
    col = lax.rem(flat, jnp.int32(K)) if slot is None else \
        take_last(slot.reshape(B, M * K), jnp.minimum(flat, M * K - 1))
    return Selection(top, parent, jnp.where(real, col, 0), real)
