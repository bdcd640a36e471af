"""The README's Quick start is examples/quickstart.py, and what the README
shows below it is what the file prints.

The README's block is fenced ```python no-run: examples/quickstart.py ...
(tests/repository/test_docs.py leaves it to this module) and must be the
file, byte for byte; the ```text block after it must be the file's stdout
when run as a user runs it (`python examples/quickstart.py`, outside the
checkout, no XLA flags). The file imports only jax, numpy and the package,
so the wheel check runs it from an installed wheel.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from helpers import REPO

README = REPO / "README.md"
EXAMPLE = REPO / "examples" / "quickstart.py"
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
ALLOWED_IMPORTS = {"jax", "numpy", "static_compiler"}


def readme_blocks() -> tuple:
    """(code, output): the README's python block that names the example
    file, and the first text block after it."""
    fences = list(FENCE.finditer(README.read_text()))
    at = [i for i, m in enumerate(fences)
          if m.group("info").startswith("python") and "examples/quickstart.py" in m.group("info")]
    assert len(at) == 1, ("README.md: expected one ```python no-run: examples/quickstart.py ... "
                          f"block, found {len(at)}")
    after = [m for m in fences[at[0] + 1:] if m.group("info").strip() == "text"]
    assert after, "README.md: no ```text block (the Quick start's output) after its code"
    return fences[at[0]].group("body"), after[0].group("body")


def test_readme_quick_start_is_the_example_file():
    code, _output = readme_blocks()
    assert code == EXAMPLE.read_text(), (
        "README.md's Quick start differs from examples/quickstart.py: paste the file into it")


def test_the_example_imports_only_jax_numpy_and_the_package():
    """The wheel check runs it where only the `jax` extra is installed."""
    tree = ast.parse(EXAMPLE.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom)}
    assert names <= ALLOWED_IMPORTS, sorted(names - ALLOWED_IMPORTS)


def test_quick_start_prints_what_the_readme_shows(tmp_path):
    _code, shown = readme_blocks()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1")
    env.pop("XLA_FLAGS", None)              # as a user runs it
    proc = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-8000:]
    assert proc.stdout == shown, (
        "README.md's Quick start output is not what examples/quickstart.py prints now; "
        f"paste its output:\n{proc.stdout}")
    assert "paper bound U_max" in shown and shown.count("\nbeam [") == 3  # table, top beams
