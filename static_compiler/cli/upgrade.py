"""`static-compiler upgrade`: rewrite an artifact of an older format version
into the current one (`static_compiler.upgrade_artifact`), atomically and
under the writers' lock, before the readers' window of versions
(`format.spec.MIN_FORMAT_VERSION`, dated in docs/artifact-format.md)
moves past it. An artifact already current is left as it is (exit 0)."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")


def run(args: argparse.Namespace) -> int:
    from static_compiler.lifecycle.upgrade import upgrade_artifact

    report = upgrade_artifact(args.artifact)
    if not report["upgraded"]:
        sys.stdout.write(f"{args.artifact}: already format version {report['to_version']}, "
                         "nothing to do\n")
        return 0
    how = ("tables and modules kept" if report["modules"] == "kept" else
           "modules exported anew (a serving process loads it anew: serving.load)")
    older = ", ".join(report["branches"]) or "none"
    sys.stdout.write(f"upgraded {args.artifact}: format version {report['from_version']} -> "
                     f"{report['to_version']} (older shapes: {older}); {how}\n")
    return 0


COMMAND = Subcommand("upgrade", "rewrite an artifact of an older format version into the current "
                                "one", add_arguments, run)
