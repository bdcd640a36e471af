"""Beam schedules: `beam_size` as one width per step,
exact against the oracle generalised to per-step widths (tests/oracle.py,
`step_widths`), on every layout, with an end token, caps and subsets."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import assert_matches, decode_and_check, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError

FIXED = oracle.random_set(np.random.default_rng(7), 60, 4, 8)
RAGGED = oracle.random_ragged_set(np.random.default_rng(8), 30, 3, 6, end_token=0)


def schedules(steps: int, widest: int = 9):
    return st.lists(st.integers(1, widest), min_size=steps, max_size=steps).map(tuple)


def test_the_oracle_with_a_uniform_schedule_is_the_oracle_with_its_int():
    cset = oracle.ConstraintSet(FIXED, 8)
    model = oracle.HashModel(8)
    for M in (1, 3, 7):
        a = oracle.beam_search(cset, model, [1, 2], M, tokens_per_beam=2)
        b = oracle.beam_search(cset, model, [1, 2], (M,) * 4, tokens_per_beam=2)
        for field in ("tokens", "scores", "valid", "lengths"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.parametrize("layout", ["default", "dense_rows", "csr", "mixed_csr", "unary"])
@settings(max_examples=examples(4), deadline=None)
@given(schedule=schedules(4), tokens_per_beam=st.sampled_from([None, 1, 2]),
       seeds=st.lists(st.integers(0, 2 ** 32 - 1), min_size=2, max_size=2),
       nan=st.sampled_from([0, 40]))
def test_a_schedule_matches_the_oracle(layout, schedule, tokens_per_beam, seeds, nan):
    compiled = oracle.compile_set(FIXED, 8, layout)
    cset = oracle.ConstraintSet(FIXED, 8)
    decode_and_check(cset, compiled, oracle.HashModel(8, nan=nan), seeds, schedule,
                     tokens_per_beam)


@settings(max_examples=examples(8), deadline=None)
@given(schedule=schedules(4, widest=4),
       seeds=st.lists(st.integers(0, 2 ** 32 - 1), min_size=3, max_size=3))
def test_a_schedule_with_an_end_token_matches_the_oracle(schedule, seeds):
    """Narrow widths end every beam early in some rows: a later step that
    changes the width still runs (the result has the last width)."""
    compiled = oracle.compile_set(RAGGED, 6, end_token=0)
    assert compiled.max_length == 4
    cset = oracle.ConstraintSet(RAGGED, 6, 0)
    decode_and_check(cset, compiled, oracle.HashModel(6), seeds, schedule)


def test_every_beam_ended_before_the_width_grows():
    """Items of one token and of three: a model that favours the end token
    ends the one beam at step 1; the steps after keep it, and the last
    step's schedule of 5 beams gives 5 beams, the rest invalid."""
    items = [(1,), (2,), (3, 1, 1), (3, 2, 1)]
    compiled = sc.compile_constraints(items, vocab_size=5, end_token=0)

    def favour_end(last, step, carry):
        logits = jnp.zeros(last.shape + (5,)).at[..., 0].set(5.0).at[..., 1].set(1.0)
        return logits, carry

    got = compiled.beam_search(favour_end, batch_size=2, beam_size=(1, 1, 1, 5))
    assert np.asarray(got.tokens).shape == (2, 5, 4)
    np.testing.assert_array_equal(np.asarray(got.valid), [[True] + [False] * 4] * 2)
    np.testing.assert_array_equal(np.asarray(got.tokens)[:, 0, :2], [[1, 0], [1, 0]])


def test_a_uniform_schedule_is_the_int_from_one_start_beam():
    """(5, 5, 5, 5) keeps what beam_size=5 keeps, bit for bit; the model's
    step 0 sees the start beam alone (the int's state holds 5 from the
    start, beam 0 alone valid)."""
    compiled = oracle.compile_set(FIXED, 8)
    model = oracle.HashModel(8)
    seeds, seen = [3, 4], []

    def watched(last, step, carry):
        seen.append(last.shape)
        return model(last, step, carry)

    a = sc.beam_search(compiled, model, batch_size=2, beam_size=5, tokens_per_beam=2,
                       carry=model.init_carry(seeds, 5), carry_axes=model.carry_axes)
    b = sc.beam_search(compiled, watched, batch_size=2, beam_size=[5] * 4, tokens_per_beam=2,
                       carry=model.init_carry(seeds, 1), carry_axes=model.carry_axes)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert seen[0] == (2, 1) and (2, 5) in seen


def test_a_flat_beam_axis_follows_the_schedule():
    """A carry leaf holding the beams flattened (B * M on axis 0) is
    reordered from each step's width to the next: the same result as the
    (B, M) leaf of the oracle's model."""
    compiled = oracle.compile_set(FIXED, 8)
    model = oracle.HashModel(8)
    seeds, schedule = [5, 6], (3, 6, 2, 4)  # the model sees 1, 3, 6 and 2 beams

    def flat_model(last, step, carry):
        B, M = last.shape
        logits, new = model(last, step, {"h": carry["h"].reshape(B, M), "knobs": carry["knobs"]})
        return logits, {"h": new["h"].reshape(B * M), "knobs": new["knobs"]}

    start = model.init_carry(seeds, 1)
    carry = {"h": start["h"].reshape(-1), "knobs": start["knobs"]}
    got, out = sc.beam_search(compiled, flat_model, batch_size=2, beam_size=schedule,
                              carry=carry, carry_axes={"h": 0, "knobs": None},
                              return_carry=True)
    assert out["h"].shape == (2 * 4,)
    want = oracle.beam_search(oracle.ConstraintSet(FIXED, 8), model, seeds, schedule)
    assert_matches(got, want)


def test_a_schedule_over_a_subset_is_the_schedule_over_the_items():
    items = np.asarray(FIXED, np.int32)
    compiled = sc.compile_constraints(items, vocab_size=8)
    keep = np.arange(len(items)) % 3 != 0
    alone = sc.compile_constraints(items[keep], vocab_size=8)
    model = oracle.HashModel(8)
    seeds, schedule = [1, 9], (2, 5, 7, 3)
    run = lambda c, **kw: sc.beam_search(c, model, batch_size=2, beam_size=schedule,
                                         carry=model.init_carry(seeds, 1),
                                         carry_axes=model.carry_axes, **kw)
    a, b = run(compiled, subset=compiled.subset(keep)), run(alone)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_beam_step_keeps_the_width_asked_for():
    """The step-at-a-time verbs (static and traced step) give the search's
    states when each step names its width."""
    compiled = oracle.compile_set(FIXED, 8)
    schedule = (2, 4, 3, 3)

    def logits_fn(last, step, carry):
        return jnp.sin((last[..., None] + 1.0) * (jnp.arange(8) + 1) * (step + 1.3)), carry

    want = compiled.beam_search(logits_fn, batch_size=2, beam_size=schedule)
    for traced in (False, True):
        state = compiled.init_beams(2, 1)  # (a schedule starts from the start beam)
        for t, width in enumerate(schedule):
            logits, _ = logits_fn(state.last_tokens, t, None)
            state = compiled.beam_step(state, logits, jnp.int32(t) if traced else t,
                                       beam_size=width)
            assert state.node.shape == (2, width)
        got = compiled.finalize(state)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    state = decode.init_beam_state(compiled.plan, 2, 2)
    logits, _ = logits_fn(state.last_tokens, 0, None)
    assert decode.beam_step(compiled.plan, compiled.lowered.device_tables, state, logits, 0,
                            beam_size=6).node.shape == (2, 6)


def test_a_schedule_compiles_once():
    compiled = oracle.compile_set(FIXED, 8)
    model = oracle.HashModel(8)
    run = lambda seeds: sc.beam_search(compiled, model, batch_size=2, beam_size=(2, 4, 8, 8),
                                       carry=model.init_carry(seeds, 1),
                                       carry_axes=model.carry_axes)
    run([1, 2])
    before = compiled.compilations()
    run([3, 4])
    assert compiled.compilations() == before


@pytest.mark.parametrize("beam_size, message", [
    ((2, 3), r"beam_size=\(2, 3\): expected an int >= 1, or a sequence of 4 ints >= 1"),
    ((2, 0, 3, 4), r"beam_size\[1\]=0: expected an int >= 1"),
    ((2, 3.5, 3, 4), r"beam_size\[1\]=3.5: expected an int >= 1"),
    ((2, True, 3, 4), r"beam_size\[1\]=True: expected an int >= 1"),
    ("2334", r"beam_size='2334': expected an int >= 1, or a sequence of 4"),
    (0, r"beam_size=0: expected an int >= 1"),
    ((2, 2 ** 31, 3, 4), r"2147483648 rows, expected fewer than 2\*\*31"),
])
def test_bad_schedules_are_named(beam_size, message):
    compiled = oracle.compile_set(FIXED, 8)
    model = oracle.HashModel(8)
    with pytest.raises(DecodeInputError, match=message):
        sc.beam_search(compiled, model, batch_size=1, beam_size=beam_size)


def test_bad_beam_step_width_is_named():
    compiled = oracle.compile_set(FIXED, 8)
    state = compiled.init_beams(1, 2)
    with pytest.raises(DecodeInputError, match=r"beam_size=0: expected an int >= 1"):
        compiled.beam_step(state, jnp.zeros((1, 2, 8)), 0, beam_size=0)


def test_an_undeclared_carry_is_refused_when_a_later_step_keeps_more_beams():
    compiled = oracle.compile_set(FIXED, 8)
    model = oracle.HashModel(8)
    with pytest.raises(DecodeInputError, match="no declaration of which hold beams"):
        sc.beam_search(compiled, model, batch_size=1, beam_size=(1, 2, 2, 2),
                       carry=model.init_carry([1], 1))
