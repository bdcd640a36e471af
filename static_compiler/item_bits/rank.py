"""Rank over item bits in trie order: the numpy reference of a subset whose
cost is its own item bits, not the trie's states (issue 54).

Trie order. A set's unique sequences sorted lexicographically, a prefix
before its extensions (the frontend's order, `frontend.sequences`), put the
items below any state in one contiguous range: the sequences that start with
the state's prefix. Without additions, item id u is trie position u. An
addition gives its items the next ids wherever they land, so trie position p
holds item p - #(at < p) except at the K listed positions `at`
(`state_order.InsertedOrder`, the same record a fixed-length set's final
states keep: there position = final state).

* `ItemRanks`: R bitmaps of `size` bits (uint32 words, bit i of word i // 32
  as `Subset`'s bits) with a uint32 count of the bits before each block of
  BLOCK_BITS (the summary: 1/64 of the bits' bytes at 512); ``count(lo, hi)``
  is two summary reads and two popcounts over at most one block's words;
  with ``fine``, also a uint16 count per word (N/16 bytes): three reads a
  rank (~3x fewer on a CPU, `tools.bench.rank`).
* `RankedSubset`: a subset as rank bits in item-id order (removed items
  cleared) and, after additions, the added items' bits in trie order:
  ``count(lo, hi)`` over trie positions.
Each trie state's items as one range of these positions, read from the
layers' row pointers: `trie_ranges`.

numpy only; importable by the serving loader (no compiler module).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits.placements import Placements
from static_compiler.item_bits.state_order import InsertedOrder
from static_compiler.support.threads import THREADS, on_threads, pack_in_spans

BLOCK_BITS = 512
"""Bits per summary block (16 uint32 words): chosen by `tools.bench.rank`
(at 1e7 the summary costs ~0.2 ms over packing, 1/64 of the bits' bytes;
a query reads at most 16 words per bound)."""

_THREADED_BITS = 1 << 20
"""Bits per row from which `ItemRanks.of_mask` packs stacked rows on
threads (below, a thread pool costs more than it saves)."""

_SPLIT_BITS = 1 << 24
"""Bits from which `ItemRanks.of_mask` packs one row in spans of this many
on threads (a 1e9 mask; below, one thread packs a row: the 1e7 row costs
more on a pool than it saves)."""

_BLOCK64 = BLOCK_BITS // 64
_SPAN_BLOCKS = 1 << 15
"""Blocks a thread counts at a time (`_word_counts`: 2 MiB of words)."""


def _word_counts(words: np.ndarray, within: Optional[np.ndarray] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(within uint16 (R, blocks * 16): set bits in its block before each
    word of `words` uint32 (R, blocks * 16), written into `within` where
    given (C-contiguous); per block uint64 (R, blocks)), by
    `rank_words.word_counts` (one pass; its numpy twin without numba),
    spans of blocks on threads."""
    from static_compiler.item_bits import rank_words  # (numba loaded on first use, not at import)
    R, blocks = words.shape[0], words.shape[1] // 16
    words = np.ascontiguousarray(words)
    within = np.empty(words.shape, np.uint16) if within is None else within
    per_block = np.empty((R, blocks), np.uint64)
    spans = [(r, a, min(_SPAN_BLOCKS, blocks - a)) for r in range(R)
             for a in range(0, blocks, _SPAN_BLOCKS)]

    def count(share) -> None:
        for r, a, n in share:
            rank_words.word_counts(words[r], within[r], per_block[r], a, n)

    on_threads(spans, count, THREADS if words.size >= 1 << 22 else 1)
    return within, per_block


@dataclasses.dataclass(frozen=True, eq=False)
class ItemRanks:
    """R bitmaps of `size` bits with a rank summary.

    words: uint32 (R, blocks * 16), bits past `size` zero; counts: uint32
    (int64 past 2^32 bits) (R, blocks + 1), the set bits before each block
    (counts[:, -1]: all of them); size: bits per row. blocks = size // 512
    + 1 (a zero bit past the last at least: position `size` lies in a word,
    below its bit 32, so a device reads it as any other);
    within: uint16 (R, blocks * 16), the set bits in its block before each
    word, or None. With it a rank reads three entries (block count, word
    count, word); without, the block's words (one 64-byte line): the
    measured trade in `tools.bench.rank` (N/16 more bytes for ~3x fewer
    reads per query on a CPU)."""

    words: np.ndarray
    counts: np.ndarray
    size: int
    within: Optional[np.ndarray] = None

    @property
    def num_rows(self) -> int:
        return int(self.words.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.words.nbytes + self.counts.nbytes +
                   (0 if self.within is None else self.within.nbytes))

    def totals(self) -> np.ndarray:
        """int64 (R,): set bits per row."""
        return self.counts[:, -1].astype(np.int64)

    @classmethod
    def of_mask(cls, mask, cleared: Optional["ItemRanks"] = None,
                fine: bool = False) -> "ItemRanks":
        """The ranks of bool `mask` (N,) or (R, N), less the bits set in
        `cleared` (an `ItemRanks` of one row and N bits, or None): packed,
        the summary counted once; with `fine`, also `within`."""
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.ndim not in (1, 2):
            raise ConstraintSetError(f"ItemRanks.of_mask: mask has dtype {mask.dtype} and shape "
                                     f"{mask.shape}: expected bool (N,) or (R, N)")
        rows = mask.reshape(1, -1) if mask.ndim == 1 else mask
        size = int(rows.shape[1])
        if cleared is not None and cleared.size != size:
            raise ConstraintSetError(f"ItemRanks.of_mask: cleared has {cleared.size} bits: "
                                     f"expected {size}")
        blocks = size // BLOCK_BITS + 1
        data = np.zeros((rows.shape[0], blocks * BLOCK_BITS // 8), np.uint8)
        words = data.view(np.uint32)
        out = cls._empty(rows.shape[0], blocks, size, fine, words)
        def pack(share) -> None:  # (a row at a time: its words stay in cache, 2x faster)
            for r in share:
                packed = np.packbits(rows[r], bitorder="little")
                data[r, :packed.shape[0]] = packed
                if cleared is not None:
                    np.bitwise_and(words[r], ~cleared.words[0], out=words[r])
                out._summarize(r)

        if rows.shape[0] == 1 and size >= _SPLIT_BITS:  # (one huge row: spans on threads)
            pack_in_spans(size, _SPLIT_BITS, lambda a, b, _own: rows[0, a:b], data[0])
            if cleared is not None:
                np.bitwise_and(words[0], ~cleared.words[0], out=words[0])
            out._summarize(0)
            return out
        # stacked rows of a large set on threads, each its own rows (numpy releases the GIL)
        many = rows.shape[0] > 1 and size >= _THREADED_BITS
        on_threads(range(rows.shape[0]), pack, THREADS if many else 1)
        return out

    @classmethod
    def of_words(cls, words, size: int, fine: bool = False, adopt: bool = False) -> "ItemRanks":
        """The ranks of packed words uint32 (W,) or (R, W) (bit i of word
        i // 32, W >= ceil(size / 32)), read as `size` bits: those past
        `size` are ignored (cleared in the copy held). adopt: the caller
        gives `words` up (a fresh array of its own): held as they are, no
        copy, where they are C-contiguous and W is blocks * 16 (packed
        bits with the room `words_for(size)`), the bits past `size` cleared
        in place."""
        words = np.asarray(words)
        size = int(size)
        if words.dtype != np.uint32 or words.ndim not in (1, 2) or size < 0 or \
                words.shape[-1] * 32 < size:
            raise ConstraintSetError(f"ItemRanks.of_words: words have dtype {words.dtype} and "
                                     f"shape {words.shape} for {size} bits: expected uint32 "
                                     f"(W,) or (R, W) with W >= {-(-max(size, 0) // 32)}")
        rows = words.reshape(1, -1) if words.ndim == 1 else words
        blocks = size // BLOCK_BITS + 1
        used = -(-size // 32)
        if adopt and rows.shape[1] == blocks * BLOCK_BITS // 32 and rows.flags.c_contiguous and \
                rows.flags.writeable:
            held = rows
            held[:, used:] = 0
        else:
            held = np.zeros((rows.shape[0], blocks * BLOCK_BITS // 32), np.uint32)
            held[:, :used] = rows[:, :used]
        if size % 32:
            held[:, used - 1] &= np.uint32((1 << (size % 32)) - 1)
        out = cls._empty(rows.shape[0], blocks, size, fine, held)
        for r in range(rows.shape[0]):
            out._summarize(r)
        return out

    @classmethod
    def of_positions(cls, positions, size: int, fine: bool = False) -> "ItemRanks":
        """The ranks of one row of `size` bits set at `positions` (ints in
        [0, size), ascending, no repeats: a near_unary layer's exception
        states): the words written from the positions (O(X + size / 32),
        no bool (size,) mask: at 1e9 states a fresh gigabyte costs this VM
        seconds in page faults)."""
        from static_compiler.item_bits import rank_words
        at = np.asarray(positions)
        size = int(size)
        blocks = size // BLOCK_BITS + 1
        words = np.zeros((1, blocks * BLOCK_BITS // 32), np.uint32)
        if at.ndim != 1 or (at.size and (at.dtype.kind not in "iu" or
                                         rank_words.position_words(at, size, words[0]) >= 0)):
            raise ConstraintSetError(f"ItemRanks.of_positions: positions (dtype {at.dtype}, "
                                     f"shape {at.shape}): expected ascending distinct ints in "
                                     f"[0, {size})")
        out = cls._empty(1, blocks, size, fine, words)
        out._summarize(0)
        return out

    @classmethod
    def _empty(cls, R: int, blocks: int, size: int, fine: bool, words: np.ndarray) -> "ItemRanks":
        """`words` with a summary to fill (`_summarize`)."""
        dtype = np.uint32 if size < 1 << 32 else np.int64
        return cls(words, np.zeros((R, blocks + 1), dtype), size,
                   np.zeros(words.shape, np.uint16) if fine else None)

    def _summarize(self, r: int) -> None:
        """Counts row r's summary (and word counts) from its words."""
        words = self.words[r:r + 1]
        if self.within is not None:  # (written in place: no second N/16 bytes)
            _, per_block = _word_counts(words, self.within[r:r + 1])
        else:
            from static_compiler.item_bits import rank_words
            per_block = rank_words.block_counts(words.view(np.uint64)).reshape(1, -1)
        np.cumsum(per_block[0], out=self.counts[r, 1:], dtype=self.counts.dtype)

    @classmethod
    def stack(cls, ranks: Sequence["ItemRanks"]) -> "ItemRanks":
        """Rows of equal-size `ranks` of one layout, in order, as one."""
        sizes, fine = {r.size for r in ranks}, {r.within is None for r in ranks}
        if len(sizes) != 1 or len(fine) != 1:
            raise ConstraintSetError(f"ItemRanks.stack: sizes {sorted(sizes)}, word counts held "
                                     f"{sorted(not f for f in fine)}: expected one of each")
        within = None if fine.pop() else np.concatenate([r.within for r in ranks])
        return cls(np.concatenate([r.words for r in ranks]),
                   np.concatenate([r.counts for r in ranks]), sizes.pop(), within)

    def rank(self, at, row=0) -> np.ndarray:
        """int64 (shape of `at`): set bits before position `at` (ints in
        [0, size]) of row `row` (ints in [0, R), broadcast with `at`)."""
        at = np.asarray(at, dtype=np.int64)
        row = np.broadcast_to(np.asarray(row, dtype=np.int64), at.shape)
        if at.size and (at.min() < 0 or at.max() > self.size):
            raise ConstraintSetError(f"ItemRanks.rank: positions in [{at.min()}, {at.max()}]: "
                                     f"expected [0, {self.size}]")
        blocks = self.counts.shape[1] - 1
        if self.within is not None:  # block count + word count + one word
            word = np.minimum(at >> 5, 16 * blocks - 1)  # (at == 512 * blocks: the last word, whole)
            bits = (at - 32 * word).astype(np.uint64)
            keep = ((np.uint64(1) << bits) - np.uint64(1)).astype(np.uint32)
            return self.counts[row, word >> 4].astype(np.int64) + \
                self.within[row, word].astype(np.int64) + \
                np.bitwise_count(self.words[row, word] & keep).astype(np.int64)
        block = np.minimum(at // BLOCK_BITS, blocks - 1)  # (at == 512 * blocks: a whole block)
        inside = at - block * BLOCK_BITS  # in [0, 512]
        words64 = self.words.view(np.uint64)
        window = words64[row[..., None], block[..., None] * _BLOCK64 + np.arange(_BLOCK64)]
        bits = np.clip(inside[..., None] - 64 * np.arange(_BLOCK64), 0, 64).astype(np.uint64)
        keep = np.where(bits >= 64, ~np.uint64(0),
                        (np.uint64(1) << np.minimum(bits, 63)) - np.uint64(1))
        partial = np.bitwise_count(window & keep).sum(axis=-1, dtype=np.int64)
        return self.counts[row, block].astype(np.int64) + partial

    def count(self, lo, hi, row=0) -> np.ndarray:
        """int64: set bits in [lo, hi) (0 <= lo <= hi <= size; broadcast
        with `row`)."""
        lo, hi = np.broadcast_arrays(np.asarray(lo, np.int64), np.asarray(hi, np.int64))
        if np.any(lo > hi):
            raise ConstraintSetError("ItemRanks.count: a range has lo > hi")
        return self.rank(hi, row) - self.rank(lo, row)


@dataclasses.dataclass(frozen=True, eq=False)
class RankedSubset:
    """R item subsets as rank bits: items, `ItemRanks` (R, N') over item ids
    (removed items cleared); added, `ItemRanks` (R, K) over the K added
    items in trie order; at int64 (K,), their trie positions ascending
    (`trie_order`); fingerprint, the set's (as `Subset`'s: a decoder
    refuses a subset of another set), "" where not given; placements, its
    device copies (`item_bits.placements`, as a `Subset`'s). ``count(lo,
    hi)`` over trie positions."""

    items: ItemRanks
    added: ItemRanks
    at: np.ndarray
    fingerprint: str = ""
    placements: Placements = dataclasses.field(default_factory=Placements, init=False,
                                               repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return self.items.nbytes + self.added.nbytes

    @property
    def num_subsets(self) -> int:
        return self.items.num_rows

    @property
    def sizes(self) -> np.ndarray:
        """int64 (R,): the items in each subset (`Subset.sizes`): the
        selected items at every trie position (an added item's bit in
        `items` is never read: its position reads `added`)."""
        return self.prefix(np.full(self.num_subsets, self.items.size), np.arange(self.num_subsets))

    @classmethod
    def stack(cls, subsets: Sequence["RankedSubset"]) -> "RankedSubset":
        """Rows of `subsets` of one set (equal positions `at` and
        fingerprints), in order, as one (per-row subsets of a batch)."""
        subsets = list(subsets)
        if not subsets or not all(isinstance(s, RankedSubset) for s in subsets):
            raise ConstraintSetError(f"RankedSubset.stack: expected a non-empty list of "
                                     f"RankedSubset, got {[type(s).__name__ for s in subsets]}")
        prints = {s.fingerprint for s in subsets}
        if len(prints) != 1 or any(not np.array_equal(s.at, subsets[0].at) for s in subsets):
            raise ConstraintSetError(f"RankedSubset.stack: the subsets come from different sets "
                                     f"(fingerprints {sorted(prints)}, added positions "
                                     f"{sorted({s.at.shape[0] for s in subsets})})")
        return cls(ItemRanks.stack([s.items for s in subsets]),
                   ItemRanks.stack([s.added for s in subsets]), subsets[0].at, prints.pop())

    def prefix(self, positions, row=0) -> np.ndarray:
        """int64: selected items at trie positions before `positions` (ints
        in [0, N']): `count(0, positions)`, one rank per bitmap."""
        at, row = np.broadcast_arrays(np.asarray(positions, np.int64), np.asarray(row, np.int64))
        j = np.searchsorted(self.at, at)
        out = self.items.rank(at - j, row)
        return out + self.added.rank(j, row) if self.at.shape[0] else out

    def count(self, lo, hi, row=0) -> np.ndarray:
        """int64: selected items at trie positions [lo, hi)."""
        lo, hi = np.broadcast_arrays(np.asarray(lo, np.int64), np.asarray(hi, np.int64))
        j_lo, j_hi = np.searchsorted(self.at, lo), np.searchsorted(self.at, hi)
        out = self.items.count(lo - j_lo, hi - j_hi, row)
        if self.at.shape[0]:
            out = out + self.added.count(j_lo, j_hi, row)
        return out


def words_for(size: int) -> int:
    """Bits an `ItemRanks` row of `size` bits holds (blocks * BLOCK_BITS):
    packed bits with this room are adopted by `ItemRanks.of_words`."""
    return (int(size) // BLOCK_BITS + 1) * BLOCK_BITS


def ranked_subset(item_live, order: InsertedOrder, removed=None,
                  fine: bool = False, fingerprint: str = "") -> RankedSubset:
    """The `RankedSubset` of bool `item_live` (N',) or (R, N') over item ids,
    less `removed` (bool (N',), its `ItemRanks` made once per index, or
    None), in trie order `order`; `fine` as `ItemRanks.of_mask`; the set's
    `fingerprint`. Its cost: the mask packed and summarized, and K gathers
    for the added items."""
    live = np.asarray(item_live)
    if live.dtype != bool or live.ndim not in (1, 2) or live.shape[-1] != order.count:
        raise ConstraintSetError(f"ranked_subset: item_live has dtype {live.dtype} and shape "
                                 f"{live.shape}: expected bool (N',) or (R, N') with N' = "
                                 f"{order.count}")
    if removed is not None and not isinstance(removed, ItemRanks):
        removed = ItemRanks.of_mask(np.asarray(removed, bool))
    rows = live.reshape(1, -1) if live.ndim == 1 else live
    picked = rows[:, order.item]
    if removed is not None and order.item.shape[0]:
        gone = np.asarray(removed.words[0]).view(np.uint8)
        ids = np.asarray(order.item, np.int64)
        picked = picked & ((gone[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1 == 0)
    return RankedSubset(ItemRanks.of_mask(rows, removed, fine), ItemRanks.of_mask(picked, None, fine),
                        np.asarray(order.at, np.int64), fingerprint)




def ranked_subset_of_words(words, order: InsertedOrder, removed: Optional[ItemRanks] = None,
                           fine: bool = False, fingerprint: str = "",
                           adopt: bool = False) -> RankedSubset:
    """`ranked_subset` of item bits already packed: uint32 words (R, W),
    bit i of word i // 32 item i (W >= ceil(N' / 32); `layer_walk.
    PackedBits` words, as a row selection's scatter writes them), cleared
    of `removed` (an `ItemRanks` of one row and N' bits, or None) in the
    copy held: no unpacking, no second packing. adopt: as
    `ItemRanks.of_words` (the words, given up, held without a copy)."""
    words = np.asarray(words)
    count = int(order.count)
    if words.dtype != np.uint32 or words.ndim != 2 or words.shape[1] * 32 < count:
        raise ConstraintSetError(f"ranked_subset_of_words: words have dtype {words.dtype} and "
                                 f"shape {words.shape}: expected uint32 (R, W), W >= "
                                 f"{-(-count // 32)}")
    if removed is not None and removed.size != count:
        raise ConstraintSetError(f"ranked_subset_of_words: removed has {removed.size} bits: "
                                 f"expected {count}")
    ids = np.asarray(order.item, np.int64)
    picked = ((words.view(np.uint8)[:, ids >> 3] >> (ids & 7).astype(np.uint8)) & 1).astype(bool)
    items = ItemRanks.of_words(words, count, fine=fine, adopt=adopt)
    if removed is not None:  # (the copy held is ours: cleared in place, then counted again)
        used = -(-count // 32)
        np.bitwise_and(items.words[:, :used], ~removed.words[0, :used], out=items.words[:, :used])
        for r in range(items.num_rows):
            items._summarize(r)
    if removed is not None and ids.shape[0]:
        gone = removed.words[0].view(np.uint8)
        picked &= ((gone[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1) == 0
    return RankedSubset(items, ItemRanks.of_mask(picked, None, fine), np.asarray(order.at, np.int64),
                        fingerprint)
