"""`backend.kernels.first_true`: the first `count` True positions of each
row, by prefix counts, against numpy on random, empty, full and ragged
rows (lengths that are not a whole number of blocks, leading dims), and
past its comparisons' bound (a top-k)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from static_compiler.backend.kernels import FIRST_TRUE_COMPARES, FIRST_TRUE_ENTRIES, first_true


def _reference(flags: np.ndarray, count: int):
    """(pos, found) per row of flags (R, n): the first count True
    positions, and whether there were that many."""
    out = []
    for row in flags:
        where = np.flatnonzero(row)
        out.append((where[:count], where.shape[0] >= count))
    return out


def _check(flags: np.ndarray, count: int, block: int = 32) -> None:
    pos, found = jax.jit(first_true, static_argnums=(1, 2))(flags, count, block)
    pos, found = np.asarray(pos), np.asarray(found)
    assert pos.shape == flags.shape[:-1] + (count,) and pos.dtype == np.int32
    assert found.shape == flags.shape[:-1] and found.dtype == bool
    rows = flags.reshape(-1, flags.shape[-1])
    for (want, enough), got, got_found in zip(_reference(rows, count),
                                              pos.reshape(-1, count), found.reshape(-1)):
        assert bool(got_found) == enough
        if enough:
            np.testing.assert_array_equal(got, want)
        assert ((got >= 0) & (got < flags.shape[-1])).all()  # (in range where not found too)


@settings(max_examples=examples(12))
@given(st.integers(1, 300), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1),
       st.sampled_from([1, 5, 32]))
def test_first_true_equals_numpy_on_random_rows(n, share, seed, block):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, n + 1))
    _check(rng.random((3, n)) < share, count, block)


@pytest.mark.parametrize("n,count", [(1120, 70), (280, 70), (33, 33), (1, 1), (64, 7)])
def test_first_true_on_empty_full_and_edge_rows(n, count):
    rng = np.random.default_rng(n)
    flags = np.stack([np.zeros(n, bool), np.ones(n, bool), rng.random(n) < 0.1,
                      np.arange(n) >= n - count, np.arange(n) < count - 1])
    _check(flags, count)
    _check(flags.reshape(5, 1, n), count)  # (leading dims)


@pytest.mark.parametrize("n,count", [(4096, 300), (2048, 1024), (FIRST_TRUE_ENTRIES + 1, 2)])
def test_first_true_past_its_bounds_takes_a_top_k(n, count):
    assert count * n > FIRST_TRUE_COMPARES or n > FIRST_TRUE_ENTRIES
    rng = np.random.default_rng(count)
    _check(np.stack([rng.random(n) < 0.2, rng.random(n) < 0.5, np.ones(n, bool)]), count)


def test_first_true_refuses_a_count_past_the_row():
    with pytest.raises(AssertionError):
        first_true(np.ones((2, 4), bool), 5)
