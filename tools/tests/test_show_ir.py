"""`python -m tools.show_ir` (tools/show_ir.py) run as the user runs it, from
the repository root: it prints what `static-compiler show-ir` prints, and bad
input exits 2 with one line on stderr and no traceback."""

import os
import pathlib
import subprocess
import sys

import numpy as np

from static_compiler import compile_constraints, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])


def _script(*args, cwd=ROOT):
    """`python -m tools.show_ir ARGS` from the repository root, the package
    found through the checkout (isolated from site-packages' copy)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "tools.show_ir", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_tools_show_ir_runs_from_a_checkout(tmp_path):
    np.save(tmp_path / "sids.npy", THREE)
    done = _script(tmp_path / "sids.npy", "--vocab-size", "4", "--stats")
    assert done.returncode == 0, done.stderr
    assert done.stdout == report.stats_table(compile_constraints(THREE, 4))
    bad = _script(tmp_path / "sids.npy", "--vocab-size", "2")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines() == [
        "static-compiler show-ir: error: sequence 0, position 1: token 2 is outside the "
        "vocabulary [0, 2)"]
