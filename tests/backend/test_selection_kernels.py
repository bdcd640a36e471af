"""`backend.selection_kernels.first_true`: the first `count` True positions of each
row, by prefix counts, against numpy on random, empty, full and ragged
rows (lengths that are not a whole number of blocks, leading dims), and
past its comparisons' bound (a top-k). `selection_kernels.top_k`: the k
largest by group maxima on the CPU, against numpy's total order and
`lax.top_k` bit for bit (ties, NaN, signed zeros, infinities)."""

from __future__ import annotations

import contextlib
from unittest import mock

import jax
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from static_compiler.backend import selection_kernels
from static_compiler.backend.selection_kernels import (
    FIRST_TRUE_COMPARES,
    FIRST_TRUE_ENTRIES,
    first_true,
)


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


# top_k

def _total_order_top_k(x: np.ndarray, k: int):
    """(values, indices) of the k largest entries of each row of float32 x
    (R, n) in the float total order (NaN above +inf, +0 above -0, -NaN
    below -inf), ties to the lower index: a stable sort of int64 keys."""
    bits = x.view(np.int32).astype(np.int64)
    key = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    order = np.argsort(-key, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)


def _check_top_k(x: np.ndarray, k: int, grouped: bool = True) -> None:
    lowered = jax.jit(selection_kernels.top_k, static_argnums=1).lower(x, k).as_text()
    assert ("stablehlo.reduce" in lowered) == grouped, (x.shape, k)  # (the path taken)
    values, indices = jax.jit(selection_kernels.top_k, static_argnums=1)(x, k)
    want_values, want_indices = jax.jit(lax.top_k, static_argnums=1)(x, k)
    values, indices = np.asarray(values), np.asarray(indices)
    assert values.shape == indices.shape == x.shape[:-1] + (k,) and indices.dtype == np.int32
    np.testing.assert_array_equal(values.view(np.int32), np.asarray(want_values).view(np.int32))
    np.testing.assert_array_equal(indices, want_indices)
    rows = x.reshape(-1, x.shape[-1])
    oracle_values, oracle_indices = _total_order_top_k(rows, k)
    np.testing.assert_array_equal(indices.reshape(-1, k), oracle_indices)
    np.testing.assert_array_equal(values.reshape(-1, k).view(np.int32),
                                  oracle_values.view(np.int32))


_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -3e38],
                     np.float32)
_NEGATIVE_NAN = np.array([0xFFC00001], np.uint32).view(np.float32)[0]


@contextlib.contextmanager
def _bound(name: str, value: int):
    """A `selection_kernels` bound read when tracing (TOP_K_GROUPED_FROM,
    TOP_PREFIX_FROM) set to `value` (small rows exercise the paths past
    it), programs traced afresh and dropped after."""
    with mock.patch.object(selection_kernels, name, value):
        jax.clear_caches()
        try:
            yield
        finally:
            jax.clear_caches()


def _grouped_from_64():
    """`top_k`'s grouped path from rows of 64 entries."""
    return _bound("TOP_K_GROUPED_FROM", 64)


def _rows(rng, kind: str, n: int) -> np.ndarray:
    """float32 (3, n) rows of a kind: normal, ties (a few integers),
    sparse ties (groups of unequal maxima sharing tied entries), specials
    (NaN, -NaN, signed zeros, infinities, subnormals)."""
    if kind == "normal":
        return rng.standard_normal((3, n)).astype(np.float32)
    if kind == "ties":
        return rng.integers(-2, 3, (3, n)).astype(np.float32)
    if kind == "sparse ties":
        x = rng.integers(0, 2, (3, n)).astype(np.float32)
        x[rng.random((3, n)) < 0.02] += rng.integers(1, 4)
        return x
    assert kind == "specials", kind
    return rng.choice(np.append(_SPECIALS, _NEGATIVE_NAN), (3, n))


@settings(max_examples=examples(16), deadline=None)
@given(st.integers(4, 160), st.integers(0, 2**31 - 1),
       st.sampled_from(["normal", "ties", "sparse ties", "specials"]))
def test_top_k_equals_the_total_order_on_random_rows(groups, seed, kind):
    rng = np.random.default_rng(seed)
    n = groups * selection_kernels.TOP_K_GROUP
    k = int(rng.integers(1, max(2, n // (selection_kernels.TOP_K_SHARE * selection_kernels.TOP_K_GROUP)) + 1))
    x = _rows(rng, kind, n)
    with _grouped_from_64():
        _check_top_k(x, k, grouped=selection_kernels.top_k_groups(n, k))


def test_top_k_on_tied_and_sentinel_rows_and_leading_dims():
    k = 70
    # (the shortest row it groups for k)
    n = selection_kernels.TOP_K_SHARE * k * selection_kernels.TOP_K_GROUP + selection_kernels.TOP_K_GROUP
    rng = np.random.default_rng(0)
    tied = np.zeros(n, np.float32)
    sentinel = np.full(n, -3.0e38, np.float32)
    sentinel[rng.choice(n, 40, replace=False)] = 0.0  # (fewer real entries than k)
    zeros = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0))
    ascending = np.arange(n, dtype=np.float32)  # (the best in the last group)
    # A later group's larger maximum ranks it first; the tied 1.0 of the
    # earlier groups still come before its own.
    later_first = np.zeros(n, np.float32)
    later_first[:16 * k:16] = 1.0
    later_first[16 * k + 3] = 1.0
    later_first[16 * k + 5] = 9.0
    x = np.stack([tied, sentinel, zeros, ascending, ascending[::-1].copy(), later_first])
    with _grouped_from_64():
        assert selection_kernels.top_k_groups(n, k) and not selection_kernels.top_k_groups(n - 16, k)
        _check_top_k(x, k)
        _check_top_k(x.reshape(6, 1, n), k)


@pytest.mark.parametrize("n,k", [(100, 3), (2048, 16), (2048, 2048), (2050, 2)])
def test_top_k_outside_the_grouped_bounds_is_lax_top_k(n, k):
    # (a row not a whole number of groups, or its k best groups 1 / 8 of it or more)
    x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
    with _grouped_from_64():
        _check_top_k(x, k, grouped=False)


def test_top_k_at_a_beam_step_size():
    # (3 rows of 70 beams x 2048 tokens, the first grouped size by default)
    x = np.random.default_rng(1).standard_normal((3, 70 * 2048)).astype(np.float32)
    assert x.shape[-1] >= selection_kernels.TOP_K_GROUPED_FROM
    _check_top_k(x, 70)
    _check_top_k(x, 560)


def test_top_k_elsewhere_than_the_cpu_is_lax_top_k():
    x = jax.ShapeDtypeStruct((3, 70 * 2048), np.float32)
    exported = jax.export.export(jax.jit(selection_kernels.top_k, static_argnums=1),
                                 platforms=["cuda"])(x, 70)
    text = exported.mlir_module()
    assert "stablehlo.reduce" not in text and text.count("top_k") >= 1
    both = jax.export.export(jax.jit(selection_kernels.top_k, static_argnums=1),
                             platforms=["cpu", "cuda"])(x, 70).mlir_module()
    assert "stablehlo.reduce" in both  # (the CPU's branch beside it)


# top_prefix

def _order(row: np.ndarray) -> np.ndarray:
    """A row's entries in `lax.top_k`'s order (the float total order
    descending, ties to the lower index)."""
    bits = row.view(np.int32).astype(np.int64)
    return np.argsort(-np.where(bits < 0, bits ^ 0x7FFFFFFF, bits), kind="stable")


def _check_top_prefix(x: np.ndarray, capacity: int) -> np.ndarray:
    """top_prefix of x (B, n): the shapes, the real slots first and in
    index order; where whole, P a prefix of the row's order, ranked by
    `lax.top_k` over x[at] as in the row. Returns whole (B,)."""
    at, real, whole = jax.jit(selection_kernels.top_prefix, static_argnums=1)(x, capacity)
    at, real, whole = np.asarray(at), np.asarray(real), np.asarray(whole)
    B, n = x.shape
    assert at.shape == real.shape == (B, capacity) and at.dtype == np.int32
    assert whole.shape == (B,) and whole.dtype == bool
    for b in range(B):
        found = int(real[b].sum())
        assert real[b, :found].all() and ((at[b] >= 0) & (at[b] < n)).all()
        P = at[b, :found]
        assert (np.diff(P) > 0).all(), b  # (index order)
        if whole[b]:
            order = _order(x[b])
            np.testing.assert_array_equal(P[_order(x[b, P])], order[:found], err_msg=str(b))
            if found:
                _, ranked = lax.top_k(x[b, P], found)
                np.testing.assert_array_equal(P[np.asarray(ranked)], order[:found])
    return whole


@settings(max_examples=examples(16), deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**31 - 1), st.sampled_from([128, 256]),
       st.sampled_from(["normal", "ties", "sparse ties", "specials", "clustered"]))
def test_top_prefix_is_a_prefix_of_the_total_order(groups, seed, capacity, kind):
    rng = np.random.default_rng(seed)
    n = groups * selection_kernels.TOP_K_GROUP
    if kind == "clustered":  # the best entries in a few runs (a beam search's best beams)
        x = (rng.standard_normal((3, n)) - 8 * (np.arange(n) // 64 % 5 != 0)).astype(np.float32)
    else:
        x = _rows(rng, kind, n)
    with _bound("TOP_PREFIX_FROM", 16):
        _check_top_prefix(x, capacity)


def test_top_prefix_at_a_beam_step_size():
    """3 rows of 70 beams x 2048 tokens: whole, about 7/16 of the capacity
    found, random and with each beam's scores offset (the best entries in
    the best beams, as at the JAX door's step 1); all-tied rows overflow
    (not whole: `select_listed` lists those by `top_k`)."""
    rng = np.random.default_rng(5)
    n = 70 * 2048
    assert selection_kernels.top_prefix_fits(n)
    normal = rng.standard_normal((3, n)).astype(np.float32)
    beams = (normal.reshape(3, 70, 2048)
             - np.sort(rng.exponential(3, (3, 70)))[..., None]).astype(np.float32)
    for x in (normal, beams.reshape(3, n)):
        assert _check_top_prefix(x, 1024).all()
        found = np.asarray(jax.jit(selection_kernels.top_prefix, static_argnums=1)(x, 1024)[1])
        assert (found.sum(-1) >= 300).all() and (found.sum(-1) <= 1024).all(), found.sum(-1)
    assert not _check_top_prefix(np.zeros((2, n), np.float32), 1024).any()


def test_top_prefix_refuses_rows_and_capacities_it_does_not_fit():
    assert not selection_kernels.top_prefix_fits(selection_kernels.TOP_PREFIX_FROM - 16)
    assert not selection_kernels.top_prefix_fits(selection_kernels.TOP_PREFIX_FROM + 8)
    with pytest.raises(AssertionError):
        selection_kernels.top_prefix(np.zeros((1, 1 << 14), np.float32), 100)
    with pytest.raises(AssertionError):
        selection_kernels.top_prefix(np.zeros((1, (1 << 14) + 8), np.float32), 128)


def test_top_prefix_elsewhere_than_the_cpu_is_lax_top_k():
    x = jax.ShapeDtypeStruct((3, 70 * 2048), np.float32)
    f = jax.jit(selection_kernels.top_prefix, static_argnums=1)
    cuda = jax.export.export(f, platforms=["cuda"])(x, 1024).mlir_module()
    # (the threshold's compaction is a scatter; chlo.top_k's decomposition a sort)
    assert "stablehlo.scatter" not in cuda and "chlo.top_k" in cuda
    assert "stablehlo.scatter" in jax.export.export(f, platforms=["cpu"])(x, 1024).mlir_module()
