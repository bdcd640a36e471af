"""Packed runs (`kernels.pack_run`): the tables of a run of steps as one CSR
table, so a loop over the run compiles one gather program instead of a
lax.switch over each step's kernel.

The packed table must list exactly what each step's own kernel lists (rows,
tokens, targets, accepting states) for every state of every layout, and a
beam search must decode the same with packing on and off: both equal the
brute-force oracle, on the families of test_decode (every layout, fixed and
variable length, mixed layers, explicit targets).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import decode_and_check, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_decode import FAMILIES, check_family_example

from static_compiler.backend import decode, kernels, row_search
from static_compiler.backend.decode.step import (
    first_alone_for,
    run_inputs,
    run_live_bound,
    step_segments,
)


@pytest.fixture
def packing_off(monkeypatch):
    """Decode without packed runs (every run takes the lax.switch path)."""
    monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", -1)
    jax.clear_caches()
    yield
    jax.clear_caches()


@functools.partial(jax.jit, static_argnums=(0, 2))
def _rows_of(plan, tables, runs):
    """Per run of `runs` (tuples of steps), per step: (packed, packed
    accepting, own kernel, own accepting) for every state: the step's own
    kernel and the packed run. One program for all the runs."""
    return [_run_rows(plan, tables, steps) for steps in runs]


def _run_rows(plan, tables, steps):
    """`_rows_of` for one run (traced)."""
    packed = kernels.pack_run(plan, tables, steps)
    out = []
    for i, t in enumerate(steps):
        n = plan.steps[t].num_states if t < plan.depth else plan.steps[-1].num_next_states
        node = jnp.arange(n, dtype=jnp.int32)
        got, got_acc = kernels.packed_expand(packed, jnp.int32(i), node)
        if t < plan.depth:
            want = kernels.expand(plan.steps[t], tables[t], node)
            want_acc = kernels.accepts(plan.steps[t], tables[t], node)
        else:
            want = kernels.Candidates(*(jnp.zeros((n, 0), dt) for dt in (jnp.int32, jnp.int32, bool)))
            want_acc = jnp.ones(n, bool)
        out.append((got, got_acc, want, want_acc))
    return out


def _edges(c: kernels.Candidates) -> list:
    """Per state, its (token, next) pairs in slot order, valid slots only."""
    tokens, nxt, valid = (np.asarray(x) for x in c)
    return [list(zip(tokens[s][valid[s]].tolist(), nxt[s][valid[s]].tolist()))
            for s in range(tokens.shape[0])]


CASES = [  # (items maker, vocab, end token, layout, minimize)
    (lambda rng: oracle.random_set(rng, 60, 4, 16, skew=1.3), 16, None, "near_unary", False),
    (lambda rng: oracle.random_set(rng, 60, 4, 16, skew=1.3), 16, None, "csr", False),
    (lambda rng: oracle.random_then_unary(rng, 30, 8), 8, None, "unary", False),
    (lambda rng: oracle.random_ragged_set(rng, 40, 5, 9, end_token=0), 9, 0, "default", False),
    (lambda rng: oracle.random_ragged_set(rng, 40, 5, 9, end_token=0), 9, 0, "mixed_near_unary",
     False),
    (lambda rng: oracle.shared_suffix_set(rng, 20, 12), 12, None, "near_unary", True),
    (lambda rng: oracle.shared_suffix_ragged_set(rng, 12, 0), 12, 0, "csr", True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@settings(max_examples=examples(1), deadline=None)  # a compile per example
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_packed_table_lists_what_each_kernel_lists(case, seed):
    make, vocab, end, layout, minimize = CASES[case]
    compiled = oracle.compile_set(make(np.random.default_rng(seed)), vocab, layout, end,
                                  minimize=minimize)
    plan = compiled.plan
    steps = tuple(t for t in range(plan.max_length)
                  if t >= plan.depth or plan.steps[t].kind != "dense_rows")
    stretches = [steps[i:j] for i in range(len(steps)) for j in range(i + 1, len(steps) + 1)
                 if steps[j - 1] - steps[i] == j - 1 - i]  # consecutive steps
    # The longest stretches, and the last step alone (the extra one if any).
    runs = tuple(sorted(stretches, key=len, reverse=True)[:3] + [steps[-1:]])
    for run, rows in zip(runs, _rows_of(plan, compiled.lowered.device_tables, runs)):
        for t, (got, got_acc, want, want_acc) in zip(run, rows):
            assert _edges(got) == _edges(want), f"step {t} of run {run}"
            if end is not None:
                np.testing.assert_array_equal(np.asarray(got_acc), np.asarray(want_acc),
                                              err_msg=f"accepting, step {t} of run {run}")


def test_run_inputs_pack_only_small_runs_without_dense_rows(monkeypatch):
    rng = np.random.default_rng(0)
    items = oracle.random_set(rng, 60, 4, 16)
    compiled = oracle.compile_set(items, 16, "near_unary")
    plan, tables = compiled.plan, compiled.lowered.device_tables
    assert isinstance(run_inputs(plan, tables, None, (1, 2, 3))[0], kernels.PackedRun)
    assert run_inputs(plan, tables, None, (2,))[0] is tables  # one step: its own kernel
    entries = kernels.packed_entries(plan, tables, (1, 2, 3))
    assert entries == sum(plan.steps[t].num_states + 1 + tables[t]["tokens"].shape[0]
                          for t in (1, 2, 3))
    monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", entries - 1)
    assert run_inputs(plan, tables, None, (1, 2, 3))[0] is tables
    dense = oracle.compile_set(items, 16, "dense_rows")
    assert kernels.packed_entries(dense.plan, dense.lowered.device_tables, (1, 2)) is None


@pytest.mark.parametrize("family, layout", [(name, layout) for name, fam in FAMILIES.items()
                                            for layout in fam.layouts])
@settings(max_examples=examples(2), deadline=None,  # the first: knobs all 0
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # one setting for all
@given(data=st.data())
def test_beam_search_without_packing_matches_oracle(packing_off, family, layout, data):
    """test_decode's families decode through packed runs; here through the
    per-step lax.switch that large tables take: both equal the oracle."""
    check_family_example(family, layout, data)


@pytest.mark.parametrize("family, layout", [("skewed", "near_unary"), ("wide", "mixed_near_unary")])
@settings(max_examples=examples(2), deadline=None,  # the first: knobs all 0
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_near_unary_binary_search_matches_oracle(packing_off, monkeypatch, family, layout, data):
    """near_unary layers with more than COMPARE_ALL_MAX exception states find
    rows by row_search.lower_bound (only sets of 1e5+ states reach it): forced
    here on small sets, unpacked, the decode still equals the oracle."""
    monkeypatch.setattr(row_search, "COMPARE_ALL_MAX", 0)
    check_family_example(family, layout, data)


@pytest.mark.parametrize("minimize", [False, True])
def test_explicit_targets_decode_the_same_packed_and_not(minimize, monkeypatch):
    rng = np.random.default_rng(7)
    items = oracle.shared_suffix_ragged_set(rng, 12, 0)
    cset = oracle.ConstraintSet(items, 12, 0)
    model = oracle.HashModel(12, dup=40, nan=20)
    seeds = [3, 99]
    results = []
    for bound in (kernels.PACK_MAX_ENTRIES, -1):
        monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", bound)
        jax.clear_caches()
        compiled = oracle.compile_set(items, 12, "near_unary", 0, minimize=minimize)
        results.append(decode_and_check(cset, compiled, model, seeds, beam_size=7,
                                        tokens_per_beam=3))
    jax.clear_caches()
    for a, b in zip(*results):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_packable_steps_share_one_run_whatever_their_widths_and_live_bounds():
    """A small variable-length set in csr: without tables, steps split where
    the live-beam bound or the width changes; with them, one run (the model
    compiles once), and the search still equals the oracle."""
    rng = np.random.default_rng(3)
    items = oracle.random_ragged_set(rng, 30, 5, 9, end_token=0)
    compiled = oracle.compile_set(items, 9, "csr", 0)
    plan, tables = compiled.plan, compiled.lowered.device_tables
    live = decode.search.live_beam_bounds(plan, 12)
    caps = (None,) * plan.max_length
    assert len(set(live)) > 1
    assert len(step_segments(plan, caps, live, 12)) > 1
    assert step_segments(plan, caps, live, 12, tables) == (tuple(range(plan.max_length)),)
    assert run_live_bound(live, tuple(range(plan.max_length))) == max(live)
    cset = oracle.ConstraintSet(items, 9, 0)
    decode_and_check(cset, compiled, oracle.HashModel(9, dup=40), [5, 6], beam_size=12)


def test_a_step_with_another_cap_starts_a_new_run():
    rng = np.random.default_rng(4)
    compiled = oracle.compile_set(oracle.random_set(rng, 40, 4, 8), 8, "csr")
    plan, tables = compiled.plan, compiled.lowered.device_tables
    caps = (None, 2, 2, None)
    assert step_segments(plan, caps, (None,) * 4, 5, tables) == ((0,), (1, 2), (3,))


def test_step_zero_is_a_run_of_its_own_when_first_alone():
    """Over a ranked subset step 0 (one bit a candidate) and the listed
    steps after it are separate runs (`first_alone_for`); the rest as
    before."""
    rng = np.random.default_rng(4)
    compiled = oracle.compile_set(oracle.random_set(rng, 40, 4, 8), 8, "csr")
    plan, tables = compiled.plan, compiled.lowered.device_tables
    caps = (None,) * 4
    whole = step_segments(plan, caps, (None,) * 4, 5, tables)
    assert whole == (tuple(range(4)),)
    assert step_segments(plan, caps, (None,) * 4, 5, tables, first_alone=True) == \
        ((0,), (1, 2, 3))
    assert step_segments(plan, (None, 2, 2, None), (None,) * 4, 5, tables,
                         first_alone=True) == ((0,), (1, 2), (3,))
    assert first_alone_for(None) is False
