"""examples/quickstart_torch.py, the quick start of PyTorch without JAX, runs
in a process where jax cannot be imported and prints the top beams of each
query (its own asserts check that every beam is an item of the set).
scripts/test-wheel.sh runs it again from the built wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

pytest.importorskip("torch")

EXAMPLE = REPO / "examples" / "quickstart_torch.py"
NO_JAX = ("import runpy, sys; sys.modules['jax'] = None; sys.modules['jaxlib'] = None; "
          "sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')")


def test_quickstart_torch_prints_the_top_beams_without_jax(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", NO_JAX, str(EXAMPLE)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("query")] == [
        "query 7: top beams", "query 42: top beams"]
    beams = [line for line in lines if re.fullmatch(r"  \[(\d+, ){3}\d+\]  log-prob -\d+\.\d{3}",
                                                    line)]
    assert len(beams) == 8, proc.stdout
    assert (tmp_path / "ids.static").is_dir()  # saved where the user ran it
