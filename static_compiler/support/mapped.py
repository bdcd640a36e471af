"""Memory-mapped arrays read or written front to back without their pages
piling up in this process's resident set.

A page of a file mapping counts in the process's RSS from the first touch
until it is unmapped, even when the kernel could drop it: copying a 2 GB
mapped table into an artifact, or scattering a billion row ids into a mapped
file, would otherwise hold the whole file resident. `release_pages` drops a
range with madvise(MADV_DONTNEED): the data stays in the page cache (and on
disk), and is read back if touched again.
"""

from __future__ import annotations

import mmap
from typing import Optional

import numpy as np


def release_pages(arr: np.ndarray, start: int = 0, stop: Optional[int] = None) -> None:
    """Drops bytes [start, stop) (default all) of `arr`'s data from this
    process's resident pages, when `arr` is (a view of) an `np.memmap`; a
    no-op for any other array, and where madvise is missing. Safe for read
    and written shared mappings alike: the file's pages keep the data."""
    mm = getattr(arr, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    except (ValueError, TypeError):  # a closed map
        return
    first = arr.ctypes.data - base
    stop = arr.nbytes if stop is None else min(int(stop), arr.nbytes)
    lo, hi = first + int(start), min(first + stop, len(mm))
    lo -= lo % mmap.PAGESIZE
    if lo < hi:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
