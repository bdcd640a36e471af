"""The selections' kernels: the first `count` True entries of a row
(`first_true`, by prefix counts) and the k best of a row (`top_k`, by group
maxima on the CPU), each exact against the primitive it replaces and
cheaper where XLA's CPU backend runs that primitive slowly (a sort with a
comparator call per comparison; a TopK heap of k scanned over the row).
Shapes are static; the bounds are read when tracing."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.kernels import take_last

FIRST_TRUE_COMPARES = 1 << 20
"""`first_true` counts by comparisons up to count x n of these a row (70 of
1,120: 78,400) and rows of up to FIRST_TRUE_ENTRIES (its matrix across
the blocks: (n / block)^2 floats), by a top-k past either."""

FIRST_TRUE_ENTRIES = 4096


def first_true(flags, count: int, block: int = 32):
    """(pos int32 (..., count), found bool (...,)): the positions, in
    order, of the first `count` True entries of `flags` bool (..., n), and
    whether it holds that many (where not, pos is clamped garbage).

    By prefix counts, not a top-k of position keys: XLA's CPU backend runs a
    top-k of a short row (70 of 1,120) as a stable sort of the whole row
    with a comparator call per comparison (0.33-0.46 ms at (3, 1120), 3-4x
    this; docs/benchmarks.md, "The JAX door's ranked step"). The counts
    are two float32 products with triangular matrices of ones (within
    blocks of `block` entries, then across the blocks: exact below 2^24),
    and entry j is the number of positions whose count is below j + 1
    (count x n comparisons a row: past FIRST_TRUE_COMPARES or
    FIRST_TRUE_ENTRIES, for beams of several hundred, a top-k of position
    keys again, O(n log n))."""
    n = flags.shape[-1]
    assert 0 < count <= n < 1 << 24, (count, n)
    if count * n > FIRST_TRUE_COMPARES or n > FIRST_TRUE_ENTRIES:
        order, pos = lax.top_k(jnp.where(flags, -lax.iota(jnp.int32, n), -n), count)
        return pos, order[..., -1] > -n
    lead = flags.shape[:-1]
    blocks = -(-n // block)
    x = jnp.pad(flags.astype(jnp.float32), [(0, 0)] * len(lead) + [(0, blocks * block - n)])
    within = x.reshape(lead + (blocks, block)) @ jnp.asarray(
        np.triu(np.ones((block, block), np.float32)))
    before = within[..., -1] @ jnp.asarray(np.triu(np.ones((blocks, blocks), np.float32), 1))
    counts = (within + before[..., None]).reshape(lead + (blocks * block,))[..., :n]
    wanted = (lax.iota(jnp.int32, count) + 1).astype(jnp.float32)
    pos = jnp.sum(counts[..., None, :] < wanted[:, None], axis=-1, dtype=jnp.int32)
    return jnp.minimum(pos, n - 1), counts[..., -1] >= count


TOP_K_GROUP = 16
"""`top_k`'s group: each group of this many consecutive entries is
represented by its largest in the first pass."""

TOP_K_GROUPED_FROM = 1 << 14
"""`top_k` takes the grouped path on the CPU for rows of at least this
many entries whose k best groups hold under 1 / TOP_K_SHARE of the row
(`top_k_groups`); elsewhere `lax.top_k` as it is. Read when tracing."""

TOP_K_SHARE = 8
"""Measured (docs/benchmarks.md, "A beam step's top-k by groups"): at
(2, 71,680) the top 560 (1/8 of the row kept) took 0.78 ms grouped
against 0.61 ms for `lax.top_k`; at 1/16 and below grouped was as fast
or faster (the top 560 of (3, 143,360): 1.36 against 1.87 ms)."""


def top_k_groups(n: int, k: int) -> bool:
    """Whether `top_k` of k from rows of n entries takes the grouped path
    on the CPU."""
    g = TOP_K_GROUP
    return n >= TOP_K_GROUPED_FROM and n % g == 0 and TOP_K_SHARE * k * g < n


def top_k(x, k: int):
    """`lax.top_k(x, k)` of float32 x (..., n): (values (..., k), indices
    int32 (..., k)), the same arrays bit for bit (descending in the float
    total order `lax.top_k` uses, NaN first and +0 above -0; ties to the
    lower index).

    On the CPU, for long rows, by group maxima first: XLA's CPU TopK call
    scans the whole row once per element with a heap of k, ~1.5 ns an
    entry (0.65 ms for the top 70 of (3, 143,360): a dense step's 70
    beams x V = 2048). Here each group of `TOP_K_GROUP` entries is reduced
    to its largest (a total-order int32 key: one vectorized pass), the k
    best groups found by a top-k of n / 16 entries, and the k best entries
    by a top-k of those groups' k x 16 entries, gathered in index order
    (docs/benchmarks.md, "A beam step's top-k by groups").

    Exact: an entry e of the true top k lies in one of the k best groups
    (by largest, then lower group): were its group g outside them, each
    of those k groups would hold an entry above e (a larger value, or an
    equal one at a lower index, its group being lower than g), k entries
    before e. Gathered in ascending index, the candidates keep the
    original order for ties. Elsewhere (other platforms, short rows)
    `lax.top_k` itself."""
    if not top_k_groups(x.shape[-1], k):
        return lax.top_k(x, k)
    return lax.platform_dependent(x, cpu=lambda x: _grouped_top_k(x, k, TOP_K_GROUP),
                                  default=lambda x: tuple(lax.top_k(x, k)))


def _grouped_top_k(x, k: int, g: int):
    """`top_k` by the maxima of groups of g entries (n a multiple of g)."""
    lead, n = x.shape[:-1], x.shape[-1]
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    # The float total order as int32 (negatives' magnitude bits flipped).
    key = bits ^ (lax.shift_right_arithmetic(bits, 31) & jnp.int32(0x7FFFFFFF))
    best = jnp.max(key.reshape(lead + (n // g, g)), axis=-1)
    # Back to float32 (the map is its own inverse): each group's largest entry.
    group_best = lax.bitcast_convert_type(
        best ^ (lax.shift_right_arithmetic(best, 31) & jnp.int32(0x7FFFFFFF)), jnp.float32)
    _, groups = lax.top_k(group_best, k)
    groups = jnp.sort(groups, axis=-1)
    idx = (groups[..., :, None] * g + lax.iota(jnp.int32, g)).reshape(lead + (k * g,))
    values, at = lax.top_k(take_last(x, idx), k)
    return values, take_last(idx, at)
