"""`python -m tools.bench ready` on tiny sizes, run as the user runs it: a
subprocess from the repository root (tests never import tools/). Every front
door gets its row in the written table, from a cold and from a warm
persistent cache; timings are not asserted, what the steady rows time is."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOORS = ("library `sc.beam_search`", "serving `beam_step`, R=0", "serving `beam_step`, R=4",
         "serving after `update --remove` + `reload()`", "`processor(B)` mask/advance",
         "HF processor, jax", "HF processor, torch", "CLI `decode`")
STEADY_DOORS = ("library", "serving", "mask-advance", "hf-jax", "hf-torch")


def test_ready_writes_a_row_per_front_door_and_times_only_the_steady_step(tmp_path):
    out = tmp_path / "ready.md"
    env = {k: v for k, v in os.environ.items() if k != "STATIC_COMPILER_NO_CACHE"}
    run = subprocess.run([sys.executable, "-m", "tools.bench", "ready", "--quick", "--states",
                          "cold,warm", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    text = out.read_text()
    assert text in run.stdout
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for door in DOORS:
        for state in ("cold", "warm"):
            assert any(line.startswith(f"| {door}") and f"| {state} |" in line
                       for line in rows), (door, state)
    assert "error" not in text
    assert "| front door | warm() | warm() s | mix xla after warm() |" in text
    # The steady rows time the steady step in both cache states: after the
    # first result (the timed calls compile and read nothing), with no
    # start-up thread beside them (the loader's numba import, which slowed
    # the warm-cache rows 2-9x), under the same XLA / JAX flags.
    numbers = {(r["door"], r["state"]): r for r in json.loads(out.with_suffix(".json").read_text())}
    for door in STEADY_DOORS:
        for state in ("cold", "warm"):
            check = numbers[door, state]["steady_check"]
            assert check == {"threads": [], "xla": 0, "reads": 0}, (door, state, check)
        if numbers[door, "cold"]["xla"]:  # (torch's door runs no jax program)
            assert numbers[door, "warm"]["reads"] > 0, door  # (warm did read the cache)
        assert numbers[door, "cold"]["flags"] == numbers[door, "warm"]["flags"], door


def test_ready_refuses_an_unknown_door(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tools.bench", "ready", "--doors", "nope",
                          "--out", str(tmp_path / "r.md")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "--doors" in run.stderr
    assert not (tmp_path / "r.md").exists()
