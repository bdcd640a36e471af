"""Partitioned build against the monolithic one: N random Semantic IDs
written as shard files (`datasets.write_synthetic_shards`, never held whole),
then built three ways, each in a fresh child process (its own peak RSS):

* monolithic: the shards loaded and concatenated, `frontend.build_trie`;
* partitioned: `build_trie_partitioned` with the tasks run in the child;
* partitioned with `--workers` processes (`ProcessPoolExecutor`);
* with `--compile` (or `--modes compile`), the whole `compile_constraints`
  of the shards on the pool, then `save` of the artifact (its seconds and
  the child's peak RSS before and after it).

Reported per build: seconds, peak RSS of the child (VmHWM, read before the
check below touches the merged arrays; the workers' own peaks are added for
the pool: each reports its VmHWM), the peak temporary disk (the file
system's used bytes above those before the build, sampled every 0.5 s),
and that the trie equals the first build's (states, edges, sequences per
layer and a hash of every array).

    python -m tools.bench.partitioned                         # 1e7 items
    python -m tools.bench.partitioned --items 1e8 --partitions 32 --workers 2
    python -m tools.bench.partitioned --items 3e8 --shards 30 --partitions 64 \
        --shard-dtype uint16 --modes compile \
        --pipeline "verify,choose-layout{memory-budget=16GiB},split-heavy,pad-branches,pack-dtypes"
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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


class _DiskPeak:
    """Samples the used bytes of the file system holding `path` in a thread:
    `peak` is the most above those at the start."""

    def __init__(self, path: str, every: float = 0.5):
        self.path, self.every = path, every
        self.base = self.peak_used = shutil.disk_usage(path).used
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.every):
            self.peak_used = max(self.peak_used, shutil.disk_usage(self.path).used)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_used - self.base


def _child(mode: str, shard_dir: str, vocab: int, partitions: int, workers: int,
           workdir: str, pipeline: str) -> dict:
    import numpy as np

    from static_compiler.frontend import build_trie
    from static_compiler.frontend.partitioned import Shards, build_trie_partitioned

    paths = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir)
                   if f.endswith(".npy"))
    Shards = functools.partial(Shards, workdir=workdir or None,
                               progress=lambda line: print(
                                   f"{line} (RSS {proc_status_bytes('VmRSS') / 2**30:.2f} GiB, "
                                   f"peak {proc_status_bytes('VmHWM') / 2**30:.2f} GiB)",
                                   file=sys.stderr, flush=True))
    disk = _DiskPeak(workdir or tempfile.gettempdir())
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
                compiled = sc.compile_constraints(shards, vocab, pipeline=pipeline or None)
                ir, items = compiled.outline, compiled.items  # (the IR stays in the tables)
                stages = ", ".join(f"{k} {v:.1f} s" for k, v in compiled.build.timings)
            else:
                ir, items = build_trie_partitioned(shards, vocab)
            worker_peaks = list(pool.map(_worker_peak, range(workers)))
    seconds = time.perf_counter() - start
    peak, disk_peak = proc_status_bytes("VmHWM"), disk.stop()
    if mode != "compile":
        stages = ""
    else:  # and the artifact: save's own time and what it adds to the peak
        from static_compiler import artifact
        with tempfile.TemporaryDirectory(dir=workdir or None) as out:
            t0 = time.perf_counter()
            artifact.save(compiled, os.path.join(out, "set.static"))
            stages += (f"; save {time.perf_counter() - t0:.1f} s, peak RSS {peak / 2**30:.2f} -> "
                       f"{proc_status_bytes('VmHWM') / 2**30:.2f} GiB (tables "
                       f"{compiled.lowered.nbytes / 2**30:.2f} GiB, "
                       f"{compiled.lowered.nbytes / len(items.row_item):.2f} "
                       f"bytes per item)")
    return {"mode": mode, "seconds": seconds, "peak": peak, "disk": disk_peak,
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
    parser.add_argument("--modes", default=None,
                        help="comma-separated builds to run, of monolithic, partitioned, pool "
                             "(default: all three, or the last two with --skip-monolithic)")
    parser.add_argument("--shard-dtype", default="int32",
                        help="dtype of the shard files (uint16 halves the input for V <= 65536)")
    parser.add_argument("--workdir", default="",
                        help="where shards and spill files go (default: the temp directory)")
    parser.add_argument("--compile", action="store_true",
                        help="also time the whole compile_constraints(Shards) on the pool "
                             "(build, passes, lowering)")
    parser.add_argument("--pipeline", default="",
                        help="--compile's pass pipeline (default: the library's; past 2 GiB of "
                             "tables give choose-layout a larger memory-budget)")
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # the children run in the checkout (cwd=ROOT): a relative --workdir means the caller's
    args.workdir = os.path.abspath(args.workdir) if args.workdir else args.workdir
    if args.child:
        mode, shard_dir, vocab, partitions, workers, workdir, pipeline = args.child
        print(json.dumps(_child(mode, shard_dir, int(vocab), int(partitions), int(workers),
                                workdir, pipeline)))
        return 0
    from static_compiler.frontend import datasets

    n = int(args.items)
    print(f"# partitioned build: {n} random items, L = {args.length}, V = {args.vocab}, "
          f"{args.shards} shards, P = {args.partitions}")
    print(f"# {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="shards-", dir=args.workdir or None) as shard_dir:
        start = time.perf_counter()
        paths = datasets.write_synthetic_shards(shard_dir, n, args.shards, args.length,
                                                args.vocab, dtype=args.shard_dtype)
        size = sum(os.path.getsize(p) for p in paths)
        print(f"# shards written in {time.perf_counter() - start:.1f} s: {size / 2**30:.2f} GiB "
              f"of {args.shard_dtype}", flush=True)
        modes = args.modes.split(",") if args.modes else \
            ["partitioned", "pool"] if args.skip_monolithic else \
            ["monolithic", "partitioned", "pool"]
        modes += ["compile"] if args.compile else []
        rows = []
        for mode in modes:
            out = subprocess.run([sys.executable, "-m", "tools.bench.partitioned", "--child", mode,
                                  shard_dir, str(args.vocab), str(args.partitions),
                                  str(args.workers), args.workdir, args.pipeline], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)  # progress on stderr
            if out.returncode:
                return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    print("\n| build | seconds | vs first | peak RSS (GiB) | temporary disk (GiB) | disk / input "
          "| same trie |")
    print("|---|---|---|---|---|---|---|")
    names = {"pool": f"partitioned, {args.workers} workers",
             "compile": f"compile_constraints(Shards), {args.workers} workers"}
    built = [r for r in rows if r["mode"] != "compile"]
    for r in rows:
        peak = r["peak"] + sum(r["worker_peaks"])
        same = "(a compile)" if r["mode"] == "compile" else \
            "yes" if r["digest"] == base["digest"] else "NO"
        print(f"| {names.get(r['mode'], r['mode'])} | {r['seconds']:.1f} | "
              f"{r['seconds'] / base['seconds']:.2f}x | {peak / 2**30:.2f} | "
              f"{r['disk'] / 2**30:.2f} | {r['disk'] / size:.2f}x | {same} |")
    for r in rows:
        if r["stages"]:
            print(f"# {names[r['mode']]}: {r['stages']}")
    return 0 if all(r["digest"] == base["digest"] for r in built) else 1


if __name__ == "__main__":
    sys.exit(main())
