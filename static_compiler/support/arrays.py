"""New table arrays: aligned for a copy-free device put (`table_array`), or
computed a range of rows at a time (`PieceArray`; `joined`, one array
then another) so a table far larger than memory can be written to a file
front to back; the .npy header of a table's file (`npy_header`). numpy
only."""

from __future__ import annotations

import io
import mmap
import threading
import weakref
from typing import Callable, Optional

import numpy as np

from static_compiler.support.mapped import release_pages

TABLE_ALIGNMENT = 64
"""Bytes a new table's data is aligned to (`table_array`)."""


def npy_header(shape, dtype) -> bytes:
    """The header `np.save` writes for a C-order array of `shape` and
    `dtype` (format 1.0): an artifact's table file is it and the array's
    bytes, so a table's file sha256 can be computed without the file
    (`compiler_items.subsets.table_digest`)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {
        "shape": tuple(int(n) for n in shape), "fortran_order": False,
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype))})
    return buf.getvalue()


def table_array(shape, dtype, fill=None, recycle: bool = False) -> np.ndarray:
    """A new table array (uninitialized, or set to `fill`) whose data starts
    on a TABLE_ALIGNMENT boundary: jax's CPU client then takes it as a
    device buffer without copying it (numpy's large allocations start 16
    bytes past a page: 150 MB of tables took 25 ms to put on the device,
    aligned ones none), which an update's next decode would otherwise pay.
    recycle: for the tables of versions that replace each other (an update's
    output): one of RECYCLE_MIN_BYTES or more comes from `TABLE_BUFFERS`,
    page-aligned, in the memory of a dead one of its size where there is one."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    nbytes = count * dtype.itemsize
    if recycle and nbytes >= RECYCLE_MIN_BYTES and hasattr(mmap, "MAP_ANONYMOUS"):
        out = TABLE_BUFFERS.take(nbytes).view(dtype).reshape(shape)
    else:
        raw = np.empty(nbytes + TABLE_ALIGNMENT, np.uint8)
        skip = -raw.ctypes.data % TABLE_ALIGNMENT
        out = raw[skip:skip + nbytes].view(dtype).reshape(shape)
    if fill is not None:
        out.fill(fill)
    return out


RECYCLE_MIN_BYTES = 1 << 20
"""Recycled tables this large or larger are allocated through `TABLE_BUFFERS`."""


class BufferPool:
    """Anonymous memory maps for large tables, each handed out again once
    every array over it has died.

    Why: an update writes every table of the new version anew, in the
    padded sizes of the old one. Fresh pages cost a fault each (4 KiB where
    the kernel has no huge page to give): 1e4 additions to a 1e7 set spent
    about half their 0.3 s faulting ~280 MB of new tables in, while an
    update whose allocator happened to reuse the last version's freed memory
    took 0.12 s. So a dead table's map is kept (at most `max_free_bytes`
    of them, the oldest unmapped first), marked MADV_FREE so the kernel may
    reclaim its pages under memory pressure, and given to the next table of
    the same size, whose writes then find the pages mapped."""

    def __init__(self, max_free_bytes: int = 1 << 30):
        self.max_free_bytes = max_free_bytes
        self._free = []  # [(size, mmap)] of dead arrays, oldest first
        self._lock = threading.RLock()  # (a release may run inside a take, from the gc)

    @property
    def free_bytes(self) -> int:
        return sum(size for size, _ in self._free)

    def take(self, nbytes: int) -> np.ndarray:
        """uint8 (nbytes,) over a page-aligned map, reused where one of its
        size class is free (the most recently freed); contents undefined."""
        size, mm = size_class(int(nbytes)), None
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i][0] == size:
                    mm = self._free.pop(i)[1]
                    break
        if mm is None:
            mm = mmap.mmap(-1, size, flags=_NEW_MAP_FLAGS)
        raw = np.frombuffer(mm, np.uint8, count=int(nbytes))
        weakref.finalize(raw, self._release, size, mm)
        return raw

    def _release(self, size: int, mm) -> None:
        _advise(mm, getattr(mmap, "MADV_FREE", None))
        with self._lock:
            self._free.append((size, mm))
            while self._free and self.free_bytes > self.max_free_bytes:
                self._free.pop(0)  # unmapped once unreferenced


_NEW_MAP_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | \
    getattr(mmap, "MAP_POPULATE", 0)
"""A new map's pages are populated by the mmap call itself, in bulk (Linux):
a fault per page cost about 1.5 us here (a virtual machine)."""


def size_class(nbytes: int) -> int:
    """The map size `BufferPool` gives `nbytes`: rounded up to a page and to
    1/32 of its power of two (at most ~3 % more), so that an array grown by
    a few items (an item index after an addition) reuses its predecessor's."""
    grain = max(mmap.PAGESIZE, 1 << max(0, nbytes.bit_length() - 6))
    return -(-nbytes // grain) * grain


def _advise(mm, advice) -> None:
    if advice is not None and hasattr(mm, "madvise"):
        try:
            mm.madvise(advice)
        except OSError:  # not supported by this kernel
            pass


TABLE_BUFFERS = BufferPool()
"""The process's pool of table memory (`table_array`)."""


FILL_BYTES = 1 << 21
"""Bytes of a `PieceArray` a fill writes at a time."""


class PieceArray:
    """An array of `shape` and `dtype` whose rows are computed on demand:
    `fill(out, start, stop)` writes rows [start, stop) into `out` ((stop -
    start,) + shape[1:]). What an addition to a saved billion-item set
    writes (`lifecycle.update`): each new table streams from the old one
    into its file a chunk at a time (`chunks`), never whole in memory.
    `materialize()` (also `np.asarray`) computes it whole, aligned;
    `a[i:j]` computes rows i..j."""

    def __init__(self, shape, dtype, fill: Callable[[np.ndarray, int, int], None]):
        self.shape = tuple(int(s) for s in (shape if isinstance(shape, tuple) else (shape,)))
        self.dtype = np.dtype(dtype)
        self.fill_rows = fill  # (out, start, stop): writes rows start..stop - 1 into out

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, start: int, stop: int, recycle: bool = False) -> np.ndarray:
        start, stop = max(0, start), min(self.shape[0], stop)
        out = table_array((max(0, stop - start),) + self.shape[1:], self.dtype, recycle=recycle)
        # A piece at a time: a fill's temporaries (int64 ids, masks) stay a few MB, reused
        # by malloc, rather than several times the table in fresh pages.
        step = max(1, FILL_BYTES // max(1, out[:1].nbytes))
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            self.fill_rows(out[lo - start:hi - start], lo, hi)
        return out

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1):
            start, stop, _ = key.indices(self.shape[0])
            return self.rows(start, stop)
        raise TypeError(f"PieceArray: only row slices a[i:j] are computed, not {key!r}")

    def materialize(self) -> np.ndarray:
        """The whole array: a table of an update's new version, recycled
        (`table_array`); a chunk (`chunks`, `a[i:j]`) is not."""
        return self.rows(0, self.shape[0], recycle=True)

    def __array__(self, dtype=None, copy=None):
        out = self.materialize()
        return out if dtype is None else out.astype(dtype, copy=False)

    def chunks(self, max_bytes: int):
        """The rows in order, about `max_bytes` at a time (numpy arrays)."""
        row_bytes = max(1, self.nbytes // max(1, self.shape[0]))
        step = max(1, max_bytes // row_bytes)
        for start in range(0, self.shape[0], step):
            yield self.rows(start, start + step)


def npy_chunks(arr, max_bytes: int, done: Optional[Callable[[np.ndarray], None]] = None):
    """The bytes `np.save` writes for `arr` (an array or a `PieceArray`): its
    header, then its data in C order, about `max_bytes` (whole rows) at a
    time, each a bytes-like object (no copy of a contiguous array's rows).
    done(rows): called with each chunk's rows of `arr` once the consumer
    asks for the next chunk (`artifact.mapped.release_pages` drops a mapped
    table's pages as they are read)."""
    yield npy_header(arr.shape, arr.dtype)
    step = max(1, max_bytes // max(1, arr.nbytes // max(1, arr.shape[0])))  # whole rows
    for start in range(0, arr.shape[0], step):
        rows = arr[start:start + step]
        yield np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
        if done is not None:
            done(rows)


def materialized(arr):
    """`arr` as a numpy array (a `PieceArray` computed whole)."""
    return arr.materialize() if isinstance(arr, PieceArray) else arr


def search_sorted(values, keys, side: str = "left"):
    """`np.searchsorted(values, keys, side)` with the keys put in the integer
    dtype of `values` first: numpy otherwise casts `values` to a dtype that
    holds both (a Python int key turns an int32 table into an int64 copy: a
    second for a mapped 256 MB table at 1e9, on every search). Keys past the
    dtype's range count none or all of the values; an int for a scalar key,
    else int64 (keys.shape)."""
    keys = np.asarray(keys)
    dtype = np.dtype(values.dtype)
    if dtype.kind not in "iu" or keys.dtype == dtype:
        found = np.searchsorted(values, keys, side=side)
    else:
        info = np.iinfo(dtype)
        found = np.searchsorted(values, np.clip(keys, info.min, info.max).astype(dtype), side=side)
        found = np.where(keys > info.max, values.shape[0], np.where(keys < info.min, 0, found))
    return int(found) if np.ndim(found) == 0 else found.astype(np.int64, copy=False)


def joined(first, second: np.ndarray) -> PieceArray:
    """`first` (an array, possibly memory-mapped) then `second`, in
    `second`'s dtype, computed a range at a time."""
    count = first.shape[0]

    def fill_rows(out, start, stop):
        head = max(0, min(stop, count) - start)
        out[:head] = first[start:start + head]
        release_pages(first, start * first.itemsize, (start + head) * first.itemsize)
        out[head:] = second[max(0, start - count):max(0, stop - count)]

    return PieceArray(count + second.shape[0], second.dtype, fill_rows)
