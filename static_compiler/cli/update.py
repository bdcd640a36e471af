"""`static-compiler update`: write a new version of an artifact without some
of its items (takedowns), atomically and under a lock; a serving process
picks it up with `Artifact.reload()` between two decodes."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART",
                        help="artifact directory (saved with --export-subsets)")
    parser.add_argument("--remove", required=True, metavar="FILE",
                        help="the items to take out: a .npy bool mask over the rows the set was "
                             "compiled from, or sequences in any `compile` format (.npy int "
                             "array, .jsonl, text)")


def run(args: argparse.Namespace) -> int:
    from static_compiler import artifact, readers
    from static_compiler.errors import CliInputError
    from static_compiler.ir import Automaton

    remove = readers.read_constraints(args.remove)
    if isinstance(remove, Automaton):
        raise CliInputError(f"--remove {args.remove!r} is an IR dump: expected a bool mask or "
                            "sequences")
    report = artifact.update_removed(args.artifact, remove)
    sys.stdout.write(f"updated {args.artifact}: {report['removed']} items removed, "
                     f"{report['already_removed']} already removed, {report['absent']} not in "
                     "the set\n")
    return 0


COMMAND = Subcommand("update", "write a new version of an artifact without some items",
                     add_arguments, run)
