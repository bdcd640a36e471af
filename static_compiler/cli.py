"""The `static-compiler` command line.

Each subcommand is one `(add_arguments, run)` pair registered in
`SUBCOMMANDS`; to add one, write both functions and append a `Subcommand`
row. `run(args)` returns the process exit status. A `StaticCompilerError`
raised anywhere prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from static_compiler.errors import CliInputError, StaticCompilerError

EXIT_USAGE = 2
"""Exit status for bad input (our typed errors, and argparse's own)."""


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name, one-line help, and two functions."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ----- show-ir -----

def _add_show_ir_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a .npy array (N, L) of token ids, an IR text dump "
                                      "(.txt / .ir), or an artifact directory (its IR is "
                                      "rebuilt from the saved tables)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size V (required for .npy input)")
    parser.add_argument("--end-token", type=int, default=None,
                        help=".npy input only: token that ends each sequence (an IR dump "
                             "carries its own)")
    parser.add_argument("--pipeline", default=None, metavar="SPEC",
                        help="pass pipeline spec. Default for .npy input: the library's "
                             "DEFAULT_PIPELINE; an IR dump is shown as it is unless SPEC is given")
    parser.add_argument("--print-after-all", action="store_true",
                        help="print the IR after the frontend and after every pass (stderr)")
    parser.add_argument("--stats", action="store_true",
                        help="print the per-layer table (states, edges, branch factors, "
                             "layout, bytes, the paper's memory bound) instead of the IR")
    parser.add_argument("--layer", type=int, default=None, metavar="N",
                        help="print only layer N's header and rows")
    parser.add_argument("--max-edges", type=int, default=None, metavar="E",
                        help="print every row when the automaton (with --layer: the layer) "
                             "has at most E edges, else elide rows (default: the IR printer's "
                             "limit)")


def _run_show_ir(args: argparse.Namespace) -> int:
    from static_compiler import report

    if args.max_edges is not None and args.max_edges < 0:
        raise CliInputError(f"--max-edges {args.max_edges}: expected an int >= 0")
    if os.path.isdir(args.input):
        from static_compiler import artifact
        given = [flag for flag, value in (("--vocab-size", args.vocab_size), ("--end-token",
                 args.end_token), ("--pipeline", args.pipeline)) if value is not None]
        if given:
            raise CliInputError(f"input {args.input!r} is an artifact, shown as compiled: "
                                f"{', '.join(given)} apply only to .npy and IR dump inputs")
        compiled = artifact.read_automaton(args.input)
    else:
        compiled = load_and_compile(args.input, vocab_size=args.vocab_size,
                                    end_token=args.end_token, pipeline=args.pipeline,
                                    print_ir_after_all=args.print_after_all)
    ir = getattr(compiled, "ir", compiled)
    if args.stats:
        sys.stdout.write(report.stats_table(compiled))
    if args.layer is not None:
        sys.stdout.write(report.layer_text(ir, args.layer, max_edges=args.max_edges))
    elif not args.stats:
        sys.stdout.write(ir.to_text() if args.max_edges is None
                         else ir.to_text(max_edges=args.max_edges))
    return 0


def load_and_compile(path: str, *, vocab_size: Optional[int], end_token: Optional[int] = None,
                     pipeline: Optional[str] = None, print_ir_after_all: bool = False):
    """Reads `path` (any format of `readers.read_constraints`) and compiles it.

    A constraint set goes through `compile_constraints` with `pipeline`
    (default: DEFAULT_PIPELINE) and gives CompiledConstraints. An IR dump is
    parsed and verified; it goes through `compile_constraints` only when
    `pipeline` is given, else the parsed `ir.Automaton` is returned as it is.

    Raises CliInputError for a constraint set without `vocab_size` or
    options that contradict an IR dump; the library's own typed errors (an
    unreadable file: ConstraintSetError) pass through."""
    from static_compiler import compile_constraints, readers
    from static_compiler.ir import Automaton

    constraints = readers.read_constraints(path)
    if not isinstance(constraints, Automaton):
        if vocab_size is None:
            raise CliInputError(f"input {path!r}: --vocab-size is required for a constraint set")
        return compile_constraints(constraints, vocab_size, end_token=end_token,
                                   pipeline=pipeline, print_ir_after_all=print_ir_after_all)
    ir = constraints
    for flag, value, own in (("--vocab-size", vocab_size, ir.vocab_size),
                             ("--end-token", end_token, ir.end_token)):
        if value is not None and value != own:
            raise CliInputError(f"input {path!r}: {flag} {value} differs from the dump's "
                                f"value {own}")
    if pipeline is None:
        if print_ir_after_all:
            sys.stderr.write("// ----- IR as read (no --pipeline given) -----\n" + ir.to_text())
        return ir
    return compile_constraints(ir, ir.vocab_size, pipeline=pipeline,
                               print_ir_after_all=print_ir_after_all)


# ----- compile / decode / verify / demo: artifacts -----

DEFAULT_BEAM_SIZES = "70"


def _int_list(flag: str, text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise CliInputError(f"{flag} {text!r}: expected comma-separated ints >= 1, e.g. 70,128")
    return values


def _pipeline_with_budget(pipeline: Optional[str], budget: Optional[str]) -> Optional[str]:
    """`pipeline` (default DEFAULT_PIPELINE) with choose-layout's memory
    budget set to `budget`, or `pipeline` unchanged when budget is None."""
    if budget is None:
        return pipeline
    from static_compiler.passes.base import ByteSize
    from static_compiler.pipeline import DEFAULT_PIPELINE, format_pipeline, parse_pipeline

    try:
        size = ByteSize.parse(budget)
    except ValueError as e:
        raise CliInputError(f"--memory-budget {budget!r}: {e}") from None
    passes = parse_pipeline(pipeline if pipeline is not None else DEFAULT_PIPELINE)
    if not any(p.name == "choose-layout" for p in passes):
        raise CliInputError(f"--memory-budget {budget}: the pipeline {format_pipeline(passes)!r} "
                            "has no choose-layout pass to give it to")
    return format_pipeline([dataclasses.replace(p, memory_budget=size)
                            if p.name == "choose-layout" else p for p in passes])


@contextlib.contextmanager
def _progress(what: str, stream, after: float = 3.0, every: float = 5.0):
    """Logs `[what] still running, N s` to `stream` for work lasting more
    than `after` seconds, then every `every` seconds, and the total at the end."""
    start = time.perf_counter()
    done = threading.Event()

    def tick():
        wait = after
        while not done.wait(wait):
            stream.write(f"[{what}] still running, {time.perf_counter() - start:.0f} s\n")
            stream.flush()
            wait = every

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    stream.write(f"[{what}] done in {time.perf_counter() - start:.3f} s\n")


def _add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="constraint set: .npy (N, L) array, .jsonl (one JSON list "
                                      "per line), an IR dump, or text (one space-separated "
                                      "sequence per line)")
    parser.add_argument("-o", "--output", required=True, metavar="ART",
                        help="artifact directory to write")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size V (required unless INPUT is an IR dump)")
    parser.add_argument("--end-token", type=int, default=None,
                        help="token ending variable-length sequences")
    parser.add_argument("--pipeline", default=None, metavar="SPEC",
                        help="pass pipeline spec (default: the library's DEFAULT_PIPELINE)")
    parser.add_argument("--memory-budget", default=None, metavar="BYTES",
                        help="choose-layout's memory budget, e.g. 512MiB (overrides the spec's)")
    parser.add_argument("--beam-sizes", default=DEFAULT_BEAM_SIZES, metavar="M,...",
                        help=f"beam sizes to export a beam_step module for (default "
                             f"{DEFAULT_BEAM_SIZES})")
    parser.add_argument("--tokens-per-beam", type=int, default=None,
                        help="expand each beam to at most this many children (default: all)")
    parser.add_argument("--print-ir-after-all", action="store_true",
                        help="print the IR after the frontend and every pass (stderr)")
    parser.add_argument("--force", action="store_true", help="replace an existing artifact")


def _run_compile(args: argparse.Namespace) -> int:
    from static_compiler import artifact, compile_constraints, readers
    from static_compiler.ir import Automaton

    if os.path.exists(args.output) and not args.force:
        raise CliInputError(f"output {args.output!r} already exists: pass --force to replace it")
    beam_sizes = _int_list("--beam-sizes", args.beam_sizes)
    if args.tokens_per_beam is not None and args.tokens_per_beam < 1:
        raise CliInputError(f"--tokens-per-beam {args.tokens_per_beam}: expected an int >= 1")
    pipeline = _pipeline_with_budget(args.pipeline, args.memory_budget)
    constraints = readers.read_constraints(args.input)
    vocab_size = args.vocab_size
    if isinstance(constraints, Automaton):
        for flag, value, own in (("--vocab-size", vocab_size, constraints.vocab_size),
                                 ("--end-token", args.end_token, constraints.end_token)):
            if value is not None and value != own:
                raise CliInputError(f"input {args.input!r}: {flag} {value} differs from the "
                                    f"dump's value {own}")
        vocab_size = constraints.vocab_size
    elif vocab_size is None:
        raise CliInputError(f"input {args.input!r}: --vocab-size is required")
    log = sys.stderr
    with _progress("compile", log):
        compiled = compile_constraints(constraints, vocab_size, end_token=args.end_token,
                                       pipeline=pipeline,
                                       print_ir_after_all=args.print_ir_after_all,
                                       export_beam_sizes=beam_sizes,
                                       export_tokens_per_beam=args.tokens_per_beam, stream=log)
    for stage, seconds in compiled.timings:
        log.write(f"[compile]   {stage:<16s} {seconds:8.3f} s\n")
    with _progress("export + save", log):
        path = artifact.save(compiled, args.output, overwrite=args.force)
    sys.stdout.write(f"wrote {path}: {compiled.ir.num_sequences} sequences, vocab "
                     f"{compiled.vocab_size}, max length {compiled.max_length}, "
                     f"{compiled.nbytes} table bytes, beam sizes {list(beam_sizes)}, "
                     f"pipeline {compiled.pipeline}\n")
    return 0


def _add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=None,
                        help="one of the artifact's exported beam sizes (default: the first)")
    parser.add_argument("--top", type=int, default=5, help="beams to print per batch row")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demo model")


def _run_decode(args: argparse.Namespace) -> int:
    from static_compiler import demo, serving

    art = serving.load(args.artifact)
    beam_size = art.beam_sizes[0] if args.beam_size is None else args.beam_size
    run = demo.decode_artifact(art, batch_size=args.batch_size, beam_size=beam_size,
                               seed=args.seed)
    out = sys.stdout
    out.write(f"{art!r}\ndemo model seed {args.seed}, batch {args.batch_size}, beams "
              f"{beam_size}\n")
    for row in range(args.batch_size):
        out.write(f"batch row {row}:\n{demo.format_top(run.result, row=row, top=args.top)}\n")
    steps = sorted(run.step_seconds)
    out.write(f"beam_step median {steps[len(steps) // 2] * 1e3:.3f} ms per step "
              f"(first pass with XLA compile {run.first_pass_seconds:.2f} s)\n")
    return 0


def _add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--input", default=None,
                        help="the constraint set it was compiled from (any `compile` format)")
    parser.add_argument("--examples", type=int, default=5,
                        help="differing sequences to print (default 5)")


def _run_verify(args: argparse.Namespace) -> int:
    import numpy as np

    from static_compiler import artifact, readers
    from static_compiler.frontend import as_token_matrix
    from static_compiler.ir import Automaton, enumerate_sequences

    ir = artifact.read_automaton(args.artifact)
    tokens, lengths = enumerate_sequences(ir)
    out = sys.stdout
    ok = tokens.shape[0] == ir.num_sequences
    out.write(f"{args.artifact}: {tokens.shape[0]} sequences enumerated from the tables; the "
              f"manifest records {ir.num_sequences}: {'OK' if ok else 'MISMATCH'}\n")
    if args.input is not None:
        given = readers.read_constraints(args.input)
        if isinstance(given, Automaton):
            want_tokens, want_lengths = enumerate_sequences(given)
        else:
            want_tokens, want_lengths, _ = as_token_matrix(given)
        width = max(tokens.shape[1], want_tokens.shape[1])
        pad = lambda a: np.pad(np.asarray(a, np.int64), ((0, 0), (0, width - a.shape[1])),
                               constant_values=-1)
        have = np.unique(artifact.row_keys(pad(tokens), lengths))
        want = np.unique(artifact.row_keys(pad(want_tokens), want_lengths))
        missing = want[~np.isin(want, have)]
        extra = have[~np.isin(have, want)]
        for label, keys in (("in the input but not in the artifact", missing),
                            ("in the artifact but not in the input", extra)):
            out.write(f"{len(keys)} sequences {label}\n")
            for key in keys[:args.examples]:
                row = np.frombuffer(key.tobytes(), dtype=np.int64)
                out.write(f"  {[int(t) for t in row if t >= 0]}\n")
        ok = ok and not len(missing) and not len(extra)
        out.write(f"{len(want)} unique input sequences: {'OK' if ok else 'MISMATCH'}\n")
    return 0 if ok else 1


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    from static_compiler import datasets

    parser.add_argument("--dataset", default=datasets.DEFAULT_DATASET,
                        choices=sorted(datasets.DATASETS), help="built-in constraint set")
    parser.add_argument("--num-items", type=int, default=datasets.DEFAULT_NUM_ITEMS,
                        help=f"items in the set (default {datasets.DEFAULT_NUM_ITEMS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=70)
    parser.add_argument("--tokens-per-beam", type=int, default=30)
    parser.add_argument("--artifact", default=None, metavar="ART",
                        help="keep the artifact here (default: a temporary directory)")
    parser.add_argument("--force", action="store_true", help="replace an existing --artifact")


def _run_demo(args: argparse.Namespace) -> int:
    from static_compiler import main_job

    for flag, value in (("--num-items", args.num_items), ("--batch-size", args.batch_size),
                        ("--beam-size", args.beam_size), ("--tokens-per-beam", args.tokens_per_beam)):
        if value < 1:
            raise CliInputError(f"{flag} {value}: expected an int >= 1")
    config = main_job.MainJobConfig(dataset=args.dataset, num_items=args.num_items,
                                    seed=args.seed, batch_size=args.batch_size,
                                    beam_size=args.beam_size,
                                    tokens_per_beam=args.tokens_per_beam,
                                    artifact_path=args.artifact, force=args.force)
    return main_job.run(config)


SUBCOMMANDS = [
    Subcommand("show-ir", "compile a constraint set (or read an IR dump) and print its IR "
                          "or per-layer statistics", _add_show_ir_arguments, _run_show_ir),
    Subcommand("compile", "compile a constraint set and save it as an artifact directory",
               _add_compile_arguments, _run_compile),
    Subcommand("decode", "load an artifact with the serving loader and decode with a built-in "
                         "demo model", _add_decode_arguments, _run_decode),
    Subcommand("verify", "re-enumerate an artifact's set from its tables and compare it with "
                         "the input", _add_verify_arguments, _run_verify),
    Subcommand("demo", "the main job: compile a built-in set, save, serve it in a fresh "
                       "process, decode, check and report", _add_demo_arguments, _run_demo),
]
"""The subcommand table; `build_parser` registers every row."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="static-compiler",
        description="Compile sets of allowed token sequences into XLA programs (STATIC).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in SUBCOMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script; returns the exit status (argv
    defaults to sys.argv[1:]; argparse itself exits 2 on bad flags)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args._run(args)
    except StaticCompilerError as e:
        message = " ".join(str(e).split("\n"))
        sys.stderr.write(f"{parser.prog} {args.command}: error: {message}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
