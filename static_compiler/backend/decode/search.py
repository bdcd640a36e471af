"""The decoding drivers: beam search, sampling and greedy decoding, each one
jitted program that runs every step over the tables, calling the user's model
for logits and reordering its per-beam carry.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.decode.candidates import candidate_columns, step_candidates
from static_compiler.backend.decode.logprobs import LogProbs, add_logprob
from static_compiler.backend.decode.step import (apply_choice, beam_step, finalize, init_beam_state,
                                                 take_beams)
from static_compiler.backend.lowering import Plan
from static_compiler.decode_state import (DecodeResult, check_callable, check_finite, check_int,
                                          check_logits, check_start_tokens)
from static_compiler.errors import DecodeInputError


def reorder_carry(carry, parent, B: int, M: int):
    """Reorders every carry leaf whose leading dims are (B, M) by `parent`."""
    def one(x):
        if hasattr(x, "shape") and len(x.shape) >= 2 and tuple(x.shape[:2]) == (B, M):
            return take_beams(x, parent)
        return x
    return jax.tree_util.tree_map(one, carry)


def live_beam_bounds(plan: Plan, beam_size: int,
                     tokens_per_beam: Optional[int] = None) -> tuple[int, ...]:
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
                                             "tokens_per_beam", "length_penalty"))
def _beam_search(plan, tables, carry, start_tokens, *, logits_fn, batch_size, beam_size,
                 tokens_per_beam, length_penalty):
    state = init_beam_state(plan, batch_size, beam_size, start_tokens)
    live = live_beam_bounds(plan, beam_size, tokens_per_beam)
    for step in range(plan.max_length):
        logits, carry = logits_fn(state.last_tokens, step, carry)
        state = beam_step(plan, tables, state, logits, step, tokens_per_beam,
                          live_beams=live[step])
        carry = reorder_carry(carry, state.parent, batch_size, beam_size)
    return finalize(state, length_penalty)


def beam_search(plan: Plan, tables, logits_fn: Callable, *, batch_size: int, beam_size: int,
                tokens_per_beam: Optional[int] = None, start_token=0, carry=None,
                length_penalty: float = 0.0) -> DecodeResult:
    """Constrained beam search (see module doc for the exact semantics).

    Args:
      logits_fn: ``(last_tokens int32 (B, M), step: int, carry) -> (logits
        float (B, M, V), carry)``. Carry leaves whose leading dims are (B, M)
        are reordered along beams after every step.
      tokens_per_beam: expand each beam to at most this many children.
      start_token: the model's input at step 0: an int, or ints (B,) one per row.
      length_penalty: GNMT exponent for re-ranking the final beams (0: off).
    """
    check_int("batch_size", batch_size, low=1)
    check_int("beam_size", beam_size, low=1)
    check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
    start_tokens = check_start_tokens(start_token, batch_size, "beam_search")
    length_penalty = check_finite("length_penalty", length_penalty)
    check_callable("logits_fn", logits_fn)
    return _beam_search(plan, tables, carry, start_tokens, logits_fn=logits_fn,
                        batch_size=int(batch_size), beam_size=int(beam_size),
                        tokens_per_beam=None if tokens_per_beam is None else int(tokens_per_beam),
                        length_penalty=length_penalty)


@functools.partial(jax.jit, static_argnames=("plan", "logits_fn", "batch_size", "temperature",
                                             "top_k"))
def _sample(plan, tables, key, carry, start_tokens, *, logits_fn, batch_size, temperature, top_k):
    state = init_beam_state(plan, batch_size, 1, start_tokens)
    for step in range(plan.max_length):
        logits, carry = logits_fn(state.last_tokens, step, carry)
        check_logits(logits, (batch_size, 1), plan.vocab_size, f"sample(step={step})")
        cand = step_candidates(plan, tables, state.node, state.valid, state.finished,
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
        state = apply_choice(plan, state, cand, parent, col, add_logprob(state.scores, lp), valid,
                             step)
    return finalize(state)


def sample(plan: Plan, tables, logits_fn: Callable, key, *, batch_size: int,
           temperature: float = 1.0, top_k: Optional[int] = None, start_token=0,
           carry=None) -> DecodeResult:
    """Samples one sequence per batch row from the constrained distribution.

    At each step the valid tokens' log-probabilities (log_softmax over the
    full vocabulary) are divided by `temperature`, optionally restricted to
    the `top_k` best, and one is drawn. Scores are the summed (untempered)
    log-probabilities. logits_fn gets last_tokens (B, 1) and returns (B, 1, V).
    Results have a beam axis of size 1."""
    check_int("batch_size", batch_size, low=1)
    top_k = check_int("top_k", top_k, low=1, allow_none=True)
    start_tokens = check_start_tokens(start_token, batch_size, "sample")
    temperature = check_finite("temperature", temperature)
    if not temperature > 0:
        raise DecodeInputError(f"temperature={temperature!r}: expected a finite float > 0")
    if temperature < np.finfo(np.float32).tiny:  # XLA flushes float32 subnormals to 0
        raise DecodeInputError(f"temperature={temperature!r}: expected at least "
                               f"{np.finfo(np.float32).tiny} (the smallest normal float32)")
    check_callable("logits_fn", logits_fn)
    return _sample(plan, tables, key, carry, start_tokens, logits_fn=logits_fn,
                   batch_size=int(batch_size), temperature=temperature, top_k=top_k)


def greedy_decode(plan: Plan, tables, logits_fn: Callable, *, batch_size: int,
                  start_token=0, carry=None) -> DecodeResult:
    """The most likely valid token at every step: beam search with one beam."""
    return beam_search(plan, tables, logits_fn, batch_size=batch_size, beam_size=1,
                       start_token=start_token, carry=carry)
