"""A beam search's result from its last state: only complete sequences are
valid, and with a length penalty the beams are re-ranked. One definition for
the JAX decoder (`backend.decode`, inside its compiled search) and both JAX
front doors' `finalize` (the compiled set's and the served artifact's); the
torch backend's `torch_backend.beam.finalize` is its twin in torch ops.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.errors import DecodeInputError
from static_compiler.support.decode_types import MIN_VALID_SCORE, SENTINEL_SCORE, BeamState, DecodeResult


def length_normalized(scores, lengths, length_penalty):
    """GNMT length penalty: score / ((5 + length) / 6) ** length_penalty
    (a Python 0 returns the scores as they are)."""
    if isinstance(length_penalty, (int, float)) and not length_penalty:
        return scores
    return scores / ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** length_penalty


def _take_beams(x, order):
    """x (B, M, ...) reordered along beams by order int (B, M): one gather."""
    B, M = x.shape[:2]
    flat = lax.broadcasted_iota(jnp.int32, order.shape, 0) * M + jnp.asarray(order, jnp.int32)
    return jnp.take(x.reshape((B * M,) + x.shape[2:]), flat, axis=0, mode="clip")


def _reranked(state: BeamState, length_penalty) -> DecodeResult:
    normalized = length_normalized(state.scores, state.lengths, length_penalty)
    ranked = jnp.where(state.valid, jnp.maximum(normalized, jnp.float32(MIN_VALID_SCORE)),
                       SENTINEL_SCORE)
    _, order = lax.top_k(ranked, ranked.shape[-1])
    pick = lambda x: _take_beams(x, order)
    return DecodeResult(pick(state.tokens), pick(ranked), pick(state.valid), pick(state.lengths))


def penalty_value(length_penalty: float):
    """A checked length penalty as the decoders' traced argument: float32,
    so that every value runs one program (a Python float would be a static
    value, one program each)."""
    if abs(length_penalty) > np.finfo(np.float32).max:
        raise DecodeInputError(f"length_penalty={length_penalty!r}: expected a finite float32 "
                               f"(|length_penalty| <= {float(np.finfo(np.float32).max):.4g})")
    return np.float32(length_penalty)


def finalize(state: BeamState, length_penalty=0.0) -> DecodeResult:
    """Final result; with a length penalty, beams are re-ranked by the
    normalized score (valid beams first), and `scores` are the normalized ones.
    length_penalty: a Python number (0: no re-ranking, nothing traced) or
    a traced float32 scalar (one program for every value: both are
    computed, (B, M) each, and a select keeps the beams as they are at 0;
    no conditional, which a GPU would read back on the host)."""
    if isinstance(length_penalty, (int, float)):
        return (_reranked if length_penalty else _as_is)(state, length_penalty)
    off = jnp.asarray(length_penalty) == 0
    return DecodeResult(*(jnp.where(off, a, b) for a, b in
                          zip(_as_is(state, 0), _reranked(state, length_penalty))))


def _as_is(state: BeamState, length_penalty) -> DecodeResult:  # noqa: ARG001 (as _penalised)
    return DecodeResult(state.tokens, state.scores, state.valid, state.lengths)


def completed(state: BeamState, depth: int) -> BeamState:
    """`state` with only its complete beams valid: those that took the end
    token (finished) or hold `depth` tokens (a fixed-length set); the others
    get SENTINEL_SCORE. After a search's last step every valid beam is
    complete; a state finalized earlier gives its unfinished prefixes back
    invalid, never as sequences of the set."""
    complete = state.valid & (state.finished | (state.lengths == depth))
    return state._replace(scores=jnp.where(complete, state.scores, SENTINEL_SCORE),
                          valid=complete)


@functools.partial(jax.jit, static_argnames=("depth",))
def _finalize_complete(state: BeamState, length_penalty, depth: int) -> DecodeResult:
    return finalize(completed(state, depth), length_penalty)


def finalize_complete(state: BeamState, depth: int, length_penalty: float = 0.0) -> DecodeResult:
    """A front door's `finalize` as one program: `finalize` of `completed`,
    the length penalty traced (`penalty_value`: one program for every
    value, per state shape)."""
    return _finalize_complete(state, penalty_value(length_penalty), depth=depth)
