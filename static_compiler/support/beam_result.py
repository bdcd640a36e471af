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
from jax import lax

from static_compiler.support.decode_types import (MIN_VALID_SCORE, SENTINEL_SCORE, BeamState,
                                                  DecodeResult)


def length_normalized(scores, lengths, length_penalty: float):
    """GNMT length penalty: score / ((5 + length) / 6) ** length_penalty."""
    if not length_penalty:
        return scores
    return scores / ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** length_penalty


def _take_beams(x, order):
    """x (B, M, ...) reordered along beams by order int (B, M): one gather."""
    B, M = x.shape[:2]
    flat = lax.broadcasted_iota(jnp.int32, order.shape, 0) * M + jnp.asarray(order, jnp.int32)
    return jnp.take(x.reshape((B * M,) + x.shape[2:]), flat, axis=0, mode="clip")


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


def completed(state: BeamState, depth: int) -> BeamState:
    """`state` with only its complete beams valid: those that took the end
    token (finished) or hold `depth` tokens (a fixed-length set); the others
    get SENTINEL_SCORE. After a search's last step every valid beam is
    complete; a state finalized earlier gives its unfinished prefixes back
    invalid, never as sequences of the set."""
    complete = state.valid & (state.finished | (state.lengths == depth))
    return state._replace(scores=jnp.where(complete, state.scores, SENTINEL_SCORE),
                          valid=complete)


@functools.partial(jax.jit, static_argnames=("depth", "length_penalty"))
def finalize_complete(state: BeamState, depth: int, length_penalty: float = 0.0) -> DecodeResult:
    """A front door's `finalize` as one program: `finalize` of `completed`."""
    return finalize(completed(state, depth), length_penalty)
