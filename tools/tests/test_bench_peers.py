"""tools/bench/peers.py: its checks of the work it generates
(`python -m tools.bench.peers_check`), and a tiny run of the bench (peers
that are not installed are reported as skipped). Both run as the user runs
them, in a subprocess: tests do not import tools/."""

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_benchs_own_checks_of_its_names_and_near_misses_pass():
    proc = subprocess.run([sys.executable, "-m", "tools.bench.peers_check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.count("ok    check_") == 5


def test_bench_runs_tiny(tmp_path):
    out = tmp_path / "peers.md"
    proc = subprocess.run(
        # 2 rows and 2 timed steps: each step of a walk is a program of ours to compile
        [sys.executable, "-m", "tools.bench", "peers", "--items", "200", "--vocab", "2000",
         "--repeats", "1", "--checks", "50", "--rows", "2", "--walk-steps", "2",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert text in proc.stdout
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| engine")}
    static = [c.strip() for c in rows["static"].split("|")]
    assert static[10] == "yes" and static[11] == "no"     # exact; holds the canonical spelling only
    every = [c.strip() for c in rows["static-any"].split("|")]
    assert every[10] == "yes" and every[11] == "yes"      # spellings="any": every tokenization
    for engine, module in (("xgrammar", "xgrammar"), ("llguidance", "llguidance"),
                           ("outlines-core", "outlines_core")):
        if importlib.util.find_spec(module) is None:
            assert "skipped (not installed)" in rows[engine]
            assert f"{engine}: skipped" in text
        else:
            assert "| 200 |" in rows[engine]
