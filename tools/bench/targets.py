"""The targets a run is judged by (`evaluate_targets`): met or missed, with
the measured values, for the rows it covers."""

from __future__ import annotations

from typing import Optional

import jax

from tools.bench.config import GPU_ITEMS, PAPER_TPU_ADDED_MS


def fmt_mb(v) -> str:
    """Bytes as MB with one decimal; "-" when not measured (empty or negative)."""
    return "-" if v in ("", None) or (isinstance(v, (int, float)) and v < 0) else f"{v / 1e6:.1f}"


def _find(rows, sweep, method, **match):
    for r in rows:
        if r["sweep"] == sweep and r["method"] == method and all(r[k] == v for k, v in match.items()):
            return r
    return None


def _sweep_value(row, key: str) -> float:
    """The sweep-interleaved measurement when there is one, else the cell's."""
    value = row.get("sweep_" + key, "")
    return row[key] if value in ("", None) else value


def evaluate_targets(rows, backend: Optional[str] = None) -> list:
    """[(target, measured text, met: bool)] for the suite's targets that the
    rows cover. Ratios across cells use the sweep-interleaved timings. The
    GPU target is judged on `backend` (jax's default backend when None) only
    when that is not the CPU."""
    out = []
    cells = {}
    for r in rows:
        if r["sweep"] in ("items", "vocab"):
            cells.setdefault((r["items"], r["vocab"]), {})[r["method"]] = r
    ratios = [(m["static"]["decode_ms"] / m["unconstrained"]["decode_ms"], key)
              for key, m in sorted(cells.items()) if "static" in m and "unconstrained" in m]
    if ratios:
        worst = max(ratios)
        out.append(("constrained decode <= unconstrained decode at every |C| and V",
                    "static / unconstrained decode: " + ", ".join(
                        f"{r:.2f} (|C|={n:.0e}, V={v})" for r, (n, v) in ratios),
                    worst[0] <= 1.0))
    items = sorted({r["items"] for r in rows if r["sweep"] == "items"})
    if len(items) >= 2:
        lo, hi = (_find(rows, "items", "static", items=n) for n in (items[0], items[-1]))
        ratio = _sweep_value(hi, "step_ms") / _sweep_value(lo, "step_ms")
        dratio = _sweep_value(hi, "decode_ms") / _sweep_value(lo, "decode_ms")
        out.append((f"per-step time flat in |C|: {items[-1]:.0e} within 1.3x of {items[0]:.0e}",
                    f"step {_sweep_value(hi, 'step_ms'):.3f} / {_sweep_value(lo, 'step_ms'):.3f} ms "
                    f"= {ratio:.2f}x; decode {dratio:.2f}x", ratio <= 1.3))
    vocabs = sorted({r["vocab"] for r in rows if r["sweep"] == "vocab"})
    if len(vocabs) >= 2:
        st = [_find(rows, "vocab", "static", vocab=v) for v in vocabs]
        kernel = [_sweep_value(r, "kernel_ms") for r in st]
        out.append((f"constraint cost flat in V from {vocabs[0]} to {vocabs[-1]} within 1.5x",
                    "static kernel ms " + ", ".join(f"{k:.4f} (V={v})" for k, v in zip(kernel, vocabs))
                    + f" = {max(kernel) / min(kernel):.2f}x max/min; step added vs unconstrained "
                    + ", ".join(f"{r['added_ms']:+.3f}" for r in st) + " ms",
                    max(kernel) / min(kernel) <= 1.5))
    with_baselines = sorted({r["items"] for r in rows
                             if r["sweep"] == "items" and r["method"] == "host_trie"})
    if with_baselines:
        n = with_baselines[-1]
        st = _find(rows, "items", "static", items=n)
        for name, need in (("host_trie", 100), ("exact_bsearch", 50)):
            other = _find(rows, "items", name, items=n)
            if other is None or st is None:
                continue
            ratio = other["kernel_ms"] / st["kernel_ms"]
            out.append((f">= {need}x faster per step than {name} at |C|={n:.0e}",
                        f"constraint kernel {other['kernel_ms']:.3f} / {st['kernel_ms']:.4f} ms = "
                        f"{ratio:.0f}x; added per step: {name} {other['added_ms']:+.3f} ms, static "
                        f"{st['added_ms']:+.3f} ms", ratio >= need))
    for n in sorted({r["items"] for r in rows if r["sweep"] == "skew"}):
        u = _find(rows, "skew", "static", items=n, dataset="uniform")
        z = _find(rows, "skew", "static", items=n, dataset="zipf")
        if u and z:
            ratio = _sweep_value(z, "step_ms") / _sweep_value(u, "step_ms")
            out.append((f"skewed set within 1.5x of uniform per step at |C|={n:.0e}",
                        f"step {_sweep_value(z, 'step_ms'):.3f} / {_sweep_value(u, 'step_ms'):.3f} ms "
                        f"= {ratio:.2f}x", ratio <= 1.5))
    gpu_cell = _find(rows, "items", "static", items=GPU_ITEMS)
    backend = backend or jax.default_backend()
    if gpu_cell and backend != "cpu":
        out.append((f"added time per step <= {PAPER_TPU_ADDED_MS} ms at |C|={GPU_ITEMS:.0e} on "
                    f"{backend} (paper: TPU v6e)", f"{gpu_cell['added_ms']:+.4f} ms "
                    f"(step {gpu_cell['step_ms']:.4f} ms)",
                    gpu_cell["added_ms"] <= PAPER_TPU_ADDED_MS))
    big = _find(rows, "items", "static", items=10 ** 7)
    if big:
        per_item = big["index_bytes"] / big["unique_items"]
        out.append(("index <= 25 bytes per item at 1e7", f"{per_item:.2f} bytes/item "
                    f"({big['index_bytes'] / 1e6:.1f} MB; U_max {big['u_max_bytes'] / 1e6:.1f} MB)",
                    per_item <= 25))
        out.append(("build <= 10 s at 1e7 from unsorted input",
                    f"{big['build_s']:.2f} s, peak {fmt_mb(big['build_peak_bytes'])} MB "
                    "above the input", big["build_s"] <= 10))
    differ = [r for r in rows if r["method"] != "static" and r["exact"]
              and r["same_as_static"] is False]
    checked = [r for r in rows if r["same_as_static"] is True] + differ
    if checked:
        out.append(("exact baselines decode static's sequences",
                    f"{len(checked) - len(differ)} of {len(checked)} (method, cell) pairs identical"
                    + "".join(f"; {r['method']} differs at |C|={r['items']:.0e} V={r['vocab']}"
                              for r in differ), not differ))
    return out


