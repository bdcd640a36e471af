#!/usr/bin/env bash
# The package as a user installs it. Builds the wheel and the sdist
# (`python -m build`) into a temporary folder and checks that they hold the
# package alone (static_compiler/, LICENSE, README, metadata; no tests/,
# tools/, scripts/), then, each in a fresh venv and from a folder outside the
# checkout (so that the installed package is the one imported):
#   (a) installs the wheel with [jax] and runs examples/quickstart.py;
#   (b) installs torch first, as a model's environment already has it
#       (TEST_WHEEL_TORCH, default torch==2.13.0), then the wheel with
#       [torch]: pip must keep that torch, and no jax comes with it; runs
#       examples/quickstart_torch.py; then adds [hf] (torch kept again) and
#       runs the Hugging Face processor once on the set.
# pip's cache is reused; nothing is fetched but from pip's configured
# indexes. CI runs it after the test suites (.ci/run). VENV_PYTHON picks the
# Python (default python3). Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${VENV_PYTHON:-python3}"
torch_spec="${TEST_WHEEL_TORCH:-torch==2.13.0}"
work="$(mktemp -d "${TMPDIR:-/tmp}/static-compiler-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH  # (the checkout must not shadow the installed package)
pip_install() { "$1/bin/python" -m pip install --quiet --disable-pip-version-check "${@:2}"; }
step() { echo "test-wheel: [${SECONDS} s] $*"; }

# The wheel and the sdist, and what they hold
"$python" -m venv "$work/build-env"
pip_install "$work/build-env" build
if ! "$work/build-env/bin/python" -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  exit 1
fi
"$work/build-env/bin/python" - "$work/dist" <<'PY'
import pathlib, re, sys, tarfile, zipfile
dist = pathlib.Path(sys.argv[1])
(wheel,), (sdist,) = dist.glob("static_compiler-*.whl"), dist.glob("static_compiler-*.tar.gz")
version = wheel.name.split("-")[1]
meta = f"static_compiler-{version}.dist-info/"
names = zipfile.ZipFile(wheel).namelist()
odd = [n for n in names if not (n.startswith("static_compiler/") and n.endswith(".py")
                                or n.startswith(meta))]
missing = [n for n in (f"{meta}licenses/LICENSE", f"{meta}METADATA", "static_compiler/__init__.py")
           if n not in names]
top = f"static_compiler-{version}/"
kept = re.compile(rf"{re.escape(top[:-1])}(/((static_compiler|static_compiler\.egg-info)(/.*)?"
                  r"|LICENSE|README\.md|pyproject\.toml|setup\.cfg|PKG-INFO))?")
with tarfile.open(sdist) as tar:
    members = {m.name: m.isfile() for m in tar.getmembers()}
odd += [n for n, is_file in members.items() if not kept.fullmatch(n)
        or is_file and "/static_compiler/" in n and not n.endswith(".py")]
missing += [n for n in (f"{top}LICENSE", f"{top}README.md", f"{top}static_compiler/__init__.py")
            if n not in members]
if odd or missing:
    sys.exit(f"test-wheel: {wheel.name} / {sdist.name}: unexpected {odd[:20]}, missing {missing}")
print(f"test-wheel: built {wheel.name} ({len(names)} files) and {sdist.name} "
      f"({len(members)} entries): the package, LICENSE, README and metadata only")
PY
wheel="$(ls "$work"/dist/static_compiler-*.whl)"

# Prints where static_compiler is imported from and fails unless it is the venv's.
installed_check='import static_compiler, sys
print(f"test-wheel: static_compiler {static_compiler.__version__} from {static_compiler.__file__}")
assert static_compiler.__file__.startswith(sys.prefix), "not the installed package"'

# (a) [jax]: examples/quickstart.py
step "(a) a fresh venv, pip install '$(basename "$wheel")[jax]'"
"$python" -m venv "$work/jax-env"
pip_install "$work/jax-env" "$wheel[jax]"
mkdir "$work/run-jax"
cp "$root/examples/quickstart.py" "$work/run-jax/"
(cd "$work/run-jax" && "$work/jax-env/bin/python" -c "$installed_check" \
  && "$work/jax-env/bin/python" quickstart.py)

# (b) torch first, then [torch] and [hf]: pip keeps that torch
step "(b) a fresh venv with $torch_spec, then pip install '$(basename "$wheel")[torch]'"
"$python" -m venv "$work/torch-env"
pip_install "$work/torch-env" "$torch_spec"
torch_version() { "$work/torch-env/bin/python" -m pip show torch | sed -n 's/^Version: //p'; }
before="$(torch_version)"
pip_install "$work/torch-env" "$wheel[torch]"
after="$(torch_version)"
if [ "$before" != "$after" ]; then
  echo "test-wheel: installing [torch] replaced torch $before with $after" >&2
  exit 1
fi
step "pip kept torch $after"
mkdir "$work/run-torch"
cp "$root/examples/quickstart_torch.py" "$work/run-torch/"
(cd "$work/run-torch" && "$work/torch-env/bin/python" -c "$installed_check
import importlib.util
assert importlib.util.find_spec('jax') is None, 'the [torch] install brought jax'" \
  && "$work/torch-env/bin/python" quickstart_torch.py)

step "(b) then pip install '$(basename "$wheel")[hf]'"
pip_install "$work/torch-env" "$wheel[hf]"
after="$(torch_version)"
if [ "$before" != "$after" ]; then
  echo "test-wheel: installing [hf] replaced torch $before with $after" >&2
  exit 1
fi
(cd "$work/run-torch" && "$work/torch-env/bin/python" - <<'PY'
import numpy as np, torch, transformers
import static_compiler as sc
from static_compiler.integrations.torch import StaticLogitsProcessor
compiled = sc.compile_constraints(np.array([[1, 2], [1, 3], [4, 5]]), vocab_size=8)
processor = StaticLogitsProcessor(compiled, prompt_length=1)  # generate's logits processor
scores = processor(torch.tensor([[0, 1], [0, 4]]), torch.zeros(2, 10))  # after tokens 1 / 4
allowed = [torch.nonzero(torch.isfinite(row)).flatten().tolist() for row in scores]
assert allowed == [[2, 3], [5]], allowed
print(f"test-wheel: transformers {transformers.__version__}: StaticLogitsProcessor allows {allowed}")
PY
)
step "pip kept torch $after; the wheel installs and runs with [jax], [torch] and [hf]"
