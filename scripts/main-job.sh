#!/usr/bin/env bash
# The README's main job: on a fresh machine, set up ./.venv with the `jax`
# extra only (what the job runs on; scripts/test.sh adds the rest), then compile the
# built-in default set (1e6 synthetic Semantic IDs, L = 8, V = 2048), save it,
# serve it in a fresh process with the serving loader only, decode with a demo
# model, check every output is in the set, and print a report.
# Options go to `static-compiler demo` (--dataset, --num-items, --artifact, ...).
# The serving process uses jax's persistent compilation cache (under
# ${XDG_CACHE_HOME:-~/.cache}/static-compiler/, or $STATIC_COMPILER_CACHE_DIR), so
# a second run reads its XLA programs instead of compiling them;
# --no-compilation-cache or STATIC_COMPILER_NO_CACHE=1 turn it off.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_EXTRAS=jax source "$root/scripts/setup-venv.sh"
cd "$root"
exec python -m static_compiler.cli demo "$@"
