"""A package's public names imported on first use (PEP 562), so importing
the package loads none of its modules: `lazy_exports` makes the package's
module-level ``__getattr__`` and ``__dir__`` (and keeps the modules that
moved out of the package reachable by their old attribute, warning, until
`support.deprecation.REMOVED_IN`)."""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str],
                 submodules: frozenset = frozenset(),
                 moved: Mapping[str, str] | None = None) -> tuple[Callable, Callable]:
    """(``__getattr__``, ``__dir__``) for the package named `package`:
    a name of `exports` (public name -> the module of the package that
    defines it) is imported from its module on first use and kept in the
    package's namespace; a name of `submodules` is that module; a name of
    `moved` (old module name -> the module's full name now) is the module
    at its new place, with a DeprecationWarning naming it (`from package
    import old` keeps working; `import package.old` does not). Any other
    name raises AttributeError."""
    moved = moved or {}

    def __getattr__(name: str):
        if name in moved:
            from static_compiler.support.deprecation import warn_deprecated  # only for an old name

            warn_deprecated(f"{package}.{name}", moved[name])
            return importlib.import_module(moved[name])
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(exports) | set(submodules))

    return __getattr__, __dir__
