"""The item index: where each input sequence (an item) ends in the trie, a
frontend output (`frontend.sequences` and the partitioned builds make
it) that the live set view, item subsets and the artifact read. numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Optional

import numpy as np

from static_compiler.items.attributes import ItemAttributes
from static_compiler.support.arrays import materialized


@dataclasses.dataclass(frozen=True, eq=False)
class ItemIndex:
    """Where each input sequence (an item) ends in the trie, for item subsets.

    Items are the input's rows in order (duplicates are one item: the same
    terminal state). row_item int32 (N,): the unique sequence (sorted order)
    each input row is; item_depth int32 (N',) and item_state int32 (N',):
    the depth and state id where each unique sequence ends, or None for a
    fixed-length set, whose unique sequence u ends in final state u, or
    after additions: state_inserted_at and state_inserted_item int32 (K,),
    the final states of the K added items and their ids
    (`item_bits.state_order.item_order`), or
    state_item int32 (N',), every final state's item (format version 8);
    removed bool (N',) or None: unique sequences an update took out (decodes
    run over the others). stale_rows bool (N,) or None: input rows whose
    item an update took out and a later one added again (as new rows):
    they no longer stand for the item, so a filter or a row selection
    picks an item only through its other rows (`live_rows`), and its
    attributes are those of its live rows. attributes: the items'
    attribute columns (`items.attributes.ItemAttributes`, one value per
    input row), or None. Arrays may be memory-mapped."""

    row_item: np.ndarray
    num_unique: int
    item_depth: Optional[np.ndarray] = None
    item_state: Optional[np.ndarray] = None
    removed: Optional[np.ndarray] = None
    state_item: Optional[np.ndarray] = None
    state_inserted_at: Optional[np.ndarray] = None
    state_inserted_item: Optional[np.ndarray] = None
    attributes: Optional[ItemAttributes] = None
    stale_rows: Optional[np.ndarray] = None

    @property
    def num_items(self) -> int:
        return int(self.row_item.shape[0])

    @functools.cached_property
    def removal_tag(self) -> str:
        """"" with nothing removed, else a short hash of `removed` (bool
        (N',): unique sequences taken out by an update): part of a set's
        fingerprint, so a subset made before a removal is refused after.
        Computed once (0.4 s at 1e9; an index is never changed, an update
        makes a new one)."""
        if self.removed is None or not self.removed.any():
            return ""
        return "~" + hashlib.blake2b(np.packbits(self.removed).tobytes(), digest_size=6).hexdigest()

    def first_live_rows(self) -> np.ndarray:
        """int64 (N',): each unique sequence's first input row that is not
        stale (`stale_rows`; its first row for an item with none: one that
        an update removed). What an item's attribute (a prior) is read
        from, and what `item_index` answers."""
        row_item = np.asarray(self.row_item)
        first = np.unique(row_item, return_index=True)[1].astype(np.int64)
        if self.stale_rows is not None:
            live = np.flatnonzero(~np.asarray(self.stale_rows))
            unique, at = np.unique(row_item[live], return_index=True)
            first[unique] = live[at]
        return first

    def materialized(self) -> "ItemIndex":
        """This index with every array read whole (`arrays.materialized`: the
        `PieceArray`s a streamed update computes lazily become numpy arrays)."""
        return dataclasses.replace(self, **{
            f.name: materialized(getattr(self, f.name)) for f in dataclasses.fields(self)
            if f.name not in ("num_unique", "attributes")},
            attributes=None if self.attributes is None else
            self.attributes.with_values(materialized))
