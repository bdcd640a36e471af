"""`static-compiler update`: write a new version of an artifact with some
items added (`--add`, with their `--attributes` where the set has
attributes) and/or taken out (`--remove`, takedowns), atomically
and under a lock; a serving process picks it up with `Artifact.reload()`
between two decodes (sharing its modules when the additions fit the
capacity reserved at compile time, `compile --capacity`)."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand, add_keep_versions_argument, read_attributes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART",
                        help="artifact directory (saved with --export-subsets)")
    parser.add_argument("--add", metavar="FILE",
                        help="items to add: sequences in any `compile` format (.npy int array, "
                             ".jsonl, text); added rows follow the set's rows")
    parser.add_argument("--remove", metavar="FILE",
                        help="the items to take out: a .npy bool mask over the rows of the set "
                             "(N entries, or N + the rows --add appends), or sequences in any "
                             "`compile` format (.npy int array, .jsonl, text)")
    parser.add_argument("--attributes", metavar="FILE.npz",
                        help="for an artifact with item attributes: the added rows' values, "
                             "each array of the .npz file (one value per --add row) a column "
                             "named by its key, every attribute of the set (as compile "
                             "--attributes)")
    add_keep_versions_argument(parser)


def _read(flag: str, file: str):
    from static_compiler.errors import CliInputError
    from static_compiler.frontend import readers
    from static_compiler.ir import Automaton

    value = readers.read_constraints(file)
    if isinstance(value, Automaton):
        raise CliInputError(f"{flag} {file!r} is an IR dump: expected "
                            f"{'a bool mask or ' if flag == '--remove' else ''}sequences")
    return value


def run(args: argparse.Namespace) -> int:
    from static_compiler.errors import CliInputError
    from static_compiler.lifecycle.update import update_artifact

    if args.add is None and args.remove is None:
        raise CliInputError("update: nothing to do: give --add FILE and/or --remove FILE")
    add = None if args.add is None else _read("--add", args.add)
    remove = None if args.remove is None else _read("--remove", args.remove)
    attributes = None if args.attributes is None else read_attributes(args.attributes)
    report = update_artifact(args.artifact, add=add, remove=remove, attributes=attributes,
                             keep_versions=args.keep_versions)
    parts = []
    if add is not None:
        parts.append(f"{report['added']} items added, {report['already_present']} already in "
                     f"the set, {report['restored']} restored")
        grew = "; ".join(report["grew"])
        parts.append({"reused": "same table shapes, modules kept",
                      "none": f"tables only{f' (grew: {grew})' if grew else ''}"}.get(
            report["modules"], f"grew past the capacity, modules exported anew ({grew})"))
    if remove is not None:
        parts.append(f"{report['removed']} items removed, {report['already_removed']} already "
                     f"removed, {report['absent']} not in the set")
    sys.stdout.write(f"updated {args.artifact}: {'; '.join(parts)}\n")
    return 0


COMMAND = Subcommand("update", "write a new version of an artifact with items added or removed",
                     add_arguments, run)
