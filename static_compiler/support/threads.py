"""Host work split over threads, each with state of its own.

numpy's ufuncs and the numba kernels release the GIL, so a pass over 1e9
rows runs a range per thread. `on_threads` deals the ranges out in turn
(a thread takes ranges t, t + k, ...) and runs each thread's share in one
call, so the thread keeps its own buffers and output (bits no other thread
writes) across its ranges: what a filter's evaluation (`rules.where`) and
the rows' item bits (`item_bits.item_masks`) do.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

THREADS = min(4, os.cpu_count() or 1)
"""Threads a pass over a large array uses (at most 4: past that the passes
are bound by memory bandwidth)."""


def on_threads(ranges: Sequence, run_share: Callable, threads: int = THREADS) -> list:
    """[run_share(ranges[t::k]) for t < k], k = min(threads, len(ranges))
    (at least 1), run on k threads (inline when k is 1): each share's
    result, such as the output its thread wrote."""
    k = max(1, min(int(threads), len(ranges)))
    if k == 1:
        return [run_share(list(ranges))]
    with ThreadPoolExecutor(k) as pool:
        return list(pool.map(lambda t: run_share(ranges[t::k]), range(k)))
