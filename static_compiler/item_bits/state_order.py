"""The items of a fixed-length set's final states, after additions, held as
the additions alone.

A fixed-length set's unique sequence u ends in final state u when it is
built (items and final states are both in sorted order). An addition inserts
new final states between the old ones and gives their items the next ids, so
the order of the older items never changes: the final states hold the ids
0, 1, 2, ... in order, except at the states where added items went. So
`InsertedOrder` keeps those states and their items, K entries for K added
items, instead of one int32 per final state (4 GB at 1e9, read whole by each
first subset: 2.3 s from disk here).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from static_compiler.item_bits import layer_walk
from static_compiler.support.mapped import release_pages


class InsertedOrder(NamedTuple):
    """Final state f holds item item[j] where f == at[j], else item
    f - #(at < f). at int32 (K,) ascending in [0, count); item int32 (K,)
    (the ids count - K .. count - 1 in some order); count: final states."""

    at: np.ndarray
    item: np.ndarray
    count: int

    @classmethod
    def empty(cls, count: int) -> "InsertedOrder":
        none = np.zeros(0, np.int32)
        return cls(none, none, int(count))

    @classmethod
    def of_array(cls, state_item, chunk: int = 1 << 24) -> "InsertedOrder":
        """The same order from `state_item` int (S,) (possibly memory-mapped,
        read a chunk at a time): an artifact of format version 8. Any
        permutation has one: the entries that continue 0, 1, 2, ... are the
        ones in order, the others are listed."""
        from static_compiler.item_bits import bit_kernels
        at, expected = [], 0
        for start in range(0, state_item.shape[0], chunk):
            part = np.asarray(state_item[start:start + chunk])
            mark = np.zeros(part.shape[0], bool)
            expected = bit_kernels.split_insertions(part, expected, mark)
            at.append(np.flatnonzero(mark) + start)
            release_pages(state_item, start * state_item.itemsize,
                          (start + chunk) * state_item.itemsize)
        at = np.concatenate(at).astype(np.int32) if at else np.zeros(0, np.int32)
        return cls(at, np.asarray(state_item[at]).astype(np.int32), int(state_item.shape[0]))

    def __getitem__(self, states) -> np.ndarray:
        """int64: the items at final states `states` (ints in range)."""
        states = np.asarray(states, dtype=np.int64)
        j = np.searchsorted(self.at, states)
        hit = j < self.at.shape[0]
        hit[hit] = self.at[j[hit]] == states[hit]
        out = states - j
        out[hit] = self.item[j[hit]]
        return out

    def with_insertions(self, before: np.ndarray, states: np.ndarray,
                        items: np.ndarray) -> "InsertedOrder":
        """The order after an addition placed new final states before the old
        ids `before` (ascending, repeats allowed) and its items `items` at the
        new ids `states` (both ascending alike)."""
        moved = self.at + np.searchsorted(before, self.at, side="right")
        at = np.concatenate([moved, states]).astype(np.int64)
        item = np.concatenate([self.item, items]).astype(np.int32)
        order = np.argsort(at, kind="stable")
        return InsertedOrder(at[order].astype(np.int32), item[order],
                             self.count + int(states.shape[0]))

    def live_bits(self, item_live: np.ndarray, chunk: int,
                  room: Optional[int] = None) -> layer_walk.PackedBits:
        """`PackedBits` (count,): bit f is whether the item at final state f
        is live in `item_live` (bool (N',), or `PackedBits` (N')); ranges of
        `chunk` states on threads; room as `PackedBits.zeros` takes it."""
        from static_compiler.item_bits import bit_kernels  # (numba: compiled on first use, cached)
        result = layer_walk.PackedBits.zeros(self.count, room)
        out = result.uint64()
        packed = isinstance(item_live, layer_walk.PackedBits)
        kernel = bit_kernels.inserted_words if packed else bit_kernels.inserted_bits
        source = item_live.uint64() if packed else item_live

        def one_range(a: int, b: int) -> None:
            lo, hi = np.searchsorted(self.at, [a, b])
            kernel(source, self.at[lo:hi], self.item[lo:hi], a - int(lo), out, a, b - a)

        layer_walk.in_ranges(self.count, one_range, chunk)
        return result


def final_states_live(state_item, item_live: np.ndarray, chunk: int,
                      room: Optional[int] = None) -> layer_walk.PackedBits:
    """`PackedBits` (S,): bit s is whether the item ending at final state s
    is live in `item_live` bool (N',) (or `PackedBits` (N') for an
    `InsertedOrder`), for `state_item` an `InsertedOrder` or int32 (S,)
    (possibly memory-mapped: read a range of states at a time, its pages
    dropped after each); ranges of `chunk` states on threads;
    room as `PackedBits.zeros` takes it. Packed as it is gathered (a
    compiled kernel), so no second bool array is held (1 GB at 1e9)."""
    if isinstance(state_item, InsertedOrder):
        return state_item.live_bits(item_live, chunk, room)
    from static_compiler.item_bits import bit_kernels  # (numba: compiled on first use, cached)
    count, size = state_item.shape[0], state_item.itemsize
    result = layer_walk.PackedBits.zeros(count, room)
    out = result.uint64()

    def one_range(a: int, b: int) -> None:
        bit_kernels.gather_bits(item_live, np.asarray(state_item[a:b]), out, a, b - a)
        release_pages(state_item, a * size, b * size)

    layer_walk.in_ranges(count, one_range, chunk)
    return result


def item_order(items):
    """The final states' items of a fixed-length set's `ItemIndex` (`items`):
    None where final state u holds item u, else an `InsertedOrder` or the
    array `state_item`, either indexed by final states (`order[states]`)."""
    if items.state_inserted_at is not None:
        return InsertedOrder(np.asarray(items.state_inserted_at, np.int32),
                             np.asarray(items.state_inserted_item, np.int32), items.num_unique)
    return items.state_item
