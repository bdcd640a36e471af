"""Compiled decoding programs, bounded per process.

`jax.jit` keeps one executable per static configuration for the life of the
process, and a compiled set's plan is static (its per-layer shapes), so a
process that decodes many sets (a server swapping catalogues, a fuzzer)
kept every set's programs: ~90 memory maps and ~4.5 MB each on CPU, until the
kernel's limit on memory maps aborted it. `BoundedJit` keeps the programs of
at most `max_programs()` static configurations, least recently used first
out: an evicted configuration's jitted function is dropped, and with it its
executables; using it again compiles it again. Sets of equal shapes (tables
padded to one reserved capacity) share a plan, so they share programs.

`jax.clear_caches()` drops every compiled program of the process at once
(ours and the model's).
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import threading
from typing import Callable

import jax

from static_compiler.errors import DecodeInputError

_DEFAULT_MAX_PROGRAMS = 32
_max_programs = int(os.environ.get("STATIC_COMPILER_MAX_PROGRAMS", _DEFAULT_MAX_PROGRAMS))
_instances: list = []


_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_xla_compilations = [0]


def _count_compilations(event: str, duration: float, **kwargs) -> None:
    if event == _BACKEND_COMPILE_EVENT:
        _xla_compilations[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compilations)


def xla_compilations() -> int:
    """XLA compilations in this process so far, of any jitted function (jax's
    backend-compile events, counted from this module's import). Unlike
    `BoundedJit.compilations`, which counts executables held per argument
    signature, a call that finds its program compiled ahead of time
    (`BoundedJit.precompile`) adds nothing here."""
    return _xla_compilations[0]


def max_programs() -> int:
    """The bound on kept programs, per decoding entry point.

    Static configurations (plan, model function, batch and beam sizes,
    caps ...) whose programs each decoding entry point keeps.

    Returns
    -------
    int
        The last `set_max_programs` value, else the environment variable
        STATIC_COMPILER_MAX_PROGRAMS as read at import, else 32.
    """
    return _max_programs


def set_max_programs(n: int) -> None:
    """Sets the bound on kept programs, per decoding entry point.

    Keep the programs of at most `n` >= 1 static configurations per
    decoding entry point (default 32, or the environment variable
    STATIC_COMPILER_MAX_PROGRAMS); evicts the oldest now if over. The
    bound is process-wide (every entry point, every thread).

    Parameters
    ----------
    n : int
        The new bound, at least 1 (not a bool). Configurations over it are
        evicted at once, least recently used first; using one again
        compiles it again.

    Raises
    ------
    DecodeInputError
        If `n` is not an int >= 1.

    Examples
    --------
    >>> import static_compiler as sc
    >>> before = sc.max_programs()
    >>> sc.set_max_programs(8)
    >>> sc.max_programs()
    8
    >>> sc.set_max_programs(before)
    """
    global _max_programs
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DecodeInputError(f"set_max_programs: n={n!r}: expected an int >= 1")
    _max_programs = n
    for cache in _instances:
        cache.trim()


class BoundedJit:
    """`jax.jit(fn, static_argnames=...)` that keeps at most `max_programs()`
    static configurations (one jitted function each, LRU). Call it as the
    jitted function: static arguments by keyword."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...],
                 shaped_by_static: tuple[str, ...] = ()):
        self._fn = fn
        self._static = tuple(static_argnames)
        self._shaped_by_static = frozenset(shaped_by_static)
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self._evicted = 0  # executables of configurations evicted so far
        self._precompiled: dict = {}  # static configuration -> argument signatures compiled ahead
        self._lock = threading.Lock()
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)
        _instances.append(self)

    def __call__(self, *args, **kwargs):
        jitted, bound, _ = self._jitted(args, kwargs)
        return jitted(**bound)

    def precompile(self, *args, **kwargs) -> bool:
        """Compiles the program that a call with these arguments runs,
        without running it (jax's ahead-of-time `lower(...).compile()`,
        which fills the cache a later call with arrays of these shapes,
        dtypes and placements reads). Any array argument may be a
        `jax.ShapeDtypeStruct`. Done once per static configuration and
        signature of the other arguments (those named in `shaped_by_static`,
        whose shapes the static configuration fixes, are left out of it:
        checking stays cheap on every call); returns whether it compiled now."""
        bound = self._signature.bind(*args, **kwargs).arguments
        static = tuple((name, bound[name]) for name in self._static)
        rest = [value for name, value in bound.items()
                if name not in self._static and name not in self._shaped_by_static]
        leaves, tree = jax.tree_util.tree_flatten(rest)
        signature = (tree, tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x)))
                                 for x in leaves))
        with self._lock:
            done = self._precompiled.setdefault(static, set())
            if signature in done:
                return False
            done.add(signature)
        jitted, bound, _ = self._jitted(args, kwargs)
        jitted.lower(**bound).compile()
        return True

    def _jitted(self, args, kwargs):
        """(the jitted function of the call's static configuration, made
        most recently used; the dynamic arguments by name; the static key)."""
        bound = self._signature.bind(*args, **kwargs).arguments
        static = tuple((name, bound.pop(name)) for name in self._static)
        with self._lock:
            jitted = self._programs.pop(static, None)
            if jitted is None:
                jitted = jax.jit(functools.partial(self._fn, **dict(static)))
            self._programs[static] = jitted
            self._trim_locked()
        return jitted, bound, static

    def trim(self) -> None:
        with self._lock:
            self._trim_locked()

    def _trim_locked(self) -> None:
        while len(self._programs) > _max_programs:
            static, jitted = self._programs.popitem(last=False)
            self._evicted += jitted._cache_size()
            self._precompiled.pop(static, None)

    def num_configurations(self) -> int:
        """Static configurations held now."""
        return len(self._programs)

    def compilations(self) -> int:
        """Executables compiled so far: those held now and those evicted
        (so a count taken before and after a call tells whether it
        compiled)."""
        with self._lock:
            return self._evicted + sum(jitted._cache_size() for jitted in self._programs.values())

    def clear_cache(self) -> None:
        """Drops every configuration's programs."""
        with self._lock:
            self._evicted += sum(jitted._cache_size() for jitted in self._programs.values())
            self._programs.clear()
            self._precompiled.clear()


def bounded_jit(static_argnames: tuple[str, ...], shaped_by_static: tuple[str, ...] = ()):
    """Decorator form of `BoundedJit`."""
    return lambda fn: BoundedJit(fn, static_argnames, shaped_by_static)
