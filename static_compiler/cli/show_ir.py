"""`static-compiler show-ir`: print a constraint set's, an IR dump's or an
artifact's IR, per-layer statistics, or one layer (also `python -m tools.show_ir`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from static_compiler.cli.common import INPUT_FORMATS, Subcommand, add_input_arguments, read_any_input
from static_compiler.errors import CliInputError

DEFAULT_MAX_NAMES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, f"an artifact directory (its IR is rebuilt from the saved "
                                f"tables), or the constraint set to compile: {INPUT_FORMATS}")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size V (required unless INPUT is an IR dump or an "
                             "artifact; with --tokenizer default the tokenizer's)")
    parser.add_argument("--end-token", type=int, default=None,
                        help="token ending variable-length sequences (with --tokenizer: default "
                             "the tokenizer's end-of-sequence token; an IR dump carries its own)")
    parser.add_argument("--pipeline", default=None, metavar="SPEC",
                        help="pass pipeline spec. Default for a constraint set: the library's "
                             "DEFAULT_PIPELINE; an IR dump is shown as it is unless SPEC is given")
    parser.add_argument("--print-ir-after-all", action="store_true",
                        help="print the IR after the frontend and after every pass (stderr)")
    parser.add_argument("--stats", action="store_true",
                        help="print the per-layer table (states, edges, branch factors, "
                             "layout, bytes, the paper's memory bound) instead of the IR")
    parser.add_argument("--devices", type=int, default=None, metavar="D",
                        help="with --stats: also each device's table bytes when the tables "
                             "are split across D devices (compiled.shard(mesh, axis))")
    parser.add_argument("--layer", type=int, default=None, metavar="N",
                        help="print only layer N's header and rows")
    parser.add_argument("--max-names", type=int, default=DEFAULT_MAX_NAMES, metavar="N",
                        help="a text catalogue: names to list after the IR (default "
                             f"{DEFAULT_MAX_NAMES})")
    parser.add_argument("--max-edges", type=int, default=None, metavar="E",
                        help="print every row when the automaton (with --layer: the layer) "
                             "has at most E edges, else elide rows (default: the IR printer's "
                             "limit)")


def run(args: argparse.Namespace) -> int:
    from static_compiler import report

    if args.max_edges is not None and args.max_edges < 0:
        raise CliInputError(f"--max-edges {args.max_edges}: expected an int >= 0")
    if args.devices is not None and (args.devices < 1 or not args.stats):
        raise CliInputError(f"--devices {args.devices}: expected an int >= 1, with --stats")
    if os.path.isdir(args.input):
        from static_compiler.saved import load
        given = [flag for flag, value in (("--vocab-size", args.vocab_size), ("--end-token",
                 args.end_token), ("--pipeline", args.pipeline), ("--tokenizer", args.tokenizer))
                 if value is not None]
        if given:
            raise CliInputError(f"input {args.input!r} is an artifact, shown as compiled: "
                                f"{', '.join(given)} apply only to a constraint set or an IR "
                                "dump")
        compiled = load(args.input)  # its IR stays in its tables
        names = compiled.names
        mesh_line = _mesh_line(args.input)
    else:
        compiled = load_and_compile(args.input, vocab_size=args.vocab_size,
                                    end_token=args.end_token, pipeline=args.pipeline,
                                    print_ir_after_all=args.print_ir_after_all,
                                    tokenizer=args.tokenizer)
        names = getattr(compiled, "names", None)
        mesh_line = ""
    if args.stats:
        sys.stdout.write(report.stats_table(compiled, devices=args.devices) + mesh_line)
    if args.layer is not None:
        sys.stdout.write(report.layer_text(compiled, args.layer, max_edges=args.max_edges))
    elif not args.stats:
        text = compiled.ir_text if hasattr(compiled, "ir_text") else compiled.to_text
        sys.stdout.write(text() if args.max_edges is None else text(max_edges=args.max_edges))
    if names is not None and args.layer is None:
        sys.stdout.write(format_names(names, args.max_names))
    return 0


def _mesh_line(path: str) -> str:
    """For an artifact exported for a device mesh: its axes, the tables split
    across the table axis and the bytes each device holds (from the
    manifest's record, see static_compiler.jax_support.placement); else ""."""
    from static_compiler.format.snapshot import read_manifest
    from static_compiler.jax_support import placement

    manifest = read_manifest(path)
    record = manifest.mesh
    if record is None:
        return ""
    D = dict(record["axes"])[record["table_axis"]]
    split = set(record["split_tables"])
    total = per_device = 0
    for table in manifest.tables:
        shape = tuple(table.shape)
        total += placement.device_bytes(table.name, shape, table.dtype, D, False)
        per_device += placement.device_bytes(table.name, shape, table.dtype, D,
                                             f"layer{table.layer}.{table.name}" in split)
    return (f"mesh {placement.mesh_text(record['axes'])}: modules exported for it; "
            f"{len(split)} tables split along {record['table_axis']!r} "
            f"({', '.join(sorted(split)) or 'none'}); {per_device} table bytes per device of "
            f"{total}\n")


def format_names(names, limit: int) -> str:
    """A text catalogue's items, sorted by tokens, one per line (token ids,
    the name, the other names with the same tokens), at most `limit` lines."""
    lines = [f"names items={len(names)} aliases={sum(len(a) for a in names.aliases)}"]
    for name, row, aliases in zip(names.names[:limit], names.tokens, names.aliases):
        also = f"  (also {', '.join(repr(a) for a in aliases)})" if aliases else ""
        lines.append(f"  {[int(t) for t in row if t >= 0]}  {name!r}{also}")
    if len(names) > limit:
        lines.append(f"  ... {len(names) - limit} more (--max-names)")
    return "\n".join(lines) + "\n"


def load_and_compile(path: str, *, vocab_size: Optional[int], end_token: Optional[int] = None,
                     pipeline: Optional[str] = None, print_ir_after_all: bool = False,
                     tokenizer: Optional[str] = None):
    """Reads `path` (any format of `readers.read_constraints`, or with
    `tokenizer`, a tokenizers JSON file, a text catalogue) and compiles it.

    A constraint set goes through `compile_constraints` with `pipeline`
    (default: DEFAULT_PIPELINE) and gives CompiledConstraints. An IR dump is
    parsed and verified; it goes through `compile_constraints` only when
    `pipeline` is given, else the parsed `ir.Automaton` is returned as it is.

    Raises CliInputError for a constraint set without `vocab_size` or
    options that contradict an IR dump; the library's own typed errors (an
    unreadable file: ConstraintSetError) pass through."""
    from static_compiler import compile_constraints
    from static_compiler.ir import Automaton

    constraints, vocab_size, tokenizer = read_any_input(path, vocab_size=vocab_size,
                                                        end_token=end_token, tokenizer=tokenizer)
    if not isinstance(constraints, Automaton):
        return compile_constraints(constraints, vocab_size, end_token=end_token,
                                   tokenizer=tokenizer, pipeline=pipeline,
                                   print_ir_after_all=print_ir_after_all)
    if pipeline is None:
        if print_ir_after_all:
            sys.stderr.write("// ----- IR as read (no --pipeline given) -----\n"
                             + constraints.to_text())
        return constraints
    return compile_constraints(constraints, vocab_size, pipeline=pipeline,
                               print_ir_after_all=print_ir_after_all)


COMMAND = Subcommand("show-ir", "compile a constraint set (or read an IR dump) and print its IR "
                                "or per-layer statistics", add_arguments, run)
