"""Compile cost of long sets: the first call of a beam search on a
set of length L compiled in time quadratic in L, because a run of steps
that cannot be packed read its candidates through a `lax.switch` with one
branch per step, and XLA hands a conditional's operands (every step's
tables) to every branch. Steps with the same `StepPlan` and table shapes
now share one kernel (`kernels.GroupedRun`): the switch has a branch per
distinct kernel, so the program no longer grows with L.

The checks here are structural (the lowered program's size, the number of
groups), not timings; and grouped decoding equals the per-step switch and
the brute-force oracle, bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import assert_matches, decode_and_check

import static_compiler as sc
from static_compiler.backend import decode, kernels
from static_compiler.backend.decode import search
from static_compiler.backend.decode.step import run_inputs, step_segments

V, M = 4, 60


@functools.lru_cache(maxsize=None)
def issue_set(length: int, num_items: int = 200):
    """The issue's set: random items over V = 4 (a few dense_rows layers,
    then a long tail of equal unary layers)."""
    items = np.random.default_rng(0).integers(0, V, size=(num_items, length))
    return sc.compile_constraints(items, vocab_size=V)


def zeros_model(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (V,), jnp.float32), carry


def lowered_search(compiled) -> str:
    fn = jax.jit(lambda t: decode.beam_search(compiled.plan, t, zeros_model, batch_size=1,
                                              beam_size=M))
    return fn.lower(compiled.lowered.device_tables).as_text()


def regions(text: str) -> int:
    """Regions of a lowered program (switch branches, loop bodies and
    conditions): each ends with one `stablehlo.return`."""
    return text.count("stablehlo.return")


def test_the_program_does_not_grow_with_the_length():
    """L = 32 and L = 128: the same few kernels; before, the lowered text
    grew ~3x (one switch branch per step) and compile time ~L^2."""
    short, long = issue_set(32), issue_set(128)
    assert long.max_length == 4 * short.max_length
    a, b = lowered_search(short), lowered_search(long)
    assert len(b) < 1.3 * len(a), (len(a), len(b))
    assert regions(b) <= regions(a) + 2 and regions(b) < 20, (regions(a), regions(b))


def test_a_long_unpackable_run_groups_into_few_kernels():
    """The issue's run (dense_rows steps, never packed, then the unary tail)
    switches over its distinct kernels: fewer than 12 groups at any L."""
    for length in (32, 256):
        compiled = issue_set(length)
        plan, tables = compiled.plan, compiled.lowered.device_tables
        caps = (None,) * plan.max_length
        live = decode.search.live_beam_bounds(plan, M)
        runs = step_segments(plan, caps, live, M, tables)
        longest = max(runs, key=len)
        assert len(longest) > length - 10
        grouped, _ = run_inputs(plan, tables, None, longest)
        assert isinstance(grouped, kernels.GroupedRun)
        assert len(grouped.steps) < 12, grouped.steps
        assert sorted(t for g in grouped.steps for t in g) == list(longest)


def test_groups_respect_the_stack_bound(monkeypatch):
    compiled = issue_set(64)
    plan, tables = compiled.plan, compiled.lowered.device_tables
    run = tuple(range(10, 40))  # unary steps, 200 entries each
    assert len(kernels.run_groups(plan, tables, run)) == 1
    groups = kernels.run_groups(plan, tables, run, limit=1000)
    assert [len(g) for g in groups] == [5] + [1] * 25  # 1000 entries in all, then alone
    assert kernels.group_run(plan, tables, run, limit=-1) is None  # all alone: no grouping


# ---------------------------------------------------------------------------
# Grouped decoding == the per-step switch == the oracle

def tail_set(rng, num_items: int, length: int, vocab: int, prefix: int = 3, end_token=None):
    """Random prefixes, then long random tails: deep layers of equal shape.
    With an end token, some items also end early (accepting states)."""
    tokens = np.array([t for t in range(vocab) if t != end_token])
    rows = [tuple(int(x) for x in rng.choice(tokens, size=length)) for _ in range(num_items)]
    if end_token is not None:
        rows += [r[:prefix + 2] for r in rows[:5]] + [r[:length - 2] for r in rows[5:9]]
    return rows


@pytest.fixture
def per_step_switch(monkeypatch):
    """Neither packed runs nor grouped kernels: every run's switch over its steps."""
    def set_bounds(pack: int, stack: int):
        monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", pack)
        monkeypatch.setattr(kernels, "STACK_MAX_ENTRIES", stack)
        jax.clear_caches()
        search._beam_search.clear_cache()
        search._sample.clear_cache()
    yield set_bounds
    jax.clear_caches()
    search._beam_search.clear_cache()
    search._sample.clear_cache()


def grouped_runs(compiled) -> int:
    plan, tables = compiled.plan, compiled.lowered.device_tables
    runs = step_segments(plan, (None,) * plan.max_length, (None,) * plan.max_length, 5, tables)
    return sum(isinstance(run_inputs(plan, tables, None, r)[0], kernels.GroupedRun)
               for r in runs if len(r) > 1)


def slow(*cases) -> list:
    """`cases` as parameters marked slow: the rest of a matrix whose CI cases
    already reach each layout's grouped kernel (and, in this file's tests
    together, grouped runs with and without an end token)."""
    return [pytest.param(*case, marks=pytest.mark.slow) for case in cases]


@pytest.mark.parametrize("layout, end_token", [
    ("csr", 0), ("near_unary", None), ("unary", None), ("dense_rows", 0), ("mixed_csr", None),
    *slow(("csr", None), ("dense_rows", None), ("near_unary", 0))])
def test_grouped_runs_match_the_oracle(per_step_switch, layout, end_token):
    rng = np.random.default_rng(len(layout) + (end_token or 0))
    vocab = 6
    items = tail_set(rng, 24, 12, vocab, end_token=end_token)
    per_step_switch(-1, kernels.STACK_MAX_ENTRIES)  # no packing: the runs take the switch
    compiled = oracle.compile_set(items, vocab, layout, end_token)
    assert grouped_runs(compiled) > 0, layout
    decode_and_check(oracle.ConstraintSet(items, vocab, end_token), compiled,
                     oracle.HashModel(vocab, dup=40, nan=20), [3, 77], beam_size=5,
                     tokens_per_beam=2)


@pytest.mark.parametrize("layout, end_token", [("near_unary", 0), *slow(("mixed_csr", None))])
def test_grouped_runs_decode_as_the_per_step_switch(per_step_switch, layout, end_token):
    """Bit for bit, beam search and sampling, grouped and not."""
    rng = np.random.default_rng(5)
    vocab = 6
    items = tail_set(rng, 24, 8, vocab, end_token=end_token)
    model = oracle.HashModel(vocab, dup=40, nan=20)
    results = []
    for stack in (kernels.STACK_MAX_ENTRIES, -1):
        per_step_switch(-1, stack)
        compiled = oracle.compile_set(items, vocab, layout, end_token)
        assert (grouped_runs(compiled) > 0) == (stack > 0), layout
        results.append(sc.beam_search(compiled, model, batch_size=2, beam_size=5,
                                      carry=model.init_carry([3, 77], 5),
                                      carry_axes=model.carry_axes))
        results.append(sc.sample(compiled, model, jax.random.PRNGKey(4), batch_size=2,
                                 carry=model.init_carry([5, 6], 1)))
    for a, b in zip(results[:2], results[2:]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("layout, end_token", [("csr", None), *slow(("dense_rows", 0))])
def test_grouped_runs_with_subsets_match_the_oracle(per_step_switch, layout, end_token):
    rng = np.random.default_rng(9)
    vocab = 6
    items = tail_set(rng, 24, 12, vocab, end_token=end_token)
    model = oracle.HashModel(vocab, dup=40)
    per_step_switch(-1, kernels.STACK_MAX_ENTRIES)
    compiled = oracle.compile_set(items, vocab, layout, end_token)
    assert grouped_runs(compiled) > 0
    masks = [rng.random(len(items)) < 0.5, np.ones(len(items), bool)]
    stacked = sc.stack_subsets([compiled.subset(m) for m in masks])
    index = np.array([0, 1, 0])
    seeds = [11, 12, 13]
    got = sc.beam_search(compiled, model, batch_size=3, beam_size=5,
                         carry=model.init_carry(seeds, 5), carry_axes=model.carry_axes,
                         subset=stacked, subset_index=index)
    for b, r in enumerate(index):
        chosen = [items[i] for i in np.flatnonzero(masks[r])]
        want = oracle.beam_search(oracle.ConstraintSet(chosen, vocab, end_token), model,
                                  [seeds[b]], 5)
        pad = compiled.max_length - want.tokens.shape[-1]
        want = oracle.Result(np.pad(want.tokens, ((0, 0), (0, 0), (0, pad)),
                                    constant_values=sc.PAD_TOKEN),
                             want.scores, want.valid, want.lengths)
        row = jax.tree_util.tree_map(lambda x: np.asarray(x)[b:b + 1], got)
        assert_matches(row, want, f"row {b}, subset {r}")


def test_beam_step_switch_with_grouped_runs_matches_the_oracle():
    """The exported step (traced step index) over a long dense_rows set:
    its one run is never packed, so it switches over grouped kernels."""
    rng = np.random.default_rng(21)
    vocab = 5
    items = tail_set(rng, 20, 16, vocab, end_token=0)
    compiled = oracle.compile_set(items, vocab, "dense_rows", 0)
    plan, tables = compiled.plan, compiled.lowered.device_tables
    runs = step_segments(plan, (None,) * plan.max_length, (None,) * plan.max_length, 4, tables)
    assert any(isinstance(run_inputs(plan, tables, None, r, kernels.PACK_MAX_ENTRIES)[0],
                          kernels.GroupedRun) for r in runs if len(r) > 1)
    model = oracle.HashModel(vocab, nan=30, dup=40)
    step_fn = jax.jit(functools.partial(decode.beam_step, plan, tokens_per_beam=2))
    seeds = [1, 2]
    state = decode.init_beam_state(plan, 2, 4)
    carry = model.init_carry(seeds, 4)
    for t in range(compiled.max_length):
        logits, carry = model(state.last_tokens, t, carry)
        state = step_fn(tables, state, logits, jnp.int32(t))
        carry = dict(carry, h=jnp.take_along_axis(carry["h"], state.parent, axis=1))
    assert_matches(decode.finalize(state),
                   oracle.beam_search(oracle.ConstraintSet(items, vocab, 0), model, seeds, 4, 2))


@pytest.mark.parametrize("layout, end_token", [("near_unary", None), *slow(("csr", 0))])
def test_grouped_mask_and_advance_switch_equal_the_static_steps(layout, end_token):
    """The exported processor pair (traced step) over a long set groups its
    steps, and equals `mask` / `advance` at the static steps (each step's own
    kernel), with and without a subset."""
    rng = np.random.default_rng(17)
    vocab = 6
    items = tail_set(rng, 20, 8, vocab, end_token=end_token)
    compiled = oracle.compile_set(items, vocab, layout, end_token)
    plan, tables = compiled.plan, compiled.lowered.device_tables
    assert kernels.group_run(plan, tables, tuple(range(plan.max_length)),
                             kernels.PACK_MAX_ENTRIES) is not None
    chosen = np.zeros(len(items), bool)
    chosen[[0, 3, 7]] = True
    live = decode.live.subset_live_mask(compiled.subset(chosen), compiled.fingerprint, None, 3,
                                        "test")
    switch_mask = jax.jit(functools.partial(decode.mask, plan))
    switch_advance = jax.jit(functools.partial(decode.advance, plan))
    walk = [items[i] + (end_token,) * (plan.max_length - len(items[i]))
            if end_token is not None else items[i] for i in (0, 7, len(items) - 1)]
    for subset in (None, live):
        state = decode.init_processor_state(3)
        for t in range(plan.max_length):
            logits = jnp.asarray(rng.normal(size=(3, vocab)), jnp.float32)
            got = switch_mask(tables, logits, state, jnp.int32(t), subset)
            want = decode.mask(plan, tables, logits, state, t, subset)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            tokens = jnp.asarray([w[t] for w in walk], jnp.int32)
            moved = switch_advance(tables, state, tokens, jnp.int32(t), subset)
            want = decode.advance(plan, tables, state, tokens, t, subset)
            for x, y in zip(moved, want):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
            state = want
        # every row followed an item: valid without a subset; with it, the last row is out
        want_valid = [True, True, subset is None]
        assert np.asarray(state.valid).tolist() == want_valid


def test_the_exported_switches_do_not_grow_with_the_length():
    """`beam_step` and `mask` at a traced step (the switch path of the
    exported modules): the same few kernels at L = 32 and L = 128."""
    def texts(compiled):
        plan, tables = compiled.plan, compiled.lowered.device_tables
        state = decode.init_beam_state(plan, 1, 8)
        pstate = decode.init_processor_state(2)
        step = jax.jit(lambda t, s, x, i: decode.beam_step(plan, t, s, x, i)).lower(
            tables, state, jnp.zeros((1, 8, V)), jnp.int32(3)).as_text()
        mask = jax.jit(lambda t, x, s, i: decode.mask(plan, t, x, s, i)).lower(
            tables, jnp.zeros((2, V)), pstate, jnp.int32(3)).as_text()
        return step, mask
    for a, b in zip(texts(issue_set(32)), texts(issue_set(128))):
        assert len(b) < 1.3 * len(a), (len(a), len(b))
        assert regions(b) <= regions(a) + 2, (regions(a), regions(b))
