"""The logits-processor pair for custom decoding loops: `mask` keeps the
logits of the tokens each row may take next, `advance` moves each row along
the token it took. One row per sequence (no beams): the engine that calls them
owns the search.
"""

from __future__ import annotations

import jax.numpy as jnp

from static_compiler.backend.decode.candidates import step_candidates
from static_compiler.backend.decode.step import switch_over_steps
from static_compiler.backend.lowering import Plan
from static_compiler.decode_state import (SENTINEL_SCORE, ProcessorState, check_int, check_logits,
                                          check_step, check_tokens)


def init_processor_state(batch_size: int) -> ProcessorState:
    """Every row at the root, valid, not finished."""
    batch_size = check_int("batch_size", batch_size, low=1)
    return ProcessorState(node=jnp.zeros((batch_size,), jnp.int32),
                          valid=jnp.ones((batch_size,), bool),
                          finished=jnp.zeros((batch_size,), bool))


def mask(plan: Plan, tables, logits, state: ProcessorState, step):
    """logits float (B, V) -> float32 (B, V): logits of allowed tokens kept,
    others (and NaN logits) set to SENTINEL_SCORE. A finished row allows only
    the end token; an invalid row allows nothing. step: an int in [0,
    max_length), or a traced int32 scalar (`mask_switch`; clamped)."""
    step = check_step(step, plan.max_length, "mask", traced=True)
    if not isinstance(step, int):
        return mask_switch(plan, tables, logits, state, step)
    B = state.node.shape[0]
    check_logits(logits, (B,), plan.vocab_size, f"mask(step={step})")
    cand = step_candidates(plan, tables, state.node, state.valid, state.finished, None, step)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], cand.tokens.shape)
    tokens = jnp.where(cand.stays, 0 if plan.end_token is None else plan.end_token, cand.tokens)
    tokens = jnp.where(cand.valid, tokens, plan.vocab_size)  # out of range: dropped
    allowed = jnp.zeros((B, plan.vocab_size), bool).at[rows, tokens].set(True, mode="drop")
    x = jnp.asarray(logits).astype(jnp.float32)
    return jnp.where(allowed & ~jnp.isnan(x), x, SENTINEL_SCORE)


def advance(plan: Plan, tables, state: ProcessorState, tokens, step) -> ProcessorState:
    """Moves each row along its chosen token int (B,); a token that is not
    allowed marks the row invalid. step: an int in [0, max_length), or a
    traced int32 scalar (`advance_switch`; clamped)."""
    step = check_step(step, plan.max_length, "advance", traced=True)
    if not isinstance(step, int):
        return advance_switch(plan, tables, state, tokens, step)
    B = state.node.shape[0]
    check_tokens(tokens, B, f"advance(step={step})")
    tokens = jnp.asarray(tokens, jnp.int32)
    cand = step_candidates(plan, tables, state.node, state.valid, state.finished, None, step)
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
