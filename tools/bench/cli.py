"""The command line of the suite: `python -m tools.bench [options]` (see the
package docstring, or --help)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import tools.bench
from tools.bench.config import (
    ALL_METHODS,
    BASE_METHODS,
    GPU_ITEMS,
    GPU_METHODS,
    PAPER_TPU_ADDED_MS,
    SWEEPS,
    CellSpec,
    Config,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exit_without_teardown(code: int) -> None:
    """Flush and leave with `code`, skipping interpreter teardown: with
    torch and XLA's CPU client in one process, their thread pools'
    destructors at exit aborted a bench once in CI ("terminate called
    without an active exception", SIGABRT) after every table had been
    printed. Nothing is left to clean up by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_checks(checks, label: str) -> int:
    """Runs [(name, thunk)] in order, one line each: "ok    name: detail (s)"
    or "FAIL  name: why" (a crash is a failed check too; the rest still
    run); then "LABEL: all passed" or "LABEL: N failed" on stderr. Returns
    1 when any failed."""
    import traceback
    failed = 0
    for name, fn in checks:
        start = time.perf_counter()
        try:
            detail = fn()
            print(f"ok    {name}: {detail} ({time.perf_counter() - start:.1f} s)", flush=True)
        except Exception as e:
            failed += 1
            what = str(e) if isinstance(e, AssertionError) and str(e) else traceback.format_exc()
            print(f"FAIL  {name}: {what}", flush=True)
    print(f"{label}: {failed} failed" if failed else f"{label}: all passed", file=sys.stderr)
    return 1 if failed else 0


def sid_set_parser(module: str, doc: str, items: float) -> argparse.ArgumentParser:
    """The parser of a single-purpose bench `python -m tools.bench.MODULE`
    over random Semantic IDs: --items (default `items`), --length, --vocab
    (the paper's L = 8, V = 2048); the module's docstring's first paragraph
    describes it."""
    parser = _items_parser(f"python -m tools.bench.{module}", doc, items)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    return parser


def _count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer (1e6 is fine)")
    return int(value)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.bench",
                                description=tools.bench.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (< 2 min)")
    p.add_argument("--large", action="store_true", help="add |C| = 1e8 to the items sweep")
    p.add_argument("--gpu", action="store_true",
                   help=f"the GPU configuration: the items sweep at |C| = {GPU_ITEMS:.0e} only, "
                        f"methods {', '.join(GPU_METHODS)}, 20 s per method; its target is the "
                        f"paper's {PAPER_TPU_ADDED_MS} ms added per step (run with a GPU jax)")
    p.add_argument("--out", default="bench_out",
                   help="output directory (default: bench_out/ in the working directory)")
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
    p.add_argument("--check", action="store_true",
                   help="measure nothing: check the baselines against the library (exact ones "
                        "decode static's sequences, the bitmap's false-positive rate equals a "
                        "brute-force count) and exit 1 on a mismatch")
    p.add_argument("--dry-run", action="store_true",
                   help="measure nothing: print the cells (sweep, set, methods) a run would measure")
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


SUBCOMMANDS = {"compile-time": "tools.bench.compile_time", "peers": "tools.bench.peers",
               "ready": "tools.bench.ready", "rules": "tools.bench.rules",
               "versions": "tools.bench.versions", "vllm": "tools.bench.vllm_engine"}
"""`python -m tools.bench NAME ...`: benchmarks with their own options,
each a module with a `main(argv)`."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = parse_args(argv)
    if args.check:
        from tools.bench.check import main as check_main
        return check_main()
    cells = plan_cells(args)
    if args.dry_run:
        for sweep, spec, methods in cells:
            print(f"{sweep}\t{spec.label}\t{' '.join(methods)}")
        return 0
    from tools.bench.cells import run_plan  # jax and the library load here
    from tools.bench.output import write_outputs

    cfg = Config(batch=args.batch, beams=args.beams, tokens_per_beam=args.tokens_per_beam,
                 length=args.length, repeats=args.repeats, method_budget_s=args.method_budget_s,
                 seed=args.seed, build_child=not args.no_build_child,
                 decode_methods=tuple(args.decode_methods))
    start = time.perf_counter()
    rows = run_plan(cells, cfg)
    command = "python -m tools.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    paths = write_outputs(rows, args.out, command.strip(), time.perf_counter() - start,
                          plots=not args.no_plots)
    with open(paths["md"]) as f:
        print(f.read())
    print(f"[bench] wrote {', '.join(paths.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _items_parser(prog: str, doc: str, items: float) -> argparse.ArgumentParser:
    """A bench's parser with --items (default `items`); its description is
    the first paragraph of `doc`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--items", type=float, default=items)
    return parser


def sized_parser(prog: str, doc: str, items: float) -> argparse.ArgumentParser:
    """The parser of a bench over a set of ``--items`` items (default
    `items`), timed ``--repeats`` times, drawn from ``--seed``."""
    parser = _items_parser(prog, doc, items)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    return parser
