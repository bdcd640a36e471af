#!/usr/bin/env bash
# The newest environment we support, tested: Python 3.13 with the current jax
# and numpy (what pip resolves today: jax 0.12.x, numpy 2.x), in ./.venv-newest,
# created and installed once. It runs the tests of what depends on jax's
# version most (tests/artifact: export and the writers; tests/format: the
# format's window; tests/serving: the serving binary and artifacts across jax
# versions; tests/lifecycle: the versions kept; tests/backend: decoding;
# tests/items, tests/item_bits, tests/rules: live sets, their item bits and
# rules);
# without torch (PyPI has no CPU torch wheel for this Python: the torch
# tests run in the oldest environment, scripts/test.sh). CI runs it after
# scripts/test.sh (.ci/run), which creates its venv first, in the
# background, while scripts/test.sh runs (SETUP_ONLY=1: set up, run
# nothing). Arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-newest"
source "$root/scripts/find-python.sh"
python="$(find_python 3.13 scripts/test-newest.sh)"
VENV_DIR="$venv" VENV_PYTHON="$python" VENV_EXTRAS=jax,test source "$root/scripts/setup-venv.sh"
cd "$root"
python -c 'import sys, jax, numpy; print(f"newest environment: Python {sys.version.split()[0]}, jax {jax.__version__}, numpy {numpy.__version__}")'
[ -n "${SETUP_ONLY:-}" ] && exit 0
if [ "$#" -eq 0 ]; then
  set -- tests/artifact tests/format tests/serving tests/lifecycle tests/backend tests/items \
    tests/item_bits tests/rules
fi
exec python -m pytest -n 2 -q "$@"
