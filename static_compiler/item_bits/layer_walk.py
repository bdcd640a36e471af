"""How liveness crosses one layer of a trie from its children's bits
(`child_live`), for `static_compiler.item_bits.liveness`: unary layers share their
children's bits; every other layer is crossed over packed bits by a compiled
kernel (`static_compiler.item_bits.bit_kernels`: near-unary layers copy the
stretches between their exceptions a word at a time, others test each row),
a range of `WALK_CHUNK` states at a time on `WALK_THREADS` threads, so a
1e9-state walk holds no bool or int64 array per state (`PackedBits`); `pack`
and `words` give a depth's bits as the uint32 words a `Subset` holds.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.item_bits.layers import LayerWalk, NearRows, row_range
from static_compiler.support.arrays import search_sorted
from static_compiler.support.threads import THREADS, on_threads

WALK_CHUNK = 1 << 22
"""A layer walked in ranges of this many states (`child_live`): the
exceptions' rows or the row pointers read for a range stay those of one
range (an int64 per state: 8 GB at 1e9), and ranges go to threads when this
is a multiple of 64 (each then writes whole words of its own)."""


WALK_THREADS = THREADS
"""Ranges of a large layer walked at once (threads; `support.threads`)."""


PACK_CHUNK = 1 << 25
"""Bools `PackedBits.of` packs at a time (a multiple of 8)."""


ALIGN = 64
"""Bytes: where `aligned_zeros` starts an array's data."""


def aligned_zeros(nbytes: int) -> np.ndarray:
    """uint8 (nbytes,) zeros whose data starts on an ALIGN-byte boundary.
    jax puts such an array on a CPU device without copying it (an XLA
    buffer's alignment); numpy's large allocations start 16 bytes into a
    page, and `jax.device_put` copies those: a 1e9 subset's 470 MB of bits
    twice in memory, 0.25-1 s at its first decode."""
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


class PackedBits:
    """A bool array (n,) held as its bits, 1/8 of the bytes: what a walk
    across a layer writes (`child_live`) and the next reads, so a 1e9 walk
    holds no bool array per depth. data: uint8 (8 * ceil(n / 64),), bit s of
    byte s // 8 in little bit order (uint64 words, as `bit_kernels` reads
    them; `pack`'s uint32 words as bytes). Slicing `[a:b]` gives bools;
    `words(size)` the packed uint32 words."""

    def __init__(self, data: np.ndarray, n: int):
        self.data, self.shape = data, (int(n),)

    @classmethod
    def of(cls, bits: np.ndarray, room: Optional[int] = None) -> "PackedBits":
        """The bits of bools `bits` (n,), packed a chunk at a time (a 1e9
        item mask: no second whole-array temporary); room: see `zeros`."""
        n = bits.shape[0]
        data = cls.zeros(n, room).data
        for a in range(0, n, PACK_CHUNK):
            part = bits[a:a + PACK_CHUNK]
            data[a // 8:a // 8 + -(-part.shape[0] // 8)] = np.packbits(part, bitorder="little")
        return cls(data, n)

    @classmethod
    def zeros(cls, n: int, room: Optional[int] = None) -> "PackedBits":
        """n zero bits, their words sized for max(n, room) bits: a padded
        depth's `words(room)` is then a view, not a copy of its bits into
        fresh pages (1.1 s of a first subset at 1e9 with capacity). The
        words past n are never touched, so they cost no memory until read.
        The data starts on a 64-byte boundary (`aligned_zeros`)."""
        return cls(aligned_zeros(8 * -(-max(int(n), room or 0) // 64)), n)

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, _ = index.indices(self.shape[0])
        stop = max(start, stop)
        lo = start // 8
        bits = np.unpackbits(self.data[lo:(stop + 7) // 8], bitorder="little").view(bool)
        return bits[start - 8 * lo:stop - 8 * lo]

    def bools(self) -> np.ndarray:
        return self[:]

    def uint64(self) -> np.ndarray:
        """uint64 (ceil(n / 64),): the words themselves (a view)."""
        return self.data.view("<u8")

    def words(self, size: Optional[int] = None) -> np.ndarray:
        """uint32 (ceil(max(n, size) / 32),), as `pack(self.bools(), size)`."""
        need = 4 * -(-max(self.shape[0], size or 0) // 32)
        have = self.data.shape[0]
        data = self.data[:need] if need <= have else \
            np.concatenate([self.data, np.zeros(need - have, np.uint8)])
        return data.view("<u4").astype(np.uint32, copy=False)

    def __or__(self, other: np.ndarray) -> "PackedBits":
        """These bits or'ed with bools `other` (n,)."""
        theirs = PackedBits.of(other).data
        data = self.data.copy()
        data[:theirs.shape[0]] |= theirs
        return PackedBits(data, self.shape[0])


def bools(bits) -> np.ndarray:
    """bool (n,) of a bool array or `PackedBits`."""
    return bits.bools() if isinstance(bits, PackedBits) else bits


def words(bits, size: Optional[int] = None) -> np.ndarray:
    """uint32 words of a bool array or `PackedBits` (`pack`)."""
    return bits.words(size) if isinstance(bits, PackedBits) else pack(bits, size)


def child_live(layer, walk: LayerWalk, live_next, room: Optional[int] = None):
    """The states of `layer` with a live child (implicit targets: child e is
    state e of the next depth), from `live_next` (bools or `PackedBits`), as
    `PackedBits` (S,) with words for `room` states (`PackedBits.zeros`); may
    return `live_next` itself (a unary layer).

    A compiled kernel (`bit_kernels`) crosses the layer over packed bits in
    one pass, a range of WALK_CHUNK states at a time on WALK_THREADS threads:
    a near-unary range copies the stretches between its exceptions a word at
    a time and tests the exceptions' rows (over a saved set's `NearRows`,
    reading its exception tables in place); any other tests each row."""
    if walk.kind == "unary":
        return live_next
    from static_compiler.item_bits import bit_kernels  # (numba: compiled on first use, cached)

    children = (live_next if isinstance(live_next, PackedBits)
                else PackedBits.of(live_next)).uint64()
    n, indptr = layer.num_states, layer.indptr
    result = PackedBits.zeros(n, room)
    out = result.uint64()

    def one_range(a: int, b: int) -> None:
        if walk.kind == "near" and isinstance(indptr, NearRows):  # the tables read in place
            lo, hi, states, starts, end_extra = indptr.exception_tables(a, b)
            bit_kernels.near_table_rows_any(children, out, a, b - a, states, starts, hi - lo,
                                            end_extra)
            indptr.release(lo, hi)
        elif walk.kind == "near":  # row pointers of the range's ends and exceptions only
            first, _, ids, starts, ends = _near_range(indptr, walk.exceptions, a, b)
            bit_kernels.near_rows_any(children, first, out, a, b - a, ids, starts, ends)
        else:
            bit_kernels.rows_any(children, row_range(indptr, a, b), out, a, b - a)

    in_ranges(n, one_range)
    return result


SPLIT_MIN = 1 << 16
"""`in_ranges` splits work of at least twice this many states over its
threads even below its chunk (a 1e7 set's 4M-state layer: two ranges)."""


def in_ranges(n: int, run, chunk: Optional[int] = None) -> None:
    """run(a, b) for ranges [a, b) of `chunk` (default WALK_CHUNK) states
    covering [0, n), on WALK_THREADS threads when `chunk` is a multiple of
    64 (then ranges writing bits of their own states touch words of their
    own), else in order."""
    chunk = max(1, WALK_CHUNK if chunk is None else chunk)
    if chunk % 64 == 0 and n >= 2 * SPLIT_MIN:  # at least a range per thread
        chunk = min(chunk, max(SPLIT_MIN, -(-n // WALK_THREADS // 64) * 64))
    ranges = [(a, min(n, a + chunk)) for a in range(0, n, chunk)]
    threads = min(WALK_THREADS, len(ranges)) if chunk % 64 == 0 else 1
    if threads < 2:
        for a, b in ranges:
            run(a, b)
    else:
        on_threads(ranges, lambda share: [run(a, b) for a, b in share], threads)


def _near_range(indptr, ex: np.ndarray, a: int, b: int) -> tuple:
    """`NearRows.exception_range` of states a..b-1 of a near-unary layer
    with row pointers `indptr` (`NearRows`, or an array) and exceptions
    `ex` (ascending)."""
    if isinstance(indptr, NearRows):
        return indptr.exception_range(a, b)
    lo, hi = search_sorted(ex, [a, b])
    mine = ex[lo:hi].astype(np.int64)
    return (int(indptr[a]), int(indptr[b]), mine, indptr[mine].astype(np.int64),
            indptr[mine + 1].astype(np.int64))


def pack(bits: np.ndarray, size: Optional[int] = None) -> np.ndarray:
    """bool (S,) -> uint32 (ceil(size / 32),), bit s of word s // 32 =
    bits[s], 0 past S (size: default S; tables padded to a reserved
    capacity have more states than the trie)."""
    return PackedBits.of(bits).words(size)
