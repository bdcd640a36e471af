"""`static-compiler rollback ART [--to ID]`: swap a kept version of the
artifact back in (`static_compiler.rollback_artifact`), atomically and
under the writers' lock; the version it replaces is kept in turn, so a
second `rollback` undoes it. A serving process picks it up with
`Artifact.reload()`."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand, add_keep_versions_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--to", metavar="ID",
                        help="the kept version to restore (an id `versions` lists); default "
                             "the previous one")
    add_keep_versions_argument(parser)


def run(args: argparse.Namespace) -> int:
    from static_compiler.lifecycle.versions import rollback_artifact

    record = rollback_artifact(args.artifact, args.to, keep_versions=args.keep_versions)
    restored = record["report"]["restored"]
    sys.stdout.write(f"rolled back {args.artifact} to version {record['report']['to']:06d} "
                     f"({restored['operation'] or 'unrecorded'} of {restored['when']}); now "
                     f"version {record['id']:06d}\n")
    return 0


COMMAND = Subcommand("rollback", "swap a kept version of an artifact back in (undo an update)",
                     add_arguments, run)
