"""`CompiledConstraints.warm` and `compilations()`: after a
warm-up, a mix of calls within the warmed shapes compiles nothing (counted
from jax's compile events: process-wide and per set), also on the versions
a removal and an addition within capacity make; warming twice compiles
nothing; results equal a cold process's; bad arguments raise typed errors;
the report is every door's `WarmReport`, a background warm-up a Future of
one."""

from __future__ import annotations

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PROFILE

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.compile_events import xla_compilations
from static_compiler.support.decode_types import WarmReport

# Three steps: each compiles its own mask / advance programs (a Python-int step).
V, L = 32, 3
KEY = jax.random.key(0)


def items(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, V, size=(n, L))


def model(last, step, carry):
    return jnp.cos(jnp.arange(V, dtype=jnp.float32) * (step + 1.3)) * jnp.ones(
        last.shape + (V,)), carry


def calls(c, stacked=None, eager=False):
    """The request mix: every entry point at the warmed shapes (B = 2,
    M = 4; B = 3 for the op-by-op pair), over every item and `stacked` (2 stacked subsets); with `eager`
    also the op-by-op mask / advance / allowed."""
    out = [sc.beam_search(c, model, batch_size=2, beam_size=4),
           sc.greedy_decode(c, model, batch_size=2),
           sc.sample(c, model, KEY, batch_size=2, temperature=0.5)]
    proc = c.processor(2)
    state = proc.init_processor()
    logits = np.cos(np.arange(V, dtype=np.float32) * 1.3) * np.ones((2, V), np.float32)
    for t in range(c.max_length):
        x = proc.mask(logits, state, t)
        state = proc.advance(state, np.argmax(np.asarray(x), -1).astype(np.int32), t)
        out.append(x)
    state = c.init_processor(3) if eager else None
    for t in range(c.max_length if eager else 0):
        x = c.mask(np.zeros((3, V), np.float32), state, t)
        state = c.advance(state, np.argmax(np.asarray(x), -1).astype(np.int32), t)
        out.extend([x, c.allowed(np.zeros((3, t), np.int32))])
    if stacked is not None:
        index = np.array([0, 1])
        out.append(sc.beam_search(c, model, batch_size=2, beam_size=4, subset=stacked,
                                  subset_index=index))
        sp = c.processor(2, subset=stacked, subset_index=index)
        state = sp.init_processor()
        for t in range(c.max_length - 1):
            state, x = sp.advance_and_mask(state, np.zeros(2, np.int32), t, logits)
            out.append(x)
    return jax.block_until_ready(out)


def warm(c, **kw):
    """The warm-up's report (or its Future, background=True)."""
    return c.warm([2], beam_sizes=[4], logits_fn=model, greedy=True, sample_key=KEY,
                  temperature=0.5, **kw)


@pytest.fixture(scope="module")
def warmed():
    rows = items(400, seed=1)
    c = sc.compile_constraints(rows, V, capacity=1.5)
    cold = calls(c)  # (cold: compiled by the calls themselves, before any warm-up)
    jax.clear_caches()
    c = sc.compile_constraints(rows, V, capacity=1.5)
    ran = warm(c, max_subsets=2).compilations
    return rows, c, cold, ran


def test_after_warm_the_request_mix_compiles_nothing_and_equals_cold_calls(warmed):
    rows, c, cold, ran = warmed
    assert ran > 0 and c.compilations() == ran
    before, own = xla_compilations(), c.compilations()
    hot = calls(c, stacked=sc.stack_subsets([c.subset(rows[:50]), c.subset(rows[100:300])]))
    assert xla_compilations() == before and c.compilations() == own
    for a, b in zip(jax.tree_util.tree_leaves(cold), jax.tree_util.tree_leaves(hot)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_after_warm_a_removal_and_a_fitting_addition_compile_nothing(warmed):
    rows, c, _, _ = warmed
    before, own = xla_compilations(), c.compilations()
    removed = c.update(remove=np.arange(len(rows)) % 3 == 0)
    calls(removed)
    added = removed.update(add=items(20, seed=9))
    assert added.build.last_update["grew"] == []
    calls(added, stacked=sc.stack_subsets([added.subset(rows[1:40]), added.subset(rows[200:])]))
    assert xla_compilations() == before
    assert added.compilations() == own  # (versions share their set's count)


def test_warm_twice_compiles_nothing(warmed):
    _, c, _, _ = warmed
    before = xla_compilations()
    report = warm(c, max_subsets=2)
    assert isinstance(report, WarmReport) and report.compilations == 0
    assert report.batch_sizes == (2,) and report.beam_sizes == (4,) and report.subset_rows == 2
    assert xla_compilations() == before


def test_background_warm_up_is_waited_on(warmed):
    _, c, _, _ = warmed
    handle = warm(c, max_subsets=2, background=True)
    assert isinstance(handle, concurrent.futures.Future)
    assert handle.result(timeout=60).compilations == 0 and handle.done()
    fresh = sc.compile_constraints(items(30, seed=4), V)  # another plan: compiles
    handle = fresh.warm(2, background=True)
    assert handle.result(timeout=60).compilations > 0 and fresh.compilations() > 0
    before = xla_compilations()
    fresh.processor(2).mask(np.zeros((2, V), np.float32), fresh.init_processor(2), 1)
    assert xla_compilations() == before


@pytest.mark.parametrize("kwargs", [
    dict(batch_sizes=[]), dict(batch_sizes=[0]), dict(batch_sizes="2"),
    dict(batch_sizes=[2.5]), dict(batch_sizes=[2], greedy=True),
    dict(batch_sizes=[2], logits_fn=model), dict(batch_sizes=[2], beam_sizes=[0], logits_fn=model),
    dict(batch_sizes=[2], beam_sizes=[4], logits_fn=model, beams=3),
    dict(batch_sizes=[2], beam_sizes=[4], logits_fn=model, tokens_per_beam=0),
    dict(batch_sizes=[2], sample_key="key", logits_fn=model),
    dict(batch_sizes=[2], max_subsets=-1), dict(batch_sizes=[2], greedy=1, logits_fn=model),
    dict(batch_sizes=[2], background="yes"), dict(batch_sizes=[2], eager=True),
])
def test_bad_arguments_are_typed_and_compile_nothing(warmed, kwargs):
    _, c, _, _ = warmed
    before = xla_compilations()
    with pytest.raises(DecodeInputError):
        c.warm(**kwargs)
    assert xla_compilations() == before


def test_max_subsets_on_a_set_without_subsets_is_typed():
    c = sc.compile_constraints([(0, 1), (1, 1)], 3,  # (items share states)
                               pipeline="verify,minimize,choose-layout,pack-dtypes")
    with pytest.raises(DecodeInputError, match="max_subsets"):
        c.warm([2], max_subsets=1)


def test_the_warm_up_covers_the_op_by_op_pair():
    c = sc.compile_constraints(np.random.default_rng(3).integers(1, V, size=(40, 2)), V)
    assert c.warm(3).compilations > 0
    before, own = xla_compilations(), c.compilations()
    state = c.init_processor(3)
    for t in range(c.max_length):
        x = c.mask(np.zeros((3, V), np.float32), state, t)
        c.allowed_tokens(state, t)
        state = c.advance(state, np.argmax(np.asarray(x), -1).astype(np.int32), t)
        c.allowed(np.zeros((3, t), np.int32))
    assert xla_compilations() == before and c.compilations() == own


def _stack_calls(c, stacked, index):
    """Every entry point over `stacked` (R subsets, rows picking by `index`)."""
    kw = dict(subset=stacked, subset_index=index)
    out = [sc.beam_search(c, model, batch_size=2, beam_size=4, **kw),
           sc.greedy_decode(c, model, batch_size=2, **kw),
           sc.sample(c, model, KEY, batch_size=2, temperature=0.5, **kw)]
    logits = np.cos(np.arange(V, dtype=np.float32) * 1.3) * np.ones((2, V), np.float32)
    proc, state = c.processor(2, **kw), c.init_processor(2)
    pstate = proc.init_processor()
    for t in range(c.max_length):
        x = proc.mask(logits, pstate, t)
        pstate = proc.advance(pstate, np.argmax(np.asarray(x), -1).astype(np.int32), t)
        y = c.mask(logits, state, t, **kw)
        state = c.advance(state, np.argmax(np.asarray(y), -1).astype(np.int32), t, **kw)
        out.extend([x, y])
    return jax.block_until_ready(out)


# Stack sizes padded to max_subsets = 4 (each compiles its own cold programs
# first): one in CI, every size below 4 under the slow profile.
PADDED_STACKS = (2, 3) if PROFILE == "slow" else (2,)


def test_stacks_up_to_max_subsets_are_padded_and_compile_nothing():
    """After warm(max_subsets=4), stacks of fewer subsets (2; also 3 under
    the slow profile) decode through the 4-subset programs: nothing
    compiles, the results are the unpadded stacks' (computed cold, before
    the warm-up)."""
    rows = items(300, seed=5)
    c = sc.compile_constraints(rows, V)
    picks = [rows[:60], rows[50:200], rows[250:]]
    stacks = {R: sc.stack_subsets([c.subset(p) for p in picks[:R]]) for R in PADDED_STACKS}
    index = {2: np.array([1, 0]), 3: np.array([2, 1])}
    cold = {R: _stack_calls(c, stacks[R], index[R]) for R in PADDED_STACKS}
    jax.clear_caches()
    c = sc.compile_constraints(rows, V)
    stacks = {R: sc.stack_subsets([c.subset(p) for p in picks[:R]]) for R in PADDED_STACKS}
    assert warm(c, max_subsets=4).compilations > 0
    before, own = xla_compilations(), c.compilations()
    for R in PADDED_STACKS:
        hot = _stack_calls(c, stacks[R], index[R])
        for a, b in zip(jax.tree_util.tree_leaves(cold[R]), jax.tree_util.tree_leaves(hot)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert xla_compilations() == before and c.compilations() == own
    padded = [stacks[R].placements for R in PADDED_STACKS]  # kept once per stack, K = 4
    assert all(("padded", 4) in p and p.get(("padded", 4), None).num_subsets == 4 for p in padded)
    with pytest.raises(DecodeInputError, match="subset_index"):  # checked against R, not 4
        sc.beam_search(c, model, batch_size=2, beam_size=4, subset=stacks[2],
                       subset_index=np.array([0, 2]))


def test_warm_reports_the_programs_xla_compiled():
    """The count warm returns equals jax's compile events during it and the
    set's `compilations()` (nested verbs once counted each program twice)."""
    c = sc.compile_constraints(items(60, seed=11), V, capacity=1.5)  # (its own plan)
    events = xla_compilations()
    ran = c.warm([2]).compilations
    assert ran > 0 and ran == xla_compilations() - events == c.compilations()


def _loop(c, B, **kw):
    """The op-by-op processor loop (each step on the state advance returned;
    then each step as a device scalar), allowed at every prefix length, and
    length penalties in the search and
    finalize."""
    out, state = [], c.init_processor(B)
    for t in range(c.max_length):
        x = c.mask(np.cos(np.arange(V, dtype=np.float32) * t)[None].repeat(B, 0), state, t, **kw)
        out += [x, c.allowed_tokens(state, t, **kw)]
        state = c.advance(state, np.argmax(np.asarray(x), -1).astype(np.int32), t, **kw)
        out.append(c.allowed(np.ones((B, t), np.int32), **kw))
    for t in range(c.max_length):  # the step as a device scalar: one program for every step
        x = c.mask(np.zeros((B, V), np.float32), state, jnp.int32(t), **kw)
        out += [x, c.allowed_tokens(state, jnp.int32(t), **kw)]
        state = c.advance(state, np.zeros(B, np.int32), jnp.int32(t), **kw)
    for penalty in (0.0, 0.6, 1.7):
        out += [sc.beam_search(c, model, batch_size=B, beam_size=4, length_penalty=penalty, **kw),
                c.finalize(c.init_beams(B, 4), penalty)]
    return jax.block_until_ready(out)


def test_after_warm_the_loop_allowed_and_length_penalties_compile_nothing():
    rows = items(120, seed=12)
    c = sc.compile_constraints(rows, V, end_token=0, capacity=1.5)
    c.warm([2], beam_sizes=[4], logits_fn=model, max_subsets=2, length_penalty=0.3)
    events, own = xla_compilations(), c.compilations()
    _loop(c, 2)
    _loop(c, 2, subset=sc.stack_subsets([c.subset(rows[:40]), c.subset(rows[30:])]),
          subset_index=np.array([1, 0]))
    _loop(c.update(remove=np.arange(len(rows)) % 4 == 0), 2)
    assert xla_compilations() == events and c.compilations() == own


def test_max_subsets_past_its_bound_is_typed_and_changes_nothing():
    from static_compiler.item_bits import padding as warming

    rows = items(80, seed=13)
    c = sc.compile_constraints(rows, V)
    bound = warming.PADDED_SUBSETS_MAX_BYTES // warming.subset_bytes(c.subset(np.zeros(80, bool)))
    for k in (bound + 1, 10 ** 12):
        with pytest.raises(DecodeInputError, match=rf"max_subsets={k}.*\[0, {bound}\]"):
            c.warm([2], max_subsets=k)
    assert c._warmth().pad_to is None and c.compilations() == 0


def test_a_failed_warm_up_leaves_the_padding_as_it_was():
    c = sc.compile_constraints(items(80, seed=14), V)

    def broken(last, step, carry):  # fails when its search compiles, after every check
        raise RuntimeError("model")

    with pytest.raises(RuntimeError, match="model"):
        c.warm([2], beam_sizes=[4], logits_fn=broken, max_subsets=3)
    assert c._warmth().pad_to is None
