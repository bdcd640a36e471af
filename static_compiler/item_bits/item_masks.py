"""The items a selection of input rows picks: where every subset starts.

A subset is asked for as a bool mask (N,) over the rows a set was compiled
from, or as rows computed a range at a time (a `RowSource`: a filter
expression's `rules.where.RowFilter`); the walk needs it per unique
sequence (an item), in item order, through
`row_item` (input row -> item, 4 GB at 1e9, read a chunk at a time).

* `rows_item_bits` gives them as `PackedBits` (N'): what a fixed-length
  set's subset, whose items are its final states, starts from. A bool per
  item is 1 GB of fresh pages at 1e9, which this VM faults in at up to
  2 s/GB when its memory has gone back to the host; the bits are 125 MB per
  thread. Each thread marks the rows of its chunks in bits of its own (no
  two threads write one word) and the threads' bits are or'ed at the end;
* `rows_item_mask` unpacks them to bool (N',): what a variable-length set's
  items (which end at several depths) and removals use.
"""

from __future__ import annotations

import threading
from typing import Optional, Protocol, runtime_checkable

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits import layer_walk
from static_compiler.support.mapped import release_pages
from static_compiler.support.threads import on_threads, pack_in_spans

ITEM_CHUNK = 1 << 24
"""Input rows mapped (final states gathered, `liveness.final_item_live`) at
a time, on threads: the pages of a memory-mapped `row_item` (`state_item`)
read are dropped after each chunk."""

SPLIT_FROM = 1 << 18
"""Rows from which a row mask's scatter is split across the threads (each
its own bits, or'ed at the end: N'/8 bytes a thread)."""


@runtime_checkable
class RowSource(Protocol):
    """Selected input rows computed a range at a time rather than held as a
    bool (N,) array, such as a filter expression's `rules.where.RowFilter`."""

    num_rows: int

    def fill(self, lo: int, hi: int, out: np.ndarray, scratch: Optional[list] = None) -> None:
        """Writes whether rows [lo, hi) are selected into `out` (bool
        (hi - lo,)); `scratch`: a list one thread keeps across calls."""


def check_selection(selection, items, where: str) -> None:
    """Raises ConstraintSetError unless `selection` is bool (N,), or a
    `RowSource` of N rows, one entry per input row of `items` (an
    `ItemIndex`)."""
    n = items.num_items
    if isinstance(selection, RowSource):
        if selection.num_rows != n:
            raise ConstraintSetError(f"{where}: filter over {selection.num_rows} rows: expected "
                                     f"one over the {n} input rows of the compiled set")
        return
    if selection.dtype != bool:
        raise ConstraintSetError(f"{where}: selection has dtype {selection.dtype}: expected a "
                                 f"bool mask of shape ({n},) over the input rows")
    if selection.shape != (n,):
        raise ConstraintSetError(f"{where}: mask has shape {selection.shape}: expected ({n},), "
                                 "one entry per input row of the compiled set (per name given, "
                                 "for a text catalogue)")


def rows_item_mask(selection, items, where: str) -> np.ndarray:
    """bool (N',) over unique sequences: those some selected input row is
    (selection: bool (N,) over the input rows, or a `RowSource`);
    `rows_item_bits` unpacked."""
    return rows_item_bits(selection, items, where).bools()


def rows_item_bits(selection, items, where: str, room: Optional[int] = None,
                   in_item_order: bool = False,
                   threads: Optional[int] = None) -> layer_walk.PackedBits:
    """`PackedBits` (N',) in item order: the unique sequences some selected
    input row is (selection: bool (N,) over the input rows, or a
    `RowSource`, filled a chunk at a time into a buffer of each thread's, so
    no bool (N,) is made); room as `PackedBits.zeros` takes it. A stale
    row (`ItemIndex.stale_rows`: its item was removed, then added again as
    a new row) picks nothing: an item is picked through its live rows.
    in_item_order: row i is item i for every row (`rows_are_items`): the
    selection's chunks are packed in place on threads, no scatter through
    `row_item` (which is not read). threads: default WALK_THREADS (1 where
    the caller runs several selections at once, `stacked_rows_item_bits`)."""
    check_selection(selection, items, where)
    n, count = items.num_items, items.num_unique
    lazy = isinstance(selection, RowSource)
    threads = layer_walk.WALK_THREADS if threads is None else max(1, int(threads))
    if in_item_order:
        return _packed_in_place(selection, n, room, lazy, threads)
    if not lazy and np.count_nonzero(selection) == n:  # every row
        bits = layer_walk.PackedBits.zeros(count, room)
        bits.data[:count // 8] = 0xFF
        bits.data[count // 8:-(-count // 8)] = (1 << (count % 8)) - 1
        return bits
    from static_compiler.item_bits import bit_kernels  # (numba: compiled on first use, cached)

    step = min(ITEM_CHUNK, max(SPLIT_FROM, -(-n // (64 * threads)) * 64))  # (every thread busy)
    ranges = [(a, min(n, a + step)) for a in range(0, n, step)]
    row_item, size = items.row_item, items.row_item.itemsize
    stale = items.stale_rows  # (rows that no longer stand for their item: never picked)
    if bit_kernels.HAVE_NUMBA:
        from static_compiler.item_bits import bucket_scatter
        if count >= bucket_scatter.BUCKET_FROM:  # (bits past the caches: by buckets)
            return bucket_scatter.scatter_by_buckets(selection, row_item, count, room,
                                                     threads, stale)

    def one_share(share) -> layer_walk.PackedBits:
        own = layer_walk.PackedBits.zeros(count, room)  # (no other thread writes its words)
        buffer = np.empty(-(-min(n, step) // 64), np.uint64)
        own_rows = lazy or stale is not None
        rows, temporaries = (np.empty(min(n, step), bool), []) if own_rows else (None, None)
        for start, stop in share:
            if lazy:
                picked = rows[:stop - start]
                selection.fill(start, stop, picked, temporaries)
            elif stale is not None:
                picked = rows[:stop - start]
                np.copyto(picked, selection[start:stop])
            else:
                picked = selection[start:stop]
            if stale is not None:
                np.logical_and(picked, np.logical_not(stale[start:stop]), out=picked)
            bit_kernels.mark_selected_words(bit_kernels.selection_words(picked, buffer),
                                            np.asarray(row_item[start:stop]), own.uint64())
            release_pages(row_item, size * start, size * stop)
        return own

    first, *others = on_threads(ranges, one_share, threads)
    for other in others:
        np.bitwise_or(first.data, other.data, out=first.data)
    return first


def _packed_in_place(selection, n: int, room: Optional[int], lazy: bool,
                     threads: int) -> layer_walk.PackedBits:
    """`PackedBits` (n,) of `selection` (bool (n,) or a `RowSource`), each
    chunk of rows (ITEM_CHUNK) packed into its own bytes of one output on
    threads (`threads.pack_in_spans`; a filter's rows filled into a buffer
    of each thread's)."""
    bits = layer_walk.PackedBits.zeros(n, room)

    def rows_of(a: int, b: int, own: dict) -> np.ndarray:
        if not lazy:
            return selection[a:b]
        if not own:
            own.update(rows=np.empty(min(n, max(8, ITEM_CHUNK)), bool), temporaries=[])
        picked = own["rows"][:b - a]
        selection.fill(a, b, picked, own["temporaries"])
        return picked

    pack_in_spans(n, ITEM_CHUNK, rows_of, bits.data, threads)
    return bits


def stacked_rows_item_bits(rows: list, items, where: str, room: Optional[int] = None,
                           in_item_order: bool = False) -> list:
    """[rows_item_bits(row, items, where, room, in_item_order) for row in
    rows]: several selections (R per-row subsets) made a selection to a
    thread, each on one, rather than each split across the threads: no
    thread's own bits or'ed in, a row's buffers made once per thread."""
    if len(rows) < 2:
        return [rows_item_bits(row, items, where, room, in_item_order) for row in rows]
    done = on_threads(list(enumerate(rows)), lambda share: [
        (i, rows_item_bits(row, items, where, room, in_item_order, threads=1))
        for i, row in share], layer_walk.WALK_THREADS)
    return [bits for _, bits in sorted((pair for part in done for pair in part),
                                       key=lambda pair: pair[0])]


def rows_are_items(items) -> bool:
    """Whether input row i is item i for every row of `items` (an
    `ItemIndex`, or None: False): a sorted input without duplicates,
    nothing added back (`row_map_is_identity`)."""
    if items is None or items.stale_rows is not None or items.num_items != items.num_unique:
        return False
    return row_map_is_identity(items.row_item)


def row_map_is_identity(row_item) -> bool:
    """Whether row_item[i] == i for every row (int (N,), possibly
    memory-mapped or a lazy `PieceArray`: read by slices). Reads it a
    chunk at a time on threads (a mapped chunk's pages dropped after it),
    stopping at the first chunk that is not (4 GB at 1e9: 0.2 s from the
    page cache, `tools.bench.row_order`); what an
    artifact's "rows_in_item_order" records (format version 17) and its
    load checks."""
    n = row_item.shape[0]
    if n and (int(np.asarray(row_item[0:1])[0]) != 0 or
              int(np.asarray(row_item[n - 1:n])[0]) != n - 1):
        return False  # (a shuffled input, told at once; slices: a lazy `PieceArray` too)
    step, size = 1 << 20, row_item.dtype.itemsize
    ranges = [(a, min(n, a + step)) for a in range(0, n, step)]
    failed = threading.Event()

    def one_share(share) -> None:
        ids = np.arange(step, dtype=row_item.dtype)
        diff = np.empty(step, row_item.dtype)
        for start, stop in share:
            if failed.is_set():
                return
            part = diff[:stop - start]
            np.subtract(row_item[start:stop], ids[:stop - start], out=part)
            if part.min() != start or part.max() != start:
                failed.set()
            release_pages(row_item, size * start, size * stop)

    on_threads(ranges, one_share, layer_walk.WALK_THREADS)
    return not failed.is_set()


def drop_items(item_live, removed: np.ndarray) -> None:
    """Clears, in place, item i of `item_live` (bool (N',) or `PackedBits`
    (N')) where removed[i] (bool (N',)), ITEM_CHUNK items at a time."""
    step = max(8, ITEM_CHUNK // 8 * 8)  # (whole bytes of packed bits)
    for a in range(0, removed.shape[0], step):
        if isinstance(item_live, layer_walk.PackedBits):
            part = np.packbits(removed[a:a + step], bitorder="little")
            held = item_live.data[a // 8:a // 8 + part.shape[0]]
            np.bitwise_and(held, ~part, out=held)
        else:
            item_live[a:a + step] &= ~removed[a:a + step]


def count_items(item_live) -> int:
    """How many items `item_live` (bool (N',) or `PackedBits` (N')) holds."""
    if isinstance(item_live, layer_walk.PackedBits):  # (the bits past N' are zero)
        data = item_live.data[:-(-item_live.shape[0] // 8)]
        return int(np.bitwise_count(data).sum(dtype=np.int64))
    return int(np.count_nonzero(item_live))


def items_ending_at(items, depth: int, num_states: int) -> np.ndarray:
    """int (num_states,): the unique sequence of `items` (an `ItemIndex`)
    ending at each state at `depth` of a variable-length set (item_depth /
    item_state), or -1 (int32 where the ids fit: 4 GB, not 8, for 1e9
    states), filled ITEM_CHUNK items at a time (no bool or int64 array per
    item)."""
    narrow = items.num_unique < np.iinfo(np.int32).max
    out = np.full(num_states, -1, dtype=np.int32 if narrow else np.int64)
    for a in range(0, items.num_unique, ITEM_CHUNK):
        at = items.item_depth[a:a + ITEM_CHUNK] == depth
        out[items.item_state[a:a + ITEM_CHUNK][at]] = np.flatnonzero(at) + a
    return out
