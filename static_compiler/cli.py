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
                        help="token ending variable-length sequences (ragged .npy input is "
                             "not supported; for IR dumps the dump's own value is used)")
    parser.add_argument("--pipeline", default=None,
                        help="pass pipeline spec (default: the library's DEFAULT_PIPELINE)")
    parser.add_argument("--print-after-all", action="store_true",
                        help="print the IR after the frontend and after every pass (stderr)")
    parser.add_argument("--stats", action="store_true",
                        help="print the per-layer table instead of the IR")
    parser.add_argument("--layer", type=int, default=None, metavar="N",
                        help="print only layer N's rows")


def _run_show_ir(args: argparse.Namespace) -> int:
    from static_compiler import report
    compiled = load_and_compile(args.input, vocab_size=args.vocab_size,
                                end_token=args.end_token, pipeline=args.pipeline,
                                print_ir_after_all=args.print_after_all)
    if args.layer is not None:
        sys.stdout.write(report.layer_text(compiled.ir, args.layer))
    elif args.stats:
        sys.stdout.write(report.stats_table(compiled))
    else:
        sys.stdout.write(compiled.ir.to_text())
    return 0


IR_SUFFIXES = (".txt", ".ir")
NPY_SUFFIXES = (".npy",)


def load_and_compile(path: str, *, vocab_size: Optional[int], end_token: Optional[int] = None,
                     pipeline: Optional[str] = None, print_ir_after_all: bool = False):
    """Reads `path` (a .npy token array or an IR dump) and compiles it.

    Raises CliInputError for a missing file, an unknown suffix, or a .npy
    input without `vocab_size`; library errors pass through."""
    import numpy as np

    from static_compiler import compile_constraints
    from static_compiler.ir import parse_ir

    if not os.path.exists(path):
        raise CliInputError(f"input {path!r}: no such file")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in NPY_SUFFIXES:
        if vocab_size is None:
            raise CliInputError(f"input {path!r}: --vocab-size is required for a .npy token array")
        try:
            constraints = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise CliInputError(f"input {path!r}: not a readable .npy array ({e})") from e
    elif suffix in IR_SUFFIXES:
        with open(path, encoding="utf-8") as f:
            constraints = parse_ir(f.read())
        if vocab_size is not None and vocab_size != constraints.vocab_size:
            raise CliInputError(f"input {path!r}: --vocab-size {vocab_size} differs from the "
                                f"dump's vocab_size {constraints.vocab_size}")
        vocab_size = constraints.vocab_size
    else:
        raise CliInputError(f"input {path!r}: unknown suffix {suffix!r} (expected one of "
                            f"{', '.join(NPY_SUFFIXES + IR_SUFFIXES)})")
    return compile_constraints(constraints, vocab_size, end_token=end_token, pipeline=pipeline,
                               print_ir_after_all=print_ir_after_all)


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


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Entry point of the console script; returns the exit status.

    `prog`, if given, replaces the program name (tools/show_ir.py passes
    argv without the subcommand and prog="show_ir.py")."""
    parser = build_parser()
    if prog is not None:
        parser.prog = prog
    args = parser.parse_args(argv)
    try:
        return args._run(args)
    except StaticCompilerError as e:
        sys.stderr.write(f"{parser.prog} {args.command}: error: {e}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
