"""Arrays a partitioned build (`frontend.partitioned`) writes to files.

Every file one task writes and another reads (spill files, partition
layers) is checked when read against the size and CRC-32 its writer
recorded while writing (`CheckedWriter`, `save_checked`, `read_checked`):
a flipped byte, a truncated or a deleted file fails the build with
BuildError naming the file, never compiles into another set.

The merged tables (or layers) are written with file writes and reopened
read-only as memory maps (`ArrayFiles`), so they are never all in memory.
"""

from __future__ import annotations

import io
import os
import pathlib
import zlib
from typing import Optional

import numpy as np

from static_compiler.errors import BuildError
from static_compiler.ir import frozen

# Files passed between tasks: checked when read against what was written.

CHECK_CHUNK_BYTES = 16 << 20


class CheckedWriter:
    """A binary file written front to back that keeps its size and CRC-32
    (zlib, some 5 GB/s: a few % of a build's time; a flipped byte or a
    truncation is always caught) as the bytes go out, so nothing is read
    back to checksum it. `close` returns the record (size, crc) that
    `read_checked` checks the file against in the task that reads it."""

    def __init__(self, path: pathlib.Path):
        self.path, self.size, self.crc = path, 0, 0
        self.file = open(path, "wb")

    def write(self, data) -> None:
        """Appends an array (any shape, written in C order) or bytes."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1)
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.file.write(view)
        self.size += view.nbytes

    def close(self) -> tuple[int, int]:
        self.file.close()
        return self.size, self.crc


def save_checked(path: pathlib.Path, arr: np.ndarray) -> tuple[int, int]:
    """`np.save` of `arr` (a .npy 1.0 file, C order) through a
    `CheckedWriter`; its record (size, crc)."""
    arr = np.ascontiguousarray(arr)
    writer = CheckedWriter(path)
    try:
        np.lib.format.write_array_header_1_0(writer,
                                             np.lib.format.header_data_from_array_1_0(arr))
        writer.write(arr)
    finally:
        record = writer.close()
    return record


def read_checked(path: pathlib.Path, record: tuple[int, int], keep: bool = True
                 ) -> Optional[np.ndarray]:
    """The bytes (uint8 (size,)) of a file another task wrote, checked
    against its writer's record (size, crc): BuildError naming the file
    when it is missing, of another size or altered since (a flipped byte
    would compile into another set). Read in CHECK_CHUNK_BYTES chunks
    straight into the array returned, so the file is held once; with keep
    False into one reused chunk (a check before the file is memory-mapped)
    and None is returned."""
    size, crc = record
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise BuildError(f"{path}: missing: a task of this build wrote {size} bytes there "
                         "(was the work directory cleaned while the build ran?)") from None
    with f:
        found = os.fstat(f.fileno()).st_size
        if found != size:
            raise BuildError(f"{path}: {found} bytes, expected the {size} its task wrote "
                             "(truncated or overwritten since)")
        out = np.empty(size if keep else min(size, CHECK_CHUNK_BYTES), np.uint8)
        got = 0
        for start in range(0, size, CHECK_CHUNK_BYTES):
            n = min(CHECK_CHUNK_BYTES, size - start)
            chunk = memoryview(out)[start:start + n] if keep else memoryview(out)[:n]
            if f.readinto(chunk) != n:
                raise BuildError(f"{path}: shorter than the {size} bytes its task wrote "
                                 "(truncated while read)")
            got = zlib.crc32(chunk, got)
    if got != crc:
        raise BuildError(f"{path}: CRC-32 {got:08x}, expected {crc:08x} as its task wrote it: "
                         "the file was altered since (disk or file system corruption?)")
    return out if keep else None


def npy_array(data: np.ndarray) -> np.ndarray:
    """The array of an .npy file's bytes (uint8, from `read_checked`), a
    view of them (no copy)."""
    head = io.BytesIO(data[:10 + (1 << 16)].tobytes())  # (magic, length, header <= 64 KiB)
    version = np.lib.format.read_magic(head)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran_order, dtype = read_header(head)
    arr = data[head.tell():].view(dtype)
    return arr.reshape(shape, order="F" if fortran_order else "C")


# The merged arrays: written front to back, reopened as memory maps.

class ArrayFiles:
    """Arrays written front to back into .npy files under `root` (the
    writers `target.lowering.lower_pieces` takes), with plain file writes, so
    the pages go to the page cache and never count in this process's RSS;
    each is reopened read-only as a memory map when closed. The caller
    removes the directory once done: the maps keep the files' data until
    the arrays are dropped (POSIX), so the merged tables are never all in
    memory."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        root.mkdir()
        self.bytes_written = 0

    def writer(self, name: str, dtype, shape: tuple) -> "NpyFileWriter":
        return NpyFileWriter(self, self.root / f"{name}.npy", np.dtype(dtype), tuple(shape))


class NpyFileWriter:
    """One array of `ArrayFiles`: an .npy header, then rows as appended."""

    FILL_ROWS = 1 << 20

    def __init__(self, files: ArrayFiles, path: pathlib.Path, dtype: np.dtype, shape: tuple):
        self.files, self.path, self.dtype, self.shape = files, path, dtype, shape
        self.rows = 0
        self.file = open(path, "wb")
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                        "shape": shape})

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if values.shape[1:] != self.shape[1:] or self.rows + values.shape[0] > self.shape[0]:
            raise BuildError(f"{self.path.name}: rows of shape {values.shape} after "
                             f"{self.rows}, for an array {self.shape}")
        if values.size:
            self.file.write(memoryview(values.reshape(-1)).cast("B"))
        self.rows += values.shape[0]

    def close(self, fill=0) -> np.ndarray:
        """The array, read-only: rows not appended hold `fill`."""
        while self.rows < self.shape[0]:
            n = min(self.shape[0] - self.rows, self.FILL_ROWS)
            self.append(np.full((n,) + self.shape[1:], fill, dtype=self.dtype))
        self.file.close()
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.files.bytes_written += nbytes
        if nbytes == 0:  # (an empty file cannot be mapped)
            return frozen(np.zeros(self.shape, self.dtype))
        return np.load(self.path, mmap_mode="r")
