"""Item priors in a beam search: each candidate ranked with the best
weighted prior among the live items below its next state (the look-ahead
of `static_compiler.live.priors`), one gather per step.

A candidate's rank is ``max(score + term, MIN_VALID_SCORE)``, term =
``best[offset(t) + next]`` (-inf where no live item lies below, which then
ranks it after every other valid candidate); invalid candidates keep
SENTINEL_SCORE. The beams keep their summed log-probabilities, and the last
step keeps the rank: at the last depth a state is one item, so the final
score is its log-probability plus weight x prior.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from static_compiler.errors import DecodeInputError
from static_compiler.support.decode_state import MIN_VALID_SCORE, SENTINEL_SCORE
from static_compiler.target.plan import Plan, prior_offsets, state_counts


class LivePrior(NamedTuple):
    """A `live.priors.Prior` on the device: best float32 (S,), its depths
    laid out one after the other (`target.plan.prior_offsets`)."""

    best: Any


def ranked(plan: Plan, prior: LivePrior, step, base, nxt):
    """float32 (B, M', K): the candidates' ranks from their scores `base`
    (float32 (B, M', K), SENTINEL_SCORE where invalid: `logprobs.scored`)
    and next states nxt int32 (B, M', K) at `step` (an int or a traced
    int32 scalar)."""
    offset = jnp.asarray(prior_offsets(plan), jnp.int32)[jnp.asarray(step, jnp.int32)]
    term = jnp.take(prior.best, jnp.maximum(nxt, 0) + offset, mode="clip")
    rank = jnp.maximum(base + term, MIN_VALID_SCORE)
    return jnp.where(base > SENTINEL_SCORE, rank, SENTINEL_SCORE).astype(jnp.float32)


def check_live_prior(plan: Plan, prior, length_penalty: float) -> None:
    """DecodeInputError unless `prior` is None or a `LivePrior` of this
    plan's shape, on a fixed-length set, without a length penalty."""
    if prior is None:
        return
    if not isinstance(prior, LivePrior):
        raise DecodeInputError(f"prior={repr(prior)[:60]}: expected a Prior "
                               "(made by the set's prior(column, weight))")
    if plan.end_token is not None:
        raise DecodeInputError("prior: item priors need a fixed-length set (this one has an end "
                               f"token, {plan.end_token})")
    want = sum(state_counts(plan)[1:])
    if tuple(prior.best.shape) != (want,) or prior.best.dtype != jnp.float32:
        raise DecodeInputError(f"prior: best has shape {tuple(prior.best.shape)} dtype "
                               f"{prior.best.dtype}, expected float32 ({want},): a prior of "
                               "another set")
    if length_penalty:
        raise DecodeInputError(f"prior with length_penalty={length_penalty}: a fixed-length "
                               "set's beams are all as long; pass one or the other")


def kept_scores(plan: Plan, step, top, base_picked):
    """float32 (B, M): what the new beams keep: their log-probabilities
    (`base_picked`), but at the last step their ranks (`top`)."""
    last = jnp.asarray(step, jnp.int32) == plan.max_length - 1
    return jnp.where(last, top, base_picked)
