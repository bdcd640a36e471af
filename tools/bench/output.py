"""What a run writes: results.csv (CSV_FIELDS), results.md (machine, command,
targets, one table per sweep) and, with matplotlib, one plot per sweep."""

from __future__ import annotations

import csv
import datetime
import math
import os
import platform

import jax

from tools.bench.config import ALL_METHODS, SWEEPS
from tools.bench.targets import evaluate_targets, fmt_mb

CSV_FIELDS = ("sweep", "dataset", "items", "unique_items", "vocab", "length", "batch", "beams",
              "tokens_per_beam", "method", "exact", "step_ms", "step_ms_p25", "step_ms_p75",
              "added_ms", "added_ms_p25", "added_ms_p75", "kernel_ms", "kernel_ms_p25",
              "kernel_ms_p75", "decode_ms", "decode_ms_p25", "decode_ms_p75", "repeats",
              "index_bytes", "u_max_bytes", "build_s", "build_peak_bytes", "fpr",
              "same_as_static", "layouts", "step_ms_by_t", "sweep_step_ms", "sweep_step_ms_p25",
              "sweep_step_ms_p75", "sweep_decode_ms", "sweep_decode_ms_p25", "sweep_decode_ms_p75",
              "sweep_kernel_ms")


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                       cpu)
    except OSError:
        pass
    mem = ""
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2 ** 30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    dev = jax.devices()[0]
    return (f"{cpu}, {os.cpu_count()} cores{mem}; jax {jax.__version__} on "
            f"{dev.platform} ({dev.device_kind}); Python {platform.python_version()}")


def _fmt_ms(row, key) -> str:
    v, lo, hi = row[key], row[key + "_p25"], row[key + "_p75"]
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def markdown_tables(rows) -> str:
    out = []
    for sweep in SWEEPS:
        sub = [r for r in rows if r["sweep"] == sweep]
        if not sub:
            continue
        out += [f"### Sweep: {sweep}", "",
                "| set | |C| (unique) | V | method | step ms [p25, p75] | added ms [p25, p75] | "
                "kernel ms | decode ms [p25, p75] | index MB | U_max MB | build s | build peak MB "
                "| FPR | same as static | layouts |",
                "|" + "---|" * 15]
        for r in sub:
            fpr = f"{r['fpr']:.4f}" if isinstance(r["fpr"], float) else ""
            out.append(
                f"| {r['dataset']} | {r['items']:.0e} ({r['unique_items']}) | {r['vocab']} | "
                f"{r['method']} | {_fmt_ms(r, 'step_ms')} | {_fmt_ms(r, 'added_ms')} | "
                f"{r['kernel_ms']:.3f} | {_fmt_ms(r, 'decode_ms')} | {fmt_mb(r['index_bytes'])} "
                f"| {fmt_mb(r['u_max_bytes'])} | {r['build_s']:.2f} | "
                f"{fmt_mb(r['build_peak_bytes'])} | {fpr} | {r['same_as_static']} | "
                f"{r['layouts']} |")
        out.append("")
    return "\n".join(out)


def write_outputs(rows, out_dir: str, command: str, seconds: float, plots: bool = True) -> dict:
    """Writes results.csv, results.md and the plots; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, "results.csv"), "md": os.path.join(out_dir, "results.md")}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in CSV_FIELDS})
    plot_note = "plots: not requested"
    if plots:
        plot_paths, plot_note = write_plots(rows, out_dir)
        paths.update(plot_paths)
    targets = evaluate_targets(rows)
    lines = ["# Benchmark results", "",
             f"Machine: {machine_line()}", "",
             f"Command: `{command}` ({seconds:.0f} s, {datetime.date.today().isoformat()})", "",
             "step/added/kernel/decode in ms: median [25th, 75th percentile] over repeats; "
             "added = step minus the unconstrained step of the same repeat.", "",
             f"{plot_note}", "", "## Targets", "",
             "| target | measured | met |", "|---|---|---|"]
    for name, text, met in targets:
        lines.append(f"| {name} | {text} | {'yes' if met else 'NO'} |")
    lines += ["", "## Results", "", markdown_tables(rows)]
    with open(paths["md"], "w") as f:
        f.write("\n".join(lines) + "\n")
    return paths


def write_plots(rows, out_dir: str) -> tuple:
    """PNG per sweep; ({name: path}, note). Without matplotlib, no plots."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, "plots: matplotlib is not installed (pip install static-compiler[plots]); none written"
    paths = {}
    for sweep, x_key, x_label in (("items", "items", "|C| (items)"), ("vocab", "vocab", "V"),
                                  ("branch", "vocab", "branch factor B = V")):
        sub = [r for r in rows if r["sweep"] == sweep]
        if not sub:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for method in ALL_METHODS:
            pts = sorted((r[x_key], r) for r in sub if r["method"] == method)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            axes[0].errorbar(xs, [p[1]["step_ms"] for p in pts],
                             yerr=[[p[1]["step_ms"] - p[1]["step_ms_p25"] for p in pts],
                                   [p[1]["step_ms_p75"] - p[1]["step_ms"] for p in pts]],
                             marker="o", label=method, capsize=2)
            if method != "unconstrained":
                axes[1].plot(xs, [max(p[1]["kernel_ms"], 1e-4) for p in pts], marker="o",
                             label=method)
        for ax, title in ((axes[0], "ms per decoding step"), (axes[1], "constraint kernel ms per step")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(x_label)
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{sweep}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[sweep] = path
    return paths, "plots: " + ", ".join(os.path.basename(p) for p in paths.values())
