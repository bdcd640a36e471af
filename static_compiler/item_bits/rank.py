"""Rank over item bits, and each trie state's items as one range of them: the
numpy reference of a subset whose cost is its own item bits, not the trie's
states (issue 54).

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
* `RangeLayers` / `state_ranges`: the trie positions [lo, hi) of the items at
  or below states, from the layers' row pointers alone (no array per state):
  with A_d(x) the accepting states before state x at depth d (every state at
  the last depth accepts),

      lo(s) = offset(s) + G_d(s),   hi(s) = offset(s) + G_d(s + 1),
      G_d(x) = sum over d' >= d of A_d'(x_d'),  x_d = x, x_{d'+1} = indptr_d'[x_d'],
      offset(s) = sum over d' < d of A_d'(ancestor_d'(s) + 1),

  and a decoder carries offset down a beam: offset(child) = offset(s) +
  A_d(s + 1) (`child_offsets`). A fixed-length set has offset 0 and G the
  composed row pointers to the last depth. An accepting state's own item is
  at lo(s). A near_unary layer's row pointers come from `ExceptionRows`
  (a rank over a bit per state marking its exceptions: O(1), not a binary
  search), a unary layer's are the identity, a dense_rows layer's are
  computed once (S + 1 entries, 1/V of its table).

numpy only; importable by the serving loader (no compiler module).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits.layers import NearRows
from static_compiler.item_bits.state_order import InsertedOrder, item_order

BLOCK_BITS = 512
"""Bits per summary block (16 uint32 words): chosen by `tools.bench.rank`
(at 1e7 the summary costs ~0.2 ms over packing, 1/64 of the bits' bytes;
a query reads at most 16 words per bound)."""

_BLOCK64 = BLOCK_BITS // 64
_LANES = np.uint64(0x00FF00FF00FF00FF)
_SUM16 = np.uint64(0x0001000100010001)


def _block_counts(words64: np.ndarray) -> np.ndarray:
    """uint64 (..., blocks): set bits per block of `words64` uint64 (...,
    blocks * 8). Byte popcounts summed as four 16-bit lanes, then the lanes
    by one multiply (a block's count <= 512 fits 16 bits): no reduction over
    a small axis, which numpy runs an order of magnitude slower."""
    pc = np.bitwise_count(words64)  # uint8, one per word, 8 per block
    lanes = pc.view(np.uint64)  # (one uint64 per block: its 8 byte counts)
    pairs = (lanes & _LANES) + ((lanes >> np.uint64(8)) & _LANES)
    return (pairs * _SUM16) >> np.uint64(48)


def _word_counts(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(within uint16 (R, blocks * 16): set bits in its block before each
    word of `words` uint32 (R, blocks * 16); per block uint64 (R, blocks)).
    Word popcounts as uint16 lanes, four to a uint64: one multiply gives
    each lane the sum of the lanes below and at it, and the four groups of
    a block add their carries column by column (no scan over a small axis)."""
    R, blocks = words.shape[0], words.shape[1] // 16
    lanes = np.bitwise_count(words).astype(np.uint16).view(np.uint64).reshape(R, blocks, 4)
    upto = lanes * _SUM16
    totals = upto >> np.uint64(48)
    carry = np.zeros_like(totals)
    for g in range(1, 4):
        np.add(carry[..., g - 1], totals[..., g - 1], out=carry[..., g])
    within = (upto - lanes + carry * _SUM16).view(np.uint16).reshape(R, blocks * 16)
    return within, carry[..., 3] + totals[..., 3]


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
        for r in range(rows.shape[0]):  # (a row at a time: its words stay in cache, 2x faster)
            packed = np.packbits(rows[r], bitorder="little")
            data[r, :packed.shape[0]] = packed
            if cleared is not None:
                np.bitwise_and(words[r], ~cleared.words[0], out=words[r])
            out._summarize(r)
        return out

    @classmethod
    def of_words(cls, words, size: int, fine: bool = False) -> "ItemRanks":
        """The ranks of packed words uint32 (W,) or (R, W) (bit i of word
        i // 32, W >= ceil(size / 32)), read as `size` bits: those past
        `size` are ignored (cleared in the copy held)."""
        words = np.asarray(words)
        size = int(size)
        if words.dtype != np.uint32 or words.ndim not in (1, 2) or size < 0 or \
                words.shape[-1] * 32 < size:
            raise ConstraintSetError(f"ItemRanks.of_words: words have dtype {words.dtype} and "
                                     f"shape {words.shape} for {size} bits: expected uint32 "
                                     f"(W,) or (R, W) with W >= {-(-max(size, 0) // 32)}")
        rows = words.reshape(1, -1) if words.ndim == 1 else words
        blocks = size // BLOCK_BITS + 1
        held = np.zeros((rows.shape[0], blocks * BLOCK_BITS // 32), np.uint32)
        used = -(-size // 32)
        held[:, :used] = rows[:, :used]
        if size % 32:
            held[:, used - 1] &= np.uint32((1 << (size % 32)) - 1)
        out = cls._empty(rows.shape[0], blocks, size, fine, held)
        for r in range(rows.shape[0]):
            out._summarize(r)
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
        if self.within is not None:
            within, per_block = _word_counts(words)
            self.within[r] = within[0]
        else:
            per_block = _block_counts(words.view(np.uint64)).reshape(1, -1)
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


def trie_order(items, layers: Optional["RangeLayers"] = None) -> InsertedOrder:
    """Where the unique sequences of `items` (an `ItemIndex`) lie in trie
    order, as an `InsertedOrder` over positions 0..N'-1 (module doc). A
    fixed-length set's is its final states' (`state_order.item_order`). A
    variable-length set's needs its `layers`: each item's position is the
    lo of its end state (`state_ranges`, the offsets carried down every
    depth's states), computed once per index (O(states + N' depth)); ids in
    order but for the added ones list only those."""
    count = int(items.num_unique)
    if items.item_depth is None:
        order = item_order(items)
        if order is None:
            return InsertedOrder.empty(count)
        return order if isinstance(order, InsertedOrder) else InsertedOrder.of_array(order)
    if layers is None:
        raise ConstraintSetError("trie_order: a variable-length set's order needs its layers "
                                 "(`range_layers`)")
    depth = np.asarray(items.item_depth).astype(np.int64)
    state = np.asarray(items.item_state).astype(np.int64)
    position = np.zeros(count, np.int64)
    ending = set(np.unique(depth).tolist())
    offsets = np.zeros(1, np.int64)  # every state's at this depth, carried down (no searches)
    for d in range(layers.depth + 1):
        if d in ending:
            at = depth == d
            position[at] = state_ranges(layers, d, state[at], offsets[state[at]])[0]
        if d < layers.depth:
            branch = np.diff(np.asarray(layers.rows[d]).astype(np.int64))
            offsets = np.repeat(child_offsets(layers, d, offsets, np.arange(branch.shape[0])),
                                branch)
    held = np.empty(count, np.int64)
    held[position] = np.arange(count)  # position -> item
    return InsertedOrder.of_array(held)


@dataclasses.dataclass(frozen=True, eq=False)
class RankedSubset:
    """R item subsets as rank bits: items, `ItemRanks` (R, N') over item ids
    (removed items cleared); added, `ItemRanks` (R, K) over the K added
    items in trie order; at int64 (K,), their trie positions ascending
    (`trie_order`); fingerprint, the set's (as `Subset`'s: a decoder
    refuses a subset of another set), "" where not given. ``count(lo, hi)``
    over trie positions."""

    items: ItemRanks
    added: ItemRanks
    at: np.ndarray
    fingerprint: str = ""

    @property
    def nbytes(self) -> int:
        return self.items.nbytes + self.added.nbytes

    @property
    def num_subsets(self) -> int:
        return self.items.num_rows

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


class ExceptionRows:
    """The row pointers of a near_unary layer of S states in O(1) reads an
    entry: indptr[s] = s + extra(r), r = the exceptions below s (a fine
    rank over a bit per state marking the exceptions), extra(r) = the extra
    children of the exceptions before exception r, read from the tables as
    ex_starts[r] - ex_states[r] (r < X; indptr[S] - S at X). Where
    `layers.NearRows` binary-searches the X exceptions (log2 X dependent
    reads), this reads 5 entries, for S / 8 bytes (+ S / 16 of word counts)
    per layer: the near_unary layers of a names set are most of its depth.
    rows: the layer's `NearRows` (its tables and exception ids)."""

    def __init__(self, rows, num_states: int):
        self.states = rows.states  # (the X real exceptions' ids, ascending)
        self.starts = rows.tables["ex_starts"]
        marks = np.zeros(int(num_states), bool)
        marks[np.asarray(self.states).astype(np.int64)] = True
        self.exceptions = ItemRanks.of_mask(marks, fine=True)
        self.end = int(rows[int(num_states)]) - int(num_states)
        self.shape = (int(num_states) + 1,)

    def extra(self, r: np.ndarray) -> np.ndarray:
        """int64: extra(r) for exception counts r (ints in [0, X])."""
        count = int(self.states.shape[0])
        if count == 0:
            return np.full(np.shape(r), self.end, np.int64)
        at = np.minimum(r, count - 1)
        own = np.asarray(self.starts[at]).astype(np.int64) - \
            np.asarray(self.states[at]).astype(np.int64)
        return np.where(r < count, own, self.end)

    def __getitem__(self, index) -> np.ndarray:
        index = np.asarray(index, np.int64)
        return index + self.extra(self.exceptions.rank(index))

    def __array__(self, dtype=None, copy=None):
        whole = self[np.arange(self.shape[0])]
        return whole if dtype is None else whole.astype(dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class RangeLayers:
    """What `state_ranges` reads of a trie: rows, per layer d its row
    pointers (an array, or the `layers.UnitRows` / `layers.NearRows` a
    `TableLayer` answers entries of; dense_rows layers' computed once);
    accepting, per depth 0..depth-1 an `ItemRanks` (fine: three reads a
    rank) of its accepting bits or None (no state accepts);
    num_final_states."""

    rows: tuple
    accepting: tuple
    num_final_states: int

    @property
    def depth(self) -> int:
        return len(self.rows)

    def accepting_before(self, d: int, x: np.ndarray) -> Optional[np.ndarray]:
        """A_d(x): accepting states before x at depth d (None: none accept;
        the last depth: x)."""
        if d == self.depth:
            return x
        ranks = self.accepting[d]
        return None if ranks is None else ranks.rank(x)


def range_layers(layers: Sequence, num_final_states: int) -> RangeLayers:
    """The `RangeLayers` of a trie's `layers` (`TrieLayer`s, `ir.Layer`s or
    `TableLayer`s: implicit targets) ending in `num_final_states` states: a
    near_unary layer's rows as `ExceptionRows`."""
    rows, accepting = [], []
    for layer in layers:
        indptr = layer.indptr
        rows.append(ExceptionRows(indptr, layer.num_states) if isinstance(indptr, NearRows)
                    else indptr if hasattr(indptr, "range") or isinstance(indptr, np.ndarray)
                    else np.asarray(indptr))
        acc = layer.accepting
        accepting.append(None if acc is None or not np.any(acc) else
                         ItemRanks.of_mask(np.asarray(acc[:layer.num_states], bool), fine=True))
    return RangeLayers(tuple(rows), tuple(accepting), int(num_final_states))


def below(layers: RangeLayers, depth: int, states) -> np.ndarray:
    """G_depth(states), int64: the items ending at or below depth `depth`
    under the states before `states` (ints in [0, S_depth]), by composing
    row pointers down (one gather per layer and state; none for a unary
    layer's `UnitRows`)."""
    x = np.asarray(states, dtype=np.int64)
    total = np.zeros(x.shape, np.int64)
    for d in range(depth, layers.depth + 1):
        here = layers.accepting_before(d, x)
        if here is not None:
            total += here
        if d < layers.depth:
            x = np.asarray(layers.rows[d][x], dtype=np.int64)
    return total


def child_offsets(layers: RangeLayers, depth: int, offsets, states) -> np.ndarray:
    """The offsets of the children of `states` at `depth` whose own offsets
    are `offsets`: what a decoder carries down a beam (module doc)."""
    offsets = np.asarray(offsets, np.int64)
    here = layers.accepting_before(depth, np.asarray(states, np.int64) + 1)
    return offsets if here is None else offsets + here


def offsets_of(layers: RangeLayers, depth: int, states) -> np.ndarray:
    """offset(states) at `depth`, from their ancestors (a binary search per
    layer above: the host's way; a decoder carries it, `child_offsets`)."""
    x = np.asarray(states, dtype=np.int64)
    if all(a is None for a in layers.accepting[:depth]):
        return np.zeros(x.shape, np.int64)
    chain = [x]
    for d in range(depth - 1, -1, -1):
        chain.append(np.searchsorted(np.asarray(layers.rows[d]), chain[-1], side="right") - 1)
    out = np.zeros(x.shape, np.int64)
    for d, parent in zip(range(depth - 1, -1, -1), chain[1:]):
        out = child_offsets(layers, d, out, parent)
    return out


def state_ranges(layers: RangeLayers, depth: int, states, offsets=None) -> tuple:
    """(lo, hi) int64: the trie positions of the items at or below `states`
    (ints) at `depth` (0..depth of the trie), given their `offsets` (None:
    `offsets_of`). An accepting state's own item is at lo."""
    x = np.asarray(states, dtype=np.int64)
    base = offsets_of(layers, depth, x) if offsets is None else np.asarray(offsets, np.int64)
    bounds = below(layers, depth, np.stack([x, x + 1]))
    return base + bounds[0], base + bounds[1]


@dataclasses.dataclass(frozen=True, eq=False)
class DepthBounds:
    """The item ranges of every state at one depth, made once per set, for
    the shallow depths whose liveness bits a subset computes from its rank
    bits (`depth_live`: few states, many candidates per beam there). lo
    int64: S + 1 consecutive bounds where each state's range ends where the
    next one's starts (no item ends above this depth between them: every
    fixed-length set), hi None; else lo, hi int64 (S,)."""

    depth: int
    lo: np.ndarray
    hi: Optional[np.ndarray]

    @property
    def num_states(self) -> int:
        return int(self.lo.shape[0]) - (1 if self.hi is None else 0)


def depth_bounds(layers: RangeLayers, depth: int) -> DepthBounds:
    """The `DepthBounds` of every state at `depth` (1..layers.depth), the
    offsets carried down from the root (O(states above + S_depth x layers
    below))."""
    offsets = np.zeros(1, np.int64)
    for d in range(depth):
        rows = np.asarray(layers.rows[d]).astype(np.int64)
        offsets = np.repeat(child_offsets(layers, d, offsets, np.arange(rows.shape[0] - 1)),
                            np.diff(rows))
    count = int(offsets.shape[0])
    lo, hi = state_ranges(layers, depth, np.arange(count), offsets)
    if count == 0 or np.array_equal(lo[1:], hi[:-1]):
        edges = np.append(lo, hi[-1:]) if count else np.zeros(1, np.int64)
        return DepthBounds(depth, edges, None)
    return DepthBounds(depth, lo, hi)


def depth_live(ranked: RankedSubset, bounds: DepthBounds) -> np.ndarray:
    """bool (R, S): whether each state at `bounds.depth` has a selected item
    at or below it, in each of `ranked`'s rows: S + 1 (or 2 S) ranks a row,
    no walk up the trie (`liveness`'s bits of that depth)."""
    rows = np.arange(ranked.num_subsets)[:, None]
    if bounds.hi is None:
        ranks = ranked.prefix(bounds.lo[None, :], rows)
        return ranks[:, 1:] > ranks[:, :-1]
    return ranked.prefix(bounds.hi[None, :], rows) > ranked.prefix(bounds.lo[None, :], rows)
