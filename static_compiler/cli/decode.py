"""`static-compiler decode`: load an artifact with the serving loader and
decode with the built-in demo model (`demo_model`); an artifact exported for
a device mesh is loaded on a mesh of this process's devices with the same
axes and sizes."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import Subcommand, beam_size_entry, device_mesh, require_jax


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--beam-size", type=beam_size_entry, default=None, metavar="M",
                        help="one of the artifact's exported beam sizes, or of its beam "
                             "schedules (widths joined by '/', e.g. 16/32/64/64) (default: the "
                             "first beam size)")
    parser.add_argument("--top", type=int, default=5, help="beams to print per batch row")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demo model")
    parser.add_argument("--where", default=None, metavar="EXPR",
                        help="decode over the items a filter expression picks, e.g. "
                             "\"in_stock and category in ('shoes', 'hats')\" (the artifact's "
                             "attributes; needs --export-subsets: docs/business-rules.md)")
    parser.add_argument("--mask", action="append", default=[], metavar="NAME=FILE.npy",
                        help="a named item mask for --where (bool (N,) over the input rows), "
                             "e.g. seen=seen.npy with --where 'not seen'; repeatable")
    parser.add_argument("--prior", default=None, metavar="COLUMN",
                        help="rank items by the model's log-probability plus --prior-weight x "
                             "this float or int attribute (item priors; needs an artifact "
                             "compiled with --export-priors: docs/business-rules.md)")
    parser.add_argument("--prior-weight", type=float, default=None, metavar="W",
                        help="the weight of --prior (default 1.0); needs --prior")
    parser.add_argument("--check-tables", action="store_true",
                        help="also check that the tables form a valid automaton (O(table "
                             "size)): catches tables edited with their checksums recomputed")


def run(args: argparse.Namespace) -> int:
    from static_compiler.errors import CliInputError

    require_jax("decode", "it runs the artifact's StableHLO modules")
    from static_compiler import serving
    from static_compiler.cli import demo_model

    if args.top < 1 or args.batch_size < 1:
        raise CliInputError(f"--top {args.top} / --batch-size {args.batch_size}: expected ints "
                            ">= 1")
    if args.prior_weight is not None and args.prior is None:
        raise CliInputError(f"--prior-weight {args.prior_weight} without --prior: it weighs "
                            "the attribute --prior COLUMN names (e.g. --prior popularity "
                            f"--prior-weight {args.prior_weight})")
    # The arguments are checked against the manifest before anything is
    # loaded or compiled.
    manifest = serving.read_manifest(args.artifact)
    if args.beam_size is not None:
        _check_beam_size(args.beam_size, manifest, args.artifact)
    # An artifact exported for a mesh runs on one of this process's devices
    # with its axes and sizes (the manifest records them).
    record = manifest.mesh
    mesh = None if record is None else device_mesh(record["axes"], f"artifact {args.artifact!r}")
    if args.check_tables:
        from static_compiler.artifact.read import load_checked
        art = load_checked(args.artifact, mesh=mesh)
    else:
        art = serving.load(args.artifact, mesh=mesh)
    beam_size = art.beam_sizes[0] if args.beam_size is None else args.beam_size
    subset = None
    if args.where is not None:
        subset = art.subset(where=args.where, masks=_masks(args.mask))
    elif args.mask:
        raise CliInputError("--mask NAME=FILE names a mask for --where, which is missing")
    prior = None if args.prior is None else \
        art.prior(args.prior, 1.0 if args.prior_weight is None else args.prior_weight)
    decoded = demo_model.decode_artifact(art, batch_size=args.batch_size, beam_size=beam_size,
                                        seed=args.seed, subset=subset, prior=prior)
    out = sys.stdout
    beams = "/".join(map(str, beam_size)) if isinstance(beam_size, tuple) else beam_size
    out.write(f"{art!r}\ndemo model seed {args.seed}, batch {args.batch_size}, beams "
              f"{beams}\n")
    texts = art.texts(decoded.result) if art.names is not None else None
    for row in range(args.batch_size):
        top = demo_model.format_top(decoded.result, row=row, top=args.top)
        if texts is not None:
            top = _with_names(top, decoded.result.valid[row], texts[row])
        out.write(f"batch row {row}:\n{top}\n")
    steps = sorted(decoded.step_seconds)
    out.write(f"beam_step median {steps[len(steps) // 2] * 1e3:.3f} ms per step "
              f"(first pass, with XLA compiles or compilation-cache reads, "
              f"{decoded.first_pass_seconds:.2f} s)\n")
    return 0


def _check_beam_size(beam_size, manifest, path: str) -> None:
    """CliInputError unless `beam_size` (an int, or a schedule: a tuple) is
    one the artifact exports: a schedule of another length than the set's
    steps says the length a schedule has (the compiler refuses any other,
    so no compile command is suggested); one the artifact lacks names what
    it exports and the compile option that adds it."""
    from static_compiler.errors import CliInputError, DecodeInputError
    from static_compiler.support.arguments import check_beam_schedule

    shown = "/".join(map(str, beam_size)) if isinstance(beam_size, tuple) else beam_size
    if isinstance(beam_size, tuple):
        try:
            check_beam_schedule(beam_size, manifest.max_length)
        except DecodeInputError:
            example = "/".join(map(str, (beam_size + (beam_size[-1],) * manifest.max_length)
                                   [:manifest.max_length]))
            raise CliInputError(f"--beam-size {shown}: a beam schedule has one width per step, "
                                f"and artifact {path!r} decodes {manifest.max_length} steps: "
                                f"give {manifest.max_length} widths joined by '/' (e.g. "
                                f"{example})") from None
    if beam_size not in manifest.beam_sizes() + manifest.beam_schedules:
        schedules = ", ".join("/".join(map(str, s)) for s in manifest.beam_schedules)
        raise CliInputError(f"--beam-size {shown}: artifact {path!r} exports beam "
                            f"sizes {list(manifest.beam_sizes())} "
                            f"{f'and beam schedules [{schedules}] ' if schedules else ''}"
                            f"(compile with --beam-sizes {shown} to add one)")


def _masks(specs: list) -> dict:
    """{name: bool array} of the --mask NAME=FILE.npy options."""
    import numpy as np

    from static_compiler.errors import CliInputError

    masks = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise CliInputError(f"--mask {spec!r}: expected NAME=FILE.npy")
        try:
            masks[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise CliInputError(f"--mask {spec!r}: cannot read {path!r} as a .npy array "
                                f"({err})") from None
    return masks


def _with_names(top: str, valid, names: list) -> str:
    """`demo_model.format_top`'s lines (one per valid beam, in beam order)
    with each beam's name appended."""
    lines = top.split("\n")
    shown = [names[m] for m in range(len(names)) if valid[m]][:len(lines)]
    if len(shown) != len(lines):  # "(no valid beam)"
        return top
    return "\n".join(f"{line}  {name!r}" for line, name in zip(lines, shown))


COMMAND = Subcommand("decode", "load an artifact with the serving loader and decode with a "
                               "built-in demo model", add_arguments, run, compiles=True)
