#!/usr/bin/env bash
# PyTorch without JAX, tested where pip brought no jax: the documented torch
# install (`pip install '.[torch]'`, here with the test tools) in
# ./.venv-torch (Python 3.11, created and installed once), checked to hold no
# jax, then the torch path's end-to-end test: compile 1e5 items, save (tables
# only), remove 1e3, take a subset, beam search with torch
# (tests/torch_backend/test_torch_without_jax.py; its jax half skips here).
# CI runs it after scripts/test.sh (.ci/run), its venv created in the
# background while scripts/test.sh runs (SETUP_ONLY=1: set up and check,
# run no test). Arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="$root/.venv-torch" VENV_EXTRAS=torch,test source "$root/scripts/setup-venv.sh"
cd "$root"
python - <<'PY'
import importlib.util, sys
found = [name for name in ("jax", "jaxlib") if importlib.util.find_spec(name) is not None]
if found:
    sys.exit(f"scripts/test-torch-only.sh: {found} installed in the torch-only environment")
import numpy, torch
print(f"torch-only environment: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"numpy {numpy.__version__}, no jax")
PY
[ -n "${SETUP_ONLY:-}" ] && exit 0
exec python -m pytest -q -p no:cacheprovider tests/torch_backend/test_torch_without_jax.py "$@"
