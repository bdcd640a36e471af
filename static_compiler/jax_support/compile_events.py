"""XLA compilations, counted from jax's own compile events.

jax reports each backend compile (tracing and lowering apart) as a
monitoring event, and records the same event around a program read from its
persistent compilation cache, after a cache-hit event; this module listens
once per process and counts the events less the hits, the programs XLA
really compiled: in all (`xla_compilations`), and per front door
(`CompileCounter`: a compiled set, a served artifact, a processor), so a
server can warm its shapes up and then assert that requests compile nothing.

A counter counts the compilations that run inside its `counting()` block on
the same thread (a context variable: jax compiles in the calling thread), so
two doors used by two threads at once count their own. jax and the standard
library only; without jax installed nothing compiles, and every count stays 0
(the compiler and the torch backend run without jax).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

try:
    import jax
except ModuleNotFoundError:
    jax = None

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_totals = [0, 0]  # backend-compile events, persistent-cache hits
_lock = threading.Lock()
_active: contextvars.ContextVar = contextvars.ContextVar("static_compiler_counters", default=())


def _count(which: int) -> None:
    with _lock:
        _totals[which] += 1
        for counter in _active.get():
            counter._events[which] += 1


def _on_duration(event: str, duration: float, **kwargs) -> None:  # noqa: ARG001 (jax's listener)
    if event == _BACKEND_COMPILE_EVENT:
        _count(0)


def _on_event(event: str, **kwargs) -> None:  # noqa: ARG001 (jax's listener)
    if event == _CACHE_HIT_EVENT:
        _count(1)


if jax is not None:
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)


def xla_compilations() -> int:
    """XLA compilations in this process so far, of any jitted function (jax's
    backend-compile events less its persistent-cache hits, counted from this
    module's import: a program read from the cache is not a compilation)."""
    return _totals[0] - _totals[1]


def cache_hits() -> int:
    """Programs this process read from jax's persistent compilation cache
    (counted from this module's import)."""
    return _totals[1]


class CompileCounter:
    """The XLA compilations run inside this counter's `counting()` blocks
    (nested blocks of other counters count in each)."""

    def __init__(self):
        self._events = [0, 0]  # backend-compile events, persistent-cache hits

    @property
    def count(self) -> int:
        """Programs XLA compiled inside this counter's blocks (cache reads apart)."""
        return self._events[0] - self._events[1]

    @property
    def cache_hits(self) -> int:
        """Programs read from the persistent cache inside this counter's blocks."""
        return self._events[1]

    @contextlib.contextmanager
    def counting(self):
        """Counts the compilations this thread runs inside the block, once
        each: a block of a counter already counting in this thread (a verb
        calling another verb of the same door) adds nothing."""
        active = _active.get()
        if self in active:
            yield self
            return
        token = _active.set(active + (self,))
        try:
            yield self
        finally:
            _active.reset(token)
