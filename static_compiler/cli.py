"""The `static-compiler` command line.

Each subcommand is one `(add_arguments, run)` pair registered in
`SUBCOMMANDS`; to add one, write both functions and append a `Subcommand`
row. `run(args)` returns the process exit status. A `StaticCompilerError`
raised anywhere prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Callable, Optional, Sequence

from static_compiler.errors import StaticCompilerError

EXIT_USAGE = 2
"""Exit status for bad input (our typed errors, and argparse's own)."""


class CliInputError(StaticCompilerError, ValueError):
    """A command-line argument is wrong (missing file, unknown extension, ...)."""


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name, one-line help, and two functions."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ----- show-ir -----

def _add_show_ir_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a .npy array (N, L) of token ids, or an IR text dump "
                                      "(.txt / .ir)")
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


IR_SUFFIXES = (".txt", ".ir")
NPY_SUFFIXES = (".npy",)


def load_and_compile(path: str, *, vocab_size: Optional[int], end_token: Optional[int] = None,
                     pipeline: Optional[str] = None, print_ir_after_all: bool = False):
    """Reads `path` and compiles it.

    A .npy token array (N, L) goes through `compile_constraints` with
    `pipeline` (default: DEFAULT_PIPELINE) and gives CompiledConstraints. An
    IR dump (.txt / .ir) is parsed and verified; it goes through
    `compile_constraints` only when `pipeline` is given, else the parsed
    `ir.Automaton` is returned as it is.

    Raises CliInputError for a missing file, an unknown suffix, a .npy input
    without `vocab_size`, or options that contradict an IR dump; the
    library's own typed errors pass through."""
    import numpy as np

    from static_compiler import compile_constraints
    from static_compiler.ir import parse_ir

    if not os.path.isfile(path):
        raise CliInputError(f"input {path!r}: no such file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in NPY_SUFFIXES:
        if vocab_size is None:
            raise CliInputError(f"input {path!r}: --vocab-size is required for a .npy token array")
        try:
            constraints = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise CliInputError(f"input {path!r}: not a readable .npy array ({e})") from e
        return compile_constraints(constraints, vocab_size, end_token=end_token,
                                   pipeline=pipeline, print_ir_after_all=print_ir_after_all)
    if suffix in IR_SUFFIXES:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CliInputError(f"input {path!r}: not a readable UTF-8 IR dump ({e})") from e
        ir = parse_ir(text)
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
    raise CliInputError(f"input {path!r}: unknown suffix {suffix!r} (expected one of "
                        f"{', '.join(NPY_SUFFIXES + IR_SUFFIXES)})")


SUBCOMMANDS = [
    Subcommand("show-ir", "compile a constraint set (or read an IR dump) and print its IR "
                          "or per-layer statistics", _add_show_ir_arguments, _run_show_ir),
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
