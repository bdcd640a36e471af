"""The import graph flows one way: errors -> core definitions -> IR ->
frontend -> passes -> backend -> artifact -> serving -> the public API, with
the applications (the CLI) on top. Every import statement of every module of
the package (those inside functions too) is parsed and checked against the
layer table below; a new module must be placed in it.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "static_compiler"

# Layers, lowest first. A module may import modules of its own layer or below.
# A key is a module or package path inside static_compiler ("live.liveness");
# a module takes the layer of the longest key its path starts with, so a
# stage's package may hold modules of several layers.
LAYERS = (
    ("errors",),
    ("support", "support.dtypes", "support.arrays", "support.arguments", "support.decode_types",
     "support.decode_state", "support.compile_events", "support.compilation_cache", "support.mapped",
     "support.processes", "artifact.format", "artifact.manifest", "artifact.names",
     "artifact.snapshot", "artifact.placement", "live", "live.layers",
     "live.bit_kernels", "live.layer_walk", "live.state_order", "live.item_masks", "live.liveness",
     "processes"),
    ("ir",),
    ("frontend", "live.subsets", "live.additions"),
    ("passes",),
    ("backend", "backend.lowering", "live.table_additions"),  # (writes lowered tables)
    ("artifact", "artifact.runtime", "artifact.warm", "artifact.serving"),
    ("compiled", "compiler", "saved", "report", "live.versions", "warm", ""),  # "" is the package's __init__ (the public API)
    ("torch_backend",),  # the tables as torch tensors; imports only numpy-only modules below
    ("integrations",),  # engines' own decoders (HF generate) on top of the public API
    ("cli",),
)
APPLICATIONS = {"cli"}

# Outside packages each library module may import (the standard library is always allowed).
THIRD_PARTY = {"jax", "jaxlib", "numpy", "numba", "networkx", "ml_dtypes", "tokenizers"}
RESTRICTED = {
    "errors": (set(), set()),
    "artifact.format": (set(), {"errors"}),
    "artifact.manifest": ({"numpy"}, {"errors", "artifact.format"}),
    "artifact.names": ({"numpy"}, {"errors", "artifact.format"}),
    "artifact.snapshot": ({"numpy"}, {"errors", "artifact.format", "artifact.manifest",
                                      "artifact.names", "support.mapped"}),
    "support.arguments": ({"numpy"}, {"errors"}),
    "support.decode_types": (set(), set()),
    "support.decode_state": ({"jax", "numpy"}, {"errors", "support.arguments", "support.decode_types"}),
    "support.compile_events": ({"jax"}, set()),  # jax's compile events, counted per front door
    "support.compilation_cache": ({"jax"}, {"errors"}),  # jax's persistent cache, on in one call
    "live.layers": ({"numpy"}, {"errors", "support.arrays", "support.mapped"}),
    # The static plan and lowering: numpy only, so the torch backend reads plans with it.
    "backend.lowering": ({"numpy"}, {"errors", "ir", "support.dtypes", "support.arrays", "live.layers"}),
    "support.arrays": ({"numpy"}, set()),
    "live.bit_kernels": ({"numba", "numpy"}, set()),  # compiled host kernels over packed bits
    "live.layer_walk": ({"numpy"}, {"support.arrays", "live.layers", "live.bit_kernels"}),
    "live.state_order": ({"numpy"}, {"live.layer_walk", "live.bit_kernels", "support.mapped"}),
    "live.item_masks": ({"numpy"}, {"errors", "live.layer_walk", "live.bit_kernels",
                                    "support.mapped"}),
    "live.liveness": ({"numpy"}, {"errors", "live.layers", "live.layer_walk", "live.bit_kernels",
                                  "live.state_order", "live.item_masks", "support.mapped"}),
    "support.mapped": ({"numpy"}, set()),
    "artifact.placement": ({"jax", "numpy"}, {"errors"}),
    # The serving loader: no compiler module (no frontend, passes, backend or writer).
    "artifact.runtime": ({"jax", "numpy"}, {"errors", "support.compile_events", "artifact.format", "artifact.manifest",
                                            "artifact.snapshot", "artifact.placement",
                                            "live.liveness"}),
    "artifact.warm": ({"jax", "numpy"}, {"errors", "support.compile_events", "support.decode_state", "support.decode_types",
                                         "live.liveness"}),  # Artifact.warm, its padding
    "artifact.serving": ({"jax", "numpy"}, {"errors", "support.compile_events", "artifact.format", "artifact.manifest",
                                            "artifact.names", "artifact.snapshot",
                                            "artifact.placement", "artifact.runtime", "artifact.warm",
                                            "support.decode_state", "support.decode_types", "live.layers",
                                            "live.liveness"}),
    "integrations": (THIRD_PARTY | {"torch", "transformers"}, None),
    # The PyTorch backend: no jax, no compiler module (the compiled set is read lazily).
    "torch_backend": ({"numpy", "torch"}, {"errors", "artifact.format", "artifact.manifest",
                                           "artifact.snapshot", "live.layers", "live.liveness",
                                           "support.arguments", "support.decode_types", "backend.lowering",
                                           "torch_backend",
                                           "compiled"}),
}
"""module -> (third-party packages, modules of ours) it may import; most are
the modules a serving binary ships, so they stay small; the integrations may
also import the engines they plug into."""


KEYS = {key for members in LAYERS for key in members}


def _top(name: str) -> str:
    """The layer key of a module name inside static_compiler ('' for the
    package): the longest key of LAYERS that is the module's path or a
    package above it, else the first part of its path."""
    parts = name.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in KEYS:
            return ".".join(parts[:n])
    return parts[0] if parts else ""


def _rank(key: str) -> int:
    for rank, members in enumerate(LAYERS):
        if key in members:
            return rank
    raise AssertionError(f"module static_compiler.{key} is in no layer of tests/test_layering.py; "
                         "place it in LAYERS")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _imports(name: str, path: pathlib.Path):
    """(imported module name, line) for every import in the file; relative
    imports are resolved against `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "static_compiler" or (node.level and not node.module):
                # `from static_compiler.artifact import x`: a module, or a name of the package
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    yield (sub if _is_module(sub) else module), node.lineno
            else:
                yield module, node.lineno


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = list(_modules())


def test_every_module_is_placed_in_a_layer():
    for name, _ in MODULES:
        _rank(_top(name))


@pytest.mark.parametrize("name, path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_flow_one_way(name, path):
    key = _top(name)
    rank = _rank(key)
    allowed_third, allowed_ours = RESTRICTED.get(key, (THIRD_PARTY, None))
    bad = []
    for module, line in _imports(name, path):
        root = module.split(".")[0]
        where = f"{path.relative_to(REPO)}:{line} imports {module}"
        if root == "static_compiler":
            target = _top(module)
            if target == key:
                continue
            if target in APPLICATIONS and key not in APPLICATIONS:
                bad.append(f"{where}: the library never imports the applications")
            elif allowed_ours is not None and target not in allowed_ours:
                bad.append(f"{where}: {key} may import only {sorted(allowed_ours)} of ours")
            elif _rank(target) > rank:
                bad.append(f"{where}: layer {rank} ({key}) imports layer {_rank(target)} "
                           f"({target}); imports go down the layers only")
        elif root in ("tools", "tests", "passes"):
            bad.append(f"{where}: the package never imports {root}/")
        elif root not in sys.stdlib_module_names and root != "__future__":
            if root not in allowed_third:
                bad.append(f"{where}: {key} may import only the standard library and "
                           f"{sorted(allowed_third)}")
    assert not bad, "\n".join(bad)


def test_the_layer_test_sees_a_violation(tmp_path):
    """The checker itself: a low module importing a high one is reported."""
    fake = tmp_path / "ir.py"
    fake.write_text("from static_compiler import compiler\nimport jax\n")
    found = list(_imports("static_compiler.ir", fake))
    assert ("static_compiler.compiler", 1) in found and ("jax", 2) in found
    assert _rank(_top("static_compiler.compiler")) > _rank(_top("static_compiler.ir"))


@pytest.mark.parametrize("module", ["static_compiler.ir", "static_compiler.errors",
                                    "static_compiler.frontend", "static_compiler.artifact.format",
                                    "static_compiler.artifact.snapshot"])
def test_the_compiler_core_loads_no_jax(module):
    code = f"import {module}, sys; assert 'jax' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_tests_do_not_import_tools():
    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for module, line in _imports(f"tests.{path.stem}", path):
            if module.split(".")[0] == "tools":
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)
