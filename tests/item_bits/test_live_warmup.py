"""A decode loop that has warmed up never compiles on an update:
a set compiled with capacity (it expects updates) compiles, with its first
decode over every item, the program of the same decode over the items a
removal leaves; the first removal and additions that fit then compile
nothing; so does a step processor loop (its programs shared by equal
plans). Counted as XLA compilations (jax's backend-compile events), not as
cache entries."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler.jax_support.compile_events import xla_compilations
from static_compiler.support.decode_state import SENTINEL_SCORE

V, L = 32, 4


def items(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, V, size=(n, L))


def model(last, step, carry):
    return jnp.sin(jnp.arange(V, dtype=jnp.float32) * (step + 1.0)) * jnp.ones(
        last.shape + (V,)), carry


DECODERS = {
    "beam_search": lambda c: sc.beam_search(c, model, batch_size=2, beam_size=5),
    "greedy_decode": lambda c: sc.greedy_decode(c, model, batch_size=3),
    "sample": lambda c: sc.sample(c, model, jax.random.key(0), batch_size=2, temperature=0.7),
}


def _remove_then_add(compiled, decode, every: int, seed: int):
    """(removed rows, decode of the version without every `every`-th row,
    the version after 20 more items that fit, decoded too)."""
    gone = np.arange(compiled.items.num_items) % every == 0
    removed = compiled.update(remove=gone)
    result = decode(removed)
    added = removed.update(add=items(20, seed=seed))
    assert added.build.last_update["grew"] == []
    decode(added)
    return gone, result, added


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_the_first_removal_and_fitting_additions_compile_nothing_after_warm_up(name):
    rows = items(300, seed=sorted(DECODERS).index(name))
    compiled = sc.compile_constraints(rows, V, capacity=1.5)
    decode = lambda c: jax.block_until_ready(DECODERS[name](c))
    decode(compiled)  # warm-up: the plain program and, ahead, the removal-aware one
    before = xla_compilations()
    gone, result, added = _remove_then_add(compiled, decode, every=3, seed=7)
    decode(added.update(remove=np.arange(len(rows) + 20) % 5 == 0))
    assert xla_compilations() == before
    # and what it decoded left the removed items out
    kept = {tuple(r) for r in rows[~gone]}
    tokens, valid = np.asarray(result.tokens), np.asarray(result.valid)
    for b in range(tokens.shape[0]):
        for m in np.flatnonzero(valid[b]):
            assert tuple(int(x) for x in tokens[b, m, :L]) in kept


def test_a_set_without_capacity_compiles_nothing_ahead():
    compiled = sc.compile_constraints(items(200, seed=3), V)
    assert compiled._removal_program(None, 2) is None
    roomy = sc.compile_constraints(items(200, seed=3), V, capacity=1.25)
    spec = roomy._removal_program(None, 2)
    assert spec is not None and spec.rows.shape == (2,)
    gone = roomy.update(remove=np.arange(200) < 3)
    assert gone._removal_program(gone._live(None, None, 2, "t"), 2) is None  # runs it already


def test_the_ahead_of_time_compile_runs_with_the_first_decode_only():
    compiled = sc.compile_constraints(items(100, seed=5), V, capacity=1.25)
    jax.block_until_ready(DECODERS["beam_search"](compiled))
    before = xla_compilations()
    for _ in range(3):  # later calls neither lower nor compile again
        jax.block_until_ready(DECODERS["beam_search"](compiled))
    assert xla_compilations() == before
    # without capacity nothing is compiled ahead: the first removal compiles
    # (so the count above can see a compile)
    plain = sc.compile_constraints(items(100, seed=5), V)
    jax.block_until_ready(DECODERS["beam_search"](plain))
    before = xla_compilations()
    jax.block_until_ready(DECODERS["beam_search"](plain.update(remove=np.arange(100) < 5)))
    assert xla_compilations() > before


def test_the_step_processor_compiles_nothing_after_an_update_once_warm():
    """A processor loop warmed up on a set with capacity compiles nothing
    when it moves to the version a removal leaves, nor to one with additions
    that fit (the programs are shared by equal plans, and the removal-aware
    ones were compiled ahead); the masks are the new versions' own."""
    rows = items(300, seed=11)
    compiled = sc.compile_constraints(rows, V, capacity=1.5)

    def run(c):  # mask at 0, then advance_and_mask, the last step an advance
        proc, logits = c.processor(2), np.zeros((2, V), np.float32)
        state = proc.init_processor()
        masks = [np.asarray(proc.mask(logits, state, 0))]
        for t in range(c.max_length):
            tokens = masks[-1].argmax(axis=1)
            if t + 1 < c.max_length:
                state, masked = proc.advance_and_mask(state, tokens, t, logits)
                masks.append(np.asarray(masked))
            else:
                state = proc.advance(state, tokens, t)
        return masks

    run(compiled)  # warm-up
    before = xla_compilations()
    gone, got, _ = _remove_then_add(compiled, run, every=2, seed=12)
    assert xla_compilations() == before
    # the removed version's first mask allows exactly the first tokens of the items left
    first = {int(r[0]) for r, g in zip(rows, gone) if not g}
    assert set(np.flatnonzero(got[0][0] > SENTINEL_SCORE).tolist()) == first


def test_wait_for_kernels_returns_once_the_loaders_thread_has_loaded_them():
    """A loader's kernel loading (numba's import, holding the GIL) runs on a
    thread; `wait_for_kernels` returns once it has ended (what a benchmark
    of steady calls waits for), and at once where none was started. In a
    fresh process: the thread starts once per process."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from static_compiler.item_bits import liveness\n"
        "alive = lambda: [t for t in threading.enumerate() if t.name == "
        "'static-compiler-warm-kernels']\n"
        "assert liveness.wait_for_kernels(timeout=0) and not alive()\n"
        "liveness.warm_kernels_in_background()\n"
        "(thread,) = liveness._WARMED\n"
        "assert liveness.wait_for_kernels(timeout=120)\n"
        "assert not thread.is_alive() and not alive()\n"
        "assert 'static_compiler.item_bits.bit_kernels' in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
