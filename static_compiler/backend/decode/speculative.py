"""Speculative decoding: how many of a draft model's tokens stay inside the
constraint set, and the logits-processor state after them.

A draft model proposes n tokens per row; before the target model verifies
them, `accept_drafts` counts per row the longest prefix of the draft that the
set allows from the row's `ProcessorState` at decoding position `step`, and
returns the state after exactly those tokens (`advance` over each of them).
Rows are vectorized; the n draft positions are a static loop (each position
reads its own layer's tables, whose shapes differ by layer).

Semantics, per row b:

* draft token j is consumed at position ``step + j``; it is accepted when
  tokens 0..j-1 were, the row is valid and not finished before it, and the
  set allows it there (`advance` keeps the row valid);
* an end token that finishes the item is accepted, and nothing after it;
* a row that is already invalid or finished accepts nothing;
* positions past the set's last step (``step + j >= plan.max_length``) are
  rejected: a row accepts at most ``max_length - step`` tokens;
* ``new_state`` is the state after the accepted tokens: rows that accept 0
  tokens keep their state unchanged (a rejected token never marks a row
  invalid here; call `advance` with the token the target picks instead).

`step` is a Python or numpy int (one program per step), or a jax int32
scalar, traced or on the device: then a `lax.switch` over the steps
(`switch_over_steps`) runs, and a step outside [0, max_length) accepts
nothing (the step is never read back to the host). Concrete drafts outside
[0, V) are rejected with DecodeInputError; traced drafts cannot be checked, so
their tokens outside [0, V) are simply not accepted.
"""

from __future__ import annotations

import jax.numpy as jnp

from static_compiler.backend.decode.live import check_live_mask
from static_compiler.backend.decode.processor import advance, select_state
from static_compiler.backend.decode.step import step_in_range, switch_over_steps
from static_compiler.lowered.plan import Plan
from static_compiler.support.decode_state import (
    ProcessorState,
    check_drafts,
    check_processor_state,
    check_step,
    is_traced,
)


def accept_drafts(plan: Plan, tables, state: ProcessorState, drafts, step, subset=None):
    """state: ProcessorState of B rows at position `step`; drafts: int (B, n);
    subset: a `LiveMask` (each row accepts only tokens towards its subset's
    items, as `advance` with it), or None.

    Returns (accepted int32 (B,) in [0, min(n, max_length - step)],
    new_state ProcessorState). See the module docstring for the semantics."""
    step = check_step(step, plan.max_length, "accept_drafts", traced=True,
                      traced_outside="a jax step outside that range accepts nothing")
    where = f"accept_drafts(step={'<traced>' if is_traced(step) else step})"
    state = check_processor_state(state, where)
    drafts = check_drafts(drafts, state.node.shape[0], plan.vocab_size, where)
    check_live_mask(plan, subset, state.node.shape[0], where)
    if isinstance(step, int):
        return _accept_at(plan, step, tables, state, drafts, subset)
    step = jnp.asarray(step, jnp.int32)
    accepted, new_state = switch_over_steps(
        plan, lambda t, *ops: _accept_at(plan, t, *ops), step, tables, state, drafts, subset)
    in_range = step_in_range(plan, step)  # the switch ran the nearest step
    return jnp.where(in_range, accepted, 0), select_state(in_range, new_state, state)


def _accept_at(plan: Plan, step: int, tables, state: ProcessorState, drafts, subset=None):
    """`accept_drafts` at a static step, on checked arguments."""
    batch, n = drafts.shape
    in_vocab = (drafts >= 0) & (drafts < plan.vocab_size)  # in the drafts' own dtype: no wrap
    tokens = jnp.where(in_vocab, drafts, 0).astype(jnp.int32)
    state = ProcessorState(jnp.asarray(state.node, jnp.int32), jnp.asarray(state.valid, bool),
                           jnp.asarray(state.finished, bool))  # `advance`'s dtypes
    open_rows = state.valid & ~state.finished  # rows that may still take a draft token
    accepted = jnp.zeros((batch,), jnp.int32)
    for j in range(min(n, plan.max_length - step)):
        moved = advance(plan, tables, state, tokens[:, j], step + j, subset)
        take = open_rows & moved.valid & in_vocab[:, j]
        state = select_state(take, moved, state)
        accepted = accepted + take.astype(jnp.int32)
        open_rows = take & ~moved.finished
    return accepted, state
