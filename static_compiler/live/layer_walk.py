"""How liveness crosses one layer of a trie from its children's bits
(`child_live`), for `static_compiler.live.liveness`: unary layers share their
children's bits, near-unary layers copy the stretches between their
exceptions, others take a running count over the edges. A layer of more than
`WALK_CHUNK` states or children is walked a range of states at a time, on
`WALK_THREADS` threads, writing packed bits as it goes (`PackedBits`), so a
1e9-state walk holds no bool or int64 array per state; `pack` and `words`
give a depth's bits as the uint32 words a `Subset` holds.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from static_compiler.live.layers import LayerWalk, NearRows, TrieLayer, row_range, state_ranges

SLICE_MAX_EXCEPTIONS = 1 << 16
"""Up to this many exceptions, a near-unary layer copies the stretches
between them (a Python loop over stretches); past it, one gather."""


WALK_CHUNK = 1 << 22
"""A layer with more states or children than this is walked this many at a
time (`_child_live_by_chunks`): the temporaries of a gather or a running
count (an int64 per state: 8 GB at 1e9) stay those of one chunk."""


class PackedBits:
    """A bool array (n,) held as its bits, 1/8 of the bytes: what a walk over
    a large layer writes (`_child_live_by_chunks`) and the next reads, so a
    1e9 walk holds no bool array per depth. data: uint8 (4 * ceil(n / 32),),
    bit s of byte s // 8 in little bit order (`pack`'s words, as bytes).
    Slicing `[a:b]` gives bools; `words(size)` the packed words."""

    def __init__(self, data: np.ndarray, n: int):
        self.data, self.shape = data, (int(n),)

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, _ = index.indices(self.shape[0])
        stop = max(start, stop)
        lo = start // 8
        bits = np.unpackbits(self.data[lo:(stop + 7) // 8], bitorder="little").view(bool)
        return bits[start - 8 * lo:stop - 8 * lo]

    def bools(self) -> np.ndarray:
        return self[:]

    def words(self, size: Optional[int] = None) -> np.ndarray:
        """uint32 (ceil(max(n, size) / 32),), as `pack(self.bools(), size)`."""
        need = 4 * -(-max(self.shape[0], size or 0) // 32)
        data = self.data if need == self.data.shape[0] else \
            np.concatenate([self.data, np.zeros(need - self.data.shape[0], np.uint8)])
        return data.view("<u4").astype(np.uint32, copy=False)

    def __or__(self, other: np.ndarray) -> "PackedBits":
        """These bits or'ed with bools `other` (n,)."""
        return PackedBits(self.data | pack(other, 32 * (self.data.shape[0] // 4)).view(np.uint8),
                          self.shape[0])


class _BitWriter:
    """Writes n bools front to back, a piece at a time, into a `PackedBits`
    (bits short of a byte wait for the next piece)."""

    def __init__(self, n: int):
        self.out = PackedBits(np.zeros(4 * -(-int(n) // 32), np.uint8), n)
        self.at, self.carry = 0, np.zeros(0, bool)

    def write(self, bits: np.ndarray) -> None:
        bits = np.concatenate([self.carry, bits]) if self.carry.size else bits
        full = bits.shape[0] // 8 * 8
        self.out.data[self.at // 8:(self.at + full) // 8] = np.packbits(bits[:full],
                                                                       bitorder="little")
        self.at, self.carry = self.at + full, bits[full:].copy()

    def close(self) -> PackedBits:
        if self.carry.size:
            self.out.data[self.at // 8] = np.packbits(self.carry, bitorder="little")[0]
        return self.out


def bools(bits) -> np.ndarray:
    """bool (n,) of a bool array or `PackedBits`."""
    return bits.bools() if isinstance(bits, PackedBits) else bits


def words(bits, size: Optional[int] = None) -> np.ndarray:
    """uint32 words of a bool array or `PackedBits` (`pack`)."""
    return bits.words(size) if isinstance(bits, PackedBits) else pack(bits, size)


def child_live(layer, walk: LayerWalk, live_next):
    """bool (S,) (a bool array, or `PackedBits` for a large layer): states
    of `layer` with a live child (implicit targets: child e is state e of
    the next depth), from `live_next` (either form). May return `live_next`
    itself."""
    if walk.kind == "unary":
        return live_next
    if max(layer.num_states, live_next.shape[0]) > WALK_CHUNK:
        return _child_live_by_chunks(layer, walk, live_next)
    return _child_live_at_once(layer, walk, bools(live_next))


def _child_live_at_once(layer, walk: LayerWalk, live_next: np.ndarray) -> np.ndarray:
    """`_child_live` of a non-unary layer in one pass over its arrays."""
    indptr = layer.indptr
    if walk.kind == "near":
        ex = walk.exceptions
        if ex.size <= SLICE_MAX_EXCEPTIONS:
            # Between two exceptions, states s take child indptr[s], which
            # advances with s: one slice copy per stretch, no gather.
            live = np.empty(layer.num_states, dtype=bool)
            first = np.concatenate([[0], ex + 1])
            last = np.concatenate([ex, [layer.num_states]])
            starts = np.asarray(indptr[first]).tolist()  # one read of the row pointers
            for a, b, c in zip(first.tolist(), last.tolist(), starts):
                if b > a:
                    live[a:b] = live_next[c:c + b - a]
        else:
            live = live_next[np.minimum(indptr[:-1], live_next.shape[0] - 1)]
        if ex.size:
            live[ex] = _any_in_rows(live_next, indptr[ex].astype(np.int64),
                                    indptr[ex + 1].astype(np.int64))
        return live
    # A running count of live children, wrapping in the walk's narrow dtype
    # (less memory to touch): a row's count is below the wrap, so its two
    # ends differ exactly when it has a live child.
    counts = np.empty(live_next.shape[0] + 1, dtype=walk.count_dtype)
    counts[0] = 0
    np.cumsum(live_next, dtype=walk.count_dtype, out=counts[1:])
    at = np.take(counts, indptr)  # one take: about half the time of two fancy indexings
    return at[1:] != at[:-1]


def _child_live_by_chunks(layer, walk: LayerWalk, live_next) -> PackedBits:
    """`_child_live` of a large layer, one range of states at a time: each
    range is a small layer of its own (its row pointers read, rebased to its
    first child; its exceptions), over the slice of `live_next` its children
    span, and its bits are packed as they come. Ranges hold at most
    WALK_CHUNK states and, past one wide row, about WALK_CHUNK children."""
    n, indptr = layer.num_states, layer.indptr
    ranges = state_ranges(n, WALK_CHUNK, indptr if walk.kind == "general" else None,
                          live_next.shape[0])
    ex = walk.exceptions

    def one_range(a: int, b: int) -> np.ndarray:
        if walk.kind == "near":  # row pointers of the range's ends and exceptions only
            first, last, mine, start, end = _near_range(indptr, ex, a, b)
            return _near_live(b - a, mine - a, start - first, end - first, live_next[first:last])
        rows = row_range(indptr, a, b)
        first, last = int(rows[0]), int(rows[-1])
        return _child_live_at_once(TrieLayer(rows - first), walk, live_next[first:last]) \
            if last > first else np.zeros(b - a, bool)

    live = _BitWriter(n)
    threads = min(WALK_THREADS, len(ranges))
    if threads < 2:
        for a, b in ranges:
            live.write(one_range(a, b))
        return live.close()
    # numpy lets go of the GIL in the copies, compresses and reductions of a
    # range: `threads` ranges at a time, written in order
    with ThreadPoolExecutor(threads) as pool:
        for i in range(0, len(ranges), threads):
            for bits in pool.map(lambda ab: one_range(*ab), ranges[i:i + threads]):
                live.write(bits)
    return live.close()


WALK_THREADS = min(4, os.cpu_count() or 1)
"""Ranges of a large layer walked at once (threads)."""


RANGE_SLICE_MAX = 1024
"""Up to this many exceptions in a range, `_near_live` copies the
stretches between them (a slice each); past it, one gather."""


def _near_range(indptr, ex: np.ndarray, a: int, b: int) -> tuple:
    """`NearRows.exception_range` of states a..b-1 of a near-unary layer
    with row pointers `indptr` (`NearRows`, or an array) and exceptions
    `ex` (ascending)."""
    if isinstance(indptr, NearRows):
        return indptr.exception_range(a, b)
    lo, hi = np.searchsorted(ex, np.array([a, b], dtype=ex.dtype))  # (no cast of ex)
    mine = ex[lo:hi].astype(np.int64)
    return (int(indptr[a]), int(indptr[b]), mine, indptr[mine].astype(np.int64),
            indptr[mine + 1].astype(np.int64))


def _near_live(n: int, ex: np.ndarray, start: np.ndarray, end: np.ndarray,
               children: np.ndarray) -> np.ndarray:
    """bool (n,): states 0..n-1 of a near-unary range with a live child,
    from its children's bits `children` (all of the range's, in order);
    ex int64: its exceptions (ascending), whose rows are [start, end) of
    `children`. The children of the other states, one each and in their
    order, are all but the exceptions' rows: a slice copy per stretch
    between exceptions (up to RANGE_SLICE_MAX of them), else one gather
    through an int32 offset per state (1.5x faster than compressing the
    bits at 4M states with 6 % exceptions)."""
    if not ex.size:
        return children  # one child each: the children's bits
    live = np.empty(n, dtype=bool)
    if ex.size <= RANGE_SLICE_MAX:  # few stretches: one slice copy each
        first = np.concatenate([[0], ex + 1])
        last = np.concatenate([ex, [n]])
        child = np.concatenate([[0], end])  # a stretch's first child follows an exception's row
        for a, b, c in zip(first.tolist(), last.tolist(), child.tolist()):
            if b > a:
                live[a:b] = children[c:c + b - a]
    elif children.shape[0]:
        # a stretch's states take consecutive children from the end of the
        # exception before it: one offset per stretch, repeated, then a
        # gather in a narrow index dtype (the exceptions' own entries are
        # overwritten below)
        dtype = np.int32 if max(n, children.shape[0]) < 2**31 else np.int64
        first_state = np.concatenate([[0], ex + 1])
        offset = np.repeat((np.concatenate([[0], end]) - first_state).astype(dtype),
                           np.diff(np.append(first_state, n)))
        offset += np.arange(n, dtype=dtype)
        np.minimum(offset, children.shape[0] - 1, out=offset)
        live = children[offset]
    else:
        live[:] = False  # (every state an exception without children)
    live[ex] = _any_in_rows(children, start, end)
    return live


def _any_in_rows(bits: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """bool (k,): whether bits[start[i]:end[i]] holds a True, for rows
    ascending and disjoint (empty ones too: False)."""
    bounds = np.empty(2 * start.size, dtype=np.int64)
    bounds[0::2], bounds[1::2] = start, end
    # Pairs [start, end) then [end, next start): keep the first of each.
    # reduceat takes indices below the length only: bounds are ascending,
    # so those equal to it trail, and dropping them makes the last kept
    # start reduce to the end (no padded copy).
    kept = int(np.searchsorted(bounds, bits.shape[0]))
    out = np.zeros(start.size, dtype=bool)
    if kept:
        reduced = np.maximum.reduceat(bits.view(np.uint8), bounds[:kept])
        out[:(kept + 1) // 2] = reduced[0::2].view(bool)
    return out & (end > start)


def pack(bits: np.ndarray, size: Optional[int] = None) -> np.ndarray:
    """bool (S,) -> uint32 (ceil(size / 32),), bit s of word s // 32 =
    bits[s], 0 past S (size: default S; tables padded to a reserved
    capacity have more states than the trie)."""
    words = -(-max(bits.shape[0], size or 0) // 32)
    packed = np.zeros(4 * words, dtype=np.uint8)
    packed[:(bits.shape[0] + 7) // 8] = np.packbits(bits, bitorder="little")
    return packed.view("<u4").astype(np.uint32, copy=False)
