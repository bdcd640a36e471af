"""`python -m tools.update_goldens --check` (tools/update_goldens.py): the
regeneration command agrees with tests/passes/test_goldens.py, which renders the
same dumps, so a test failure and its fix point at the same files."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_update_check_mode_reports_no_difference():
    out = subprocess.run([sys.executable, "-m", "tools.update_goldens", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, ""), out.stdout + out.stderr
