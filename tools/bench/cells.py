"""The decode timing cells: one cell measured (`run_cell`: build, runners,
timed repeats, one row per method) and a whole run (`run_plan`: each
distinct cell once, then the sweep-interleaved re-timing)."""

from __future__ import annotations

import sys
import time

import numpy as np

from tools.bench.build import measure_build
from tools.bench.config import ALL_METHODS, SWEEP_METHODS, SWEEPS, CellSpec
from tools.bench.runners import make_runners
from tools.bench.timing import measure_runners, measure_sweep, quantiles_ms


def run_cell(spec: CellSpec, methods, cfg) -> tuple:
    """Measures every method on `spec`; returns (one row (dict) per method,
    {name: Runner} of the SWEEP_METHODS for `measure_sweep`)."""
    print(f"[bench] {spec.label}: methods {', '.join(methods)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    build = measure_build(spec, in_child=cfg.build_child)
    runners, compiled = make_runners(spec, methods, cfg)
    ref = next((r.final for r in runners if r.name == "static"), None)
    ready = time.perf_counter()
    times = measure_runners(runners, cfg)
    print(f"[bench]   build + trace {ready - start:.1f} s, compile + timing "
          f"{time.perf_counter() - ready:.1f} s", file=sys.stderr, flush=True)
    unc = times.get("unconstrained", {}).get("step")
    rows = []
    for r in runners:
        t = times[r.name]
        step = quantiles_ms(t["step"])
        n = min(len(t["step"]), len(unc)) if unc else 0
        added = quantiles_ms([a - b for a, b in zip(t["step"][:n], unc[:n])]) if n else \
            quantiles_ms([])
        kernel = quantiles_ms(t["kernel"]) if t["kernel"] else (0.0, 0.0, 0.0)
        dec = quantiles_ms(t["decode"])
        same = ""
        if ref is not None and r.exact and r.name != "static":
            same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(r.final, ref))
        row = {
            "dataset": spec.dataset, "items": spec.items, "unique_items": compiled.ir.num_sequences,
            "vocab": spec.vocab, "length": spec.length, "batch": cfg.batch, "beams": cfg.beams,
            "tokens_per_beam": cfg.tokens_per_beam, "method": r.name, "exact": r.exact,
            "step_ms": step[0], "step_ms_p25": step[1], "step_ms_p75": step[2],
            "added_ms": added[0], "added_ms_p25": added[1], "added_ms_p75": added[2],
            "kernel_ms": kernel[0], "kernel_ms_p25": kernel[1], "kernel_ms_p75": kernel[2],
            "decode_ms": dec[0], "decode_ms_p25": dec[1], "decode_ms_p75": dec[2],
            "repeats": len(t["step"]), "index_bytes": r.index_bytes,
            "u_max_bytes": r.extra.get("u_max_bytes", ""),
            "build_s": build["build_s"] if r.name in ("static", "static_mask") else r.build_s,
            "build_peak_bytes": build["build_peak_bytes"] if r.name == "static" else "",
            "fpr": r.extra.get("fpr", ""), "same_as_static": same,
            "layouts": r.extra.get("layouts", ""),
            "step_ms_by_t": " ".join(f"{np.median(x) * 1e3:.3f}" for x in t["by_step"]),
        }
        rows.append(row)
        print(f"[bench]   {r.name:15s} step {step[0]:8.3f} ms  added {added[0]:+8.3f} ms  "
              f"kernel {kernel[0]:8.3f} ms  decode {dec[0]:9.3f} ms  x{len(t['step'])}",
              file=sys.stderr, flush=True)
    kept = {r.name: r for r in runners if r.name in SWEEP_METHODS}
    del runners, compiled
    return rows, kept


def run_plan(cells, cfg) -> list:
    """Runs each distinct CellSpec once (with the union of its methods);
    returns rows with a "sweep" key, one per (sweep, cell, method)."""
    wanted = {}
    for _, spec, methods in cells:
        wanted.setdefault(spec, [])
        wanted[spec] += [m for m in methods if m not in wanted[spec]]
    measured, rows = {}, []
    for sweep, spec, methods in cells:
        if spec not in measured:
            measured[spec] = run_cell(spec, [m for m in ALL_METHODS if m in wanted[spec]], cfg)
        rows += [dict(row, sweep=sweep, spec=spec) for row in measured[spec][0]
                 if row["method"] in methods]
    for sweep in SWEEPS:
        specs = list(dict.fromkeys(spec for sw, spec, _ in cells if sw == sweep))
        if len(specs) < 2:
            continue
        print(f"[bench] sweep {sweep}: static and unconstrained across {len(specs)} cells",
              file=sys.stderr, flush=True)
        timed = measure_sweep([measured[spec][1] for spec in specs], cfg)
        for spec, times in zip(specs, timed):
            for row in rows:
                if row["sweep"] == sweep and row["spec"] == spec and row["method"] in times:
                    t = times[row["method"]]
                    row["sweep_step_ms"], row["sweep_step_ms_p25"], row["sweep_step_ms_p75"] = \
                        quantiles_ms(t["step"])
                    row["sweep_decode_ms"], row["sweep_decode_ms_p25"], row["sweep_decode_ms_p75"] = \
                        quantiles_ms(t["decode"])
                    if t["kernel"]:
                        row["sweep_kernel_ms"] = quantiles_ms(t["kernel"])[0]
    for row in rows:
        del row["spec"]
    return rows


