"""tools/bench/vllm_engine.py (`python -m tools.bench vllm`): its harness's
own checks, which need no vLLM (membership, time limits, Semantic IDs, the
table), and a smoke run of the bench where vLLM is installed (the vLLM
environment; skipped in the main one). Both run as the user runs them, in a
subprocess: tests do not import tools/."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_harness_checks_pass_without_vllm():
    proc = subprocess.run([sys.executable, "-m", "tools.bench", "vllm", "--self-check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.count("ok    ") == 4 and "FAIL" not in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_bench_runs_tiny_on_the_engine(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", "vllm", "--names", "200", "--sids", "1000",
         "--backends", "xgrammar", "--prompts", "4", "--repeats", "1", "--work", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    table = (tmp_path / "vllm.md").read_text()
    for row in ("| names | 200 | static |", "| names | 200 | unconstrained |",
                "| names | 200 | xgrammar |", "| sids | 1e3 | static |"):
        assert row in table, table
    assert table.count(" members |") == 3 and "FAILED" not in table
