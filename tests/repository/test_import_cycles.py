"""No import circles inside the package: the graph of which module imports
which (module-level imports and the deferred ones inside functions alike;
only imports under `if TYPE_CHECKING:` left out, since they never run) has
no cycle. A deferred import that closes a circle hides it from Python's
loader, not from the reader: the two modules still depend on each other, and
the code that both need belongs in a lower module.
"""

from __future__ import annotations

import ast

import pytest
from test_layering import MODULES, _imports, _is_module


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The line numbers of the import statements under `if TYPE_CHECKING:`
    (or `typing.TYPE_CHECKING`), anywhere in the file."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                or isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"):
            for statement in node.body:
                for inner in ast.walk(statement):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        lines.add(inner.lineno)
    return lines


def _runtime_imports(name, path) -> set[str]:
    """The modules of ours that module `name` (file `path`) imports when it
    runs: every import statement but those under `if TYPE_CHECKING:`."""
    skip = _type_checking_lines(ast.parse(path.read_text(), str(path)))
    return {module for module, line in _imports(name, path)
            if line not in skip and module.split(".")[0] == "static_compiler" and module != name}


def import_graph(modules) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (run-time imports only), for
    (name, path) pairs. A name taken from a package (`from static_compiler.
    artifact import Artifact`) is an edge to the package's __init__; the
    parent packages Python loads on the way are not edges (every module
    would otherwise sit in a circle with the root's __init__)."""
    return {name: {m for m in _runtime_imports(name, path) if _is_module(m)}
            for name, path in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each a
    circle of imports), each sorted, in sorted order; Tarjan's algorithm,
    iterative (the package is deeper than Python's recursion is comfortable)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _where(graph, component) -> str:
    """A component's edges, one `a -> b` per import inside it."""
    members = set(component)
    return "; ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a] & members))


def test_the_package_has_no_import_circle():
    graph = import_graph(MODULES)
    found = cycles(graph)
    assert not found, "import circles (module-level and deferred imports):\n" + "\n".join(
        f"  {' / '.join(c)}: {_where(graph, c)}" for c in found)


def test_the_circle_finder_sees_a_deferred_circle(tmp_path):
    """The checker itself: a circle closed by an import inside a function is
    found, one under `if TYPE_CHECKING:` is not, and a chain is no circle."""
    package = tmp_path / "static_compiler"
    package.mkdir()
    (package / "a.py").write_text("import static_compiler.b\n")
    (package / "b.py").write_text("def f():\n    import static_compiler.a\n")
    (package / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n"
                                  "    import static_compiler.a\nimport static_compiler.b\n")
    files = [(f"static_compiler.{p.stem}", p) for p in sorted(package.glob("*.py"))]
    graph = {name: _runtime_imports(name, path) for name, path in files}
    assert graph == {"static_compiler.a": {"static_compiler.b"}, "static_compiler.b": {"static_compiler.a"},
                     "static_compiler.c": {"static_compiler.b"}}
    assert cycles(graph) == [["static_compiler.a", "static_compiler.b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": {"c"}}, [["a", "b"]]),  # a self-import is no circle of two
    ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}, [["a", "b", "c"], ["d", "e"]]),
    ({}, []),
])
def test_the_circles_of_small_graphs(graph, expected):
    assert cycles(graph) == expected
