"""Old names kept working for one release: each call warns with a
`DeprecationWarning` that names the new name, then does what the new name
does. Standard library only.

    class Door:
        def init_processor(self, batch_size): ...
        init_state = renamed_method("init_processor")      # Door.init_state(2) warns

    load_compiled = renamed_function(load, "static_compiler.load_compiled",
                                     "static_compiler.load")
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

REMOVED_IN = "the next release"
"""When the old names go: they are kept for one release after their rename."""


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warns that `old` is deprecated in favour of `new` (a
    DeprecationWarning pointing at the caller of the function that calls
    this, with stacklevel=3)."""
    warnings.warn(f"{old} is deprecated and will be removed in {REMOVED_IN}: use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


class renamed_method:
    """A class attribute for a method's old name: ``old = renamed_method(
    "new")`` in a class body makes ``obj.old(...)`` (and a classmethod's
    ``Cls.old(...)``) warn, naming ``Type.new``, and return ``obj.new(...)``
    with the same arguments."""

    def __init__(self, new: str):
        self.new = new
        self.old = new  # (set by __set_name__)

    def __set_name__(self, owner, name: str) -> None:
        self.old = name

    def __get__(self, obj, objtype=None) -> Callable:
        owner = objtype if obj is None else type(obj)
        target = getattr(owner if obj is None else obj, self.new)
        old, new = f"{owner.__name__}.{self.old}", f"{owner.__name__}.{self.new}"

        @functools.wraps(target)
        def call(*args, **kwargs):
            warn_renamed(old, new)
            return target(*args, **kwargs)

        return call


def renamed_function(target: Callable, old: str, new: str) -> Callable:
    """A module-level function's old name: warns, naming `new`, then calls
    `target` with the same arguments."""

    @functools.wraps(target)
    def call(*args, **kwargs):
        warn_renamed(old, new)
        return target(*args, **kwargs)

    call.__name__ = old.rpartition(".")[2]
    call.__qualname__ = call.__name__
    return call
