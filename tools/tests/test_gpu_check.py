"""`python -m tools.gpu_check` (artifacts saved on a CPU, served on a GPU)
run here on the CPU at small sizes: `check` reproduces what `prepare`
recorded, and a changed expectation fails it."""

import importlib.util
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


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="prepare compiles with jax (the vLLM venv has none)")
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


def _vllm_on_cuda() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch
    return torch.cuda.is_available()


@pytest.mark.skipif(_vllm_on_cuda(), reason="vllm and CUDA are here: the path runs, not skips")
def test_vllm_path_skips_without_vllm_or_cuda(tmp_path):
    done = _run("vllm", tmp_path / "vllm.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_check vllm: skipped: ")
    reason = "sees no CUDA device" if importlib.util.find_spec("vllm") else \
        "vllm is not importable here"
    assert reason in done.stdout and not (tmp_path / "vllm.json").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_path_runs_on_the_cpu_engine(tmp_path):
    """The same path with --cpu on vLLM's CPU engine: opted-in greedy and
    sampled outputs are names, the untouched requests ran."""
    done = _run("vllm", tmp_path / "vllm.json", "--names", 500, "--cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "vllm.json").read_text())
    assert report["ok"] and report["opted_in"] == report["members"] == 16
    assert [r["kind"] for r in report["rows"]].count("untouched") == 4
