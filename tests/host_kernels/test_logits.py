"""`host_kernels.logits.fill_disallowed`: rows masked in place exactly as
the tensor ops mask them (pad the allowed rows to the logits' width, a row
left with nothing keeps its fallback column, every other row untouched),
on random rows, positions (-1: a row that allows nothing), widths on both
sides of the allowed rows' and fallbacks inside and outside the row."""

from __future__ import annotations

import numpy as np
import pytest

from static_compiler.host_kernels import logits as host_logits
from static_compiler.host_kernels import processor

pytestmark = pytest.mark.skipif(not processor.AVAILABLE, reason="numba is not installed")


def reference(logits, rows, positions, allowed, fallback, value):
    out = logits.copy()
    W = logits.shape[1]
    for r, p, f in zip(rows, positions, fallback):
        ok = np.zeros(W, bool)
        if p >= 0:
            n = min(W, allowed.shape[1])
            ok[:n] = allowed[p, :n]
        if not ok.any() and f >= 0:
            ok[f] = True
        out[r, ~ok] = value
    return out


@pytest.mark.parametrize("seed", range(12))
def test_fill_disallowed_matches_the_tensor_semantics(seed):
    rng = np.random.default_rng(seed)
    N, W = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    V = int(rng.integers(1, 48))  # (wider and narrower than the logits)
    m = int(rng.integers(1, 6))
    allowed = rng.random((m, V)) < rng.choice([0.0, 0.1, 0.5])
    rows = rng.permutation(N)[:int(rng.integers(0, N + 1))].astype(np.int64)
    positions = rng.integers(-1, m, rows.shape[0]).astype(np.int64)
    fallback = rng.integers(-1, W, rows.shape[0]).astype(np.int64)
    logits = rng.standard_normal((N, W)).astype(np.float32)
    value = float(rng.choice([-np.inf, -1e9]))
    want = reference(logits, rows, positions, allowed, fallback, value)
    host_logits.fill_disallowed(logits, rows, positions, allowed, fallback, value)
    assert np.array_equal(logits, want)
