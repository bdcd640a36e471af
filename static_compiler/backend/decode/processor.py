"""The logits-processor pair for custom decoding loops: `mask` keeps the
logits of the tokens each row may take next, `advance` moves each row along
the token it took. One row per sequence (no beams): the engine that calls them
owns the search.
"""

from __future__ import annotations

import jax.numpy as jnp

from static_compiler.backend.decode.candidates import step_candidates
from static_compiler.backend.decode.live import check_live_mask
from static_compiler.backend.decode.step import step_in_range, switch_over_groups
from static_compiler.backend.lowering import Plan
from static_compiler.decode_state import (SENTINEL_SCORE, ProcessorState, check_int, check_logits,
                                          check_step, check_tokens)


def init_processor_state(batch_size: int) -> ProcessorState:
    """Every row at the root, valid, not finished."""
    batch_size = check_int("batch_size", batch_size, low=1)
    return ProcessorState(node=jnp.zeros((batch_size,), jnp.int32),
                          valid=jnp.ones((batch_size,), bool),
                          finished=jnp.zeros((batch_size,), bool))


def _checked_valid(plan: Plan, state: ProcessorState, step: int):
    """state.valid, and False where a row's state id is not a state at depth
    `step` (a state from another compiled set, or a tampered one): gathers
    clamp ids, so such a row would otherwise read some other state's children
    and stay valid on sequences outside the set."""
    count = plan.steps[step].num_states if step < plan.depth else plan.steps[-1].num_next_states
    node = jnp.asarray(state.node)
    return state.valid & (node >= 0) & (node < count)


def mask(plan: Plan, tables, logits, state: ProcessorState, step, subset=None):
    """logits float (B, V) -> float32 (B, V): logits of allowed tokens kept,
    others (and NaN logits) set to SENTINEL_SCORE. A finished row allows only
    the end token; an invalid row allows nothing. step: an int in [0,
    max_length), or a traced int32 scalar (`mask_switch`: past the end,
    finished rows allow only the end token and others nothing).
    subset: a `LiveMask` (each row allows only tokens towards its subset's
    items), or None."""
    step = check_step(step, plan.max_length, "mask", traced=True)
    B = state.node.shape[0]
    check_live_mask(plan, subset, B, "mask")
    if not isinstance(step, int):
        return mask_switch(plan, tables, logits, state, step, subset)
    check_logits(logits, (B,), plan.vocab_size, f"mask(step={step})")
    return _mask_at(plan, tables, logits, state, step, subset)


def _mask_at(plan: Plan, tables, logits, state: ProcessorState, step: int, subset=None):
    """`mask` at a static step, on checked arguments (`tables[step]` and
    the subset's bits at `step` may be a group's views: `switch_over_groups`)."""
    B = state.node.shape[0]
    cand = step_candidates(plan, tables, state.node, _checked_valid(plan, state, step),
                           state.finished, None, step, subset=subset)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], cand.tokens.shape)
    tokens = jnp.where(cand.stays, 0 if plan.end_token is None else plan.end_token, cand.tokens)
    tokens = jnp.where(cand.valid, tokens, plan.vocab_size)  # out of range: dropped
    allowed = jnp.zeros((B, plan.vocab_size), bool).at[rows, tokens].set(True, mode="drop")
    x = jnp.asarray(logits).astype(jnp.float32)
    return jnp.where(allowed & ~jnp.isnan(x), x, SENTINEL_SCORE)


def advance(plan: Plan, tables, state: ProcessorState, tokens, step,
            subset=None) -> ProcessorState:
    """Moves each row along its chosen token int (B,); a token that is not
    allowed (by the set, or by the row's `subset` as in `mask`) marks the row
    invalid. step: an int in [0, max_length), or a traced int32 scalar
    (`advance_switch`: past the end, a finished row stays finished on the
    end token and every other row becomes invalid)."""
    step = check_step(step, plan.max_length, "advance", traced=True)
    B = state.node.shape[0]
    check_live_mask(plan, subset, B, "advance")
    if not isinstance(step, int):
        return advance_switch(plan, tables, state, tokens, step, subset)
    check_tokens(tokens, B, f"advance(step={step})")
    return _advance_at(plan, tables, state, tokens, step, subset)


def _advance_at(plan: Plan, tables, state: ProcessorState, tokens, step: int,
                subset=None) -> ProcessorState:
    """`advance` at a static step, on checked arguments (see `_mask_at`)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    cand = step_candidates(plan, tables, state.node, _checked_valid(plan, state, step),
                           state.finished, None, step, subset=subset)
    end = -2 if plan.end_token is None else plan.end_token
    hit = cand.valid & jnp.where(cand.stays, tokens[:, None] == end, cand.tokens == tokens[:, None])
    ok = jnp.any(hit, axis=-1)
    nxt = jnp.sum(jnp.where(hit & ~cand.ends & ~cand.stays, cand.next, 0), axis=-1)
    finished = ok & jnp.any(hit & (cand.ends | cand.stays), axis=-1)
    return ProcessorState(node=jnp.where(ok & ~finished, nxt, 0).astype(jnp.int32),
                          valid=ok, finished=finished)


def mask_switch(plan: Plan, tables, logits, state: ProcessorState, step, subset=None):
    """`mask` with a traced `step` (see `switch_over_groups`); outside [0,
    max_length) nothing can be appended: finished rows allow only the end
    token, other rows nothing."""
    check_step(step, plan.max_length, "mask", traced=True)
    check_live_mask(plan, subset, state.node.shape[0], "mask")
    check_logits(logits, (state.node.shape[0],), plan.vocab_size, "mask(step=<traced>)")
    masked = switch_over_groups(
        plan, lambda t, tabs, sub, x, st: _mask_at(plan, tabs, x, st, t, sub),
        step, tables, subset, logits, state)
    x = jnp.asarray(logits).astype(jnp.float32)
    end_only = jnp.arange(plan.vocab_size) == (-1 if plan.end_token is None else plan.end_token)
    done = (state.valid & state.finished)[:, None] & end_only & ~jnp.isnan(x)
    return jnp.where(step_in_range(plan, step), masked, jnp.where(done, x, SENTINEL_SCORE))


def advance_switch(plan: Plan, tables, state: ProcessorState, tokens, step,
                   subset=None) -> ProcessorState:
    """`advance` with a traced `step` (see `switch_over_groups`); outside [0,
    max_length) only a finished row taking the end token stays valid."""
    check_step(step, plan.max_length, "advance", traced=True)
    check_live_mask(plan, subset, state.node.shape[0], "advance")
    check_tokens(tokens, state.node.shape[0], "advance(step=<traced>)")
    moved = switch_over_groups(
        plan, lambda t, tabs, sub, st, tok: _advance_at(plan, tabs, st, tok, t, sub),
        step, tables, subset, state, tokens)
    end = -2 if plan.end_token is None else plan.end_token
    done = state.valid & state.finished & (jnp.asarray(tokens, jnp.int32) == end)
    past = ProcessorState(jnp.zeros_like(state.node), done, done)
    return select_state(step_in_range(plan, step), moved, past)


def select_state(take, new: ProcessorState, old: ProcessorState) -> ProcessorState:
    """Per row (or for all rows, `take` scalar): `new` where `take`, else `old`."""
    return ProcessorState(*(jnp.where(take, a, b) for a, b in zip(new, old)))
