#!/usr/bin/env bash
# Lint (ruff: pyflakes, pycodestyle errors, import order, unused arguments)
# and the type check of the public API (mypy; the modules are listed in
# pyproject.toml's [tool.mypy]). Sets up ./.venv like the test command.
# CI runs it after the tests (.ci/run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-venv.sh"
cd "$root"
ruff --version
ruff check static_compiler tests tools examples
mypy --version
mypy
