"""Masking logits in place on the host: each row keeps the tokens its
allowed row marks and gets a value (-inf) at every other column, as one
compiled loop (numba) instead of a pad, a gather, a reduction and a fill
in tensor ops (vLLM's processor on a CPU: `integrations.vllm.steps`).

numba is optional: without it `jit.AVAILABLE` is False and callers
keep their tensor ops.
"""

from __future__ import annotations

import numpy as np

from static_compiler.host_kernels.jit import AVAILABLE, njit


@njit(nogil=True, cache=True)
def fill_disallowed_rows(logits, rows, positions, allowed, fallback, value):
    """logits float32 (N, W), in place: row rows[i] keeps the columns that
    allowed[positions[i]] (bool (n, V)) marks (positions[i] < 0: none;
    columns past V: none) and gets `value` at the others; a row left with
    nothing keeps column fallback[i] (< 0: none) instead."""
    V = min(allowed.shape[1], logits.shape[1])
    W = logits.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        p = positions[i]
        some = False
        if p >= 0:
            for v in range(V):
                if allowed[p, v]:
                    some = True
                    break
        keep = -1 if some else fallback[i]
        for v in range(W):
            if v == keep or (some and v < V and allowed[p, v]):
                continue
            logits[r, v] = value


def fill_disallowed(logits: np.ndarray, rows: np.ndarray, positions: np.ndarray,
                    allowed: np.ndarray, fallback: np.ndarray, value: float = -np.inf) -> None:
    """`fill_disallowed_rows` on C-contiguous arrays: logits float32 (N,
    W); rows, positions, fallback int64 (n,); allowed bool (m, V)."""
    fill_disallowed_rows(logits, rows, positions, allowed, fallback, np.float32(value))


def warm() -> None:
    """Loads (or compiles once) the kernel for the types callers pass."""
    if not AVAILABLE:
        return
    one = np.zeros(1, np.int64)
    fill_disallowed(np.zeros((1, 2), np.float32), one, one, np.ones((1, 2), np.bool_), one)
