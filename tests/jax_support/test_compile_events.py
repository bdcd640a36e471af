"""Compilations counted from jax's own compile events, per front door
(static_compiler.jax_support.compile_events)."""

from __future__ import annotations

import threading

import jax
import numpy as np

from static_compiler.jax_support.compile_events import CompileCounter, xla_compilations


def _fresh_program(k: float):
    """A jitted function no other test compiles (its constant is k)."""
    return jax.jit(lambda x: x * k + 1.0)


def test_a_counter_counts_the_compilations_of_its_block_only():
    counter, other = CompileCounter(), CompileCounter()
    f = _fresh_program(3.25)
    total = xla_compilations()  # (numpy inputs: no program but f's compiles)
    with counter.counting():
        f(np.ones(3)).block_until_ready()
        f(np.ones(3)).block_until_ready()  # compiled once
        with other.counting():  # nested: counts in both
            f(np.ones(4)).block_until_ready()
    f(np.ones(5)).block_until_ready()  # outside every block
    assert (counter.count, other.count) == (2, 1)
    assert xla_compilations() - total == 3


def test_a_counter_on_another_thread_does_not_see_this_threads_compilations():
    counter = CompileCounter()
    started, release = threading.Event(), threading.Event()

    def hold():
        with counter.counting():
            started.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait(30)
    try:
        _fresh_program(7.5)(np.ones(2)).block_until_ready()  # compiled on this thread
    finally:
        release.set()
        thread.join()
    assert counter.count == 0


def test_a_counter_nested_in_itself_counts_each_compilation_once():
    """A door's verb calling another verb of the same door enters its
    counter twice: each program still counts once, as jax reported it."""
    counter = CompileCounter()
    f = _fresh_program(9.75)
    total = xla_compilations()
    with counter.counting():
        with counter.counting():
            f(np.ones(3)).block_until_ready()
        f(np.ones(6)).block_until_ready()
    assert counter.count == xla_compilations() - total == 2
