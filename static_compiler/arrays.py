"""New table arrays: aligned for a copy-free device put (`table_array`), or
computed a range of rows at a time (`PieceArray`) so a table far larger
than memory can be written to a file front to back; the .npy header of a
table's file (`npy_header`). numpy only."""

from __future__ import annotations

import io
from typing import Callable

import numpy as np

TABLE_ALIGNMENT = 64
"""Bytes a new table's data is aligned to (`table_array`)."""


def npy_header(shape, dtype) -> bytes:
    """The header `np.save` writes for a C-order array of `shape` and
    `dtype` (format 1.0): an artifact's table file is it and the array's
    bytes, so a table's file sha256 can be computed without the file
    (`live.subsets.table_digest`)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {
        "shape": tuple(int(n) for n in shape), "fortran_order": False,
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype))})
    return buf.getvalue()


def table_array(shape, dtype, fill=None) -> np.ndarray:
    """A new table array (uninitialized, or set to `fill`) whose data starts
    on a TABLE_ALIGNMENT boundary: jax's CPU client then takes it as a
    device buffer without copying it (numpy's large allocations start 16
    bytes past a page: 150 MB of tables took 25 ms to put on the device,
    aligned ones none), which an update's next decode would otherwise pay."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + TABLE_ALIGNMENT, np.uint8)
    skip = -raw.ctypes.data % TABLE_ALIGNMENT
    out = raw[skip:skip + count * dtype.itemsize].view(dtype).reshape(shape)
    if fill is not None:
        out.fill(fill)
    return out


class PieceArray:
    """An array of `shape` and `dtype` whose rows are computed on demand:
    `fill(out, start, stop)` writes rows [start, stop) into `out` ((stop -
    start,) + shape[1:]). What an addition to a saved billion-item set
    writes (`artifact.update`): each new table streams from the old one
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

    def rows(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(self.shape[0], stop)
        out = table_array((max(0, stop - start),) + self.shape[1:], self.dtype)
        if stop > start:
            self.fill_rows(out, start, stop)
        return out

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1):
            start, stop, _ = key.indices(self.shape[0])
            return self.rows(start, stop)
        raise TypeError(f"PieceArray: only row slices a[i:j] are computed, not {key!r}")

    def materialize(self) -> np.ndarray:
        return self.rows(0, self.shape[0])

    def __array__(self, dtype=None, copy=None):
        out = self.materialize()
        return out if dtype is None else out.astype(dtype, copy=False)

    def chunks(self, max_bytes: int):
        """The rows in order, about `max_bytes` at a time (numpy arrays)."""
        row_bytes = max(1, self.nbytes // max(1, self.shape[0]))
        step = max(1, max_bytes // row_bytes)
        for start in range(0, self.shape[0], step):
            yield self.rows(start, start + step)


def materialized(arr):
    """`arr` as a numpy array (a `PieceArray` computed whole)."""
    return arr.materialize() if isinstance(arr, PieceArray) else arr
