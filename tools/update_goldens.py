#!/usr/bin/env python3
"""Regenerates golden/: the IR text dump after the frontend and after every
pass of the default pipeline, for small reference constraint sets.

    python tools/update_goldens.py          # rewrite golden/, then review `git diff golden/`
    python tools/update_goldens.py --check  # exit 1 and list the files that differ

This is the only way golden files change; tests/test_goldens.py compares
`render_goldens()` with the files and never writes them. Layout:
``golden/<case>/<NN>-<stage>.ir`` with NN = 00 for the frontend output and
01.. for the passes in pipeline order.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from static_compiler.frontend import build_automaton  # noqa: E402
from static_compiler.pipeline import DEFAULT_PIPELINE, run_pipeline  # noqa: E402

GOLDEN_DIR = os.path.join(ROOT, "golden")

_HEADER = "// ----- IR after "

CASES = {
    # name: (sequences, vocab_size, end_token)
    "three_items": ([[1, 2, 1], [3, 1, 2], [3, 1, 3]], 4, None),
    "single_item": ([[2]], 3, None),
    "root_full_fanout": ([[v, (3 * v) % 8] for v in range(8)], 8, None),
    "chain": ([[0, 1, 2, 3, 4, 5, 6, 7]], 8, None),
    # one state with 16 children beside 20 with one: a skewed level
    "skewed": ([[0, j, 0] for j in range(16)] + [[i, 0, i] for i in range(1, 21)], 64, None),
    # one state with 32 children beside 40 with one: split-heavy mixes that level
    "skewed_mixed": ([[0, j] for j in range(32)] + [[i, i % 7] for i in range(1, 41)], 64, None),
    "ragged_end_token": ([[1, 2], [1], [3, 1, 2], [3, 1], [0]], 5, 4),
}
"""Reference sets: the 3-item example of the README, a single one-token item,
a root with V children, a chain, two skewed sets (the second skewed enough
for the mixed layout) and a ragged set."""


def _stage_name(spec: str) -> str:
    """File-name part of a pass spec: its name without options."""
    return spec.split("{", 1)[0]


def render_case(sequences, vocab_size: int, end_token, pipeline: str = DEFAULT_PIPELINE) -> dict:
    """{file name: IR text} after the frontend and after each pass of `pipeline`,
    as the pass manager prints them with print_ir_after_all."""
    ir = build_automaton(sequences, vocab_size, end_token=end_token)
    stream = io.StringIO()
    run_pipeline(ir, pipeline, print_ir_after_all=True, stream=stream)
    files = {"00-frontend.ir": ir.to_text()}
    chunks = stream.getvalue().split(_HEADER)[1:]
    for i, chunk in enumerate(chunks, start=1):
        spec, _, text = chunk.partition(" -----\n")
        files[f"{i:02d}-{_stage_name(spec)}.ir"] = text
    return files


def render_goldens() -> dict:
    """{path relative to golden/: text} for every case."""
    out = {}
    for name, (sequences, vocab_size, end_token) in CASES.items():
        for fname, text in render_case(sequences, vocab_size, end_token).items():
            out[f"{name}/{fname}"] = text
    return out


def read_goldens(directory: str = GOLDEN_DIR) -> dict:
    """{path relative to `directory`: text} of the .ir files there."""
    out = {}
    for dirpath, _, files in os.walk(directory):
        for f in files:
            if f.endswith(".ir"):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    out[os.path.relpath(path, directory).replace(os.sep, "/")] = fh.read()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when golden/ differs from the current output")
    args = parser.parse_args(argv)
    want, have = render_goldens(), read_goldens()
    changed = sorted(p for p in want if have.get(p) != want[p])
    stale = sorted(set(have) - set(want))
    if args.check:
        for p in changed + stale:
            print(f"differs: golden/{p}")
        return 1 if changed or stale else 0
    for p in changed:
        path = os.path.join(GOLDEN_DIR, p)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(want[p])
        print(f"wrote golden/{p}")
    for p in stale:
        os.remove(os.path.join(GOLDEN_DIR, p))
        print(f"removed golden/{p}")
    print(f"{len(want)} golden files, {len(changed)} written, {len(stale)} removed; "
          "review with `git diff golden/`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
