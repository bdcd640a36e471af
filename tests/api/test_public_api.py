"""The public API is listed once, in `static_compiler.__all__`, and every name
in it is documented in the numpydoc style.

For every name of `__all__` (resolved through the package's lazy PEP 562
attributes):

* a function has a one-line summary, a ``Parameters`` section naming every
  parameter of its signature (none needed when it takes none), a
  ``Returns`` section unless it is annotated ``-> None``, and no documented
  parameter that the signature lacks;
* a class has a one-line summary and a ``Parameters`` or ``Attributes``
  section; every public parameter of its constructor (a private one, with a
  leading underscore, is the library's own: `CompiledConstraints._held_ir`)
  is named in one of them, and
  every documented attribute exists;
* a module has a docstring with a one-line summary;
* a constant is described in its defining module's docstring, under a
  ``Constants`` section that names it.

Everywhere: a ``Raises`` section names error classes of
`static_compiler.errors` (or builtin exceptions); an entry typed as an
array states its dtype and its shape, e.g. ``tokens : int32 array (B, M,
T)``; an ``Examples`` section runs (doctest, in its defining module's
namespace).
"""

from __future__ import annotations

import ast
import builtins
import doctest
import importlib
import inspect
import pathlib
import re
import sys
import types

import pytest

import static_compiler
from static_compiler import errors

ALL = list(static_compiler.__all__)

# Variadic parameters that need no entry of their own.
SKIPPED_VARIADIC = {"args", "kwargs", "changes"}
# A dtype: exact (int32), or a kind an input may take any dtype of (int, float).
DTYPE = re.compile(r"\b(u?int(8|16|32|64)?|integer|float(16|32|64)?|bfloat16|bool|"
                   r"complex(64|128)?)\b")
SHAPE = re.compile(r"\([^()]*\)")
ARRAY_TYPE = re.compile(r"\barray\b(?![-_]like)")


def resolve(name):
    return getattr(static_compiler, name)


def kind(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return "constant"


def sections(doc: str) -> dict[str, list[str]]:
    """numpydoc sections of a (dedented) docstring: {title: body lines}.
    A title is a line underlined by as many dashes."""
    lines = doc.splitlines()
    out: dict[str, list[str]] = {}
    current = None
    i = 0
    while i < len(lines):
        line = lines[i]
        underline = lines[i + 1].strip() if i + 1 < len(lines) else ""
        title = line.strip()
        if title and underline and set(underline) == {"-"} and len(underline) == len(title) \
                and line == line.lstrip():
            current = title
            out[current] = []
            i += 2
            continue
        if current is not None:
            out[current].append(line)
        i += 1
    return out


def entries(body: list[str]) -> list[tuple[list[str], str]]:
    """(names, type) of each entry of a section: its unindented lines,
    ``name : type`` or ``name1, name2 : type`` or ``name``."""
    out = []
    for line in body:
        if not line.strip() or line[0].isspace():
            continue
        head, _, typ = line.partition(" : ")
        out.append(([n.strip().lstrip("*") for n in head.split(",") if n.strip()], typ.strip()))
    return out


def entry_names(body: list[str]) -> set[str]:
    return {n for names, _ in entries(body) for n in names}


def summary_problem(doc) -> str | None:
    if not doc or not doc.strip():
        return "no docstring"
    lines = doc.splitlines()
    if not lines[0].strip():
        return "the docstring does not start with a summary line"
    if len(lines) > 1 and lines[1].strip():
        return f"the summary is not one line (a blank line must follow it): {lines[:2]}"
    return None


def documented_params(sig: inspect.Signature) -> list[str]:
    names = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name in SKIPPED_VARIADIC:
            continue
        names.append(p.name)
    return names


def returns_none(sig: inspect.Signature) -> bool:
    ann = sig.return_annotation
    return ann is None or ann is type(None) or (isinstance(ann, str) and ann.strip() == "None")


def shared_problems(doc: str, secs: dict) -> list[str]:
    problems = []
    for names, _typ in entries(secs.get("Raises", [])):
        for name in names:
            cls = getattr(errors, name, None) or getattr(builtins, name, None)
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                problems.append(f"Raises names {name!r}: not an error of static_compiler.errors "
                                "(nor a builtin exception)")
    for title in ("Parameters", "Attributes", "Returns", "Constants"):
        for names, typ in entries(secs.get(title, [])):
            if ARRAY_TYPE.search(typ) and not (DTYPE.search(typ) and SHAPE.search(typ)):
                problems.append(f"{title} entry {', '.join(names)} : {typ!r} is an array "
                                "without a dtype and a shape, e.g. 'int32 array (B, M, T)'")
    return problems


def defining_module(name: str, obj) -> types.ModuleType:
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module in sys.modules:
        return sys.modules[module]
    where = static_compiler._LAZY[name]
    return importlib.import_module(f"static_compiler.{where}")


def test_all_is_unique_and_resolves():
    duplicates = sorted({n for n in ALL if ALL.count(n) > 1})
    assert not duplicates, f"__all__ lists {duplicates} more than once"
    missing = []
    for name in ALL:
        try:
            resolve(name)
        except AttributeError as err:
            missing.append(f"{name}: {err}")
    assert not missing, "names of __all__ that do not resolve:\n" + "\n".join(missing)


def test_dir_lists_all():
    listed = set(dir(static_compiler))
    assert not [n for n in ALL if n not in listed], \
        f"dir(static_compiler) lacks {[n for n in ALL if n not in listed]}"


@pytest.mark.parametrize("name", ALL)
def test_documented(name):
    obj = resolve(name)
    what = kind(obj)
    problems = []
    if what == "constant":
        module = defining_module(name, obj)
        doc = inspect.getdoc(module) or ""
        constants = entry_names(sections(doc).get("Constants", []))
        if name not in constants:
            problems.append(f"constant {name} is not an entry of the 'Constants' section of "
                            f"{module.__name__}'s docstring")
        problems += shared_problems(doc, sections(doc))
        assert not problems, f"{name}:\n  " + "\n  ".join(problems)
        return
    doc = inspect.getdoc(obj)
    problem = summary_problem(doc)
    assert doc, f"{name} ({what}): {problem}"
    problems += [problem] if problem else []
    secs = sections(doc)
    problems += shared_problems(doc, secs)
    if what == "function":
        sig = inspect.signature(obj)
        params = documented_params(sig)
        given = entry_names(secs.get("Parameters", []))
        if params and "Parameters" not in secs:
            problems.append("no 'Parameters' section")
        missing = [p for p in params if p not in given]
        if missing and "Parameters" in secs:
            problems.append(f"parameters {missing} are not in the 'Parameters' section")
        stale = sorted(given - {p.name for p in sig.parameters.values()})
        if stale:
            problems.append(f"the 'Parameters' section names {stale}, not in the signature {sig}")
        if not returns_none(sig) and "Returns" not in secs and "Yields" not in secs:
            problems.append("no 'Returns' section (the function is not annotated -> None)")
    elif what == "class":
        if "Parameters" not in secs and "Attributes" not in secs:
            problems.append("no 'Parameters' or 'Attributes' section")
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            sig = None
        given = entry_names(secs.get("Parameters", [])) | entry_names(secs.get("Attributes", []))
        if sig is not None:
            missing = [p for p in documented_params(sig) if p not in given
                       and not p.startswith("_")]
            if missing:
                problems.append(f"constructor parameters {missing} are in neither 'Parameters' "
                                "nor 'Attributes'")
        annotated = set()
        for klass in obj.__mro__:
            annotated |= set(getattr(klass, "__annotations__", {}))
        unknown = sorted(a for a in entry_names(secs.get("Attributes", []))
                         if a not in annotated and not hasattr(obj, a))
        if unknown:
            problems.append(f"the 'Attributes' section names {unknown}, not attributes of the "
                            "class")
    assert not problems, f"{name} ({what}):\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", [n for n in ALL if kind(resolve(n)) == "module"])
def test_module_docstring(name):
    problem = summary_problem(inspect.getdoc(resolve(name)))
    assert problem is None, f"module {name}: {problem}"


def _examples():
    out = []
    for name in ALL:
        obj = resolve(name)
        if kind(obj) in ("function", "class") and ">>>" in (inspect.getdoc(obj) or ""):
            out.append(name)
    return out


@pytest.mark.parametrize("name", _examples())
def test_examples_run(name):
    obj = resolve(name)
    module = defining_module(name, obj)
    test = doctest.DocTestParser().get_doctest(inspect.getdoc(obj), dict(vars(module)),
                                               f"{module.__name__}.{name}", module.__file__, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


# --------------------------------------------------------------------------
# Internal packages say which of their modules are public

PACKAGE_ROOT = pathlib.Path(static_compiler.__file__).parent
NOT_YET_STATED: dict = {}
_STATEMENT = re.compile(r"\b(Public|Internal): (.*?)(?:\n\s*\n|\Z)", re.S)


def package_statement_problems(package: pathlib.Path, modules_anywhere: set) -> list:
    """What is wrong with `package`'s ``Public:`` (or ``Internal:``)
    statement: none in its docstring, or a backticked module name in it
    that is not a module of this package."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    found = _STATEMENT.search(doc)
    if found is None:
        return ["its docstring has no 'Public:' or 'Internal:' statement"]
    own = {p.stem for p in package.glob("*.py")} | \
        {p.parent.name for p in package.glob("*/__init__.py")}
    named = set(re.findall(r"(?<!`)`([a-z_][a-z0-9_]*)`(?!`)", found.group(2)))
    return [f"names `{name}`, not a module of it" for name in sorted(named & modules_anywhere - own)]


def _packages() -> list:
    return sorted(p.parent for p in PACKAGE_ROOT.rglob("*/__init__.py")
                  if "__pycache__" not in p.parts)


def _modules_anywhere() -> set:
    return {p.stem for p in PACKAGE_ROOT.rglob("*.py")} | {p.name for p in _packages()}


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_every_package_says_which_of_its_modules_are_public(package):
    name = str(package.relative_to(PACKAGE_ROOT))
    if name in NOT_YET_STATED:
        pytest.skip(NOT_YET_STATED[name])
    assert package_statement_problems(package, _modules_anywhere()) == [], name


def test_a_statement_naming_another_packages_module_is_caught(tmp_path):
    (tmp_path / "__init__.py").write_text('"""A package.\n\nPublic: `alpha` and `beta`.\n"""\n')
    (tmp_path / "alpha.py").write_text("")
    assert package_statement_problems(tmp_path, {"alpha", "beta"}) == \
        ["names `beta`, not a module of it"]
    (tmp_path / "__init__.py").write_text('"""A package with no statement."""\n')
    assert package_statement_problems(tmp_path, {"alpha"}) == \
        ["its docstring has no 'Public:' or 'Internal:' statement"]
