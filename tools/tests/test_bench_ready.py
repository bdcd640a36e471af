"""`python -m tools.bench ready` on tiny sizes, run as the user runs it: a
subprocess from the repository root (tests never import tools/). Every front
door gets its row in the written table; timings are not asserted."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOORS = ("library `sc.beam_search`", "serving `beam_step`, R=0", "serving `beam_step`, R=4",
         "serving after `update --remove` + `reload()`", "`processor(B)` mask/advance",
         "HF processor, jax", "HF processor, torch", "CLI `decode`")


def test_ready_writes_a_row_per_front_door(tmp_path):
    out = tmp_path / "ready.md"
    env = {k: v for k, v in os.environ.items() if k != "STATIC_COMPILER_NO_CACHE"}
    run = subprocess.run([sys.executable, "-m", "tools.bench", "ready", "--quick", "--states",
                          "cold", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    text = out.read_text()
    assert text in run.stdout
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for door in DOORS:
        assert any(line.startswith(f"| {door}") and "| cold |" in line for line in rows), door
    assert "error" not in text
    assert "| front door | warm() | warm() s | mix xla after warm() |" in text


def test_ready_refuses_an_unknown_door(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tools.bench", "ready", "--doors", "nope",
                          "--out", str(tmp_path / "r.md")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "--doors" in run.stderr
    assert not (tmp_path / "r.md").exists()
