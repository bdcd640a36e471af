"""Item priors in a beam search: each candidate ranked with the best
weighted prior among the live items below its next state (the look-ahead
of `static_compiler.rules.priors`), one gather per step.

A candidate's rank is ``max(score + term, MIN_VALID_SCORE)``, term =
``best[offset(t) + next]`` (for items outside the prior's selection a
constant below every live term, `rules.priors.outside_term`, so they rank
after the live ones and by the model among themselves); with an end token, the end
token's candidate reads its state's own item's term and a finished beam
carried over adds none. Invalid candidates keep SENTINEL_SCORE. The beams
keep their summed log-probabilities until they are complete (the last
step, or the end token), then their rank: the term there is the item's
own, so the final score is its log-probability plus weight x prior.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from static_compiler.errors import DecodeInputError
from static_compiler.lowered.plan import Plan, prior_offsets, prior_size
from static_compiler.rules.priors import check_no_length_penalty
from static_compiler.support.decode_state import MIN_VALID_SCORE, SENTINEL_SCORE


class LivePrior(NamedTuple):
    """A `rules.priors.Prior` on the device: best float32 (S,), laid out as
    `lowered.plan.prior_offsets` says."""

    best: Any


def ranked(plan: Plan, prior: LivePrior, step, base, cand, node):
    """float32 (B, M', K): the candidates' ranks from their scores `base`
    (float32 (B, M', K), SENTINEL_SCORE where invalid: `logprobs.scored`),
    their `StepCandidates` cand (next states; with an end token, which end
    and which carry a finished beam over) and the beams' states node int32
    (B, M') at `step` (an int or a traced int32 scalar): a child reads the
    best term below its next state, the end token its state's own item's,
    a carried-over beam none (its score is its rank already)."""
    children, own = prior_offsets(plan)
    step = jnp.asarray(step, jnp.int32)
    term = jnp.take(prior.best, jnp.maximum(cand.next, 0) + jnp.asarray(children, jnp.int32)[step],
                    mode="clip")
    if own is not None:
        ended = jnp.take(prior.best, jnp.maximum(node, 0) + jnp.asarray(own, jnp.int32)[step],
                         mode="clip")[..., None]
        term = jnp.where(cand.ends, ended, jnp.where(cand.stays, 0.0, term))
    rank = jnp.maximum(base + term, MIN_VALID_SCORE)
    return jnp.where(base > SENTINEL_SCORE, rank, SENTINEL_SCORE).astype(jnp.float32)


def check_live_prior(plan: Plan, prior, length_penalty: float) -> None:
    """DecodeInputError unless `prior` is None or a `LivePrior` of this
    plan's shape, without a length penalty."""
    if prior is None:
        return
    if not isinstance(prior, LivePrior):
        raise DecodeInputError(f"prior={repr(prior)[:60]}: expected a Prior "
                               "(made by the set's prior(column, weight))")
    want = prior_size(plan)
    if tuple(prior.best.shape) != (want,) or prior.best.dtype != jnp.float32:
        raise DecodeInputError(f"prior: best has shape {tuple(prior.best.shape)} dtype "
                               f"{prior.best.dtype}, expected float32 ({want},): a prior of "
                               "another set")
    check_no_length_penalty(prior, length_penalty)


def kept_scores(plan: Plan, step, top, base_picked, done_picked):
    """float32 (B, M): what the new beams keep: their log-probabilities
    (`base_picked`), but their ranks (`top`) once complete: at the last
    step, or where they took the end token or were carried over finished
    (`done_picked` bool (B, M))."""
    last = jnp.asarray(step, jnp.int32) == plan.max_length - 1
    return jnp.where(last | done_picked, top, base_picked)
