"""Log-probabilities that never turn into NaN, and the scores built from them.

Scores are ``log_softmax`` of the logits over the full vocabulary: a NaN logit
is an invalid token, +inf logits share all the probability, tokens whose
log-probability is -inf are invalid, and a valid score is never below
`MIN_VALID_SCORE` (so valid beams always rank above invalid ones).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from static_compiler.backend.kernels import take_last, take_rows
from static_compiler.support.decode_state import MIN_VALID_SCORE, SENTINEL_SCORE


def _posinf_rows(x, posinf):
    """In rows holding +inf logits (posinf bool (..., 1)), +inf -> 0 and
    everything else -> -inf: the +inf tokens share all the probability."""
    return jnp.where(posinf, jnp.where(x == jnp.inf, 0.0, -jnp.inf), x)


ROW_FOLD_LEAF = 16
"""`row_max` / `row_any` combine halves down to blocks of this many entries."""


def _row_fold(x, op, reduce):
    """``reduce(x, axis=-1, keepdims=True)`` for an op whose result does not
    depend on the order (max of floats without NaN, or): `op` of the two
    halves of the row's blocks of ROW_FOLD_LEAF entries until one block is
    left, then one reduce over it (and the entries past the last block).

    Why: XLA's algebraic simplifier turns elementwise ops on a broadcast
    constant into a broadcast, but not a max / or reduce over part of its
    axes, which its constant folder then evaluates entry by entry (~1 us
    each). A model whose logits are constant (a trivial or test model) made
    XLA spend ~0.3 s per step program folding each (B, M, V) reduction (B =
    2, M = 70, V = 2048); folded this way it is one block per row. The
    result is the reduce's (max and or are exact), and on CPU LogProbs.of
    runs faster this way (~220 vs ~300 us at that shape)."""
    V = x.shape[-1]
    n = V // ROW_FOLD_LEAF
    if n < 2:
        return reduce(x, axis=-1, keepdims=True)
    part = lambda a, start, stop, axis: lax.slice_in_dim(a, start, stop, axis=axis)
    y = part(x, 0, n * ROW_FOLD_LEAF, -1).reshape(x.shape[:-1] + (n, ROW_FOLD_LEAF))
    while n > 1:
        half = n // 2
        top = op(part(y, 0, half, -2), part(y, half, 2 * half, -2))
        y = top if n % 2 == 0 else lax.concatenate([top, part(y, 2 * half, n, -2)], y.ndim - 2)
        n = y.shape[-2]
    y = y.reshape(x.shape[:-1] + (ROW_FOLD_LEAF,))
    if V % ROW_FOLD_LEAF:
        y = lax.concatenate([y, part(x, V - V % ROW_FOLD_LEAF, V, -1)], y.ndim - 1)
    return reduce(y, axis=-1, keepdims=True)


def row_max(x):
    """float (..., 1): the max over the last axis of x (no NaN in x)."""
    return _row_fold(x, jnp.maximum, jnp.max)


def row_any(x):
    """bool (..., 1): any over the last axis of x."""
    return _row_fold(x, jnp.logical_or, jnp.any)


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
        # The barrier keeps XLA from evaluating the log-softmax of constant
        # logits (a trivial model) at compile time: its constant folder's
        # exp / log round apart from the compiled kernels', so the same
        # logits passed as an argument (a served module) gave other bits.
        x = lax.optimization_barrier(jnp.asarray(logits).astype(jnp.float32))
        x = jnp.where(jnp.isnan(x), -jnp.inf, x)
        posinf = row_any(x == jnp.inf)
        shifted = _posinf_rows(x, posinf)
        # Three reductions as written (the max and any folded, `_row_fold`):
        # a fused max / sum variant, or the max taken from x before the shift,
        # rounded the sum differently inside the exported lax.switch step
        # than under jit (tests/serving/test_loader.py checks the two are
        # bit-identical).
        m = row_max(shifted)
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
        return self._normalize(take_last(self.logits, tokens))

    def take_beams(self, beams, tokens):
        """float32 (B, H, K): log-probabilities of tokens int32 (B, H, K) in
        the rows `beams` int32 (B, H) of logits (B, M, V)."""
        B, M, V = self.logits.shape
        flat = (beams[..., None] * V + tokens).reshape(B, -1)
        x = take_last(self.logits.reshape(B, M * V), flat).reshape(tokens.shape)
        rows = lambda a: take_rows(a, beams)
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


def scored(valid, lp, scores):
    """float32 (B, M', K): a candidate's beam-search score (its beam's score
    float32 (B, M') plus its log-prob lp float32 (B, M', K)), SENTINEL_SCORE
    where not valid (bool (B, M', K))."""
    return jnp.where(valid, add_logprob(scores[..., None], lp), SENTINEL_SCORE)
