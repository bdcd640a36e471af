#!/usr/bin/env bash
# Creates ./.venv (once) and installs the project with its test, torch, examples
# and distributed extras into it (torch: tests/integrations/test_integration_torch.py;
# distributed: the Dask test of tests/frontend/test_partitioned.py).
# Sourced by main-job.sh and test.sh, so a fresh machine needs nothing else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.installed-$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e "$root[test,torch,examples,distributed]"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
