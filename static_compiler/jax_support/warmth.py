"""A JAX door's warm state and the arrays its warm-up walks with: what the
one warm-up (`static_compiler.decoding.warm_up`, numpy only) leaves to the
JAX doors, the compiled set and the served artifact.

* `Warmth`: what a door shares with the versions made from it, its XLA
  compile counter and the padding bound of its stacked subsets;
* `JaxPaths`: the `WarmPaths` of a JAX door (device arrays, jax's
  asynchronous dispatch waited on).

jax is imported on first use (by the compile counter's module and the
paths' methods), so the warm-up planner and the torch backend never load it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional

import numpy as np

from static_compiler.decoding.warm_up import WarmPaths
from static_compiler.jax_support.compile_events import CompileCounter


class Warmth:
    """What a JAX door shares with the versions made from it (`update`,
    `reload`): `counter`, the XLA compilations their calls caused
    (`compilations()`), and `pad_to`, the number of stacked subsets every
    stack up to it is padded to (None before a warm-up: stacks go as they
    are). The torch backend has none (nothing compiles)."""

    def __init__(self, counter: Optional[CompileCounter] = None):
        self.counter = counter if counter is not None else CompileCounter()
        self.pad_to: Optional[int] = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def counted(self):
        """Counts the block's compilations in `counter` and in a new
        `CompileCounter`, which it yields: a warm-up's own count, whatever
        other threads compile meanwhile."""
        mine = CompileCounter()
        with self.counter.counting(), mine.counting():
            yield mine

    def raise_pad_to(self, num: int) -> int:
        """Sets pad_to to at least `num`; returns it (a later warm-up with a
        smaller bound keeps the larger one: its programs are compiled)."""
        with self._lock:
            self.pad_to = max(num, self.pad_to or 0)
            return self.pad_to

    @contextlib.contextmanager
    def padding_to(self, num: int):
        """`raise_pad_to(num)` for a warm-up that must be all or nothing:
        if the block raises, pad_to goes back to what it was (unless
        another warm-up raised it meanwhile), so a failed warm-up leaves
        requests decoding as before. Yields the bound."""
        with self._lock:
            before = self.pad_to
            self.pad_to = after = max(num, before or 0)
        try:
            yield after
        except BaseException:
            with self._lock:
                if self.pad_to == after:
                    self.pad_to = before
            raise

    def padded_rows(self, num_subsets: int) -> int:
        """The stacked subsets a stack of `num_subsets` is decoded as."""
        pad = self.pad_to
        return pad if pad is not None and num_subsets <= pad else num_subsets


class JaxPaths(WarmPaths):
    """The JAX doors' arrays: numpy on the host, jax on the device, and
    waiting for jax's asynchronous dispatch (jax imported when a JAX door
    warms up, not by this module's import)."""

    def logits_forms(self) -> tuple:
        import jax

        return (lambda x: x, jax.device_put)

    def device_step(self, step: int) -> Any:
        import jax

        return jax.device_put(np.int32(step))

    def ready(self, value: Any) -> Any:
        import jax

        return jax.block_until_ready(value)

    _ranked_made: dict  # stack size -> a ranked subset of no item (`ranked`)
    ranked_door: Any = None
    """The door whose `ranked_subset` makes the ranked subsets walked
    (``warm(..., ranked=True)``), or None: none walked."""

    def ranked(self, batch_size: int, subset_rows: int) -> list:
        """With a `ranked_door`: a ranked subset of no item, and subset_rows
        of them stacked (subset_rows > 1, each row's index 0), made once per
        stack size."""
        if self.ranked_door is None:
            return []
        if not hasattr(self, "_ranked_made"):
            self._ranked_made = {}
        made = self._ranked_made
        out = []
        for R in sorted({1, max(subset_rows, 1)}):
            if R not in made:
                items = self.ranked_door._set_view.items
                made[R] = self.ranked_door.ranked_subset(np.zeros((R, items.num_items), bool))
            out.append((made[R], None if R == 1 else np.zeros(batch_size, np.int32)))
        return out
