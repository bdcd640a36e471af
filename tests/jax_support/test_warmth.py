"""A JAX door's warm state and warm-up arrays
(static_compiler.jax_support.warmth): `Warmth.counted` counts a warm-up's
compilations in the door's counter and in its own; the padding bound only
grows, and goes back when its block raises; `JaxPaths` gives host and
device forms."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from static_compiler.jax_support.compile_events import CompileCounter
from static_compiler.jax_support.warmth import JaxPaths, Warmth


def test_counted_counts_the_block_in_the_doors_counter_and_in_its_own():
    door = CompileCounter()
    warmth = Warmth(door)
    f = jax.jit(lambda x: x * 4.125 - 2.0)  # (a program no other test compiles)
    with warmth.counted() as first:
        f(np.ones(3)).block_until_ready()
    with warmth.counted() as second:
        f(np.ones(3)).block_until_ready()  # compiled already: counts nowhere
        f(np.ones(6)).block_until_ready()
    f(np.ones(7)).block_until_ready()  # outside every block
    assert (first.count, second.count, door.count) == (1, 1, 2)
    assert warmth.counter is door and Warmth().counter is not door  # a new one by default


def test_the_padding_bound_grows_and_a_raising_block_puts_it_back():
    warmth = Warmth()
    assert warmth.pad_to is None and warmth.padded_rows(3) == 3  # before a warm-up: as they are
    with warmth.padding_to(4) as bound:
        assert bound == 4 == warmth.pad_to
    with pytest.raises(MemoryError), warmth.padding_to(8):
        raise MemoryError("a failed warm-up")
    assert warmth.pad_to == 4
    assert warmth.raise_pad_to(2) == 4  # a smaller bound keeps the larger one
    assert (warmth.padded_rows(1), warmth.padded_rows(4), warmth.padded_rows(5)) == (4, 4, 5)


class _Paths(JaxPaths):
    def beam_widths(self, beam_size, batch_size):
        return (beam_size,)


def test_jax_paths_walk_host_and_device_logits_and_a_device_step():
    paths = _Paths()
    host, device = paths.logits_forms()
    x = np.zeros((2, 3), np.float32)
    assert host(x) is x and isinstance(device(x), jax.Array)
    step = paths.device_step(5)
    assert isinstance(step, jax.Array) and step.dtype == np.int32 and int(step) == 5
    assert int(paths.ready(step)) == 5
