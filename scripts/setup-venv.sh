#!/usr/bin/env bash
# Creates a virtual environment (once) and installs the project into it, then
# puts it first on PATH. Sourced by main-job.sh and test.sh (./.venv, the
# python3 on PATH, extras jax,test,torch,hf,examples,distributed: torch and hf for
# tests/integrations/test_integration_torch.py, distributed for the Dask test
# of tests/frontend/test_partitioned.py), so a fresh machine needs nothing
# else; test-newest.sh sets VENV_DIR, VENV_PYTHON and VENV_EXTRAS first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_DIR:-$root/.venv}"
stamp="$venv/.installed-$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  "${VENV_PYTHON:-python3}" -m venv "$venv"
fi
venv_extras="${VENV_EXTRAS:-jax,test,torch,hf,examples,distributed}"
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # The torch the tests run with (VENV_TORCH; here the CPU wheel), installed
  # first: the extras ask for a range (torch>=2.5), which keeps it.
  case ",$venv_extras," in
    *,torch,*|*,hf,*) "$venv/bin/python" -m pip install --quiet "${VENV_TORCH:-torch==2.13.0}" ;;
  esac
  "$venv/bin/python" -m pip install --quiet -e "$root[$venv_extras]"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
