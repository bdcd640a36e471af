"""`static-compiler compile`: compile a constraint set file and save it as an
artifact directory, logging each stage with its time."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Optional

from static_compiler.cli.common import (
    INPUT_FORMATS,
    Subcommand,
    add_input_arguments,
    beam_size_entry,
    device_mesh,
    parse_mesh,
    progress,
    read_any_input,
    read_attributes,
)
from static_compiler.errors import CliInputError, installed

DEFAULT_BEAM_SIZES = "70"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, f"the constraint set: {INPUT_FORMATS}")
    parser.add_argument("--spellings", choices=("canonical", "any"), default="canonical",
                        help="with --tokenizer: each name's own encoding (canonical, the "
                             "default) or every token sequence that spells it (any)")
    parser.add_argument("-o", "--output", required=True, metavar="ART",
                        help="artifact directory to write")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size V (required unless INPUT is an IR dump; with "
                             "--tokenizer default the tokenizer's, added tokens included)")
    parser.add_argument("--end-token", type=int, default=None,
                        help="token ending variable-length sequences (with --tokenizer: "
                             "default the tokenizer's end-of-sequence token)")
    parser.add_argument("--pipeline", default=None, metavar="SPEC",
                        help="pass pipeline spec (default: the library's DEFAULT_PIPELINE)")
    parser.add_argument("--memory-budget", default=None, metavar="BYTES",
                        help="choose-layout's memory budget, e.g. 512MiB (overrides the spec's)")
    parser.add_argument("--beam-sizes", default=DEFAULT_BEAM_SIZES, metavar="M,...",
                        help=f"beam sizes to export a beam_step module for, and beam "
                             f"schedules (one width per step joined by '/', e.g. "
                             f"70,16/32/64/64) to export the modules of (default "
                             f"{DEFAULT_BEAM_SIZES})")
    parser.add_argument("--tokens-per-beam", type=int, default=None,
                        help="expand each beam to at most this many children (default: all)")
    parser.add_argument("--capacity", type=float, default=None, metavar="GROWTH",
                        help="reserve room for items added later (e.g. 1.25: 25%% more states "
                             "per depth), so additions that fit recompile nothing")
    parser.add_argument("--export-subsets", action="store_true",
                        help="also save the item index and subset modules, so a serving process "
                             "restricts each request to a subset of the items (Artifact.subset)")
    parser.add_argument("--export-priors", action="store_true",
                        help="also export the step modules' item-prior variants, so a serving "
                             "process ranks by a float attribute (Artifact.prior; needs "
                             "--export-subsets and --attributes)")
    parser.add_argument("--attributes", default=None, metavar="FILE.npz",
                        help="item attributes: each array of the .npz file (N,) is a column "
                             "named by its key, one value per input row (needs "
                             "--export-subsets to be saved)")
    parser.add_argument("--print-ir-after-all", action="store_true",
                        help="print the IR after the frontend and every pass (stderr)")
    parser.add_argument("--partitions", type=int, default=None, metavar="P",
                        help="build in P partitions (sc.Shards): INPUT is then a .npy file or a "
                             "directory of .npy shards (N_i, L), read in chunks")
    parser.add_argument("--workers", type=int, default=0, metavar="W",
                        help="with --partitions: run the spill and build tasks on W worker "
                             "processes (default: in this process)")
    parser.add_argument("--mesh", default=None, metavar="NAME=SIZE[,...]",
                        help="export for a device mesh of this process's devices: the tables "
                             "split across the last axis named (compiled.shard); serve it with "
                             "serving.load(path, mesh=...) or `decode`")
    parser.add_argument("--tables-only", action="store_true",
                        help="write the tables without StableHLO modules (what the torch "
                             "backend reads; the default where jax is not installed): "
                             "`re-export` adds the modules later")
    parser.add_argument("--force", action="store_true", help="replace an existing artifact")


def run(args: argparse.Namespace) -> int:
    from static_compiler import compile_constraints

    if os.path.exists(args.output) and not args.force:
        raise CliInputError(f"output {args.output!r} already exists: pass --force to replace it")
    beam_sizes = _beam_sizes("--beam-sizes", args.beam_sizes)
    if args.tokens_per_beam is not None and args.tokens_per_beam < 1:
        raise CliInputError(f"--tokens-per-beam {args.tokens_per_beam}: expected an int >= 1")
    pipeline = _pipeline_with_budget(args.pipeline, args.memory_budget)
    axes = None if args.mesh is None else parse_mesh(args.mesh)
    mesh = None if axes is None else device_mesh(axes, f"--mesh {args.mesh}")
    log = sys.stderr
    attributes = None if args.attributes is None else read_attributes(args.attributes)
    with contextlib.ExitStack() as stack:
        if args.partitions is not None:
            constraints, vocab_size, tokenizer = _shards(args, stack, log), args.vocab_size, None
        else:
            constraints, vocab_size, tokenizer = read_any_input(
                args.input, vocab_size=args.vocab_size, end_token=args.end_token,
                tokenizer=args.tokenizer)
        with progress("compile", log):
            compiled = compile_constraints(constraints, vocab_size, end_token=args.end_token,
                                           tokenizer=tokenizer, spellings=args.spellings,
                                           pipeline=pipeline,
                                           print_ir_after_all=args.print_ir_after_all,
                                           export_beam_sizes=beam_sizes,
                                           export_tokens_per_beam=args.tokens_per_beam,
                                           export_subsets=args.export_subsets,
                                           export_priors=args.export_priors,
                                           capacity=args.capacity, stream=log,
                                           attributes=attributes)
    for stage, seconds in compiled.build.timings:
        log.write(f"[compile]   {stage:<16s} {seconds:8.3f} s\n")
    text = compiled.build.frontend_stats.get("text")
    if text is not None:
        log.write(f"[compile] {text['names']} names -> {text['items']} items ({text['duplicates']} "
                  f"names share another name's tokens), end token {text['end_token']}\n")
    if mesh is not None:
        compiled = compiled.shard(mesh, axes[-1][0])
        log.write(f"[compile] tables split across {axes[-1][0]!r}: "
                  f"{sum(r['bytes_per_device'] for r in compiled.layer_stats())} bytes per "
                  f"device of {compiled.lowered.nbytes}\n")
    modules = False if args.tables_only else installed("jax")
    with progress("export + save" if modules else "save (tables only)", log):
        path = compiled.save(args.output, overwrite=args.force, modules=modules)
    shown = ["/".join(map(str, m)) if isinstance(m, tuple) else str(m) for m in beam_sizes]
    held = f"beam sizes {', '.join(shown)}" if modules else \
        "tables only (no modules: `static-compiler re-export` adds them)"
    sys.stdout.write(f"wrote {path}: {compiled.outline.num_sequences} sequences, vocab "
                     f"{compiled.vocab_size}, max length {compiled.max_length}, "
                     f"{compiled.lowered.nbytes} table bytes, {held}, "
                     f"pipeline {compiled.build.pipeline}\n")
    return 0


def _shards(args: argparse.Namespace, stack: contextlib.ExitStack, log):
    """The `Shards` that --partitions / --workers describe (a worker pool
    entered on `stack`)."""
    from static_compiler.frontend.partitioned import Shards

    if args.partitions < 1 or args.workers < 0:
        raise CliInputError(f"--partitions {args.partitions} / --workers {args.workers}: "
                            "expected ints >= 1 / >= 0")
    if args.vocab_size is None or args.tokenizer is not None:
        raise CliInputError("--partitions needs --vocab-size and .npy input (no --tokenizer)")
    if os.path.isdir(args.input):
        paths = sorted(os.path.join(args.input, f) for f in os.listdir(args.input)
                       if f.endswith(".npy"))
        if not paths:
            raise CliInputError(f"input {args.input!r}: a directory without .npy shards")
    elif args.input.endswith(".npy"):
        paths = [args.input]
    else:
        raise CliInputError(f"input {args.input!r}: with --partitions, expected a .npy file or "
                            "a directory of them")
    executor = None
    if args.workers:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        executor = stack.enter_context(ProcessPoolExecutor(
            args.workers, mp_context=multiprocessing.get_context("spawn")))
    return Shards(paths, partitions=args.partitions, executor=executor,
                  progress=lambda line: log.write(line + "\n"))


def _beam_sizes(flag: str, text: str) -> tuple:
    """The comma-separated entries of --beam-sizes: ints and '/'-joined
    beam schedules (`common.beam_size_entry`)."""
    entries = [v.strip() for v in text.split(",") if v.strip()]
    if not entries:
        raise CliInputError(f"{flag} {text!r}: expected comma-separated ints >= 1 or beam "
                            "schedules, e.g. 70,128 or 70,16/32/64/64")
    try:
        return tuple(beam_size_entry(v) for v in entries)
    except argparse.ArgumentTypeError as err:
        raise CliInputError(f"{flag} {text!r}: entry {err}") from None


def _pipeline_with_budget(pipeline: Optional[str], budget: Optional[str]) -> Optional[str]:
    """`pipeline` (default DEFAULT_PIPELINE) with choose-layout's memory
    budget set to `budget`, or `pipeline` unchanged when budget is None."""
    if budget is None:
        return pipeline
    from static_compiler.errors import PipelineError
    from static_compiler.passes.base import ByteSize
    from static_compiler.passes.pipeline import (
        DEFAULT_PIPELINE,
        format_pipeline,
        parse_pipeline,
        with_memory_budget,
    )

    try:
        size = ByteSize.parse(budget)
    except ValueError as e:
        raise CliInputError(f"--memory-budget {budget!r}: {e}") from None
    passes = parse_pipeline(pipeline if pipeline is not None else DEFAULT_PIPELINE)
    try:
        return format_pipeline(with_memory_budget(passes, size))
    except PipelineError as e:
        raise CliInputError(f"--memory-budget {budget}: {e}") from None


COMMAND = Subcommand("compile", "compile a constraint set and save it as an artifact directory",
                     add_arguments, run)
