"""`static-compiler versions ART`: the artifact's versions, newest first
(`static_compiler.list_versions`): the current one, then those kept in
`.ART.versions/` (`lifecycle.versions`), one line each."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")


def version_line(row: dict) -> str:
    """One `list_versions` row as a line: id (current marked), time,
    operation, number of sequences (DAMAGED for a kept version whose
    manifest cannot be read, with why at the end), the report's scalar
    fields."""
    report = row.get("report") if isinstance(row.get("report"), dict) else {}
    details = ", ".join(f"{key}={value:06d}" if key == "to" and isinstance(value, int)
                        else f"{key}={value}" for key, value in sorted(report.items())
                        if isinstance(value, (int, float, str)) and key != "path")
    size = ("DAMAGED" if row.get("damaged") else f"{row['num_sequences']} sequences")
    line = (f"{row['id']:06d}{' current' if row['current'] else ''}  {row['when'] or '?'}  "
            f"{row['operation'] or 'unrecorded'}  {size}{f'  ({details})' if details else ''}")
    return line + (f"  ({row['damaged']})" if row.get("damaged") else "")


def run(args: argparse.Namespace) -> int:
    from static_compiler.lifecycle.versions import list_versions

    for row in list_versions(args.artifact):
        sys.stdout.write(version_line(row) + "\n")
    return 0


COMMAND = Subcommand("versions", "list an artifact's versions (the current one, then those kept "
                                 "for rollback)", add_arguments, run)
