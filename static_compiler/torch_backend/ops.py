"""The logits-processor pair and the stateless prefix mask in torch, on
checked arguments (`TorchConstraints` checks them): the semantics of
`static_compiler.backend.decode.processor` (`mask`, `advance`) and
`static_compiler.backend.decode.prefix` (`allowed`), bit for bit.

Every function is vectorized over the rows, at a static step (a Python
int), with no host synchronisation and no branch on tensor values.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from static_compiler.support.decode_types import ProcessorState
from static_compiler.torch_backend.kernels import StepColumns, dense_child, row_status, step_columns

TorchState = ProcessorState
"""Per-row processor state (B rows): `static_compiler.support.decode_types.ProcessorState`
(node, valid, finished) of torch tensors, node int64 (B,), the JAX
backend's fields in its order."""


class RowColumns(NamedTuple):
    """The columns a `processor_step` read at `step` for the rows of the
    state it returned (`node` is that state's node tensor, `bits` the
    subset bits it read, None without a subset): the next step's advance
    reads them instead of the tables (columns None: it reads the tables, as
    the host steps do). Opaque to callers; pass it back unchanged with that
    state."""

    step: int
    node: torch.Tensor
    bits: object
    columns: Optional[StepColumns]


class ProcessorStep(NamedTuple):
    """What `TorchConstraints.processor_step` returns: the rows' state at
    the step, the tokens they may take there bool (B, V) (the caller may
    write to it: at a dense step it is the columns' valid, which no advance
    reads) and the columns the next call's advance reads (`RowColumns`)."""

    state: TorchState
    allowed: torch.Tensor
    columns: RowColumns


def init_state(rows: int, device=None) -> TorchState:
    """Every row at the root, valid, not finished."""
    return TorchState(torch.zeros(rows, dtype=torch.int64, device=device),
                      torch.ones(rows, dtype=torch.bool, device=device),
                      torch.zeros(rows, dtype=torch.bool, device=device))


def columns_at(plan, tables, state: TorchState, step: int, sub=None,
               with_children: bool = True) -> StepColumns:
    """The candidates of each row of `state` at `step` (`step_columns`):
    what `mask_from` and `advance_from` read. Dense steps: children None
    unless `with_children` (an advance there reads one column per row)."""
    return step_columns(plan, tables, step, state.node, state.valid, state.finished, sub,
                        with_children=with_children)


def mask_from(plan, cols: StepColumns, step: int, rows: int, device) -> torch.Tensor:
    """bool (rows, V): the tokens each row may take, from its columns at
    `step`. A finished row allows only the end token, an invalid row
    nothing."""
    V = plan.vocab_size
    kids = cols.children
    if kids is None:
        allowed = torch.zeros((rows, V), dtype=torch.bool, device=device)
    elif kids.tokens.shape[1] == V and plan.steps[step].kind == "dense_rows":
        allowed = kids.valid  # dense rows: column v is token v
    else:  # (the tables' tokens are in [0, V): a verified artifact's)
        at = torch.where(kids.valid, kids.tokens, V)  # V: a dropped column
        allowed = torch.zeros((rows, V + 1), dtype=torch.bool, device=device)
        allowed = allowed.scatter_(1, at, True)[:, :V]
    ends = None
    for part in (cols.end, cols.stay):
        if part is not None:
            ends = part if ends is None else ends | part
    if ends is not None:  # (a dense step's valid columns are written: an advance there
        allowed[:, plan.end_token] |= ends  # reads the table, `dense_child`, not them)
    return allowed


def advance_from(plan, tables, state: TorchState, cols: StepColumns, tokens: torch.Tensor,
                 step: int, sub=None) -> TorchState:
    """Moves each row of `state` along its token int64 (B,), reading its
    columns at `step` (`columns_at` of this state, children or not at a
    dense step); a token the row does not allow (see `mask_from`) makes
    the row invalid."""
    dense = step < plan.depth and plan.steps[step].kind == "dense_rows"
    tokens = tokens.long()
    zeros = torch.zeros_like(state.valid)
    ok, done = zeros, zeros
    nxt = torch.zeros_like(state.node)
    kids = cols.children
    if dense:
        _, expanding = row_status(plan, step, state.node, state.valid, state.finished)
        ok, nxt = dense_child(plan, tables, step, state.node, expanding, tokens, sub)
    elif kids is not None:
        hit = kids.valid & (kids.tokens == tokens[:, None])
        ok = hit.any(dim=1)
        nxt = (kids.next * hit).sum(dim=1)
    if plan.end_token is not None:
        takes_end = tokens == plan.end_token
        for part in (cols.end, cols.stay):
            if part is not None:
                done = done | (part & takes_end)
        ok = ok | done
    return TorchState(nxt * (ok & ~done), ok, done)


def mask_at(plan, tables, state: TorchState, step: int, sub=None) -> torch.Tensor:
    """bool (B, V): the tokens each row may take at `step` (`mask_from` of
    `columns_at`)."""
    return mask_from(plan, columns_at(plan, tables, state, step, sub), step,
                     state.node.shape[0], state.node.device)


def advance_at(plan, tables, state: TorchState, tokens: torch.Tensor, step: int,
               sub=None) -> TorchState:
    """Moves each row along its token int64 (B,) (`advance_from` of
    `columns_at`, without the V children of a dense step)."""
    dense = step < plan.depth and plan.steps[step].kind == "dense_rows"
    cols = columns_at(plan, tables, state, step, sub, with_children=not dense)
    return advance_from(plan, tables, state, cols, tokens, step, sub)


def processor_step(plan, tables, state: TorchState, tokens: Optional[torch.Tensor],
                   cols: Optional[StepColumns], step: int, sub=None) -> ProcessorStep:
    """`advance_at` of `tokens` at step - 1 (reading `cols`, the columns
    of `state` at step - 1, when given; tokens None: no advance), then
    `mask_at` at `step`: one call per step for an engine whose rows take
    a token and are masked again (vLLM's processor)."""
    if tokens is not None:
        prev = step - 1
        if cols is None:
            dense = prev < plan.depth and plan.steps[prev].kind == "dense_rows"
            cols = columns_at(plan, tables, state, prev, sub, with_children=not dense)
        state = advance_from(plan, tables, state, cols, tokens, prev, sub)
    cols = columns_at(plan, tables, state, step, sub)
    allowed = mask_from(plan, cols, step, state.node.shape[0], state.node.device)
    return ProcessorStep(state, allowed, RowColumns(step, state.node,
                                                    None if sub is None else sub[0], cols))


def prefix_mask(plan, tables, prefixes: torch.Tensor, sub=None) -> torch.Tensor:
    """prefixes int (N, t), t static -> bool (N, V): `advance` from the root
    along each prefix, then `mask` at step t (tokens outside [0, V) make
    their row allow nothing)."""
    n, t = prefixes.shape
    state = init_state(n, prefixes.device)
    prefixes = prefixes.long()
    for step in range(t):
        state = advance_at(plan, tables, state, prefixes[:, step], step, sub)
    return mask_at(plan, tables, state, t, sub)
