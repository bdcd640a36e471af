#!/usr/bin/env python3
"""Writes tests/data/jax_versions/jax-<version>/: a small artifact (with item
subsets and an end token) whose modules the running jax exported, so that
the other supported jax can be tested against it
(tests/serving/test_jax_versions.py loads every folder there).

    python -m tools.jax_fixtures            # under each supported jax, then commit the folder

Run it once under the oldest and once under the newest jax the README
names (Python 3.11 with its jax, and Python 3.13 with the current one);
an existing folder for the running jax is replaced. The items are
tests/data/jax_versions/items.npy (written once, by the first run): every
fixture holds the same set, so their beams must agree.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "jax_versions"
VOCAB, END = 16, 0


def items() -> list:
    """The fixture set's token sequences (1 to 4 tokens of 1..15), from
    items.npy (rows padded with -1), written by the first run."""
    path = FIXTURES / "items.npy"
    if not path.exists():
        rng = np.random.default_rng(2026)
        rows = np.full((300, 4), -1, np.int32)
        for row, n in zip(rows, rng.integers(1, 5, size=len(rows))):
            row[:n] = rng.integers(1, VOCAB, size=n)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        np.save(path, rows)
    return [[int(t) for t in row if t >= 0] for row in np.load(path)]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import static_compiler as sc

    compiled = sc.compile_constraints(items(), VOCAB, end_token=END, export_beam_sizes=(4,),
                                      export_subsets=True)
    dest = FIXTURES / f"jax-{jax.__version__}"
    tmp = FIXTURES / f".jax-{jax.__version__}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    compiled.save(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    print(f"wrote {dest.relative_to(ROOT)} (jax {jax.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
