"""Compile time per stage (`compile_constraints`: frontend, verify, each pass,
lower), each build in a fresh process, compared with a committed baseline:

    python -m tools.bench compile-time [--items 1e6 1e7] [--repeats 3]
        [--library PATH]      # measure another checkout's static_compiler
        [--check]             # exit 1 when a stage regressed past --tolerance
        [--write-baseline]    # record this run as the baseline (review the diff)
        [--save-run PATH]     # keep this run's figures (JSON)
        [--run PATH]          # compare a saved run instead of measuring

The set is the issue's: `datasets.synthetic_sids(N)` (uniform random
Semantic IDs, L = 8, V = 2048, unsorted, seed 0) compiled with the default
pipeline. A child imports the compiler (and so JAX) and makes the input
before its clock starts, so a stage's time is the build's alone, page faults
of its fresh arrays included, as a user's first build pays them. Each size
is built `--repeats` times, each in its own process, and the median of each
stage is reported.

The baseline (`tools/bench/compile_time_baseline.json`) holds the medians of
one run and the machine it ran on (CPU model, cores). Each stage is printed
with its ratio to the baseline; a ratio above `--tolerance` (default 1.25)
on a stage that takes at least 0.05 s in the baseline is marked REGRESSED.
A baseline from another CPU model or core count makes ratios indicative
only, and the table says so. The baseline changes only by `--write-baseline`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASELINE = os.path.join(ROOT, "tools", "bench", "compile_time_baseline.json")
DEFAULT_ITEMS = (10 ** 6, 10 ** 7)
TOLERANCE = 1.25
MIN_STAGE_S = 0.05
"""Stages faster than this in the baseline are printed but never flagged:
their ratios are noise."""

CHILD = r"""
import json, sys, time
import static_compiler.compiler  # jax & co. load before the clock starts
import static_compiler as sc
from static_compiler import datasets  # both layouts (a --library checkout may be older)

items = int(sys.argv[1])
sids = datasets.synthetic_sids(items)
start = time.perf_counter()
compiled = sc.compile_constraints(sids, vocab_size=2048)
total = time.perf_counter() - start
print(json.dumps({"library": sc.__file__, "total": total,
                  "stages": dict(compiled.build.timings), "nbytes": int(compiled.lowered.nbytes)}))
"""


def machine() -> dict:
    """The machine class a timing belongs to: CPU model and core count."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count()}


def _child(items: int, library: str | None) -> dict:
    env = dict(os.environ)
    if library:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [library, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", CHILD, str(items)], cwd=library or ROOT,
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the build of {items} items failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(items: int, repeats: int, library: str | None = None) -> dict:
    """Median seconds of each stage and of the whole build over `repeats`
    fresh processes: {"total": s, "stages": {name: s}, "library": path}."""
    runs = [_child(items, library) for _ in range(repeats)]
    stages = {name: statistics.median(r["stages"][name] for r in runs)
              for name in runs[0]["stages"]}
    return {"total": statistics.median(r["total"] for r in runs), "stages": stages,
            "library": runs[0]["library"], "repeats": repeats}


def read_baseline(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_baseline(path: str, results: dict) -> None:
    """Writes the run as the baseline, atomically; sorted keys and rounded
    times keep the file's diff readable."""
    _write_json(path, {"machine": machine(), "items": {
        str(items): {"total": round(r["total"], 4),
                     "stages": {k: round(v, 4) for k, v in r["stages"].items()}}
        for items, r in results.items()}})


def _write_json(path: str, body: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def compare(results: dict, baseline: dict | None, tolerance: float) -> tuple[list[str], list[str]]:
    """(markdown lines, regressions): a table per size of each stage's median,
    the baseline's and their ratio."""
    lines, regressed = [], []
    if baseline is None:
        lines.append("No baseline: run with --write-baseline to record one.")
    elif baseline.get("machine") != machine():
        lines.append(f"Baseline from another machine ({baseline.get('machine')}; this one "
                     f"{machine()}): ratios are indicative only.")
    for items, r in results.items():
        base = (baseline or {}).get("items", {}).get(str(items))
        lines += ["", f"{items:.0e} items (median of {r['repeats']} fresh processes, "
                      f"library {r['library']}):", "",
                  "| stage | seconds | baseline s | ratio |", "|---|---|---|---|"]
        rows = list(r["stages"].items()) + [("total", r["total"])]
        for name, seconds in rows:
            was = None if base is None else (base["total"] if name == "total"
                                             else base["stages"].get(name))
            if was is None:
                lines.append(f"| {name} | {seconds:.3f} | - | - |")
                continue
            ratio = seconds / was if was > 0 else float("inf")
            flag = ""
            if ratio > tolerance and was >= MIN_STAGE_S:
                flag = " REGRESSED"
                regressed.append(f"{items:.0e} {name}: {seconds:.3f} s vs {was:.3f} s "
                                 f"({ratio:.2f}x)")
            lines.append(f"| {name} | {seconds:.3f} | {was:.3f} | {ratio:.2f}{flag} |")
    return lines, regressed


def _count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer (1e6 is fine)")
    return int(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench compile-time",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", nargs="+", type=_count, default=list(DEFAULT_ITEMS))
    parser.add_argument("--repeats", type=_count, default=3)
    parser.add_argument("--library", help="a checkout whose static_compiler to measure")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a stage is slower than the baseline by --tolerance")
    parser.add_argument("--write-baseline", action="store_true",
                        help="record this run as the baseline")
    parser.add_argument("--save-run", help="also write this run's figures here (JSON)")
    parser.add_argument("--run", help="compare the figures saved by --save-run instead of measuring")
    args = parser.parse_args(argv)
    if args.tolerance <= 1:
        parser.error(f"--tolerance {args.tolerance}: expected a ratio > 1")
    if args.run:
        with open(args.run) as f:
            results = {int(items): r for items, r in json.load(f).items()}
    else:
        results = {}
        for items in args.items:
            results[items] = measure(items, args.repeats, args.library)
            print(f"{items:.0e} items: {results[items]['total']:.3f} s", file=sys.stderr,
                  flush=True)
    if args.save_run:
        _write_json(args.save_run, {str(items): r for items, r in results.items()})
    baseline = read_baseline(args.baseline)
    lines, regressed = compare(results, baseline, args.tolerance)
    print("\n".join(lines))
    if args.write_baseline:
        write_baseline(args.baseline, results)
        print(f"\nbaseline written: {args.baseline}")
    if regressed:
        print("\nREGRESSED:\n" + "\n".join(regressed))
    return 1 if args.check and regressed else 0


if __name__ == "__main__":
    sys.exit(main())
