"""The logits-processor pair and the stateless prefix mask in torch, on
checked arguments (`TorchConstraints` checks them): the semantics of
`static_compiler.backend.decode.processor` (`mask`, `advance`) and
`static_compiler.backend.decode.prefix` (`allowed`), bit for bit.

Every function is vectorized over the rows, at a static step (a Python
int), with no host synchronisation and no branch on tensor values.
"""

from __future__ import annotations

import torch

from static_compiler.support.decode_types import ProcessorState
from static_compiler.torch_backend.kernels import dense_child, row_status, step_columns

TorchState = ProcessorState
"""Per-row processor state (B rows): `static_compiler.support.decode_types.ProcessorState`
(node, valid, finished) of torch tensors, node int64 (B,), the JAX
backend's fields in its order."""


def init_state(rows: int, device=None) -> TorchState:
    """Every row at the root, valid, not finished."""
    return TorchState(torch.zeros(rows, dtype=torch.int64, device=device),
                      torch.ones(rows, dtype=torch.bool, device=device),
                      torch.zeros(rows, dtype=torch.bool, device=device))


def mask_at(plan, tables, state: TorchState, step: int, sub=None) -> torch.Tensor:
    """bool (B, V): the tokens each row may take at `step`. A finished row
    allows only the end token, an invalid row nothing."""
    cols = step_columns(plan, tables, step, state.node, state.valid, state.finished, sub)
    V = plan.vocab_size
    B = state.node.shape[0]
    device = state.node.device
    kids = cols.children
    if kids is None:
        allowed = torch.zeros((B, V), dtype=torch.bool, device=device)
    elif kids.tokens.shape[1] == V and plan.steps[step].kind == "dense_rows":
        allowed = kids.valid  # dense rows: column v is token v
    else:
        ok = kids.valid & (kids.tokens >= 0) & (kids.tokens < V)
        at = torch.where(ok, kids.tokens, torch.full_like(kids.tokens, V))  # V: dropped
        allowed = torch.zeros((B, V + 1), dtype=torch.bool, device=device)
        allowed = allowed.scatter(1, at, torch.ones_like(ok))[:, :V]
    ends = None
    for part in (cols.end, cols.stay):
        if part is not None:
            ends = part if ends is None else ends | part
    if ends is not None:
        is_end = torch.arange(V, device=device) == plan.end_token
        allowed = allowed | (is_end[None, :] & ends[:, None])
    return allowed


def advance_at(plan, tables, state: TorchState, tokens: torch.Tensor, step: int,
               sub=None) -> TorchState:
    """Moves each row along its token int64 (B,); a token the row does not
    allow (see `mask_at`) makes the row invalid."""
    dense = step < plan.depth and plan.steps[step].kind == "dense_rows"
    cols = step_columns(plan, tables, step, state.node, state.valid, state.finished, sub,
                        with_children=not dense)
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
        nxt = torch.where(hit, kids.next, torch.zeros_like(kids.next)).sum(dim=1)
    if plan.end_token is not None:
        takes_end = tokens == plan.end_token
        for part in (cols.end, cols.stay):
            if part is not None:
                done = done | (part & takes_end)
        ok = ok | done
    moved = ok & ~done
    return TorchState(torch.where(moved, nxt, torch.zeros_like(nxt)), ok, done)


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
