"""The selected rows of a large set scattered into item bits by buckets
(numba only): what `item_masks.rows_item_bits` runs for a bool row mask,
or a filter's rows, once the item bits outgrow the caches (BUCKET_FROM
items).

Marking each selected row's item straight in the bits (`bit_kernels.
mark_selected_words`) is one read-modify-write of a random word of N'/8
bytes per selected row: at 1e9 items, 1e8 cache misses into 125 MB, ~6x
the time of reading the mask and the row -> item map once
(`tools.bench.row_order`). Here the selection is first packed into words
a chunk at a time on the threads (a filter evaluated as it is packed: no
bool per row is held) and counted; then each thread finds its chunks'
selected rows by their words' set bits and appends each row's item id to
the bucket of its item range (2^BUCKET_SHIFT items: 256 KiB of bits,
which a core's L2 holds), then the threads set the bits a bucket at a
time, each thread its own
buckets' ranges of the one output (no two threads write a word). The
appends are sequential writes to a few hundred streams, and each bucket's
bits are set while they are in cache.

Rows go in rounds of about ROUND_IDS selected rows (by the chunks'
counts), and each thread's buckets are made once, sized for the
round share that selects the most, and reused by every round: about 1.3 x
4 bytes x ROUND_IDS in all whatever the mask's density (fresh pages cost
this VM up to 2 s/GB). A bucket that fills anyway (a mask whose rows crowd
one item range) sends its thread's round to the direct marking into bits
of its own (setting a bit twice is harmless), or'ed in at the end: the
same bits, slower.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.item_bits import layer_walk
from static_compiler.item_bits.jit import njit, trailing_zeros, uint64
from static_compiler.support.mapped import release_pages
from static_compiler.support.threads import on_threads

BUCKET_SHIFT = 21
"""Items per bucket, as a power of two: 2^21 items are 256 KiB of bits
(measured at 1e9 items: 2^20 to 2^22 within the noise, 2^23 slower)."""

BUCKET_FROM = 1 << 26
"""Items from which a row mask is scattered by buckets (8 MiB of bits:
below, the bits stay in the caches and the direct marking is faster)."""

ROUND_IDS = 1 << 25
"""Selected rows per round (about): the buckets' memory, ~5 bytes an id
(172 MB at 2^25, against 250 MB of the direct marking's two threads' own
bits at 1e9; measured at 1e9: 2^25 and 2^26 alike, 2^24 ~15 % slower)."""

BUCKET_SLACK = 256
"""Ids a bucket holds beyond 1.3 x its even share of a round."""

ROUND_CHUNK = 1 << 22
"""Rows a thread packs and buckets at a time (its scratch: 4 bytes a row)."""


@njit(nogil=True, cache=True)
def bucket_selected(selected, ids, buckets, fill, capacity, shift):
    """Appends ids[r] for each set bit r of `selected` (uint64 words, rows
    packed by `bit_kernels.selection_words`; ids int (n,) >= 0) to bucket
    ids[r] >> shift: buckets of the ids' dtype (B * capacity,), bucket h at
    [h * capacity, (h + 1) * capacity), fill int64 (B,) its length. Returns
    False, with what it appended kept, when a bucket is full."""
    for w in range(selected.shape[0]):
        word = selected[w]
        base = w << 6
        while word:
            v = ids[base + trailing_zeros(word)]
            word &= word - uint64(1)
            h = v >> shift
            f = fill[h]
            if f == capacity:
                return False
            buckets[h * capacity + f] = v
            fill[h] = f + 1
    return True


@njit(nogil=True, cache=True)
def drain_buckets(buckets, fill, capacity, first, stop, out):
    """Sets bit v of `out` (uint64 words) for each id v in buckets [first,
    stop) (as `bucket_selected` filled them)."""
    for h in range(first, stop):
        base = h * capacity
        for j in range(fill[h]):
            v = buckets[base + j]
            out[v >> 6] |= uint64(1) << uint64(v & 63)


def scatter_by_buckets(selection, row_item, count: int, room: Optional[int],
                       threads: int, stale: Optional[np.ndarray] = None) -> layer_walk.PackedBits:
    """`PackedBits` (count,): bit row_item[i] set for each row i where
    selection[i] (bool (N,), or an `item_masks.RowSource` filled a chunk at
    a time: a filter's rows) and not stale[i] (bool (N,) or None), by
    buckets on `threads` threads (see the module doc); room as
    `PackedBits.zeros` takes it. row_item: int (N,) in [0, count), possibly
    memory-mapped. The selection is packed into words first, a chunk at a
    time on the threads (N/8 bytes: 125 MB at 1e9), and counted from them."""
    n = selection.shape[0] if isinstance(selection, np.ndarray) else selection.num_rows
    bits = layer_walk.PackedBits.zeros(count, room)
    num_buckets = ((count - 1) >> BUCKET_SHIFT) + 1 if count else 1
    starts = range(0, n, ROUND_CHUNK)
    words = np.empty((len(starts), -(-min(n, ROUND_CHUNK) // 64)), np.uint64)
    selected = _packed_chunks(selection, stale, n, words, threads)
    per_round = max(1, -(-ROUND_IDS * len(starts) // max(1, sum(selected))))  # (chunks)
    rounds = [[(c, starts[c], min(n, starts[c] + ROUND_CHUNK))
               for c in range(r, min(len(starts), r + per_round))]
              for r in range(0, len(starts), per_round)]
    # (each thread's buckets sized for the most its share of any round selects)
    most = max(sum(selected[r + i] for i in range(t, min(per_round, len(starts) - r), threads))
               for r in range(0, len(starts), per_round) for t in range(threads))
    scatter = _Scatter(words, row_item, num_buckets,
                       int(1.3 * most / num_buckets) + BUCKET_SLACK, count, room, threads)
    spans = [(h, min(num_buckets, h + 8)) for h in range(0, num_buckets, 8)]
    for chunks in rounds:
        on_threads(list(range(threads)), lambda ts, chunks=chunks: [
            scatter.fill_buckets(t, chunks[t::threads]) for t in ts], threads)
        on_threads(spans, lambda share: [
            drain_buckets(buckets, fill, scatter.capacity, first, stop, bits.uint64())
            for first, stop in share for buckets, fill in scatter.buckets], threads)
    for extra in scatter.own:
        if extra is not None:
            np.bitwise_or(bits.data, extra.data, out=bits.data)
    return bits


def _packed_chunks(selection, stale: Optional[np.ndarray], n: int, words: np.ndarray,
                   threads: int) -> list:
    """Fills words[c] with chunk c's selected rows (rows [c * ROUND_CHUNK,
    ...) packed by `bit_kernels.selection_words`, stale rows cleared) on
    threads; returns each chunk's count of selected rows."""
    from static_compiler.item_bits import bit_kernels

    lazy = not isinstance(selection, np.ndarray)

    def share(chunks) -> list:
        rows = np.empty(min(n, ROUND_CHUNK), bool) if lazy or stale is not None else None
        temporaries: list = []
        counts = []
        for c in chunks:
            a = c * ROUND_CHUNK
            b = min(n, a + ROUND_CHUNK)
            if lazy:
                picked = rows[:b - a]
                selection.fill(a, b, picked, temporaries)
            else:
                picked = selection[a:b]
            if stale is not None:
                picked = np.logical_and(picked, np.logical_not(stale[a:b]), out=rows[:b - a])
            packed = bit_kernels.selection_words(picked, words[c])
            words[c, packed.shape[0]:] = 0
            counts.append((c, int(np.bitwise_count(packed).sum(dtype=np.int64))))
        return counts

    done = on_threads(list(range(words.shape[0])), share, threads)
    return [k for _, k in sorted(pair for part in done for pair in part)]


class _Scatter:
    """`scatter_by_buckets`' state: each thread's buckets (capacity ids
    each) and fill, reused by every round, and its own bits once a bucket
    of it filled."""

    def __init__(self, words: np.ndarray, row_item, num_buckets: int, capacity: int,
                 count: int, room: Optional[int], threads: int):
        self.words, self.row_item = words, row_item
        self.capacity, self.count, self.room = capacity, count, room
        self.buckets = [(np.empty(num_buckets * capacity, row_item.dtype),
                         np.zeros(num_buckets, np.int64)) for _ in range(threads)]
        self.own: list = [None] * threads

    def fill_buckets(self, t: int, chunks: list) -> None:
        """Thread t's buckets emptied, then filled from `chunks` ((index,
        first row, stop) of the packed chunks); a full bucket sends that
        chunk again, and the rest, to its own bits (`own[t]`: setting a bit
        twice is harmless)."""
        from static_compiler.item_bits import bit_kernels

        buckets, fill = self.buckets[t]
        fill[:] = 0
        size = self.row_item.itemsize
        direct = False
        for c, a, b in chunks:
            selected = self.words[c]
            ids = np.asarray(self.row_item[a:b])
            if not direct and not bucket_selected(selected, ids, buckets, fill, self.capacity,
                                                  BUCKET_SHIFT):
                direct = True
            if direct:
                if self.own[t] is None:
                    self.own[t] = layer_walk.PackedBits.zeros(self.count, self.room)
                bit_kernels.mark_selected_words(selected, ids, self.own[t].uint64())
            release_pages(self.row_item, size * a, size * b)


def warm() -> None:
    """Loads (or compiles, the first time) the two kernels for the types
    `scatter_by_buckets` passes (int32 ids, read-only where mapped)."""
    ids = np.zeros(1, np.int32)
    mapped = ids.copy()
    mapped.flags.writeable = False
    for source in (ids, mapped):
        bucket_selected(np.zeros(1, np.uint64), source, np.zeros(1, np.int32),
                        np.zeros(1, np.int64), 1, BUCKET_SHIFT)
    drain_buckets(np.zeros(1, np.int32), np.zeros(1, np.int64), 1, 0, 1, np.zeros(1, np.uint64))
