"""The torch benchmarks on a tiny set, run as the user runs them: a
subprocess from the repository root. `tools.bench.torch_generate` checks
that the constrained processors (dict trie, static jax, static torch)
return identical sequences, all members of the set, `tools.bench.torch_beam`
that the torch and jax beam searches return the same beams (each exits 1
otherwise); each prints one table row per processor or shape. Timings are
not asserted."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generate_benchmark_runs_and_agrees():
    out = subprocess.run([sys.executable, "-m", "tools.bench.torch_generate", "--items", "200",
                          "--length", "3", "--vocab", "64", "--shapes", "2x3", "--repeats", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("none", "trie", "jax", "torch"):
        assert f"| 2x3 | {name} |" in out.stdout, out.stdout


def test_beam_benchmark_runs_and_agrees():
    out = subprocess.run([sys.executable, "-m", "tools.bench.torch_beam", "--items", "200",
                          "--length", "3", "--vocab", "64", "--shapes", "2x3", "1x1",
                          "--repeats", "1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| 2x3 |" in out.stdout and "| 1x1 |" in out.stdout, out.stdout


def test_mask_benchmark_runs_and_agrees():
    """`python -m tools.bench.torch_mask` on a tiny set: it checks that both
    processors agree at every step (exit 1 otherwise) and prints its table."""
    out = subprocess.run([sys.executable, "-m", "tools.bench.torch_mask", "--items", "300",
                          "--length", "3", "--vocab", "16", "--rows", "4", "5", "--repeats", "1",
                          "--calls", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("| mean |") == 2
