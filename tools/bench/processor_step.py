"""The torch door's `processor_step` on CPU tensors: its compiled host loops
(`static_compiler.host_kernels`, what the door runs there) against the torch
ops (`torch_backend.ops.processor_step`, what it runs under torch.compile
and on other devices), on the same rows in the same run.

At each step t >= 1 the rows hold random members' first t - 1 tokens (their
state) and take token t - 1; both paths advance them and mask step t, and
their states and masks must be equal (the run exits 1 otherwise). Per step:
the median over repeats of the mean of `calls` back-to-back calls, the
repeats interleaving the two paths. The set: N random Semantic IDs, or a
saved artifact (``--artifact``: e.g. the vLLM bench's names, whose
near-unary layers cost the ops the most). Each subset form (``--subsets``)
is a row of its own per step: none; `subset()`, liveness bits; `ranked`,
`ranked_subset()`'s rank bits (a per-request rule's form); the rows take
`--stack` per-row subsets of `--fraction` of the items (row i subset i %
stack) and walk the tokens their subset allows.

    python -m tools.bench.processor_step                       # 1e5 items, L = 8, V = 2048, 32 rows
    python -m tools.bench.processor_step --artifact names.static --rows 32 140
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

import static_compiler as sc
from static_compiler.torch_backend import TorchConstraints, ops
from tools.bench.cli import exit_without_teardown, sid_set_parser
from tools.bench.output import machine_line

FORMS = ("none", "subset", "ranked")
"""The subset forms a step is timed with (`--subsets`)."""


def rows_at(tc: TorchConstraints, n: int, t: int, rng, **subset) -> tuple:
    """(state at step t - 1, the tokens taken there) of n rows walking
    random allowed tokens (a row that ended takes the end token) of their
    `subset` (keywords: subset, subset_index; none: the set's)."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    state = tc.init_processor(n)
    for step in range(t):
        allowed = tc.allowed_tokens(state, step, **subset)
        tokens = torch.multinomial(allowed.float() + 1e-9 * (~allowed.any(1, keepdim=True)), 1,
                                   generator=gen)[:, 0]
        if step == t - 1:
            return state, tokens
        state = tc.advance(state, tokens, step, **subset)
    raise AssertionError("t >= 1")


def subsets(tc: TorchConstraints, forms, n: int, stack: int, fraction: float,
            seed: int = 0) -> dict:
    """Per form, the door's keywords for n rows: `stack` random selections
    of `fraction` of the items, row i taking selection i % stack."""
    out: dict = {"none": {}}
    if set(forms) - {"none"}:
        N = tc._set_view.items.num_items
        masks = np.random.default_rng(seed).random((stack, N)) < fraction
        index = np.arange(n) % stack
        out["subset"] = dict(subset=sc.stack_subsets([tc.subset(m) for m in masks]),
                             subset_index=index)
        out["ranked"] = dict(subset=tc.ranked_subset(masks), subset_index=index)
    return {form: out[form] for form in forms}


def measure(tc: TorchConstraints, n: int, repeats: int, calls: int, seed: int = 0,
            forms=("none",), stack: int = 4, fraction: float = 0.1) -> list:
    """One row per step t in [1, max_length) and subset form: t, form,
    kinds, ops us, host us."""
    rng = np.random.default_rng(seed)
    made = subsets(tc, forms, n, stack, fraction, seed)
    return [(t, form, *_step(tc, n, t, rng, repeats, calls, kw))
            for t in range(1, tc.max_length) for form, kw in made.items()]


def _step(tc: TorchConstraints, n: int, t: int, rng, repeats: int, calls: int, kw: dict) -> tuple:
    """(kinds, ops us, host us) of step t with the subset keywords `kw`,
    its states and masks checked."""
    engine = tc._engine
    plan, tables = engine.plan, engine.tables
    state, tokens = rows_at(tc, n, t, rng, **kw)
    sub = None if not kw else engine.place_subset(kw["subset"], kw["subset_index"], n,
                                                  "processor_step", tc.fingerprint)
    if engine._host_for(sub) is None:
        raise SystemExit("processor_step: no host loops here (numba missing?): nothing to "
                         "compare")
    host = tc.processor_step(state, t, tokens=tokens, **kw)
    want = ops.processor_step(plan, tables, state, tokens, None, t, sub)
    if not (torch.equal(host.allowed, want.allowed)
            and all(torch.equal(a, b) for a, b in zip(host.state, want.state))):
        raise AssertionError(f"step {t}: the host loops and the torch ops differ")
    paths = {"ops": lambda: ops.processor_step(plan, tables, state, tokens, None, t, sub),
             "host": lambda: tc.processor_step(state, t, tokens=tokens, **kw)}
    times: dict = {name: [] for name in paths}
    for _ in range(repeats):
        for name, run in paths.items():
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    kinds = "->".join(str(plan.steps[s].kind) if s < plan.depth else "end" for s in (t - 1, t))
    return kinds, statistics.median(times["ops"]), statistics.median(times["host"])


def table(rows: list) -> str:
    lines = ["| step | subset | layers (advance -> mask) | torch ops us | host loops us | "
             "ops / host |", "|--:|---|---|--:|--:|--:|"]
    for t, form, kinds, ops_us, host_us in rows:
        lines.append(f"| {t} | {form} | {kinds} | {ops_us:.1f} | {host_us:.1f} | "
                     f"{ops_us / host_us:.1f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sid_set_parser("processor_step", __doc__, 1e5)
    parser.add_argument("--artifact", default=None,
                        help="a saved set to load instead of random Semantic IDs")
    parser.add_argument("--rows", type=int, nargs="+", default=[32],
                        help="rows per call; one table each")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="back-to-back calls per repeat")
    parser.add_argument("--subsets", nargs="+", choices=FORMS, default=list(FORMS),
                        help="subset forms, a row each per step: none, subset() (liveness "
                             "bits), ranked (ranked_subset(): rank bits)")
    parser.add_argument("--stack", type=int, default=4, help="per-row subsets (row i: i %% stack)")
    parser.add_argument("--fraction", type=float, default=0.1,
                        help="each subset's share of the items (random)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.artifact:
        tc = TorchConstraints.load(args.artifact)
        what = f"the artifact {args.artifact}"
    else:
        rng = np.random.default_rng(0)
        items = rng.integers(0, args.vocab, (int(args.items), args.length))
        tc = TorchConstraints.from_compiled(sc.compile_constraints(items, args.vocab))
        what = f"{int(args.items)} random items, L = {args.length}, V = {args.vocab}"
    tc.warm([1])  # (the host loops' kernels loaded or compiled: not timed)
    print(f"# processor_step on CPU tensors: {what}; torch 1 thread")
    print(f"# {machine_line()}; torch {torch.__version__}; states and masks equal at every step")
    if set(args.subsets) - {"none"}:
        print(f"# subsets: {args.stack} per-row random selections of {args.fraction:g} of the "
              "items (row i: i % stack), the rows walking their tokens")
    for n in args.rows:
        print(f"\n{n} rows per call\n")
        print(table(measure(tc, n, args.repeats, args.calls, forms=args.subsets,
                            stack=args.stack, fraction=args.fraction)))
    print(f"# {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
