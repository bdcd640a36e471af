"""`static-compiler re-export`: an artifact's modules exported anew by the
running jax (`static_compiler.reexport_artifact`), atomically and under the
writers' lock, its tables kept: for a tables-only artifact (saved without
jax), for an artifact another JAX exported
(`serving.load` raises ArtifactVersionError naming both versions) or whose
export date nears the end of jax.export's six-month window
(`serving.load` warns with ArtifactExpiryWarning)."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand, beam_size_entry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--beam-sizes", type=beam_size_entry, nargs="+", default=None,
                        metavar="M",
                        help="for a tables-only artifact (saved without jax): the beam sizes "
                             "to export beam_step modules for, and beam schedules (widths "
                             "joined by '/', e.g. 16/32/64/64) (default: those the set was "
                             "saved for, which its manifest records; 70 for an artifact "
                             "saved before format version 15)")


def run(args: argparse.Namespace) -> int:
    from static_compiler.lifecycle.upgrade import reexport_artifact

    report = reexport_artifact(args.artifact, beam_sizes=args.beam_sizes)
    before = ("no modules (tables only)" if report["tables_only"] else
              f"jax {report['from_jax']} (jaxlib {report['from_jaxlib']}), exported "
              f"{report['from_exported_at'] or 'on an unrecorded date'}")
    after = f"jax {report['jax']} (jaxlib {report['jaxlib']}), exported {report['exported_at']}"
    how = (f"format version {report['from_version']} -> {report['to_version']}, tables rewritten"
           if report["upgraded"] else "tables kept")
    sys.stdout.write(f"re-exported {args.artifact}: {before} -> modules of {after}; {how} "
                     "(a serving process picks them up with reload())\n")
    return 0


COMMAND = Subcommand("re-export", "export an artifact's modules anew with this jax, keeping its "
                                  "tables (renews modules another or an older JAX exported)",
                     add_arguments, run)
