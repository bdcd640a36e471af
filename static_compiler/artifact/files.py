"""The files of an artifact version as the writer holds them before they
are written (`writer`): bytes, an array written in chunks as .npy
(`NpyFile`, its sha256 taken as it goes), or a file of the version before
hard-linked (`LinkedFile`); `_write_file` writes one (fsync'd), `_file_entry`
is its manifest entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pathlib

import numpy as np

from static_compiler.format.manifest import FileEntry
from static_compiler.support.arrays import PieceArray, npy_chunks, npy_header
from static_compiler.support.mapped import release_pages


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


class NpyFile:
    """The bytes `np.save` writes for `arr`, produced in chunks of about
    CHUNK_BYTES: a table is hashed and written without a copy of it in
    memory (a memory-mapped one is read a chunk at a time). Compares equal
    to another NpyFile or to bytes with the same content."""

    CHUNK_BYTES = 1 << 24

    def __init__(self, arr):
        self.arr = arr  # an array, or an `arrays.PieceArray`
        self.header = npy_header(arr.shape, arr.dtype)

    @property
    def size(self) -> int:
        return len(self.header) + self.arr.nbytes

    def chunks(self):
        """The header, then the data (bytes-like objects; a mapped table's
        pages dropped as they are read)."""
        return npy_chunks(self.arr, self.CHUNK_BYTES, release_pages)

    @property
    def streamed(self) -> bool:
        """Whether its content is computed as it goes (a `PieceArray`): then
        it is hashed while it is written (`write_to`), not in a pass of its
        own."""
        return isinstance(self.arr, PieceArray)

    def entry(self) -> FileEntry:
        cached = getattr(self, "_entry", None)
        if cached is None:
            digest = hashlib.sha256()
            for chunk in self.chunks():
                digest.update(chunk)
            cached = self._entry = FileEntry(size=self.size, sha256=digest.hexdigest())
        return cached

    def write_to(self, f) -> None:
        """Writes the bytes to the open file `f`, hashing them on the way
        when the entry is not known yet."""
        digest = None if getattr(self, "_entry", None) is not None else hashlib.sha256()
        for chunk in self.chunks():
            f.write(chunk)
            if digest is not None:
                digest.update(chunk)
        if digest is not None:
            self._entry = FileEntry(size=self.size, sha256=digest.hexdigest())

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks())

    def __eq__(self, other):
        if isinstance(other, (bytes, bytearray, NpyFile)):
            return bytes(self) == bytes(other)
        return NotImplemented

    __hash__ = None


@dataclasses.dataclass(frozen=True)
class LinkedFile:
    """A file of the new version that is a file of an open snapshot
    unchanged (a reused module): hard-linked from it as it is written
    (`Snapshot.link_into`: a copy where links fail), its manifest entry
    taken as recorded, so a kept version shares its bytes with the next."""
    snap: object
    rel: str

    def entry(self) -> FileEntry:
        return self.snap.manifest.files[self.rel]


def _file_entry(data) -> FileEntry:
    return data.entry() if isinstance(data, (NpyFile, LinkedFile)) else FileEntry.of_bytes(data)


def _write_file(root: pathlib.Path, rel: str, data) -> None:
    """Writes `data` (bytes, an `NpyFile` in chunks, or a `LinkedFile`
    linked) to root / rel."""
    target = root / rel
    if isinstance(data, LinkedFile):
        data.snap.link_into(data.rel, target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if callable(data):  # a manifest made once the files before it are written
        data = data()
    with open(target, "wb") as f:
        if isinstance(data, NpyFile):
            data.write_to(f)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
