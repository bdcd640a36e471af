"""Build measurements: compile time, peak memory and index size, each build
in a fresh child process so that its peak RSS belongs to that build alone.

Two uses: the build columns of a benchmark cell (`measure_build`, run by
`python -m tools.bench`), and the build benchmark at scale (`main`): the
child makes N unsorted random Semantic IDs (L tokens over V), notes its RSS,
compiles with the default pipeline, and reports the peak RSS above that
baseline (i.e. above the input array), the time of each stage and the bytes
of every table.

    python -m tools.bench.build                    # 1e7 items, L=8, V=2048
    python -m tools.bench.build --items 1e6 1e7 1e8 --out bench_out/build.md

Reference points: the reference implementation needs ~16 s to sort plus
~14 s to build 1e7 items, 6.9 GiB peak, ~75 bytes per item; the paper
measures ~73 MB per 1M items on TPU.

Children are this module run as ``python -m tools.bench.build --child ...``
(a scale build) or ``--cell-child JSON`` (a benchmark cell), with the
repository root as working directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

import static_compiler as sc
from tools.bench.config import CellSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root: the working directory of the children, where
`tools` is importable."""


def proc_status_bytes(key: str) -> int:
    """A memory line of /proc/self/status ("VmRSS", "VmHWM") in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _measured_compile(sequences, vocab_size: int) -> tuple:
    """(compiled, seconds, peak bytes above the RSS before the build). The
    peak is VmHWM, the high-water mark of this process's own memory
    (getrusage's ru_maxrss would carry the parent's peak over the fork and
    exec), so it means something only in a fresh child."""
    before = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    compiled = sc.compile_constraints(sequences, vocab_size=vocab_size)
    seconds = time.perf_counter() - start
    return compiled, seconds, max(0, proc_status_bytes("VmHWM") - before)


def _run_child(args: list) -> dict:
    """Runs this module with `args` in a fresh process; its last stdout line (JSON)."""
    cmd = [sys.executable, "-m", "tools.bench.build"] + args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# A benchmark cell's build


def _cell_child(spec: CellSpec) -> dict:
    """Builds `spec` in this (fresh) process; returns time, peak RSS above the
    input array, and the index size."""
    compiled, seconds, peak = _measured_compile(spec.sequences(), spec.vocab)
    return {"build_s": seconds, "build_peak_bytes": peak, "index_bytes": compiled.lowered.nbytes}


def measure_build(spec: CellSpec, in_child: bool = True) -> dict:
    """Build time and peak memory of `spec` (in a child process unless
    in_child is False, when the peak is not measured and reported as -1)."""
    if not in_child:
        start = time.perf_counter()
        compiled = sc.compile_constraints(spec.sequences(), vocab_size=spec.vocab)
        return {"build_s": time.perf_counter() - start, "build_peak_bytes": -1,
                "index_bytes": compiled.lowered.nbytes}
    return _run_child(["--cell-child", json.dumps(dataclasses.asdict(spec))])


# --------------------------------------------------------------------------
# The build benchmark at scale


def _scale_child(items: int, length: int, vocab: int, seed: int) -> dict:
    """Runs one build in this process and returns its measurements."""
    import static_compiler.compiler  # noqa: F401  (jax & co. load before the baseline)

    rng = np.random.default_rng(seed)
    dtype = np.int16 if vocab <= 1 << 15 else np.int32
    sids = rng.integers(0, vocab, size=(items, length), dtype=dtype)
    compiled, seconds, peak = _measured_compile(sids, vocab)
    return {
        "items": items, "length": length, "vocab": vocab,
        "unique_items": compiled.ir.num_sequences,
        "build_s": seconds,
        "stages": {name: t for name, t in compiled.build.timings},
        "peak_above_input_bytes": peak,
        "input_bytes": int(sids.nbytes),
        "index_bytes": compiled.lowered.nbytes,
        "layers": compiled.layer_stats(),
    }


def _markdown(results: list) -> str:
    gib = 1 << 30
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             "",
             "| items | unique | L | V | build s | frontend s | passes s | lower s | peak above input GiB "
             "| index MB | bytes/item |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        st = r["stages"]
        passes = sum(t for k, t in st.items() if k not in ("frontend", "lower"))
        lines.append(
            f"| {r['items']:.0e} | {r['unique_items']} | {r['length']} | {r['vocab']} | "
            f"{r['build_s']:.2f} | {st['frontend']:.2f} | {passes:.2f} | {st['lower']:.2f} | "
            f"{r['peak_above_input_bytes'] / gib:.2f} | {r['index_bytes'] / 1e6:.1f} | "
            f"{r['index_bytes'] / r['items']:.2f} |")
    for r in results:
        lines += ["", f"Per layer at {r['items']:.0e} items:", "",
                  "| layer | states | edges | max branch | layout | k | dtypes | bytes |",
                  "|---|---|---|---|---|---|---|---|"]
        for t, s in enumerate(r["layers"]):
            lines.append(f"| {t} | {s['states']} | {s['edges']} | {s['max_branch']} | {s['layout']} | "
                         f"{s['k']} | {s['token_dtype']}/{s['state_dtype']} | {s['bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", nargs="+", type=float, default=[1e7])
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cell-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_scale_child(*args.child)))
        return 0
    if args.cell_child:
        print(json.dumps(_cell_child(CellSpec(**json.loads(args.cell_child)))))
        return 0
    results = []
    for items in args.items:
        r = _run_child(["--child", str(int(items)), str(args.length), str(args.vocab_size),
                        str(args.seed)])
        results.append(r)
        print(f"{int(items):.0e} items: build {r['build_s']:.2f} s, peak above input "
              f"{r['peak_above_input_bytes'] / (1 << 30):.2f} GiB, "
              f"{r['index_bytes'] / r['items']:.2f} bytes/item", file=sys.stderr)
    table = _markdown(results)
    print(table)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(table)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
