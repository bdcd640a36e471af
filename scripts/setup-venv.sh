#!/usr/bin/env bash
# Creates a virtual environment (once) and installs the project into it with
# the extras $VENV_EXTRAS, then puts it first on PATH. Sourced by main-job.sh
# (VENV_EXTRAS=jax: what the main job runs on) and test.sh (the default,
# jax,test,torch,hf,examples,distributed,lint: torch and hf for
# tests/integrations/test_integration_torch.py, distributed for the Dask test
# of tests/frontend/test_partitioned.py), so a fresh machine needs nothing
# else; test-newest.sh and test-torch-only.sh set VENV_DIR, VENV_PYTHON and
# VENV_EXTRAS first. The install stamp names pyproject.toml's hash and the
# extras installed: a later call asking for extras not yet installed (test.sh
# after main-job.sh) installs them; one asking for fewer installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_DIR:-$root/.venv}"
extras="${VENV_EXTRAS:-jax,test,torch,hf,examples,distributed,lint}"
hash="$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  "${VENV_PYTHON:-python3}" -m venv "$venv"
fi
# The extras already installed for this pyproject.toml (one stamp, or none).
installed=""
for stamp in "$venv"/.installed-"$hash"-*; do
  [ -f "$stamp" ] && installed="${stamp##*/.installed-"$hash"-}"
done
missing=""
for extra in ${extras//,/ }; do
  case ",$installed," in *",$extra,"*) ;; *) missing="$missing,$extra" ;; esac
done
if [ -n "$missing" ]; then
  # Install the union, so the stamp names everything this venv holds.
  want="$(printf '%s\n' ${installed//,/ } ${extras//,/ } | sort -u | paste -sd, -)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # The torch the tests run with (VENV_TORCH; here the CPU wheel), installed
  # first: the extras ask for a range (torch>=2.5), which keeps it.
  case ",$want," in
    *,torch,*|*,hf,*) "$venv/bin/python" -m pip install --quiet "${VENV_TORCH:-torch==2.13.0}" ;;
  esac
  # One editable install of this checkout at a time (.ci/run sets up several
  # venvs at once; each writes the checkout's egg-info).
  flock "${TMPDIR:-/tmp}/static-compiler-editable.lock" \
    "$venv/bin/python" -m pip install --quiet -e "$root[$want]"
  rm -f "$venv"/.installed-*
  touch "$venv/.installed-$hash-$want"
fi
export PATH="$venv/bin:$PATH"
