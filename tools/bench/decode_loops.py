"""The fused beam search with loops over runs of steps against every step
inline (`static_compiler.backend.decode.search.UNROLL_BACKENDS`), beside the
harness's unrolled `static_mask` and `unconstrained` decodes, in one process:

    python -m tools.bench.decode_loops --items 1e5 2e7

Prints, per |C| (uniform SIDs, L = 8, V = 2048 unless --length / --vocab say
otherwise, batch 2, 70 beams, 30 tokens per beam), the median ms of each
decode over interleaved rounds and the first call (trace + compile) of each
search; the last line is JSON. Measured on an
H200 (docs/benchmarks.md, "On an H200"), where the loops cost a host round
trip per step.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from static_compiler.backend.decode import search
from tools.bench.config import CellSpec, Config
from tools.bench.runners import make_runners


def measure(items: int, rounds: int, calls: int, vocab: int = 2048, length: int = 8) -> dict:
    runners, _ = make_runners(CellSpec("uniform", items, vocab, length),
                              ("static", "static_mask", "unconstrained"), Config(build_child=False))
    by = {r.name: r for r in runners}
    backend = jax.default_backend()
    variants = {"loops": (), "inline": (backend,)}
    saved, cell = search.UNROLL_BACKENDS, {"first_call_s": {}}
    try:
        for name, backends in variants.items():
            search.UNROLL_BACKENDS = backends
            start = time.perf_counter()
            by["static"].decode()
            cell["first_call_s"][name] = round(time.perf_counter() - start, 2)
        times = {key: [] for key in ("loops", "inline", "static_mask", "unconstrained")}
        for _ in range(rounds):
            for key in times:
                if key in variants:
                    search.UNROLL_BACKENDS = variants[key]
                decode = by["static" if key in variants else key].decode
                decode()
                for _ in range(calls):
                    start = time.perf_counter()
                    decode()
                    times[key].append((time.perf_counter() - start) * 1e3)
    finally:
        search.UNROLL_BACKENDS = saved
    cell.update({f"{key}_ms": round(float(np.median(v)), 4) for key, v in times.items()})
    return cell


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.decode_loops",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=float, nargs="+", default=[1e5])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="timed decodes per round")
    parser.add_argument("--vocab", type=int, default=2048, help="V (smaller for a smoke run)")
    parser.add_argument("--length", type=int, default=8, help="L (smaller for a smoke run)")
    args = parser.parse_args(argv)
    out = {"backend": jax.default_backend(), "jax": jax.__version__, "cells": {}}
    for items in args.items:
        cell = measure(int(items), args.rounds, args.calls, args.vocab, args.length)
        out["cells"][f"{items:.0e}"] = cell
        print(f"|C|={items:.0e}", cell, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
