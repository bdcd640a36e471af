"""A stateless mask from prefixes, for engines that own the beam search (vLLM,
Hugging Face ``generate``): they reorder, fork and drop beams themselves, so
the constraint reads each row's tokens so far instead of a per-row state
kept in step with the engine's beams.

``allowed(plan, tables, prefixes)`` replays the logits-processor pair
(`init_processor_state`, then `advance` over the t static steps, then `mask`
at step t): one program per prefix length t, O(t) gathers per row, no host
round trip. `padded_prefix_mask` is the same mask from prefixes padded to
max_length with the length traced: one program for every t (per row count),
what the Hugging Face processor runs so that a generate call compiles once,
not once per step. Semantics (those of the pair, so a prefix allows what a
processor row that took these tokens allows):

* a prefix of some item allows the tokens that extend it towards an item,
  and the end token where it is itself a complete item of a variable-length
  set;
* a prefix holding the end token is a finished item: it allows exactly the
  end token, as long as everything after the first end token is the end
  token again (an engine that pads finished rows with the end token, as
  Hugging Face does with GPT-2's ``pad_token_id = eos_token_id``, keeps them
  valid, and a finished row is never all-False, which would make sampling
  divide by zero);
* any other prefix (not in the set, a token after the end token that is not
  the end token) allows nothing: an all-False row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler.backend.decode.live import check_live_mask
from static_compiler.backend.decode.processor import (
    advance,
    advance_switch,
    init_processor_state,
    mask,
    mask_switch,
)
from static_compiler.lowered.plan import Plan
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    check_prefixes,
    check_token_values,
    int32_within,
)


def allowed(plan: Plan, tables, prefixes, subset=None):
    """prefixes int (N, t), t static in [0, plan.max_length) (t = 0: the
    root) -> bool (N, V): True for the tokens that may follow each prefix
    (see the module docstring for finished and unknown prefixes). Jit-able
    (one program per t); concrete prefixes are checked: a token outside
    [0, V) raises DecodeInputError (traced ones are not: such a row allows
    nothing). subset: a `LiveMask` with one subset row per prefix row (only
    tokens towards that subset's items), or None."""
    check_prefixes(prefixes, plan.max_length, "allowed")
    if not isinstance(prefixes, jax.core.Tracer):
        check_token_values("prefixes", np.asarray(prefixes), plan.vocab_size, "allowed")
    check_live_mask(plan, subset, np.shape(prefixes)[0], "allowed")
    return prefix_mask(plan, tables, prefixes, subset)


def prefix_mask(plan: Plan, tables, prefixes, subset=None):
    """`allowed` without the checks: for callers that have checked the shape
    already and want any token outside [0, V) (a model's larger vocabulary, a
    padding id) to make its row allow nothing rather than raise."""
    prefixes = jnp.asarray(int32_within(prefixes, plan.vocab_size))  # before the cast: no wrap
    n, t = prefixes.shape
    if n == 0:
        return jnp.zeros((0, plan.vocab_size), bool)
    state = init_processor_state(n)
    for step in range(t):
        state = advance(plan, tables, state, prefixes[:, step], step, subset)
    kept = mask(plan, tables, jnp.zeros((n, plan.vocab_size), jnp.float32), state, t, subset)
    return kept != SENTINEL_SCORE


def padded_prefix_mask(plan: Plan, tables, prefixes, length, subset=None):
    """`prefix_mask` of ``prefixes[:, :length]`` with `length` traced:
    prefixes int32 (N, plan.max_length) (the columns from `length` on are
    padding and never read), length an int32 scalar in [0, max_length) ->
    bool (N, V), bit for bit `prefix_mask` at that length. Jit-able as one
    program for every length (per N and subset shape): a `fori_loop` of
    `advance_switch` over the first `length` columns, then `mask_switch` at
    `length` (each a switch over the plan's step groups), so the program's
    size and its compile time do not grow with the length either. No checks
    (the caller checks the shape and that length < max_length; a token
    outside [0, V) makes its row allow nothing)."""
    prefixes = jnp.asarray(int32_within(prefixes, plan.vocab_size))
    n = prefixes.shape[0]
    if n == 0:
        return jnp.zeros((0, plan.vocab_size), bool)
    length = jnp.asarray(length, jnp.int32)

    def step(t, state):
        tokens = jax.lax.dynamic_index_in_dim(prefixes, t, axis=1, keepdims=False)
        return advance_switch(plan, tables, state, tokens, t, subset)

    state = jax.lax.fori_loop(0, length, step, init_processor_state(n))
    kept = mask_switch(plan, tables, jnp.zeros((n, plan.vocab_size), jnp.float32), state, length,
                       subset)
    return kept != SENTINEL_SCORE
