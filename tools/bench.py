"""Benchmark suite: STATIC (this library) against the paper's baselines.

Every method decodes with the same model (`baselines.TableModel`, a table
lookup, so constraint handling is what differs) at the paper's configuration:
batch 2, beams 70, tokens per beam 30, L = 8. Methods:

* ``static``: the library's own beam search (`static_compiler.beam_search`:
  sparse candidates from the compiled tables, no (B, M, V) mask);
* ``static_mask``: the library's logits-processor pair (`mask` / `advance`)
  in the baselines' harness: a dense mask, as the paper measures STATIC;
* ``unconstrained``, ``host_trie``, ``exact_bsearch``, ``approx_bsearch``,
  ``hash_bitmap``: see `tools/baselines.py`; all run by the same masked beam
  search as ``static_mask``.

Per cell (constraint set) and method:

* ``step_ms``: one decoding step (model + constraint + beam update), each
  step t jitted on its own and timed with block_until_ready on the real state
  of a decode at t; a repeat times all L steps and takes their mean; reported
  as the median and the 25th / 75th percentiles over repeats (after warm-up).
  Repeats interleave the methods, so machine load hits them alike.
* ``added_ms``: step_ms minus the unconstrained step_ms of the same repeat
  (the paper's "added latency per step"); negative means faster.
* ``step_ms_by_t``: the median of each step t (the per-step breakdown).
* ``kernel_ms``: the constraint lookup alone per step, on the same states:
  for static the layout kernels giving each live beam's candidate tokens,
  next states and validity (`backend.kernels.expand`); for the baselines the
  allowed tokens (`allowed`). The L steps' lookups run as one program,
  divided by L, so per-call dispatch does not swamp microsecond kernels; each
  repeat is the mean of KERNEL_CALLS calls.
* ``decode_ms``: the whole jitted decode (L steps).
* index bytes (and the paper's bound U_max for static), build seconds and
  the build's peak RSS above its input (static: measured in a child process).
* ``sweep_step_ms`` / ``sweep_decode_ms`` / ``sweep_kernel_ms`` (static and
  unconstrained): the same, re-timed with the repeats interleaved over all
  cells of the sweep, so that ratios across cells (flat in |C|, in V, skew)
  compare measurements taken under the same machine load.

Sweeps: ``items`` (|C| at V = 2048), ``vocab`` (V at |C| = 1e6), ``skew``
(Zipf tokens vs uniform, same size), ``branch`` (V = B at |C| = 1e6).

    python tools/bench.py --quick            # ~70 s on 2 idle cores
    python tools/bench.py                    # the full suite
    python tools/bench.py --large            # adds |C| = 1e8 (static + unconstrained)
    python tools/bench.py --gpu              # on a GPU: |C| = 2e7 vs the paper's 0.033 ms/step
    python tools/bench.py --sweeps items --items 1e5 1e7 --out bench_out/items

Writes ``results.md`` (tables, machine, targets met / missed), ``results.csv``
and, when matplotlib is installed, ``<sweep>.png`` into --out (bench_out/).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import static_compiler as sc  # noqa: E402
from static_compiler import report  # noqa: E402
from static_compiler.backend import decode  # noqa: E402
from static_compiler.backend.kernels import expand  # noqa: E402
from static_compiler.datasets import synthetic_sids  # noqa: E402
from tools import baselines as bl  # noqa: E402

ALL_METHODS = ("static", "static_mask", "unconstrained", "host_trie", "exact_bsearch",
               "approx_bsearch", "hash_bitmap")
BASE_METHODS = ("static", "static_mask", "unconstrained")
SWEEPS = ("items", "vocab", "skew", "branch")
GPU_ITEMS = 2 * 10 ** 7
GPU_METHODS = ("static", "unconstrained", "host_trie", "exact_bsearch")
PAPER_TPU_ADDED_MS = 0.033
"""The paper's per-step overhead of STATIC on TPU v6e (|C| = 2e7, V = 2048,
batch 2, beams 70): the goal of a --gpu run."""
ZIPF_EXPONENT = 1.0


# --------------------------------------------------------------------------
# Constraint sets


def zipf_sids(num_items: int, length: int, vocab_size: int, exponent: float = ZIPF_EXPONENT,
              seed: int = 0) -> np.ndarray:
    """int32 (num_items, length): every position drawn independently with
    P(token v) proportional to 1 / (v + 1) ** exponent (token 0 the most
    frequent), from numpy's PCG64 seeded with `seed`."""
    if num_items < 1 or length < 1 or vocab_size < 1:
        raise ValueError(f"zipf_sids: num_items={num_items}, length={length}, "
                         f"vocab_size={vocab_size}; expected all >= 1")
    rng = np.random.Generator(np.random.PCG64(seed))
    cdf = np.cumsum(1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** exponent)
    cdf /= cdf[-1]
    u = rng.random((int(num_items), int(length)))
    return np.minimum(np.searchsorted(cdf, u, side="right"), vocab_size - 1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """One constraint set: `dataset` is "uniform" or "zipf"."""

    dataset: str
    items: int
    vocab: int
    length: int
    seed: int = 0

    def sequences(self) -> np.ndarray:
        if self.dataset == "uniform":
            return synthetic_sids(self.items, length=self.length, vocab_size=self.vocab,
                                  seed=self.seed)
        if self.dataset == "zipf":
            return zipf_sids(self.items, self.length, self.vocab, seed=self.seed)
        raise ValueError(f"unknown dataset {self.dataset!r}, expected 'uniform' or 'zipf'")

    @property
    def label(self) -> str:
        return f"{self.dataset} |C|={self.items:.0e} V={self.vocab} L={self.length}"


def proc_status_bytes(key: str) -> int:
    """A memory line of /proc/self/status ("VmRSS", "VmHWM") in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _build_child(spec: CellSpec) -> dict:
    """Builds `spec` in this (fresh) process; returns time, peak RSS above the
    input array, and the index size. The peak is VmHWM, the high-water mark
    of this process's own memory (getrusage's ru_maxrss would carry the
    parent's peak over the fork and exec)."""
    sequences = spec.sequences()
    before = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    compiled = sc.compile_constraints(sequences, vocab_size=spec.vocab)
    seconds = time.perf_counter() - start
    peak = proc_status_bytes("VmHWM")
    return {"build_s": seconds, "build_peak_bytes": max(0, peak - before),
            "index_bytes": compiled.nbytes}


def measure_build(spec: CellSpec, in_child: bool = True) -> dict:
    """Build time and peak memory of `spec` (in a child process unless
    in_child is False, when the peak is not measured and reported as -1)."""
    if not in_child:
        start = time.perf_counter()
        compiled = sc.compile_constraints(spec.sequences(), vocab_size=spec.vocab)
        return {"build_s": time.perf_counter() - start, "build_peak_bytes": -1,
                "index_bytes": compiled.nbytes}
    cmd = [sys.executable, os.path.abspath(__file__), "--build-child",
           json.dumps(dataclasses.asdict(spec))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# Runners: one per method, each with a jitted step per t, the states a real
# decode passes through, a kernel per t and a full decode.


@dataclasses.dataclass
class Runner:
    name: str
    exact: bool
    steps: list          # [(jitted fn, args)] per step
    kernels: Optional[tuple]  # (jitted fn of all steps' kernels, args), None without a constraint
    decode: object       # () -> (tokens, scores, valid), blocking
    final: tuple = ()    # (tokens, valid) after the L timed steps ran in a chain
    index_bytes: int = 0
    build_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)


def _layout_label(step) -> str:
    """Short layout of a plan step: "unary", "csr(504)", "near_unary(1696/16x4)"
    (mixed: k / light_k x wide_slots)."""
    if step.kind in ("dense_rows", "unary"):
        return step.kind
    return f"{step.kind}({step.k}/{step.light_k}x{step.wide_slots})" if step.light_k \
        else f"{step.kind}({step.k})"


def _static_runner(compiled, model, cfg) -> Runner:
    plan, tables = compiled.plan, compiled.device_tables
    B, M, tpb = cfg.batch, cfg.beams, cfg.tokens_per_beam
    live = decode.live_beam_bounds(plan, M, tpb)  # as static_compiler.beam_search

    def step_fn(tables, model_table, state, *, t):
        logits = bl.TableModel.logits(model_table, state.last_tokens, t)
        return decode.beam_step(plan, tables, state, logits, t, tpb, live_beams=live[t])

    def kernels_fn(tables, nodes):
        out = []
        for t, node in enumerate(nodes):
            cand = expand(plan.steps[t], tables[t], node)
            # dense_rows tokens are an iota (nothing read): not returned, not timed
            out.append(cand[1:] if plan.steps[t].kind == "dense_rows" else cand)
        return out

    steps, nodes = [], []
    state = decode.init_beam_state(plan, B, M)
    for t in range(plan.max_length):
        fn = jax.jit(functools.partial(step_fn, t=t))
        steps.append((fn, (tables, model.table, state)))
        nodes.append(state.node[:, :live[t]])
        state = fn(tables, model.table, state)
    kernels = (jax.jit(kernels_fn), (tables, nodes))

    def run_decode():  # static_compiler.beam_search, without holding `compiled`
        r = decode.beam_search(plan, tables, bl.TableModel.logits_fn, batch_size=B, beam_size=M,
                               tokens_per_beam=tpb, carry=model.table)
        return jax.block_until_ready((r.tokens, r.scores, r.valid))

    summary = report.summary(compiled)
    layouts = " ".join(_layout_label(s) for s in plan.steps)
    return Runner("static", True, steps, kernels, run_decode, (state.tokens, state.valid),
                  index_bytes=compiled.nbytes,
                  extra={"u_max_bytes": summary["paper_bound_bytes"], "layouts": layouts})


class StaticMask:
    """The library's logits-processor pair (`mask` / `advance`, one row per
    beam) as a method of the baselines' harness: STATIC with a dense mask."""

    name = "static_mask"
    exact = True

    def __init__(self, compiled):
        self.plan = compiled.plan
        self.tables = compiled.device_tables

    def init(self, tables, batch_size, beam_size):
        return decode.ProcessorState(node=jnp.zeros((batch_size, beam_size), jnp.int32),
                                     valid=jnp.ones((batch_size, beam_size), bool),
                                     finished=jnp.zeros((batch_size, beam_size), bool))

    @staticmethod
    def _rows(state):
        return jax.tree_util.tree_map(lambda x: x.reshape(-1), state)

    def allowed(self, tables, state, logprobs, step):
        B, M, V = logprobs.shape
        masked = decode.mask(self.plan, tables, logprobs.reshape(B * M, V), self._rows(state), step)
        # mask() keeps allowed log-probs and writes SENTINEL_SCORE elsewhere.
        return (masked > decode.SENTINEL_SCORE).reshape(B, M, V), None

    def advance(self, tables, state, aux, parent, token, step):
        nxt = decode.advance(self.plan, tables, self._rows(state), token.reshape(-1), step)
        return jax.tree_util.tree_map(lambda x: x.reshape(token.shape), nxt)


def _harness_runner(method, model, cfg, length: int, build_s: float = 0.0,
                    index_bytes: int = 0, extra: Optional[dict] = None) -> Runner:
    B, M, tpb = cfg.batch, cfg.beams, cfg.tokens_per_beam
    tables = method.tables

    def step_fn(tables, model_table, state, *, t):
        return bl.model_and_step(method, tables, model_table, state, t, tpb)

    def kernels_fn(tables, constraints, logprobs):
        return [method.allowed(tables, c, lp, t) for t, (c, lp) in enumerate(zip(constraints,
                                                                                 logprobs))]

    steps, constraints, logprobs = [], [], []
    state = bl.init_masked_state(method, tables, B, M, length)
    for t in range(length):
        fn = jax.jit(functools.partial(step_fn, t=t))
        steps.append((fn, (tables, model.table, state)))
        live = bl.harness_live_beams(t, M, model.vocab_size, tpb)
        logprobs.append(decode.safe_log_softmax(
            bl.TableModel.logits(model.table, state.last_tokens, t)[:, :live]))
        constraints.append(jax.tree_util.tree_map(lambda x: x[:, :live], state.constraint))
        state = fn(tables, model.table, state)
    kernels = None
    if not isinstance(method, bl.Unconstrained):
        kernels = (jax.jit(kernels_fn), (tables, constraints, logprobs))

    def run_decode():
        return jax.block_until_ready(bl.masked_beam_search(
            method, tables, model.table, batch_size=B, beam_size=M, length=length,
            tokens_per_beam=tpb))

    return Runner(method.name, method.exact, steps, kernels, run_decode,
                  (state.tokens, state.valid), index_bytes=index_bytes, build_s=build_s,
                  extra=extra or {})


def _nbytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def make_runners(spec: CellSpec, methods, cfg):
    """(runners, compiled): one Runner per method, in `methods` order.

    Baseline indexes are built one after the other (their build time is
    measured); the runners, which trace and compile L steps each, are made
    on cfg.compile_threads threads (XLA compiles without the GIL)."""
    sequences = spec.sequences()
    compiled = sc.compile_constraints(sequences, vocab_size=spec.vocab)
    model = bl.TableModel(spec.vocab, seed=cfg.seed)
    L = compiled.plan.max_length
    makers = []  # thunks -> Runner
    if "static" in methods:
        makers.append(lambda: _static_runner(compiled, model, cfg))
    if "static_mask" in methods:
        makers.append(lambda: _harness_runner(StaticMask(compiled), model, cfg, L,
                                              index_bytes=compiled.nbytes))
    if "unconstrained" in methods:
        makers.append(lambda: _harness_runner(bl.Unconstrained(), model, cfg, L))
    if {"host_trie", "exact_bsearch", "approx_bsearch", "hash_bitmap"} & set(methods):
        start = time.perf_counter()
        sorted_set = bl.SortedSet(sequences, spec.vocab)
        sort_s = time.perf_counter() - start
        exact = None
        for name in ("host_trie", "exact_bsearch", "approx_bsearch", "hash_bitmap"):
            if name not in methods:
                continue
            start = time.perf_counter()
            extra = {}
            if name == "host_trie":
                method = bl.HostTrie(sorted_set)
                nbytes = _nbytes(method.host_arrays())
            elif name == "exact_bsearch":
                method = exact = bl.ExactBinarySearch(sorted_set)
                nbytes = _nbytes(method.tables)
            elif name == "approx_bsearch":
                method = bl.ApproxBinarySearch(sorted_set, top_n=cfg.approx_top_n, base=exact)
                nbytes = _nbytes(method.tables)
            else:
                method = bl.HashBitmap(sorted_set, bits_per_prefix=cfg.bitmap_bits)
                nbytes = _nbytes(method.tables)
                extra["fpr"] = method.false_positive_rate(sorted_set)
            build_s = sort_s + time.perf_counter() - start
            makers.append(functools.partial(_harness_runner, method, model, cfg, L, build_s,
                                            nbytes, extra))
        del sorted_set
    del sequences
    with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.compile_threads) as pool:
        runners = list(pool.map(lambda make: make(), makers))
    return runners, compiled


# --------------------------------------------------------------------------
# Timing


KERNEL_CALLS = 10
"""Back-to-back calls per kernel timing: a kernel program runs for ~0.1-0.5 ms
here, where one call's time is mostly scheduling jitter."""


def _time_call(fn, args, calls: int = 1) -> float:
    """Mean seconds of `calls` calls of fn(*args), each waited for."""
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / calls


def _time_kernels(r: "Runner") -> float:
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


def _quantiles_ms(values) -> tuple:
    if not values:
        return (float("nan"),) * 3
    q = np.percentile(np.asarray(values) * 1e3, [50, 25, 75])
    return float(q[0]), float(q[1]), float(q[2])


# --------------------------------------------------------------------------
# A cell: build, run, compare


SWEEP_METHODS = ("static", "unconstrained")
"""Methods re-timed across the cells of a sweep (`measure_sweep`)."""


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
        step = _quantiles_ms(t["step"])
        n = min(len(t["step"]), len(unc)) if unc else 0
        added = _quantiles_ms([a - b for a, b in zip(t["step"][:n], unc[:n])]) if n else \
            _quantiles_ms([])
        kernel = _quantiles_ms(t["kernel"]) if t["kernel"] else (0.0, 0.0, 0.0)
        dec = _quantiles_ms(t["decode"])
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


# --------------------------------------------------------------------------
# Plan of the run


@dataclasses.dataclass
class Config:
    batch: int = 2
    beams: int = 70
    tokens_per_beam: Optional[int] = 30
    length: int = 8
    repeats: int = 10
    method_budget_s: float = 60.0
    approx_top_n: int = 50
    bitmap_bits: int = 32
    seed: int = 0
    build_child: bool = True
    decode_methods: tuple = ALL_METHODS
    compile_threads: int = 2


def plan_cells(args) -> list:
    """[(sweep, CellSpec, methods)] in run order."""
    L, cells = args.length, []
    baseline_sweeps = set(args.baseline_sweeps)
    methods_of = lambda sweep: tuple(m for m in args.methods
                                     if sweep in baseline_sweeps or m in args.sweep_methods)
    if "items" in args.sweeps:
        for n in args.items:
            methods = methods_of("items")
            if not args.baseline_min_items <= n <= args.baseline_max_items:
                methods = tuple(m for m in methods if m in args.sweep_methods)
            cells.append(("items", CellSpec("uniform", n, args.items_vocab, L, args.seed), methods))
    if "vocab" in args.sweeps:
        for v in args.vocabs:
            cells.append(("vocab", CellSpec("uniform", args.vocab_items, v, L, args.seed),
                          methods_of("vocab")))
    if "skew" in args.sweeps:
        for n in args.skew_items:
            for dataset in ("uniform", "zipf"):
                cells.append(("skew", CellSpec(dataset, n, args.items_vocab, L, args.seed),
                              methods_of("skew")))
    if "branch" in args.sweeps:
        for b in args.branches:
            cells.append(("branch", CellSpec("uniform", args.branch_items, b, L, args.seed),
                          methods_of("branch")))
    return cells


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
                        _quantiles_ms(t["step"])
                    row["sweep_decode_ms"], row["sweep_decode_ms_p25"], row["sweep_decode_ms_p75"] = \
                        _quantiles_ms(t["decode"])
                    if t["kernel"]:
                        row["sweep_kernel_ms"] = _quantiles_ms(t["kernel"])[0]
    for row in rows:
        del row["spec"]
    return rows


# --------------------------------------------------------------------------
# Output


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


def _fmt_bytes(v) -> str:
    return "-" if v in ("", None) or (isinstance(v, (int, float)) and v < 0) else f"{v / 1e6:.1f}"


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
                f"{r['kernel_ms']:.3f} | {_fmt_ms(r, 'decode_ms')} | {_fmt_bytes(r['index_bytes'])} "
                f"| {_fmt_bytes(r['u_max_bytes'])} | {r['build_s']:.2f} | "
                f"{_fmt_bytes(r['build_peak_bytes'])} | {fpr} | {r['same_as_static']} | "
                f"{r['layouts']} |")
        out.append("")
    return "\n".join(out)


def _find(rows, sweep, method, **match):
    for r in rows:
        if r["sweep"] == sweep and r["method"] == method and all(r[k] == v for k, v in match.items()):
            return r
    return None


def _sweep_value(row, key: str) -> float:
    """The sweep-interleaved measurement when there is one, else the cell's."""
    value = row.get("sweep_" + key, "")
    return row[key] if value in ("", None) else value


def evaluate_targets(rows) -> list:
    """[(target, measured text, met: bool)] for the issue's targets that the
    rows cover. Ratios across cells use the sweep-interleaved timings."""
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
    backend = jax.default_backend()
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
                    f"{big['build_s']:.2f} s, peak {_fmt_bytes(big['build_peak_bytes'])} MB "
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


# --------------------------------------------------------------------------
# Command line


def _count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer (1e6 is fine)")
    return int(value)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (< 2 min)")
    p.add_argument("--large", action="store_true", help="add |C| = 1e8 to the items sweep")
    p.add_argument("--gpu", action="store_true",
                   help=f"the GPU configuration: the items sweep at |C| = {GPU_ITEMS:.0e} only, "
                        f"methods {', '.join(GPU_METHODS)}, 20 s per method; its target is the "
                        f"paper's {PAPER_TPU_ADDED_MS} ms added per step (run with a GPU jax)")
    p.add_argument("--out", default=os.path.join(_ROOT, "bench_out"), help="output directory")
    p.add_argument("--sweeps", nargs="+", choices=SWEEPS, default=list(SWEEPS))
    p.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=list(ALL_METHODS))
    p.add_argument("--baseline-sweeps", nargs="*", choices=SWEEPS, default=["items"],
                   help="sweeps that run the baselines (the others run static, static_mask, "
                        "unconstrained)")
    p.add_argument("--baseline-max-items", type=_count, default=10 ** 7,
                   help="items sweep cells above this run no baselines")
    p.add_argument("--baseline-min-items", type=_count,
                   help="items sweep cells below this run no baselines (quick: 1e5)")
    p.add_argument("--sweep-methods", nargs="+", choices=ALL_METHODS,
                   help="methods of cells without baselines (default static, static_mask, "
                        "unconstrained; quick: static, unconstrained)")
    p.add_argument("--decode-methods", nargs="+", choices=ALL_METHODS,
                   help="methods whose fused full decode is timed (default all; quick: static, "
                        "unconstrained)")
    p.add_argument("--items", nargs="+", type=_count, help="items sweep |C| values (V = 2048)")
    p.add_argument("--items-vocab", type=_count, default=2048)
    p.add_argument("--vocabs", nargs="+", type=_count, help="vocab sweep V values")
    p.add_argument("--vocab-items", type=_count, help="|C| of the vocab sweep")
    p.add_argument("--skew-items", nargs="+", type=_count, help="|C| of the skew comparison")
    p.add_argument("--branches", nargs="+", type=_count, help="branch sweep B = V values")
    p.add_argument("--branch-items", type=_count, help="|C| of the branch sweep")
    p.add_argument("--length", type=_count, default=8)
    p.add_argument("--batch", type=_count, default=2)
    p.add_argument("--beams", type=_count, default=70)
    p.add_argument("--tokens-per-beam", type=_count, default=30)
    p.add_argument("--repeats", type=_count)
    p.add_argument("--method-budget-s", type=float, default=60.0,
                   help="seconds of timed repeats per method and cell (slow methods get >= 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-build-child", action="store_true",
                   help="time the build in this process (no peak memory)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--build-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    if args.gpu:
        if args.quick or args.large:
            p.error("--gpu runs its own configuration: drop --quick / --large")
        args.sweeps = ["items"]
        args.items = args.items or [GPU_ITEMS]
        args.methods = [m for m in args.methods if m in GPU_METHODS]
        args.baseline_max_items = max(args.baseline_max_items, max(args.items))
        args.decode_methods = args.decode_methods or ["static", "unconstrained"]
        args.method_budget_s = min(args.method_budget_s, 20.0)
    defaults = {"items": [10 ** 5] if quick else [10 ** 5, 10 ** 6, 10 ** 7],
                "vocabs": [256, 8192] if quick else [256, 2048, 8192, 32768],
                "vocab_items": 10 ** 5 if quick else 10 ** 6,
                "skew_items": [10 ** 5] if quick else [10 ** 6],
                "branches": [256, 8192] if quick else [2 ** i for i in range(1, 17)],
                "branch_items": 10 ** 5 if quick else 10 ** 6,
                "repeats": 3 if quick else 10,
                "baseline_min_items": 10 ** 5 if quick else 1,
                "sweep_methods": ["static", "unconstrained"] if quick else list(BASE_METHODS),
                "decode_methods": ["static", "unconstrained"] if quick else list(ALL_METHODS)}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.large and 10 ** 8 not in args.items:
        args.items = list(args.items) + [10 ** 8]
    if args.quick:
        args.method_budget_s = min(args.method_budget_s, 5.0)
        args.no_build_child = True
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.build_child:
        spec = CellSpec(**json.loads(args.build_child))
        print(json.dumps(_build_child(spec)))
        return 0
    cfg = Config(batch=args.batch, beams=args.beams, tokens_per_beam=args.tokens_per_beam,
                 length=args.length, repeats=args.repeats, method_budget_s=args.method_budget_s,
                 seed=args.seed, build_child=not args.no_build_child,
                 decode_methods=tuple(args.decode_methods))
    start = time.perf_counter()
    rows = run_plan(plan_cells(args), cfg)
    command = "python tools/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    paths = write_outputs(rows, args.out, command.strip(), time.perf_counter() - start,
                          plots=not args.no_plots)
    print(open(paths["md"]).read())
    print(f"[bench] wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
