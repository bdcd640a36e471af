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
from typing import Callable, Optional

import jax

from static_compiler.errors import DecodeInputError

_DEFAULT_MAX_PROGRAMS = 32
_max_programs = int(os.environ.get("STATIC_COMPILER_MAX_PROGRAMS", _DEFAULT_MAX_PROGRAMS))
_instances: list = []


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
    jitted function: static arguments by keyword. group_by: a static
    argument whose values are what is bounded instead (every configuration
    of the `max_programs()` most recently used values is kept: a step
    processor's programs, one per step, counted per plan)."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...],
                 group_by: Optional[str] = None):
        self._fn = fn
        self._static = tuple(static_argnames)
        self._group = None if group_by is None else self._static.index(group_by)
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self._evicted = 0  # executables of configurations evicted so far
        self._lock = threading.Lock()
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)
        _instances.append(self)

    def __call__(self, *args, also_compile: Optional[dict] = None, **kwargs):
        """Runs the program of these arguments. also_compile: {argument name:
        value} (arrays or `jax.ShapeDtypeStruct`s): when this call compiled
        its program (the first with these static options and argument
        shapes), also compile, ahead of time and without running it, the
        program of the same call with those arguments swapped in (jax's
        `lower(...).compile()` fills the cache a later call of those shapes
        reads); a call that compiled nothing checks one count."""
        bound = self._signature.bind(*args, **kwargs).arguments
        jitted = self.jitted(**{name: bound.pop(name) for name in self._static})
        ahead = None if not also_compile else (lambda: ((), {**bound, **also_compile}))
        return run_compiling_ahead(jitted, ahead, **bound)

    def compile_ahead(self, *args, **kwargs) -> None:
        """Compiles, without running it, the program a call with these
        arguments runs (arrays or `jax.ShapeDtypeStruct`s; static ones by
        keyword): jax's `lower(...).compile()` fills the cache that call
        reads, and a program compiled already is found there (no compile)."""
        bound = self._signature.bind(*args, **kwargs).arguments
        jitted = self.jitted(**{name: bound.pop(name) for name in self._static})
        jitted.lower(**bound).compile()

    def jitted(self, **static):
        """The jitted function of one static configuration (every static
        argument by keyword), made most recently used: a caller that runs
        it many times (a step processor) keeps it and skips binding the
        call's signature each time; it is counted and bounded as a call's."""
        key = tuple((name, static[name]) for name in self._static)
        with self._lock:
            jitted = self._programs.pop(key, None)
            if jitted is None:
                jitted = jax.jit(functools.partial(self._fn, **static))
            self._programs[key] = jitted
            self._trim_locked()
        return jitted

    def trim(self) -> None:
        with self._lock:
            self._trim_locked()

    def _trim_locked(self) -> None:
        if self._group is None:
            while len(self._programs) > _max_programs:
                self._evicted += self._programs.popitem(last=False)[1]._cache_size()
            return
        kept = set()  # the most recently used groups, newest first
        for key in reversed(self._programs):
            if len(kept) < _max_programs:
                kept.add(key[self._group][1])
        for key in [k for k in self._programs if k[self._group][1] not in kept]:
            self._evicted += self._programs.pop(key)._cache_size()

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


def run_compiling_ahead(jitted, ahead: Optional[Callable[[], tuple]], *args, **kwargs):
    """`jitted(*args, **kwargs)`; when that call compiled its program, also
    compile, without running it, the program of the arguments `ahead()`
    returns as (args, kwargs) (arrays or `jax.ShapeDtypeStruct`s: jax's
    `lower(...).compile()` fills the cache a later call of those shapes
    reads). ahead None: just the call."""
    if ahead is None:
        return jitted(*args, **kwargs)
    before = jitted._cache_size()
    out = jitted(*args, **kwargs)
    if jitted._cache_size() > before:
        ahead_args, ahead_kwargs = ahead()
        jitted.lower(*ahead_args, **ahead_kwargs).compile()
    return out


def bounded_jit(static_argnames: tuple[str, ...], group_by: Optional[str] = None):
    """Decorator form of `BoundedJit`."""
    return lambda fn: BoundedJit(fn, static_argnames, group_by)
