"""The import graph flows one way, one layer per folder, lowest first: the
serving binary's folders (errors -> support -> items -> IR -> the lowered
plan and tables -> item bits -> the host kernels -> rules -> decoding -> the artifact's format ->
the jax utilities -> serving), then the compiler's (frontend -> passes ->
target -> the items' compiler side -> backend -> the artifact's writer),
the torch backend, the public API, with the integrations and the
applications (the CLI) on top. Every import statement of every module of
the package (those inside functions too) is parsed and checked against the
layer table below: its folders below it, and the outside packages its line
names; a new folder must be placed in it.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
from helpers import REPO

PACKAGE = REPO / "static_compiler"

# Outside packages the library may import (the standard library is always allowed).
THIRD_PARTY = {"jax", "jaxlib", "numpy", "numba", "networkx", "ml_dtypes", "tokenizers"}
ROOT = ("", "compiled", "records", "compiler", "contract", "decode_calls", "saved", "report", "warm",
        "lifecycle")
"""The public API: the package's root, and the lifecycle of a compiled set and
its artifact (updates, upgrades, re-export, versions, rollback) beside it."""

# Layers, lowest first: one line per folder (MLIR's tree: the folders are the layers), with the
# outside packages its modules may import. A module may import modules of its own folder or of a
# folder below; the folders up to `serving` are the serving binary (no compiler module).
LAYERS = (
    (("errors",), set()),
    (("support",), {"numpy"}),  # numpy/stdlib utilities every layer imports (dtypes, arrays, checks)
    (("items",), {"numpy"}),  # what a set's items are: the item index, names, attribute columns (data)
    (("ir",), {"numpy"}),  # the automaton IR, its verifier, printer and parser
    (("lowered",), {"numpy"}),  # the plan and the table format every backend reads
    (("item_bits",), {"numpy", "numba"}),  # the items' liveness bits (numba: bit_kernels, optional)
    (("host_kernels",), {"numpy", "numba"}),  # the processor pair as compiled host loops (optional)
    (("rules",), {"numpy"}),  # filters, priors and the set view that applies them (they read item bits)
    (("decoding",), {"numpy"}),  # the verb family written once over an engine, and the one warm-up
    (("format",), {"numpy"}),  # the artifact on disk: file names, versions, manifest, snapshot
    (("jax_support",), {"jax", "numpy"}),  # the two JAX doors' utilities: compile events, placement, ...
    (("serving",), {"jax", "numpy"}),  # the serving binary: loader, engine, runtime, warm-up
    (("frontend",), {"numpy", "networkx", "tokenizers"}),  # inputs -> IR (and the items' data)
    (("passes",), {"numpy"}),
    (("target",), {"numpy"}),  # lowering IR -> (plan, tables), raising tables -> IR
    (("compiler_items",), {"numpy"}),  # item subsets and additions over the compiled automaton
    (("backend",), {"jax", "numpy"}),  # JAX kernels and decoding
    (("artifact",), {"jax", "numpy"}),  # the writer side: export, metadata, lock, writer, read back
    (("torch_backend",), {"numpy", "torch"}),  # the same plan and set view in torch ops
    (ROOT, THIRD_PARTY),
    (("integrations",), THIRD_PARTY | {"torch", "transformers", "vllm"}),  # engines' own (HF generate, vLLM)
    (("cli",), THIRD_PARTY),
)
APPLICATIONS = {"cli"}

KNOWN_UPWARD = {
    # importer -> imported: edges against LAYERS still to be removed, each with its reason
    # (none today: a new one needs its reason here and a plan to remove it).
}
"""(importer, imported) module keys allowed to point up the layers for now."""

SERVING_BINARY = {key for folders, _ in LAYERS[:[f for f, _ in LAYERS].index(("serving",)) + 1]
                  for key in folders}
"""The folders a serving binary loads: `serving` and every folder below it."""
TORCH_ONLY = SERVING_BINARY - {"jax_support", "serving"} | {"torch_backend"}
"""The folders a torch-only process loads: the serving binary's but jax's."""
RESTRICTED = {
    # the verb family's Protocols, imported by every door: the standard library and the types they name
    "contract": (set(), {"support", "item_bits"}),
    # a set's and an artifact's next versions: no decoder, no door (the compiled set imports them)
    "lifecycle": (None, {"errors", "support", "jax_support", "items", "passes", "target",
                         "compiler_items", "format", "artifact", "saved"}),
    # torch without jax: no jax utility, no serving binary, no compiler module
    "torch_backend": (None, TORCH_ONLY),
}
"""The exceptions: module or folder -> (outside packages, or None for its
layer's; folders or modules of ours) it may import, fewer than its layer
allows."""


KEYS = {key for folders, _ in LAYERS for key in folders}


def _key(name: str, keys) -> str:
    """The longest of `keys` that is the path of module `name` inside
    static_compiler or a package above it ('' for the package itself)."""
    parts = name.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in keys:
            return ".".join(parts[:n])
    return parts[0] if parts else ""


def _top(name: str) -> str:
    """The layer key of a module name inside static_compiler: its package,
    or the module itself at the package's root ('' for the package)."""
    return _key(name, KEYS)


def _path(name: str) -> str:
    """A module name's path inside static_compiler ("item_bits.liveness")."""
    return name.partition(".")[2]


def _within(path: str, allowed) -> bool:
    """Whether module `path` is one of `allowed` or inside a package of it."""
    return any(path == a or path.startswith(a + ".") for a in allowed)


def _rank(key: str) -> int:
    for rank, (folders, _) in enumerate(LAYERS):
        if key in folders:
            return rank
    raise AssertionError(f"module static_compiler.{key} is in no layer of tests/repository/test_layering.py; "
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
    key, mine = _top(name), _path(name)
    rank = _rank(key)
    restricted = _key(name, RESTRICTED)
    allowed_third, allowed_ours = RESTRICTED.get(restricted, (None, None))
    if allowed_third is None:
        allowed_third = LAYERS[rank][1]
    bad = []
    for module, line in _imports(name, path):
        root = module.split(".")[0]
        where = f"{path.relative_to(REPO)}:{line} imports {module}"
        if root == "static_compiler":
            target, theirs = _top(module), _path(module)
            if target in APPLICATIONS and key not in APPLICATIONS:
                bad.append(f"{where}: the library never imports the applications")
            elif allowed_ours is not None and not _within(theirs, allowed_ours) \
                    and _key(module, RESTRICTED) != restricted:
                bad.append(f"{where}: {restricted} may import only {sorted(allowed_ours)} of ours")
            elif target != key and _rank(target) > rank and \
                    (mine, theirs) not in KNOWN_UPWARD:
                bad.append(f"{where}: layer {rank} ({key or 'the root'}) imports layer "
                           f"{_rank(target)} ({target or 'the root'}); imports go down the "
                           "layers only")
        elif root in ("tools", "tests", "passes"):
            bad.append(f"{where}: the package never imports {root}/")
        elif root not in sys.stdlib_module_names and root != "__future__":
            if root not in allowed_third:
                bad.append(f"{where}: {restricted or 'the root'} may import only the standard "
                           f"library and {sorted(allowed_third)}")
    assert not bad, "\n".join(bad)


def test_known_upward_edges_still_exist():
    """Each exception of KNOWN_UPWARD is an import that still exists (a
    removed one leaves the table)."""
    edges = {(_path(name), _path(module)) for name, path in MODULES
             for module, _ in _imports(name, path)}
    assert not set(KNOWN_UPWARD) - edges, sorted(set(KNOWN_UPWARD) - edges)


def _reached(start: str) -> set:
    """The paths of every module of ours `start` may load: its imports
    (inside functions too), followed through every module they reach, with
    the packages above each."""
    files = dict(MODULES)
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        for module, _ in _imports(name, files[name]):
            parts = module.split(".")
            if parts[0] == "static_compiler":
                todo.extend(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return {_path(name) for name in seen}


def _outside(reached: set, folders: set) -> list:
    """The modules of `reached` in none of `folders` (the package's root,
    above every folder, aside)."""
    return sorted(path for path in reached if path and not _within(path, folders))


def test_the_serving_binary_reaches_no_compiler_module():
    """The serving loader's boundary, followed through every module it may
    load (a deferred import too): the folders up to `serving` in LAYERS
    (the format, the item folders, the plan and table format, the IR types,
    the verbs and the utilities); no frontend module, pass, lowering,
    backend, writer, export or lifecycle module, nor the items' compiler
    side."""
    reached = _reached("static_compiler.serving")
    assert _outside(reached, SERVING_BINARY) == [], "the serving binary may load these"
    assert {"items.index", "item_bits.liveness", "rules.set_view", "rules.where", "lowered.plan",
            "jax_support.warmth"} <= reached
    assert SERVING_BINARY.isdisjoint({"frontend", "passes", "target", "compiler_items", "backend",
                                      "artifact", "lifecycle"})
    # the walk follows deferred imports: the items' compiler side reaches the frontend
    assert "frontend.sequences" in _reached("static_compiler.compiler_items.subsets")
    assert _outside(_reached("static_compiler.compiler_items.subsets"), SERVING_BINARY)


def test_a_torch_only_process_reaches_no_jax_module():
    """The torch backend's boundary, followed the same way: the serving
    binary's folders but the jax utilities and the serving binary itself."""
    reached = _reached("static_compiler.torch_backend")
    assert _outside(reached, TORCH_ONLY) == [], "a torch-only process may load these"
    assert {"torch_backend.engine", "decoding.warm_up", "rules.set_view", "format.snapshot"} <= reached
    assert "jax_support" not in TORCH_ONLY and "serving" not in TORCH_ONLY


def test_the_layer_test_sees_a_violation(tmp_path):
    """The checker itself: a low module importing a high one is reported."""
    fake = tmp_path / "ir.py"
    fake.write_text("from static_compiler import compiler\nimport jax\n")
    found = list(_imports("static_compiler.ir", fake))
    assert ("static_compiler.compiler", 1) in found and ("jax", 2) in found
    assert _rank(_top("static_compiler.compiler")) > _rank(_top("static_compiler.ir"))


@pytest.mark.parametrize("module", ["static_compiler.ir", "static_compiler.errors",
                                    "static_compiler.frontend", "static_compiler.target",
                                    "static_compiler.format.spec",
                                    "static_compiler.format.snapshot"])
def test_the_compiler_core_loads_no_jax(module):
    code = f"import {module}, sys; assert 'jax' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module, absent", [
    ("static_compiler.contract", ("numpy", "jax", "torch")),
    ("static_compiler.decoding.warm_up", ("jax", "torch")),
])
def test_the_contract_and_the_warm_up_planner_load_no_engine(module, absent):
    """Importable by a serving binary and a torch-only process alike."""
    code = (f"import {module}, sys; bad = [m for m in {absent!r} if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_tests_do_not_import_tools():
    """The library's tests (every folder of tests/) and the tools' own tests
    (tools/tests/) run the tools as the user does, in a subprocess."""
    offenders = []
    paths = [*(REPO / "tests").rglob("*.py"), *(REPO / "tools" / "tests").rglob("*.py")]
    assert len(paths) > 60 and any(p.parts[-3] == "tools" for p in paths)  # both trees seen
    for path in sorted(paths):
        for module, line in _imports(f"tests.{path.stem}", path):
            if module.split(".")[0] == "tools":
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)
