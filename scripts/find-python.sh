#!/usr/bin/env bash
# Sourced by the test scripts that need one Python version: `find_python
# 3.13 scripts/test-newest.sh` prints the path of a Python of that version
# (pythonX.Y on PATH, else pyenv's), or says so naming the caller and fails.
find_python() {
  local version="$1" caller="$2" candidate
  for candidate in "python$version" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/python"$version"; do
    if "$candidate" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$version'.split('.')))" 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "$caller: no Python $version found (python$version on PATH, or pyenv's)" >&2
  return 1
}
