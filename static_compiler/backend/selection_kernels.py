"""The selections' kernels: the first `count` True entries of a row
(`first_true`, by prefix counts), the k best of a row (`top_k`, by group
maxima on the CPU) and a prefix of a row's order found by a threshold
(`top_prefix`, unranked), each exact against the primitive it replaces and
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
    best = jnp.max(_total_order_key(x).reshape(lead + (n // g, g)), axis=-1)
    # Back to float32 (the map is its own inverse): each group's largest entry.
    group_best = lax.bitcast_convert_type(_flip_negatives(best), jnp.float32)
    _, groups = lax.top_k(group_best, k)
    groups = jnp.sort(groups, axis=-1)
    idx = (groups[..., :, None] * g + lax.iota(jnp.int32, g)).reshape(lead + (k * g,))
    values, at = lax.top_k(take_last(x, idx), k)
    return values, take_last(idx, at)


TOP_PREFIX_FROM = 1 << 14
"""`top_prefix` applies (`top_prefix_fits`) to rows of at least this many
entries, a multiple of `TOP_K_GROUP`: below, a top-k of the row is as
cheap. Read when tracing (tests lower it)."""

TOP_PREFIX_STRIDE = 8
"""`top_prefix` draws its candidate thresholds from every TOP_PREFIX_STRIDE-th
group's largest entry: the sample's rank r has about 8 (r + 1) groups at
or above it, however the row's best entries cluster (the super groups'
maxima tried first did not: with the best entries in the best beams, the
280th largest of 560 had over 512 groups at or above it)."""


def top_prefix_fits(n: int) -> bool:
    """Whether `top_prefix` takes rows of n entries."""
    return n >= TOP_PREFIX_FROM and n % TOP_K_GROUP == 0


def top_prefix(x, capacity: int):
    """A prefix of each row's `lax.top_k` order, found without ranking it:
    (at int32 (B, capacity), real bool (B, capacity), whole bool (B,)) for
    float32 x (B, n) (`top_prefix_fits(n)`, capacity a multiple of 128).

    Where `whole`, the real slots of `at` (the first slots) hold the
    indices of a set P of the row's entries that is a prefix of its order
    (every entry outside P comes after every entry in P: below in the
    float total order, or equal at a higher index), in index order, so
    `lax.top_k` over x[at] (unreal slots below every real one) ranks P as
    `lax.top_k(x)` does. P is aimed at about capacity / 2 entries, not
    promised (random rows of 143,360 with a capacity of 1,024: 450-470;
    the JAX door's step-1 scores, where the best cluster in the best
    beams: 400-580). Where not whole (the entries at or above the
    threshold overflow: ties across many groups, or rows whose best
    entries cluster past the sample's estimate), P is not a prefix.

    Why: XLA's CPU TopK grows with k (the top 560 of (3, 143,360): 1.2-1.4
    ms by `top_k`'s groups, 0.4-0.6 ms this way); a caller that reads
    something costly about its best few hundred entries (`select_listed`:
    their liveness) needs a prefix of about that size, not its order.

    On the CPU `_threshold_prefix`; elsewhere the top capacity / 2 by
    `lax.top_k` (unmeasured there), in order, the rest unreal (a prefix,
    whole everywhere)."""
    assert top_prefix_fits(x.shape[-1]) and capacity % 128 == 0, (x.shape, capacity)
    return lax.platform_dependent(x, cpu=lambda x: _threshold_prefix(x, capacity),
                                  default=lambda x: _top_k_prefix(x, capacity))


def _top_k_prefix(x, capacity: int):
    """`top_prefix` by `lax.top_k(x, capacity / 2)`."""
    B, size = x.shape[0], min(capacity // 2, x.shape[-1])
    _, at = lax.top_k(x, size)
    at = jnp.pad(at, ((0, 0), (0, capacity - size)))
    return (at, jnp.broadcast_to(lax.iota(jnp.int32, capacity) < size, (B, capacity)),
            jnp.ones((B,), bool))


def _threshold_prefix(x, capacity: int):
    """`top_prefix` by a threshold t. Each group of `TOP_K_GROUP` entries
    is reduced to its largest (total-order keys); every
    `TOP_PREFIX_STRIDE`-th group's largest is sorted, and three candidates
    read from it where about 7/16, 3/8 and 1/4 of the capacity in groups
    would lie at or above them; one pass counts each candidate's groups,
    and the lowest whose groups fit half the capacity is taken. Those
    groups are gathered in index order (`_compact`), then their entries at
    or above t. Every entry at or above t lies in a group whose largest
    is, so when all those groups were gathered and their entries at or
    above t fit the capacity, P is every entry at or above t: a prefix."""
    B, n = x.shape
    g, stride = TOP_K_GROUP, TOP_PREFIX_STRIDE
    G = n // g
    key = _total_order_key(x)
    group_key = jnp.max(key.reshape(B, G, g), axis=-1)  # (B, G)
    group_capacity = min(G, capacity // 2)
    sample = jnp.sort(group_key[:, ::stride], axis=-1)  # ascending
    S = sample.shape[-1]
    ranks = sorted({min(S - 1, max(0, group_capacity * f // (8 * stride) - 1)) for f in (4, 6, 7)})
    thresholds = sample[:, [S - 1 - r for r in ranks]]  # (B, J) descending
    counts = jnp.sum(group_key[:, None, :] >= thresholds[:, :, None], axis=-1, dtype=jnp.int32)
    pick = jnp.maximum(jnp.sum(counts <= group_capacity, axis=-1) - 1, 0)  # the lowest that fits
    t = take_last(thresholds, pick[:, None])  # (B, 1)
    groups, groups_found = _compact(group_key >= t, lax.broadcasted_iota(jnp.int32, (B, G), 1),
                                    G, group_capacity)
    gathered = (jnp.minimum(groups, G - 1)[..., None] * g + lax.iota(jnp.int32, g)
                ).reshape(B, group_capacity * g)
    over = jnp.repeat(groups < G, g, axis=-1) & (take_last(key, gathered) >= t)
    at, found = _compact(over, gathered, n, capacity)
    whole = (groups_found <= group_capacity) & (found <= capacity)
    real = lax.iota(jnp.int32, capacity) < jnp.minimum(found, capacity)[:, None]
    return jnp.minimum(at, n - 1), real, whole


def _total_order_key(x):
    """int32 x.shape: float32 x's total order (`lax.top_k`'s: NaN first, +0
    above -0) as signed integers (negatives' magnitude bits flipped; the
    map is its own inverse)."""
    return _flip_negatives(lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32))


def _flip_negatives(bits):
    """int32 bits with a negative's magnitude bits flipped: a float32's bits
    to its total-order key and back."""
    return bits ^ (lax.shift_right_arithmetic(bits, 31) & jnp.int32(0x7FFFFFFF))


def _compact(flags, values, fill: int, capacity: int, block: int = 64):
    """(int32 (B, capacity), int32 (B,)): `values` (B, n) int32 at the set
    entries of `flags` bool (B, n), in index order, the slots past the
    last at `fill`, entries past `capacity` dropped; and how many are set.
    Prefix counts by float32 products with triangular ones (within blocks
    of `block`, then across the blocks: exact below 2^24), placed by one
    scatter (XLA's CPU cumsum and sort are slower)."""
    B, n = flags.shape
    blocks = -(-n // block)
    x = jnp.pad(flags.astype(jnp.float32), ((0, 0), (0, blocks * block - n)))
    within = x.reshape(B, blocks, block) @ jnp.asarray(
        np.triu(np.ones((block, block), np.float32)))
    before = within[..., -1] @ jnp.asarray(np.triu(np.ones((blocks, blocks), np.float32), 1))
    rank = (within + before[..., None]).reshape(B, blocks * block)[:, :n].astype(jnp.int32) - 1
    out = jnp.full((B, capacity), fill, jnp.int32)
    rows = lax.broadcasted_iota(jnp.int32, (B, n), 0)
    return (out.at[rows, jnp.where(flags, rank, capacity)].set(values, mode="drop"),
            rank[:, -1] + 1)
