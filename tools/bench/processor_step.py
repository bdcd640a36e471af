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
near-unary layers cost the ops the most).

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


def rows_at(tc: TorchConstraints, n: int, t: int, rng) -> tuple:
    """(state at step t - 1, the tokens taken there) of n rows walking
    random allowed tokens (a row that ended takes the end token)."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    state = tc.init_processor(n)
    for step in range(t):
        allowed = tc.allowed_tokens(state, step)
        tokens = torch.multinomial(allowed.float() + 1e-9 * (~allowed.any(1, keepdim=True)), 1,
                                   generator=gen)[:, 0]
        if step == t - 1:
            return state, tokens
        state = tc.advance(state, tokens, step)
    raise AssertionError("t >= 1")


def measure(tc: TorchConstraints, n: int, repeats: int, calls: int, seed: int = 0) -> list:
    """One row per step t in [1, max_length): kinds, ops us, host us."""
    engine = tc._engine
    plan, tables = engine.plan, engine.tables
    rng = np.random.default_rng(seed)
    out = []
    for t in range(1, tc.max_length):
        state, tokens = rows_at(tc, n, t, rng)
        host = tc.processor_step(state, t, tokens=tokens)
        if engine._host_for(None) is None:
            raise SystemExit("processor_step: no host loops here (numba missing?): nothing to "
                             "compare")
        want = ops.processor_step(plan, tables, state, tokens, None, t)
        if not (torch.equal(host.allowed, want.allowed)
                and all(torch.equal(a, b) for a, b in zip(host.state, want.state))):
            raise AssertionError(f"step {t}: the host loops and the torch ops differ")
        paths = {"ops": lambda: ops.processor_step(plan, tables, state, tokens, None, t),
                 "host": lambda: tc.processor_step(state, t, tokens=tokens)}
        times: dict = {name: [] for name in paths}
        for _ in range(repeats):
            for name, run in paths.items():
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                times[name].append((time.perf_counter() - start) / calls * 1e6)
        kinds = "->".join(str(plan.steps[s].kind) if s < plan.depth else "end"
                          for s in (t - 1, t))
        out.append((t, kinds, statistics.median(times["ops"]), statistics.median(times["host"])))
    return out


def table(rows: list) -> str:
    lines = ["| step | layers (advance -> mask) | torch ops us | host loops us | ops / host |",
             "|--:|---|--:|--:|--:|"]
    for t, kinds, ops_us, host_us in rows:
        lines.append(f"| {t} | {kinds} | {ops_us:.1f} | {host_us:.1f} | {ops_us / host_us:.1f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sid_set_parser("processor_step", __doc__, 1e5)
    parser.add_argument("--artifact", default=None,
                        help="a saved set to load instead of random Semantic IDs")
    parser.add_argument("--rows", type=int, nargs="+", default=[32],
                        help="rows per call; one table each")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="back-to-back calls per repeat")
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
    for n in args.rows:
        print(f"\n{n} rows per call\n")
        print(table(measure(tc, n, args.repeats, args.calls)))
    print(f"# {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
