"""Timing primitives: calls waited for with block_until_ready, per-cell
repeats interleaved over the methods (`measure_runners`) and over the cells
of a sweep (`measure_sweep`), and their quantiles."""

from __future__ import annotations

import time
from typing import Optional

import jax
import numpy as np

KERNEL_CALLS = 10
"""Back-to-back calls per kernel timing: a kernel program runs for ~0.1-0.5 ms
here, where one call's time is mostly scheduling jitter."""


def median_ms(fn, repeats: int) -> float:
    """Median milliseconds of `repeats` calls of fn() (which waits for its
    own result)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def alternating_ms(fns: list, repeats: int) -> tuple[list, list]:
    """(median ms of each of `fns`, their last results): after one call
    each (the compiles), `repeats` rounds calling each once in turn."""
    outs = [jax.block_until_ready(fn()) for fn in fns]
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            outs[i] = jax.block_until_ready(fn())
            samples[i].append(time.perf_counter() - t0)
    return [float(np.median(s)) * 1e3 for s in samples], outs


def _time_call(fn, args, calls: int = 1) -> float:
    """Mean seconds of `calls` calls of fn(*args), each waited for."""
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / calls


def _time_kernels(r) -> float:
    """Seconds per step of the runner's constraint kernels (all steps in one
    program, divided by L), over KERNEL_CALLS calls."""
    return _time_call(*r.kernels, calls=KERNEL_CALLS) / len(r.steps)


def _time_steps(pairs, per_step: Optional[list] = None) -> float:
    """Mean seconds per step of one pass over `pairs`; appends each step's
    seconds to per_step[t] when given."""
    seconds = [_time_call(fn, args) for fn, args in pairs]
    if per_step is not None:
        for t, sec in enumerate(seconds):
            per_step[t].append(sec)
    return sum(seconds) / len(pairs)


def measure_runners(runners, cfg) -> dict:
    """{name: {"step": [s...], "kernel": [s...], "decode": [s...]}}: seconds
    per step (mean over the L steps), per step of the kernels (all steps'
    kernels run as one program, divided by L) and per decode, over
    interleaved repeats. Slow methods get fewer repeats (>= 3) so that each
    fits in cfg.method_budget_s. Decodes are timed for cfg.decode_methods."""
    timed_decode = lambda r: r.name in cfg.decode_methods
    for r in runners:  # warm-up (compiles) and a cost estimate
        for _ in range(2):
            _time_steps(r.steps)
            if r.kernels:
                _time_call(*r.kernels)
            if timed_decode(r):
                r.decode()
        est = len(r.steps) * _time_steps(r.steps) + (_time_call(r.decode, ()) if timed_decode(r)
                                                     else 0.0)
        r.extra["repeats"] = int(max(3, min(cfg.repeats, cfg.method_budget_s // max(est, 1e-9))))
    times = {r.name: {"step": [], "kernel": [], "decode": [], "by_step": [[] for _ in r.steps]}
             for r in runners}
    for i in range(max(r.extra["repeats"] for r in runners)):
        for r in runners:
            if i >= r.extra["repeats"]:
                continue
            times[r.name]["step"].append(_time_steps(r.steps, times[r.name]["by_step"]))
            if r.kernels:
                times[r.name]["kernel"].append(_time_kernels(r))
            if timed_decode(r):
                times[r.name]["decode"].append(_time_call(r.decode, ()))
    return times


def quantiles_ms(values) -> tuple:
    if not values:
        return (float("nan"),) * 3
    q = np.percentile(np.asarray(values) * 1e3, [50, 25, 75])
    return float(q[0]), float(q[1]), float(q[2])


def measure_sweep(kept: list, cfg) -> list:
    """Times the kept runners of every cell of a sweep interleaved (repeat
    after repeat over all cells), so that ratios across cells see the same
    machine load. kept: [{name: Runner}] per cell; returns [{name: times}]
    in the same order (times as in `measure_runners`)."""
    times = [{name: {"step": [], "kernel": [], "decode": []} for name in cell} for cell in kept]
    for _ in range(cfg.repeats):
        for cell, out in zip(kept, times):
            for name, r in cell.items():
                out[name]["step"].append(_time_steps(r.steps))
                if r.kernels:
                    out[name]["kernel"].append(_time_kernels(r))
                out[name]["decode"].append(_time_call(r.decode, ()))
    return times


