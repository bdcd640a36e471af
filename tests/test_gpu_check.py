"""tools/gpu_check (the CPU-saved, GPU-served cross-check) on this CPU: what
`prepare` records, `check` reproduces, and a wrong expectation fails it."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
from tools import gpu_check  # noqa: E402


def test_check_reproduces_prepare_and_fails_on_a_changed_expectation(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "SIZES", {"sids": 3000, "variable": 2000})
    monkeypatch.setattr(gpu_check, "BEAMS", 8)
    gpu_check.prepare(tmp_path)
    assert gpu_check.check(tmp_path, tmp_path / "report.json") == 0
    report = json.loads((tmp_path / "report.json").read_text())
    for entry in report["sets"].values():
        assert entry["torch_allowed_equal_cpu"]
        for row in entry["checks"]:
            assert row["beams_equal_cpu"] == row["beams"] == 16 and row["valid_not_in_set"] == 0
    expected = tmp_path / "sids.expected.npz"
    want = dict(np.load(expected))
    want["allowed"][0] = ~want["allowed"][0]
    np.savez_compressed(expected, **want)
    assert gpu_check.check(tmp_path, tmp_path / "report.json") == 1
