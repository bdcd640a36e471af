"""The one clamped gather every torch kernel reads its tables with (`take`):
its own module so that `kernels` and `rank_kernels` both import it."""

from __future__ import annotations

import torch


def take(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[clamp(idx, 0, n - 1)]`` along the first axis (zeros of the
    table's dtype when it is empty): idx.shape + table.shape[1:]."""
    n = table.shape[0]
    if n == 0:
        return torch.zeros(idx.shape + table.shape[1:], dtype=table.dtype, device=idx.device)
    idx = idx.clamp(0, n - 1)
    # (index_select: indexing and torch.take run a parallel region from a few thousand
    # indices, which waits milliseconds for a descheduled thread on a busy CPU)
    if idx.ndim == 1:
        return table.index_select(0, idx)
    return table.index_select(0, idx.reshape(-1)).reshape(idx.shape + table.shape[1:])
