"""XLA compilations, counted from jax's own compile events.

jax reports each backend compile (tracing and lowering apart, a persistent-
cache hit excluded) as a monitoring event; this module listens once per
process and counts them: in all (`xla_compilations`), and per front door
(`CompileCounter`: a compiled set, a served artifact, a processor), so a
server can warm its shapes up and then assert that requests compile nothing.

A counter counts the compilations that run inside its `counting()` block on
the same thread (a context variable: jax compiles in the calling thread), so
two doors used by two threads at once count their own. jax and the standard
library only.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_total = [0]
_lock = threading.Lock()
_active: contextvars.ContextVar = contextvars.ContextVar("static_compiler_counters", default=())


def _on_event(event: str, duration: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE_EVENT:
        return
    with _lock:
        _total[0] += 1
        for counter in _active.get():
            counter._count += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def xla_compilations() -> int:
    """XLA compilations in this process so far, of any jitted function (jax's
    backend-compile events, counted from this module's import; a program
    read from jax's persistent compilation cache is not a compilation)."""
    return _total[0]


class CompileCounter:
    """The XLA compilations run inside this counter's `counting()` blocks
    (nested blocks of other counters count in each)."""

    def __init__(self):
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def counting(self):
        """Counts the compilations this thread runs inside the block."""
        token = _active.set(_active.get() + (self,))
        try:
            yield self
        finally:
            _active.reset(token)
