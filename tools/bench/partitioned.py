"""Partitioned build against the monolithic one: N random Semantic IDs
written as shard files (`datasets.write_synthetic_shards`, never held whole),
then built three ways, each in a fresh child process (its own peak RSS):

* monolithic: the shards loaded and concatenated, `frontend.build_trie`;
* partitioned: `build_trie_partitioned` with the tasks run in the child;
* partitioned with `--workers` processes (`ProcessPoolExecutor`).

Reported per build: seconds, peak RSS of the child (VmHWM; the workers'
own peaks are added for the pool: each reports its VmHWM), and that the
trie equals the monolithic one (states, edges, sequences per layer and a
hash of every array).

    python -m tools.bench.partitioned                         # 1e7 items
    python -m tools.bench.partitioned --items 1e8 --partitions 32 --workers 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

from tools.bench.build import ROOT, proc_status_bytes
from tools.bench.cli import sid_set_parser
from tools.bench.output import machine_line


def _digest(ir, items) -> str:
    h = hashlib.blake2b(digest_size=8)
    for layer in ir.layers:
        for arr in (layer.indptr, layer.tokens, layer.accepting):
            if arr is not None:
                h.update(str(arr.dtype).encode())
                h.update(memoryview(arr.view("u1") if arr.dtype == bool else arr).cast("B"))
    h.update(memoryview(items.row_item).cast("B"))
    return h.hexdigest()


def _worker_peak(_=None) -> int:
    return proc_status_bytes("VmHWM")


def _child(mode: str, shard_dir: str, vocab: int, partitions: int, workers: int) -> dict:
    import numpy as np

    from static_compiler.frontend import build_trie
    from static_compiler.partitioned import Shards, build_trie_partitioned

    paths = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir)
                   if f.endswith(".npy"))
    start = time.perf_counter()
    worker_peaks = []
    if mode == "monolithic":
        ir, items = build_trie(np.concatenate([np.load(p) for p in paths]), vocab)
    elif mode == "partitioned":
        ir, items = build_trie_partitioned(Shards(paths, partitions=partitions), vocab)
    else:  # "pool", or "compile": the whole compile_constraints on the pool
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        import static_compiler as sc
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            shards = Shards(paths, partitions=partitions, executor=pool)
            if mode == "compile":
                compiled = sc.compile_constraints(shards, vocab)
                ir, items = compiled.ir, compiled.items
                stages = ", ".join(f"{k} {v:.1f}" for k, v in compiled.timings)
            else:
                ir, items = build_trie_partitioned(shards, vocab)
            worker_peaks = list(pool.map(_worker_peak, range(workers)))
    seconds = time.perf_counter() - start
    if mode != "compile":
        stages = ""
    return {"mode": mode, "seconds": seconds, "peak": proc_status_bytes("VmHWM"),
            "worker_peaks": worker_peaks, "stages": stages,
            "digest": _digest(ir, items) if mode != "compile" else "",
            "sequences": ir.num_sequences, "states": ir.num_states}


def main(argv=None) -> int:
    parser = sid_set_parser("partitioned", __doc__, 1e7)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-monolithic", action="store_true",
                        help="past this machine's memory: compare the two partitioned builds")
    parser.add_argument("--compile", action="store_true",
                        help="also time the whole compile_constraints(Shards) on the pool "
                             "(build, passes, lowering)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, shard_dir, vocab, partitions, workers = args.child
        print(json.dumps(_child(mode, shard_dir, int(vocab), int(partitions), int(workers))))
        return 0
    from static_compiler import datasets

    n = int(args.items)
    print(f"# partitioned build: {n} random items, L = {args.length}, V = {args.vocab}, "
          f"{args.shards} shards, P = {args.partitions}")
    print(f"# {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="shards-") as shard_dir:
        start = time.perf_counter()
        datasets.write_synthetic_shards(shard_dir, n, args.shards, args.length, args.vocab)
        print(f"# shards written in {time.perf_counter() - start:.1f} s")
        modes = ["partitioned", "pool"] if args.skip_monolithic else \
            ["monolithic", "partitioned", "pool"]
        modes += ["compile"] if args.compile else []
        rows = []
        for mode in modes:
            out = subprocess.run([sys.executable, "-m", "tools.bench.partitioned", "--child", mode,
                                  shard_dir, str(args.vocab), str(args.partitions),
                                  str(args.workers)], cwd=ROOT, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    print("\n| build | seconds | vs first | peak RSS (GiB) | same trie |")
    print("|---|---|---|---|---|")
    names = {"pool": f"partitioned, {args.workers} workers",
             "compile": f"compile_constraints(Shards), {args.workers} workers"}
    built = [r for r in rows if r["mode"] != "compile"]
    for r in rows:
        peak = r["peak"] + sum(r["worker_peaks"])
        same = "(a compile)" if r["mode"] == "compile" else \
            "yes" if r["digest"] == base["digest"] else "NO"
        print(f"| {names.get(r['mode'], r['mode'])} | {r['seconds']:.1f} | "
              f"{r['seconds'] / base['seconds']:.2f}x | {peak / 2**30:.2f} | {same} |")
    for r in rows:
        if r["stages"]:
            print(f"# {names[r['mode']]}: {r['stages']} s")
    return 0 if all(r["digest"] == base["digest"] for r in built) else 1


if __name__ == "__main__":
    sys.exit(main())
