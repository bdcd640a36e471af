"""`static-compiler demo`: the main job (`main_job.run`) with options from
the command line."""

from __future__ import annotations

import argparse

from static_compiler.cli.common import Subcommand, require_jax
from static_compiler.errors import CliInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from static_compiler.frontend import datasets

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
    parser.add_argument("--verbose", action="store_true",
                        help="list the static_compiler modules the serving process imported")


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--num-items", args.num_items), ("--batch-size", args.batch_size),
                        ("--beam-size", args.beam_size), ("--tokens-per-beam", args.tokens_per_beam)):
        if value < 1:
            raise CliInputError(f"{flag} {value}: expected an int >= 1")
    require_jax("demo", "it serves the compiled set's StableHLO modules with jax")
    from static_compiler.cli import main_job

    config = main_job.MainJobConfig(dataset=args.dataset, num_items=args.num_items,
                                    seed=args.seed, batch_size=args.batch_size,
                                    beam_size=args.beam_size,
                                    tokens_per_beam=args.tokens_per_beam,
                                    artifact_path=args.artifact, force=args.force,
                                    compilation_cache=not args.no_compilation_cache,
                                    verbose=args.verbose)
    return main_job.run(config)


COMMAND = Subcommand("demo", "the main job: compile a built-in set, save, serve it in a fresh "
                             "process, decode, check and report", add_arguments, run,
                     compiles=True)
