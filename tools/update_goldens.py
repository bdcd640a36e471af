#!/usr/bin/env python3
"""Regenerates golden/: the IR text dump after the frontend and after every
pass of the default pipeline, for small reference constraint sets.

    python tools/update_goldens.py          # rewrite golden/, then review `git diff golden/`
    python tools/update_goldens.py --check  # exit 1 and list the files that differ

(`python -m tools.update_goldens` from the repository root is the same.)

This is the only way golden .ir files change; tests/passes/test_goldens.py compares
the library's dumps with the files and never writes them. Layout: each case
is a folder ``golden/<case>/`` whose ``input.json`` holds the set
(``sequences``, ``vocab_size``, ``end_token``, and ``about``, a line on what
it exercises); ``<NN>-<stage>.ir`` are its dumps, NN = 00 for the frontend
output and 01.. for the passes in pipeline order
(`static_compiler.passes.pipeline.stage_dumps`). A new case is a new folder with an
input.json; run this to create its dumps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from static_compiler.frontend import build_automaton
from static_compiler.passes.pipeline import DEFAULT_PIPELINE, stage_dumps

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
INPUT = "input.json"


def read_cases(directory: str = GOLDEN_DIR) -> dict:
    """{case: (sequences, vocab_size, end_token)} from each <case>/input.json."""
    cases = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, INPUT)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                spec = json.load(fh)
            cases[name] = (spec["sequences"], spec["vocab_size"], spec["end_token"])
    return cases


def render_case(sequences, vocab_size: int, end_token, pipeline: str = DEFAULT_PIPELINE) -> dict:
    """{file name: IR text} after the frontend and after each pass of `pipeline`."""
    ir = build_automaton(sequences, vocab_size, end_token=end_token)
    return {f"{i:02d}-{stage}.ir": text
            for i, (stage, text) in enumerate(stage_dumps(ir, pipeline, input_stage="frontend"))}


def render_goldens(directory: str = GOLDEN_DIR) -> dict:
    """{path relative to golden/: text} for every case."""
    return {f"{name}/{fname}": text
            for name, case in read_cases(directory).items()
            for fname, text in render_case(*case).items()}


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
