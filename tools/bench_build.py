"""Build benchmark: compile time, peak memory and index size at scale.

Each size runs in a fresh child process, so peak RSS belongs to that build
alone: the child makes N unsorted random Semantic IDs (L tokens over V), notes
its RSS, compiles with the default pipeline, and reports the peak RSS above
that baseline (i.e. above the input array), the time of each stage and the
bytes of every table.

    python tools/bench_build.py                    # 1e7 items, L=8, V=2048
    python tools/bench_build.py --items 1e6 1e7 1e8 --out bench_out/build.md

Reference points (issue 2): the reference implementation needs ~16 s to sort
plus ~14 s to build 1e7 items, 6.9 GiB peak, ~75 bytes per item; the paper
measures ~73 MB per 1M items on TPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _child(items: int, length: int, vocab: int, seed: int) -> dict:
    """Runs one build in this process and returns its measurements."""
    import time

    import numpy as np

    import static_compiler as sc
    from tools.bench import proc_status_bytes  # VmHWM: this child's own peak
    import static_compiler.compiler  # noqa: F401  (jax & co. load before the baseline)

    rng = np.random.default_rng(seed)
    dtype = np.int16 if vocab <= 1 << 15 else np.int32
    sids = rng.integers(0, vocab, size=(items, length), dtype=dtype)
    baseline = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    compiled = sc.compile_constraints(sids, vocab_size=vocab)
    seconds = time.perf_counter() - start
    peak = proc_status_bytes("VmHWM")
    return {
        "items": items, "length": length, "vocab": vocab,
        "unique_items": compiled.ir.num_sequences,
        "build_s": seconds,
        "stages": {name: t for name, t in compiled.timings},
        "peak_above_input_bytes": max(0, peak - baseline),
        "input_bytes": int(sids.nbytes),
        "index_bytes": compiled.nbytes,
        "layers": compiled.layer_stats(),
    }


def _run_child(items: int, length: int, vocab: int, seed: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(items), str(length),
           str(vocab), str(seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    results = []
    for items in args.items:
        r = _run_child(int(items), args.length, args.vocab_size, args.seed)
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
