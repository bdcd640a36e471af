"""An artifact's item index and attribute columns read from a `Snapshot`
(`read_item_arrays`): the item arrays its manifest names, checked (row ->
item ids in range, depths and states within the layers, insertions
sorted), memory-mapped where they are large, and the attribute columns
beside them. numpy only.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.format.normalize import current_items
from static_compiler.format.snapshot import Snapshot
from static_compiler.format.spec import ITEM_ARRAYS, format_error
from static_compiler.item_bits.item_masks import row_map_is_identity
from static_compiler.items.attributes import Column, ItemAttributes
from static_compiler.support.mapped import release_pages

ID_CHECK_CHUNK = 1 << 24
"""Entries of a memory-mapped id array `_ids_within` reads at a time."""


def _ids_within(ids: np.ndarray, n: int) -> bool:
    """Whether every entry of the 1-D int array `ids` is in [0, n), read a
    chunk at a time with the chunk's mapped pages dropped after it."""
    for start in range(0, ids.shape[0], ID_CHECK_CHUNK):
        part = ids[start:start + ID_CHECK_CHUNK]
        if part.min() < 0 or part.max() >= n:
            return False
        release_pages(part)
    return True


def read_item_arrays(snap: Snapshot) -> Optional[dict]:
    """{name: array} of the artifact's item index (`ITEM_ARRAYS`, as
    `items.index.ItemIndex` takes them; files verified with the rest), or None
    when it was saved without subsets, in the current shape
    (`normalize.current_items`: a version 8 state_item read as insertions).
    Raises ArtifactFormatError when an array is unreadable or disagrees
    with the manifest's set (ids out of range, depths or states outside the
    set; an index the manifest says is in item order that is not)."""
    manifest, path = snap.manifest, snap.path
    if manifest.item_files is None:
        return None
    arrays = {}
    for key, rel in manifest.item_files.items():
        if key not in ITEM_ARRAYS:
            raise format_error(path, f"item_files names {key!r}, expected one of "
                                     f"{list(ITEM_ARRAYS)}")
        # row_item, state_item (4 GB each at 1e9) and stale_rows stay mapped: read in chunks
        arrays[key] = snap.npy(rel, mmap=key in ("row_item", "state_item", "stale_rows"))
    orders = [key for key in ("item_depth", "state_item", "state_inserted_at") if key in arrays]
    if "row_item" not in arrays or ("item_depth" in arrays) != ("item_state" in arrays) or \
            ("state_inserted_at" in arrays) != ("state_inserted_item" in arrays) or len(orders) > 1:
        raise format_error(path, f"item_files {sorted(arrays)}: expected row_item, and "
                                 "item_depth with item_state (a variable-length set), "
                                 "state_inserted_at with state_inserted_item or state_item "
                                 "(a fixed-length set with additions), or none of these")
    n = manifest.num_sequences
    row_item, depth, state = arrays["row_item"], arrays.get("item_depth"), arrays.get("item_state")
    removed, state_item = arrays.get("removed"), arrays.get("state_item")
    at, added = arrays.get("state_inserted_at"), arrays.get("state_inserted_item")
    stale = arrays.get("stale_rows")
    problem = None
    if removed is not None and (removed.dtype != bool or removed.shape != (n,)):
        problem = f"removed must be bool ({n},)"
    elif stale is not None and (stale.dtype != bool or stale.shape != row_item.shape):
        problem = f"stale_rows must be bool {row_item.shape}, one entry per row"
    elif row_item.ndim != 1 or row_item.dtype.kind != "i" or (
            not manifest.rows_in_item_order and not _ids_within(row_item, n)):
        problem = f"row_item must be ints in [0, {n}) (the set's {n} sequences)"
    elif manifest.rows_in_item_order and not rows_in_item_order(row_item, stale, n):
        problem = (f"rows_in_item_order is true, but row_item is not 0, 1, ..., {n - 1} (row i "
                   "item i) or stale_rows is present")
    elif depth is None and n != manifest.num_final_states:
        problem = "a fixed-length set's items must be its final states"
    elif state_item is not None and (state_item.shape != (n,) or state_item.dtype.kind != "i"
                                     or not _ids_within(state_item, n)):
        problem = f"state_item must be ({n},) ints in [0, {n})"  # COMPAT["state_item"]
    elif at is not None and not _insertions_valid(at, added, n):
        problem = (f"state_inserted_at / state_inserted_item must be (K,) ints: final states "
                   f"ascending in [0, {n}), and the ids {n} - K .. {n - 1} in some order")
    elif depth is not None:
        sizes = [s["num_states"] for s in manifest.plan_steps] + [manifest.num_final_states]
        if depth.shape != (n,) or state.shape != (n,) or depth.min(initial=1) < 1 or \
                depth.max(initial=1) > manifest.depth or \
                (state < 0).any() or (state >= np.asarray(sizes)[depth]).any():
            problem = (f"item_depth / item_state must be ({n},) depths in [1, {manifest.depth}] "
                       "and state ids within their depth")
    if problem:
        raise format_error(path, f"items: {problem}")
    return current_items({"row_item": row_item, "item_depth": depth, "item_state": state,
                          "removed": removed, "state_item": state_item, "state_inserted_at": at,
                          "state_inserted_item": added, "stale_rows": stale,
                          "attributes": read_attributes(snap, row_item.shape[0])})


def rows_in_item_order(row_item: np.ndarray, stale: Optional[np.ndarray], n: int) -> bool:
    """What the manifest's "rows_in_item_order" (format version 17)
    records for an item index of `n` sequences: whether row i is item i for
    every row (`item_masks.row_map_is_identity`: one pass over the map on
    threads; in range, then, without a check of its own), with no stale
    rows."""
    return stale is None and row_item.shape[0] == n and row_map_is_identity(row_item)


def read_attributes(snap: Snapshot, num_rows: int) -> Optional[ItemAttributes]:
    """The artifact's item attributes (format version 12), each column
    memory-mapped (read as used), or None when it has none.
    ArtifactFormatError when a file is not the (num_rows,) array of the
    dtype the manifest records."""
    record = snap.manifest.attributes
    if record is None:
        return None
    columns = {}
    for name, entry in record.items():
        values = snap.npy(entry["file"])
        if values.shape != (num_rows,) or values.dtype != np.dtype(entry["dtype"]):
            raise format_error(snap.path, f"attribute {name!r}: {entry['file']} holds "
                                          f"{values.dtype} {values.shape}, expected "
                                          f"{entry['dtype']} ({num_rows},) (one per row)")
        categories = entry["categories"]
        columns[name] = Column(entry["kind"], values,
                               None if categories is None else tuple(categories))
    return ItemAttributes.of(columns, num_rows)


def _insertions_valid(at: np.ndarray, item: np.ndarray, n: int) -> bool:
    """Whether `at` and `item` describe an order of n final states
    (`item_bits.state_order.InsertedOrder`): as many of each, at ascending within
    [0, n), item a permutation of the K largest ids."""
    k = at.shape[0] if at.ndim == 1 else -1
    if k < 0 or at.dtype.kind != "i" or item.dtype.kind != "i" or item.shape != (k,) or k > n:
        return False
    if k == 0:
        return True
    return bool(at[0] >= 0 and at[-1] < n and (np.diff(at) > 0).all()
                and (np.sort(item) == np.arange(n - k, n)).all())
