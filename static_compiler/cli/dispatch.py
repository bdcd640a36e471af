"""The parser and the dispatcher of `static-compiler`.

Each subcommand is one module with a `COMMAND = Subcommand(name, help,
add_arguments, run)` row; to add one, write the module and append its row
to `SUBCOMMANDS`. A row with `compiles=True` takes --no-compilation-cache
and runs with jax's persistent compilation cache on
(`common.start_compilation_cache`). A `StaticCompilerError` raised
anywhere prints one line to stderr (the library's parameters named as the CLI's flags:
`common.in_cli_terms`) and exits with status 2, as does an OSError (a path
the user named) or input nested or sized past reason; a closed stdout pipe
stops quietly.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from static_compiler.cli import (
    compile,
    decode,
    demo,
    reexport,
    rollback,
    show_ir,
    update,
    upgrade,
    verify,
    versions,
)
from static_compiler.cli.common import add_cache_argument, in_cli_terms, start_compilation_cache
from static_compiler.errors import StaticCompilerError

EXIT_USAGE = 2
"""Exit status for bad input (our typed errors, and argparse's own)."""

SUBCOMMANDS = [show_ir.COMMAND, compile.COMMAND, decode.COMMAND, verify.COMMAND, update.COMMAND,
               upgrade.COMMAND, reexport.COMMAND, versions.COMMAND, rollback.COMMAND,
               demo.COMMAND]
"""The subcommand table; `build_parser` registers every row, in this order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="static-compiler",
        description="Compile sets of allowed token sequences into XLA programs (STATIC).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in SUBCOMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        if cmd.compiles:
            add_cache_argument(p)
        p.set_defaults(_run=cmd.run, _compiles=cmd.compiles)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parses `argv` (default sys.argv[1:]) and runs the subcommand; returns
    its exit status, or EXIT_USAGE after printing a typed error's message as
    one line (argparse itself exits 2 on bad flags)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args._compiles:
            start_compilation_cache(args, sys.stderr)
        return args._run(args)
    except BrokenPipeError:  # `... | head` closed our stdout: stop quietly
        _silence_stdout()
        return 0
    except (StaticCompilerError, OSError, RecursionError, MemoryError) as e:
        # OSError: a path the user named (-o under a file, a read-only disk);
        # RecursionError / MemoryError: input nested or sized past reason.
        what = "" if isinstance(e, StaticCompilerError) else f"{type(e).__name__}: "
        message = " ".join(f"{what}{in_cli_terms(e)}".split("\n"))
        sys.stderr.write(f"{parser.prog} {args.command}: error: {message}\n")
        return EXIT_USAGE


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so the interpreter's final flush does not
    fail again on the closed pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
