"""Host work split over threads, each with state of its own.

numpy's ufuncs and the numba kernels release the GIL, so a pass over 1e9
rows runs a range per thread. `on_threads` deals the ranges out in turn
(a thread takes ranges t, t + k, ...) and runs each thread's share in one
call, so the thread keeps its own buffers and output (bits no other thread
writes) across its ranges: what a filter's evaluation (`rules.where`) and
the rows' item bits (`item_bits.item_masks`) do.

The threads are kept between calls (`workers`): a new thread's first
megabytes come from a fresh malloc arena, whose pages this VM faults in at
~6 us each, which cost a 1e7 subset's second thread 2 ms of its 2.5
(docs/benchmarks.md, "Selected rows found by their words"). A call made
from one of those threads runs on threads of its own, as before, so a
share that splits its work again never waits for a worker it holds.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

THREADS = min(4, os.cpu_count() or 1)
"""Threads a pass over a large array uses (at most 4: past that the passes
are bound by memory bandwidth)."""

KEPT_WORKERS = 32
"""Most threads the kept pool holds: callers on several threads at once
(a served set's range tables begun at load beside a request's subset) get
idle workers first, then new ones, never a queue behind each other."""

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()
_inside = threading.local()


def _kept_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(KEPT_WORKERS, thread_name_prefix="static-compiler",
                                       initializer=_mark_worker)
        return _pool


def _mark_worker() -> None:
    _inside.worker = True


def _forget_pool() -> None:
    """In a forked child: the parent's workers do not exist there."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run_all(tasks: Iterable[Callable[[], object]], k: int) -> list:
    """[task() for task in tasks] (at least two), on the kept workers, or
    on k threads of their own when called from a kept worker."""
    tasks = list(tasks)
    if getattr(_inside, "worker", False):
        with ThreadPoolExecutor(k) as pool:
            return list(pool.map(lambda task: task(), tasks))
    pool = _kept_pool()
    return [future.result() for future in [pool.submit(task) for task in tasks]]


def on_threads(ranges: Sequence, run_share: Callable, threads: int = THREADS) -> list:
    """[run_share(ranges[t::k]) for t < k], k = min(threads, len(ranges))
    (at least 1), run on k threads (inline when k is 1): each share's
    result, such as the output its thread wrote."""
    k = max(1, min(int(threads), len(ranges)))
    if k == 1:
        return [run_share(list(ranges))]
    return run_all([lambda t=t: run_share(ranges[t::k]) for t in range(k)], k)


def pack_in_spans(n: int, span: int, rows_of: Callable, out: np.ndarray,
                  threads: int = THREADS) -> None:
    """Packs n bools into `out` (uint8, at least ceil(n / 8) bytes; numpy's
    little bit order: row r is bit r % 8 of byte r // 8) a span of `span`
    rows (rounded down to whole bytes) at a time on `threads` threads, no
    two writing a byte: rows_of(a, b, own) gives rows [a, b) as bool (b -
    a,), `own` a dict its thread keeps across its spans (for its buffers).
    A 1e9 mask packed in 43 ms on two threads against 58 ms for one
    `np.packbits` (docs/benchmarks.md, "Rows in trie order and buckets")."""
    span = max(8, span // 8 * 8)

    def one_share(share) -> None:
        own: dict = {}
        for a in share:
            packed = np.packbits(rows_of(a, min(n, a + span), own), bitorder="little")
            out[a // 8:a // 8 + packed.shape[0]] = packed

    on_threads(range(0, n, span), one_share, threads)
