"""The host loops' reads of a ranked subset (`torch_backend.rank_kernels`'
reads, a row at a time, for `host_kernels.processor`'s RANK_BITS mode): a
set's trie ranges packed once (`HostRanges`, `host_ranges`, with the bounds
below the states of its shallowest depths kept), and the numba functions
that count a subset row's selected items below a state (`ranked_run`,
`ranked_end`), every read clamped as the torch kernels clamp it.

numpy and numba (optional: `jit.AVAILABLE`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from static_compiler.host_kernels.jit import clamp as _clamp
from static_compiler.host_kernels.jit import njit

ROWS_UNARY, ROWS_INDEX, ROWS_EXCEPTIONS = 0, 1, 2
"""A layer's row pointers in `HostRanges`: the identity, an index array,
a near_unary layer's exception ranks (`trie_ranges.ExceptionRows`)."""

(COUNT, ROWS, PTR, PTR_N, EX_WORDS, EX_COUNTS, EX_SIZE, EXTRA, EXTRA_N, EX_STATES, EX_STARTS,
 EX_N, ACC_WORDS, ACC_COUNTS, ACC_SIZE, TOP, BELOW, AT, AT_N, ITEMS, FIELDS) = range(21)
"""Columns of `HostRanges.meta` (D + 1, FIELDS), row d per depth d: its
states; its row pointers' kind and where their pieces start in `ints`
(PTR; EXTRA, EX_STATES, EX_STARTS) and the exception marks' bitmap in
`words` / `counts` (EX_*); its accepting states' bitmap (ACC_SIZE -1:
none accepts); TOP, the first depth above d whose states accept (-1:
none, its states' offsets are 0); BELOW, where `ints` keeps the bound
below every state x in [0, S_d] (`_below` read once: -1, none kept).
Row D only: AT, AT_N, the added items' trie positions in `ints`; ITEMS,
the item bitmap's size (all N' items)."""


class HostRanges(NamedTuple):
    """A set's trie ranges (`torch_backend.rank_kernels.RangeTensors`'
    arrays) as the kernels read a ranked subset over them (`host_ranges`):
    meta int64 (D + 1, FIELDS); ints, every index array (row pointers,
    exceptions' extra counts, states and row starts, the added positions)
    in the ranges' index dtype (int32 or int64); the set's bitmaps
    (exception marks, accepting states) as one row: words int32 (1, n),
    within int16 (1, n), counts int64 (1, c)."""

    meta: np.ndarray
    ints: np.ndarray
    words: np.ndarray
    within: np.ndarray
    counts: np.ndarray


def host_ranges(rows, accepting, counts, at: np.ndarray, num_items: int,
                kept: int) -> HostRanges:
    """The `HostRanges` of a set, packed once (a copy of the set's range
    arrays, not of any subset's). rows, per layer: None (unary), an index
    array, or (words, within, counts, size, extra, states, starts): the
    exception marks' bitmap (words int32 (1, W), within int16 (1, W),
    counts ints (1, C), its bits) and the `ExceptionRows` pieces;
    accepting, per layer: None or (words, within, counts, size); counts:
    the states per depth 0..D; at: the added items' trie positions (the
    index dtype); kept: the most bounds to keep (`_below` of every state of
    depths 1, 2, ... while they fit: a shallow state has many children,
    each a walk down every layer below it otherwise)."""
    D = len(rows)
    meta = np.full((D + 1, FIELDS), -1, np.int64)
    parts: dict = {"ints": [], "words": [], "within": [], "counts": []}

    def put(name: str, a) -> int:
        """Appends a to `name`'s parts: where it starts."""
        start = sum(x.shape[0] for x in parts[name])
        parts[name].append(np.asarray(a).reshape(-1))
        return start

    def bitmap(d: int, columns: tuple, ranks: tuple) -> None:
        w, wi, c, size = ranks
        meta[d, columns[0]], meta[d, columns[1]] = put("words", w), put("counts", c)
        put("within", wi)
        meta[d, columns[2]] = size

    top = -1
    for d in range(D + 1):
        meta[d, COUNT], meta[d, TOP] = counts[d], top
        if d == D:
            break
        r = rows[d]
        meta[d, ROWS] = ROWS_UNARY if r is None else \
            ROWS_EXCEPTIONS if isinstance(r, tuple) else ROWS_INDEX
        if isinstance(r, tuple):
            bitmap(d, (EX_WORDS, EX_COUNTS, EX_SIZE), r[:4])
            meta[d, EXTRA], meta[d, EXTRA_N] = put("ints", r[4]), len(r[4])
            meta[d, EX_STATES], meta[d, EX_N] = put("ints", r[5]), len(r[5])
            meta[d, EX_STARTS] = put("ints", r[6])
        elif r is not None:
            meta[d, PTR], meta[d, PTR_N] = put("ints", r), len(r)
        if accepting[d] is not None:
            bitmap(d, (ACC_WORDS, ACC_COUNTS, ACC_SIZE), accepting[d])
            top = d if top < 0 else top
    meta[D, AT], meta[D, AT_N], meta[D, ITEMS] = put("ints", at), len(at), num_items
    flat = {name: np.concatenate(a) if a else np.zeros(0) for name, a in parts.items()}
    ranges = HostRanges(meta, np.ascontiguousarray(flat["ints"], np.asarray(at).dtype),
                        *(np.ascontiguousarray(flat[name], t)[None] for name, t in
                          (("words", np.int32), ("within", np.int16), ("counts", np.int64))))
    return _keep_bounds(ranges, kept)


def _keep_bounds(ranges: HostRanges, budget: int) -> HostRanges:
    """`ranges` keeping the bounds below every state of its depths 1, 2,
    ... while they fit in `budget` entries (`_below` read once each)."""
    meta = ranges.meta.copy()
    rk = (*ranges, *_NO_SUBSET_RANKS)  # (a subset's placeholders: the kernels' argument types)
    tables, start = [], ranges.ints.shape[0]
    for d in range(1, meta.shape[0] - 1):
        n = int(meta[d, COUNT]) + 1
        if n > budget:
            break
        tables.append(np.empty(n, ranges.ints.dtype))
        _below_table(rk, d, tables[-1])
        meta[d, BELOW], start, budget = start, start + n, budget - n
    return ranges._replace(meta=meta, ints=np.concatenate([ranges.ints, *tables]))


NO_META = np.full((1, FIELDS), -1, np.int64)
NO_WORDS = np.zeros((1, 0), np.int32)
NO_WITHIN = np.zeros((1, 0), np.int16)
NO_COUNTS = np.zeros((1, 0), np.int32)  # (a subset's, as placed below 2 ** 31 items: the
# kernels' types with and without a ranked subset are the same, compiled once)
NO_SUMS = np.zeros((1, 0), np.int64)
_NO_SUBSET_RANKS = (NO_WORDS, NO_WITHIN, NO_COUNTS, NO_WORDS, NO_WITHIN, NO_COUNTS,
                    np.zeros((1, 0), np.bool_))
"""No ranked subset's arrays (items, added, first): the kernels' argument types."""


# Ranked subsets: `torch_backend.rank_kernels`' reads, a row at a time, on explicit
# arrays (a set's: meta, ints, words, within, counts; a subset's: iw, iwi, ic over its
# items, aw, awi, ac over the added ones, first). rk: the HostSubset's twelve as one
# tuple, unpacked once per row (a tuple passed per candidate costs its arrays' refcounts).


@njit(nogil=True, cache=True, inline="always")
def _popcount32(v):
    """Set bits of v, an int64 holding 32 bits."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) & 0xFFFFFFFF) >> 24


@njit(nogil=True, cache=True, inline="always")
def _rank(words, within, counts, row, word0, count0, size, at):
    """Set bits before position `at` (clamped into [0, size]) of the
    bitmap in row `row` (clamped into [0, R)) of words / within (R, W) and
    counts (R, C) (`rank_kernels.rank_at`) whose words start at column
    word0 and block counts (a block: 16 words) at count0 (a set's bitmaps
    share one row; a subset's start at 0)."""
    W, C = words.shape[1], counts.shape[1]
    if W == 0 or C == 0:
        return np.int64(0)
    at = min(max(np.int64(at), 0), size)
    row = _clamp(row, words.shape[0])
    word = _clamp(word0 + (at >> 5), W)
    value = np.int64(words[row, word]) & 0xFFFFFFFF & ((np.int64(1) << (at & 31)) - 1)
    return (_popcount32(value) + np.int64(within[row, word])
            + np.int64(counts[row, _clamp(count0 + (at >> 9), C)]))


@njit(nogil=True, cache=True, inline="always")
def int_at(ints, start, n, i):
    """Entry i (clamped into [0, n)) of ints[start:start + n] (0 when it
    is empty, as a gather reads an empty table)."""
    if n <= 0:
        return np.int64(0)
    return np.int64(ints[start + _clamp(i, n)])


@njit(nogil=True, cache=True, inline="always")
def _search(ints, start, n, x, right):
    """searchsorted(ints[start:start + n], x) (ascending; right: side
    right)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        v = ints[start + mid]
        if v < x or (right and v == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True, inline="always")
def _accepting_before(meta, words, within, counts, d, x):
    """Accepting states at depth d (< D) before state x (0: none accepts)."""
    if meta[d, ACC_SIZE] < 0:
        return np.int64(0)
    return _rank(words, within, counts, 0, meta[d, ACC_WORDS], meta[d, ACC_COUNTS],
                 meta[d, ACC_SIZE], x)


@njit(nogil=True, cache=True)
def _below(meta, ints, words, within, counts, depth, x):
    """`rank_kernels.below` of one bound x at `depth` (clamped into [0,
    S_depth]): the items ending at or below `depth` under the states
    before x, the layers' row pointers composed down (`_bound`: or kept)."""
    D = meta.shape[0] - 1
    x = min(max(np.int64(x), 0), meta[depth, COUNT])
    total = np.int64(0)
    for d in range(depth, D):
        total += _accepting_before(meta, words, within, counts, d, x)
        if meta[d, ROWS] == ROWS_INDEX:
            x = int_at(ints, meta[d, PTR], meta[d, PTR_N], x)
        elif meta[d, ROWS] == ROWS_EXCEPTIONS:
            r = _rank(words, within, counts, 0, meta[d, EX_WORDS], meta[d, EX_COUNTS],
                      meta[d, EX_SIZE], x)
            x = x + int_at(ints, meta[d, EXTRA], meta[d, EXTRA_N], r)
    return total + x


@njit(nogil=True, cache=True)
def _bound(meta, ints, words, within, counts, depth, x):
    """`_below`, read from the bounds kept at `depth` (BELOW) if any."""
    if meta[depth, BELOW] >= 0:
        return np.int64(ints[meta[depth, BELOW] + min(max(np.int64(x), 0), meta[depth, COUNT])])
    return _below(meta, ints, words, within, counts, depth, x)


@njit(nogil=True, cache=True)
def _below_table(rk, depth, out):
    """out[x] = `_below` of every state x in [0, S_depth] (out: S_depth + 1)."""
    meta, ints, words, within, counts = rk[:5]
    for x in range(out.shape[0]):
        out[x] = _below(meta, ints, words, within, counts, depth, x)


@njit(nogil=True, cache=True, inline="always")
def _selected_before(meta, ints, iw, iwi, ic, aw, awi, ac, row, position):
    """`rank_kernels.selected_before`: the selected items of the row's
    subset at trie positions before `position` (the added items' bits
    read at their positions `at`)."""
    D = meta.shape[0] - 1
    K = meta[D, AT_N]
    if K <= 0:
        return _rank(iw, iwi, ic, row, 0, 0, meta[D, ITEMS], position)
    j = _search(ints, meta[D, AT], K, position, False)
    return _rank(iw, iwi, ic, row, 0, 0, meta[D, ITEMS], position - j) + \
        _rank(aw, awi, ac, row, 0, 0, K, j)


@njit(nogil=True, cache=True)
def offsets_of(rk, step, s):
    """(own, children's): a ranked subset's offsets of state s at depth
    `step` (`rank_kernels.node_offsets`: the accepting states before its
    ancestors, a search up a layer per depth; 0 where no item ends above)
    and of its children (`rank_kernels.child_offsets`)."""
    meta, ints, words, within, counts = rk[:5]
    own = np.int64(0)
    top = meta[step, TOP]
    x = min(max(np.int64(s), 0), max(meta[step, COUNT] - 1, 0))
    for d in range(step - 1, top - 1 if top >= 0 else step - 1, -1):
        if meta[d, ROWS] == ROWS_EXCEPTIONS:  # row s starts at s + extra(exceptions below s)
            X = meta[d, EX_N]
            j = _search(ints, meta[d, EX_STARTS], X, x, True)
            shift = int_at(ints, meta[d, EXTRA], meta[d, EXTRA_N], j)
            last = int_at(ints, meta[d, EX_STATES], X, j - 1)
            x = last if j > 0 and x < last + 1 + shift else x - shift
        elif meta[d, ROWS] == ROWS_INDEX:
            x = _search(ints, meta[d, PTR], meta[d, PTR_N], x, True) - 1
        x = min(max(x, 0), max(meta[d, COUNT] - 1, 0))
        own += _accepting_before(meta, words, within, counts, d, x + 1)
    if step >= meta.shape[0] - 1:
        return own, own
    return own, own + _accepting_before(meta, words, within, counts, step,
                                        min(max(np.int64(s) + 1, 0), meta[step, COUNT]))


@njit(nogil=True, cache=True)
def ranked_run(rk, row, step, t0, n, off, out):
    """out[j] for j < n: whether state t0 + j at depth step + 1 has a
    selected item in the row's subset (its offset `off`): n + 1 bounds,
    each read once (`rank_kernels.child_live`, consecutive); at step 0,
    the depth-1 states' bits made when placed (`RankedLive.first`)."""
    meta, ints, words, within, counts, iw, iwi, ic, aw, awi, ac, first = rk
    if step == 0:
        r = _clamp(row, first.shape[0])
        for j in range(n):
            t = t0 + j
            out[j] = 0 <= t < first.shape[1] and first[r, t]
        return
    before = _selected_before(meta, ints, iw, iwi, ic, aw, awi, ac, row,
                              _bound(meta, ints, words, within, counts, step + 1, t0) + off)
    for j in range(n):
        upto = _selected_before(meta, ints, iw, iwi, ic, aw, awi, ac, row, off + _bound(
            meta, ints, words, within, counts, step + 1, t0 + j + 1))
        out[j] = upto > before
        before = upto


@njit(nogil=True, cache=True)
def ranked_end(rk, row, step, s, own):
    """`rank_kernels.end_live` of state s at depth `step` (its offset
    `own`): s accepts and its item is in the row's subset."""
    meta, ints, words, within, counts, iw, iwi, ic, aw, awi, ac, _ = rk
    if s < 0 or s >= meta[step, COUNT]:
        return False
    if step < meta.shape[0] - 1 and (meta[step, ACC_SIZE] < 0 or _accepting_before(
            meta, words, within, counts, step, s + 1) <= _accepting_before(
            meta, words, within, counts, step, s)):
        return False
    lo = _bound(meta, ints, words, within, counts, step, s) + own
    return _selected_before(meta, ints, iw, iwi, ic, aw, awi, ac, row, lo + 1) > \
        _selected_before(meta, ints, iw, iwi, ic, aw, awi, ac, row, lo)
