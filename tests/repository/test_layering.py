"""The import graph flows one way, one layer per package: errors -> support
-> items -> IR -> frontend -> passes -> target -> item bits -> rules ->
decoding -> backend -> the artifact's format -> the serving binary -> the
artifact's writer -> torch backend -> the public API, with the integrations and the applications (the
CLI) on top. Every import statement of every module of
the package (those inside functions too) is parsed and checked against the
layer table below; a new module must be placed in it.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
from helpers import REPO

PACKAGE = REPO / "static_compiler"

# Layers, lowest first: one line per package (MLIR's tree: the folders are the
# layers). A module may import modules of its own package or of a package below.
LAYERS = (
    ("errors",),
    ("support",),  # numpy/stdlib utilities every layer imports (dtypes, arrays, mapped files)
    ("items",),  # what a set's items are: the item index, names, attribute columns (data)
    ("ir",),
    ("frontend",),  # inputs -> IR (and the items' data)
    ("passes",),
    ("target",),  # plan types, lowering IR -> tables, raising tables -> IR (numpy only)
    ("item_bits",),  # the items' liveness bits over a trie's layers, additions
    ("rules",),  # filters, priors and the set view that applies them (they read item bits)
    ("decoding",),  # the verb family written once over an engine (numpy only)
    ("backend",),  # JAX kernels and decoding
    ("format",),  # the artifact on disk: file names, versions, manifest, snapshot (no jax)
    ("serving",),  # the serving binary: loader, modules and tables on the device, warm-up (no compiler)
    ("artifact",),  # the writer side: export, metadata, lock, writer (and its version history), read back
    ("torch_backend",),  # the same plan and set view in torch ops
    # the public API: the package's root, and the lifecycle of a compiled set and its artifact
    # (updates, upgrades, re-export, versions, rollback) beside it
    ("", "compiled", "computed", "compiler", "contract", "decode_calls", "saved", "report", "warm",
     "lifecycle"),
    ("integrations",),  # engines' own decoders (HF generate, vLLM) on top of the public API
    ("cli",),
)
APPLICATIONS = {"cli"}

KNOWN_UPWARD = {
    # importer -> imported: edges against LAYERS still to be removed, each with its reason
    # (none today: a new one needs its reason here and a plan to remove it).
}
"""(importer, imported) module keys allowed to point up the layers for now."""

# Outside packages each library module may import (the standard library is always allowed).
THIRD_PARTY = {"jax", "jaxlib", "numpy", "numba", "networkx", "ml_dtypes", "tokenizers"}
SERVING_SUPPORT = {"errors", "support.arguments", "support.arrays", "support.mapped",
                   "support.compile_events", "support.decode_state", "support.decode_types",
                   "support.beam_loop", "support.beam_result", "support.deprecation",
                   "support.dtypes", "support.lazy", "support.placement", "support.threads"}
"""The utilities a serving binary ships."""
SERVED_ITEMS = {"items", "item_bits", "rules", "target.plan", "target.tables"}
"""The numpy folders and modules a serving binary reads a set's items and
plan with (their compiler modules, COMPILER_ITEMS, it never reaches:
`test_the_serving_binary_reaches_no_compiler_module`)."""
COMPILER_ITEMS = {"item_bits.additions", "item_bits.table_additions", "rules.subsets"}
"""The item folders' modules that need the compiler (the frontend, IR
building, lowering)."""
SERVING_BINARY = SERVING_SUPPORT | SERVED_ITEMS | {"format", "serving", "ir", "decoding"}
"""Every module a serving binary may load (with the packages above them)."""
RESTRICTED = {
    "errors": (set(), set()),
    "support.arguments": ({"numpy"}, {"errors"}),
    "support.arrays": ({"numpy"}, set()),
    "support.mapped": ({"numpy"}, set()),
    "support.decode_types": (set(), set()),
    "support.decode_state": ({"jax", "numpy"}, {"errors", "support.arguments", "support.decode_types"}),
    "support.compile_events": ({"jax"}, set()),  # jax's compile events, counted per front door
    "support.compilation_cache": ({"jax"}, {"errors"}),  # jax's persistent cache, on in one call
    "support.deprecation": (set(), set()),  # old names kept one release, warning
    "support.beam_loop": (set(), {"errors", "support.arguments"}),  # a search stepped from Python
    "support.beam_result": ({"jax", "numpy"}, {"errors", "support.decode_types"}),  # finalize, for both JAX doors
    "support.placement": ({"jax", "numpy"}, {"errors"}),  # which tables split across a mesh
    "support.threads": (set(), set()),  # host passes split over threads
    # The plan and the table format: numpy only, read by every backend.
    "target.plan": (set(), {"ir"}),
    "target.tables": ({"numpy"}, {"support.arrays"}),
    "target": ({"numpy"}, {"errors", "ir", "support", "target"}),
    # The items' data (index, names, attribute columns), read by every layer above.
    "items": ({"numpy"}, {"errors", "support"}),
    # Their liveness bits (numpy; numba for the compiled host kernels alone) and additions.
    "item_bits": ({"numpy"}, {"errors", "support", "items", "ir", "frontend", "target", "item_bits"}),
    "item_bits.bit_kernels": ({"numba", "numpy"}, set()),  # compiled host kernels over packed bits
    # The rules over the items (filters, priors) and the set view behind every front door.
    "rules": ({"numpy"}, {"errors", "support", "items", "item_bits", "target.plan", "frontend"}),
    # The artifact's format (`format/`): what every reader and writer shares; no jax.
    "format": ({"numpy"}, {"errors", "support.mapped", "support.dtypes", "items.names", "items.attributes",
                           "item_bits.layers", "item_bits.state_order"}),  # normalize: format.COMPAT
    # The serving binary (`serving/`): the format, item data, bits and rules, the verbs
    # (`decoding.decoder.Decoder`) and utilities; no compiler module (no frontend stage, passes,
    # lowering, backend or writer).
    "serving": ({"jax", "numpy"}, SERVING_SUPPORT | SERVED_ITEMS | {"format", "decoding"}),
    # The lifecycle: a compiled set's next version, and the writers of an artifact's next
    # versions (written by the artifact's writer, read back as the compiled set `saved` loads).
    "lifecycle": ({"numpy"}, {"errors", "support", "items", "passes", "target", "item_bits",
                              "rules", "format", "artifact", "saved"}),
    # the verb family's Protocols (its types named for the type checker alone)
    "contract": (set(), {"support.decode_types", "item_bits.liveness"}),
    # The verbs over an engine: shared by the serving binary and torch-only processes.
    "decoding": (set(), {"errors", "support.arguments", "support.beam_loop", "item_bits.liveness",
                         "item_bits.padding", "rules.priors"}),
    # the one warm-up planner of every front door (jax imported only inside the JAX doors'
    # hooks and their compile counter: importing it loads neither jax nor torch, tested below)
    "decoding.warm_up": ({"numpy", "jax"}, {"errors", "support.arguments", "support.decode_types",
                                            "support.compile_events", "item_bits.padding"}),
    "integrations": (THIRD_PARTY | {"torch", "transformers", "vllm"}, None),
    # The PyTorch backend: no jax, no compiler module (the compiled set is read lazily).
    "torch_backend": ({"numpy", "torch"}, SERVING_SUPPORT | SERVED_ITEMS |
                      {"format", "torch_backend", "compiled", "decoding"}),
}
"""module or package -> (third-party packages, modules of ours) it may import
(a module, or every module of a package named); most are the modules a
serving binary ships, so they stay small; the integrations may also import
the engines they plug into."""


KEYS = {key for members in LAYERS for key in members}


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
    for rank, members in enumerate(LAYERS):
        if key in members:
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
    allowed_third, allowed_ours = RESTRICTED.get(_key(name, RESTRICTED), (THIRD_PARTY, None))
    bad = []
    for module, line in _imports(name, path):
        root = module.split(".")[0]
        where = f"{path.relative_to(REPO)}:{line} imports {module}"
        if root == "static_compiler":
            target, theirs = _top(module), _path(module)
            if target in APPLICATIONS and key not in APPLICATIONS:
                bad.append(f"{where}: the library never imports the applications")
            elif allowed_ours is not None and not _within(theirs, allowed_ours) \
                    and _key(module, RESTRICTED) != _key(name, RESTRICTED):
                bad.append(f"{where}: {_key(name, RESTRICTED)} may import only "
                           f"{sorted(allowed_ours)} of ours")
            elif target != key and _rank(target) > rank and \
                    (mine, theirs) not in KNOWN_UPWARD:
                bad.append(f"{where}: layer {rank} ({key or 'the root'}) imports layer "
                           f"{_rank(target)} ({target or 'the root'}); imports go down the "
                           "layers only")
        elif root in ("tools", "tests", "passes"):
            bad.append(f"{where}: the package never imports {root}/")
        elif root not in sys.stdlib_module_names and root != "__future__":
            if root not in allowed_third:
                bad.append(f"{where}: {_key(name, RESTRICTED)} may import only the standard "
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


def test_the_serving_binary_reaches_no_compiler_module():
    """The serving loader's boundary, followed through every module it may
    load (a deferred import too): the format, the item folders' numpy
    modules, the plan and table format, the IR types and the utilities; no
    frontend module, pass, lowering, backend, writer, export or lifecycle
    module, nor the item folders' compiler modules."""
    reached = _reached("static_compiler.serving")
    above = {".".join(path.split(".")[:n]) for path in SERVING_BINARY for n in range(len(path.split(".")))}
    bad = sorted(path for path in reached if path not in above and
                 (not _within(path, SERVING_BINARY) or _within(path, COMPILER_ITEMS)))
    assert not bad, f"the serving binary may load {bad}"
    assert {"items.index", "item_bits.liveness", "rules.set_view", "rules.where"} <= reached
    # the walk follows deferred imports: a compiler module of the item folders reaches the frontend
    assert "frontend.sequences" in _reached("static_compiler.rules.subsets")


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
