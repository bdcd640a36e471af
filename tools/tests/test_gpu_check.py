"""`python -m tools.gpu_check` (artifacts saved on a CPU, served on a GPU)
run here on the CPU at small sizes: `check` reproduces what `prepare`
recorded, and a changed expectation fails it."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.gpu_check", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_check_reproduces_prepare_and_fails_on_a_changed_expectation(tmp_path):
    done = _run("prepare", tmp_path, "--sids", 3000, "--variable", 2000, "--beams", 8)
    assert done.returncode == 0, done.stderr
    report = tmp_path / "report.json"
    done = _run("check", tmp_path, report)
    assert done.returncode == 0, done.stdout + done.stderr
    for entry in json.loads(report.read_text())["sets"].values():
        assert entry["torch_allowed_equal_cpu"]
        for row in entry["checks"]:
            assert row["beams_equal_cpu"] == row["beams"] == 16 and row["valid_not_in_set"] == 0
    expected = tmp_path / "sids.expected.npz"
    want = dict(np.load(expected))
    want["allowed"][0] = ~want["allowed"][0]
    np.savez_compressed(expected, **want)
    assert _run("check", tmp_path, report).returncode == 1
    assert not json.loads(report.read_text())["sets"]["sids"]["torch_allowed_equal_cpu"]
