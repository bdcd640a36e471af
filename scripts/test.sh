#!/usr/bin/env bash
# The test command: sets up ./.venv if needed, then runs the test suite and
# prints its 25 slowest tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-venv.sh"
cd "$root"
exec python -m pytest -n 2 -q --durations=25 "$@"
