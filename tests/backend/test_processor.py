"""The logits-processor pair (`compiled.mask` / `compiled.advance`) against the oracle.

Rows walk random paths through the set, mostly along allowed tokens, now and
then taking a disallowed one (the row becomes invalid) and, with an end
token, ending early; at every step the masked logits must equal the oracle's
bit for bit (allowed logits kept, NaN and disallowed at SENTINEL_SCORE) and
the rows' valid / finished flags must match. Every layout kind, fixed-length
and variable-length sets, eager, under jax.jit, and with a traced step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import examples

from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError

BATCH = 16
# Random walks of BATCH rows per set (the programs compile on the first one).
WALKS = examples(2)


@functools.lru_cache(maxsize=None)
def make_set(kind: str):
    """(items, end_token) for kind fixed / ragged; the 'shared' kinds share
    suffixes, for minimize."""
    rng = np.random.default_rng({"fixed": 1, "ragged": 2, "shared": 3, "shared-ragged": 4}[kind])
    if kind == "fixed":
        return oracle.random_then_unary(rng, 30, 8), None
    if kind == "shared":
        return oracle.shared_suffix_set(rng, 30, 8), None
    if kind == "shared-ragged":
        return oracle.shared_suffix_ragged_set(rng, 8, 0), 0
    return oracle.ragged_then_unary(rng, 14, 8, end_token=0), 0


def random_logits(rng, shape) -> np.ndarray:
    """float32 logits with NaN, -inf and +inf sprinkled in."""
    x = rng.standard_normal(shape).astype(np.float32)
    special = rng.random(shape)
    x[special < 0.05] = np.nan
    x[(special >= 0.05) & (special < 0.1)] = -np.inf
    x[(special >= 0.1) & (special < 0.13)] = np.inf
    return x


def choose_tokens(rng, cset: oracle.ConstraintSet, rows: list) -> np.ndarray:
    """Per row: an allowed token (9 times in 10), else any token, some of
    them outside the vocabulary."""
    out = []
    for row in rows:
        allowed = (cset.end_token,) if row.finished else cset.allowed(row.prefix)
        if allowed and row.valid and rng.random() < 0.9:
            out.append(int(rng.choice(allowed)))
        else:
            out.append(int(rng.integers(-2, cset.vocab_size + 2)))
    return np.asarray(out, np.int32)


def walk_and_check(compiled, cset: oracle.ConstraintSet, rng, mask_fn, advance_fn, init_fn):
    """Random paths for BATCH rows through every step; mask and flags vs the oracle."""
    state = init_fn(BATCH)
    rows = [oracle.ProcessorRow() for _ in range(BATCH)]
    for step in range(compiled.max_length):
        logits = random_logits(rng, (BATCH, cset.vocab_size))
        got = np.asarray(mask_fn(logits, state, step))
        assert got.dtype == np.float32 and got.shape == (BATCH, cset.vocab_size)
        np.testing.assert_array_equal(got, oracle.mask(cset, logits, rows),
                                      err_msg=f"mask at step {step}")
        tokens = choose_tokens(rng, cset, rows)
        state = advance_fn(state, tokens, step)
        rows = oracle.advance(cset, rows, tokens)
        np.testing.assert_array_equal(np.asarray(state.valid), [r.valid for r in rows],
                                      err_msg=f"valid after step {step}")
        np.testing.assert_array_equal(np.asarray(state.finished), [r.finished for r in rows],
                                      err_msg=f"finished after step {step}")
    return rows


@pytest.mark.parametrize("kind, layout, minimize", [
    *[(kind, layout, False) for kind in ("fixed", "ragged") for layout in oracle.LAYOUTS],
    *[("shared", layout, True) for layout in ("csr", "unary", "dense_rows")],
    *[("shared-ragged", layout, True) for layout in ("near_unary", "csr")]])
def test_mask_and_advance_match_oracle(kind, layout, minimize):
    items, end_token = make_set(kind)
    compiled = oracle.compile_set(items, 8, layout, end_token, minimize)
    assert not minimize or any(s.explicit_targets for s in compiled.plan.steps)
    cset = oracle.ConstraintSet(items, 8, end_token)
    rng = np.random.default_rng([oracle.LAYOUTS.index(layout), len(kind)])
    finished_valid = 0
    for _ in range(WALKS):
        rows = walk_and_check(compiled, cset, rng, compiled.mask, compiled.advance,
                              compiled.init_processor)
        for row in rows:  # a row still valid at the end holds a member of the set
            if row.valid:
                assert row.prefix in cset.items
                finished_valid += 1
    assert finished_valid > 0


def test_mask_and_advance_under_jit_and_with_a_traced_step():
    items, end_token = make_set("ragged")
    compiled = oracle.compile_set(items, 8, "csr", end_token)
    cset = oracle.ConstraintSet(items, 8, end_token)
    plan = compiled.plan
    rng = np.random.default_rng(5)
    jit_mask = jax.jit(compiled.mask, static_argnums=2)
    jit_advance = jax.jit(compiled.advance, static_argnums=2)
    walk_and_check(compiled, cset, rng, jit_mask, jit_advance, compiled.init_processor)
    switch_mask = jax.jit(functools.partial(decode.mask, plan))
    switch_advance = jax.jit(functools.partial(decode.advance, plan))
    tables = compiled.lowered.device_tables
    for _ in range(3):
        walk_and_check(compiled, cset, rng,
                       lambda x, s, t: switch_mask(tables, x, s, jnp.int32(t)),
                       lambda s, tok, t: switch_advance(tables, s, tok, jnp.int32(t)),
                       compiled.init_processor)


def test_fixed_length_rows_end_valid_and_unfinished():
    """Without an end token a row that followed the set is valid after the
    last step and never 'finished'."""
    items = [(0, 1), (1, 0), (1, 2)]
    compiled = oracle.compile_set(items, 3)
    state = compiled.init_processor(3)
    for step, tokens in enumerate(([1, 1, 0], [0, 1, 1])):
        state = compiled.advance(state, np.asarray(tokens, np.int32), step)
    assert np.asarray(state.valid).tolist() == [True, False, True]
    assert not np.asarray(state.finished).any()


@pytest.mark.parametrize("end_token", [None, 0])
def test_past_the_end_a_traced_step_appends_nothing(end_token):
    """A traced step outside [0, max_length) used to run the last step
    again. Now: mask allows a finished row only the end token and other
    rows nothing; advance keeps a finished row on the end token and marks
    every other row invalid (no sequence of the set is that long)."""
    items = [(1, 2), (2, 1)] if end_token is None else [(1,), (1, 2)]
    compiled = oracle.compile_set(items, 3, end_token=end_token)
    plan, tables = compiled.plan, compiled.lowered.device_tables
    state = compiled.init_processor(2)
    walk = [[1, 2], [2, 1]] if end_token is None else [[1, 1], [0, 2]]  # row 0 ends, row 1 not
    for step, tokens in enumerate(walk):
        state = compiled.advance(state, np.asarray(tokens, np.int32), step)
    logits = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    traced_mask = jax.jit(functools.partial(decode.mask, plan))
    traced_advance = jax.jit(functools.partial(decode.advance, plan))
    for step in (plan.max_length, plan.max_length + 3, -1):
        masked = np.asarray(traced_mask(tables, logits, state, jnp.int32(step)))
        allowed = masked > decode.SENTINEL_SCORE
        want = [[False] * 3, [False] * 3]
        if end_token is not None:
            want[0][end_token] = True  # row 0 took the end token at step 1
        assert allowed.tolist() == want, step
        for token in range(3):
            moved = traced_advance(tables, state, jnp.full((2,), token, jnp.int32),
                                   jnp.int32(step))
            assert np.asarray(moved.valid).tolist() == [want[0][token], want[1][token]]


@pytest.mark.parametrize("step", [-1, 3, 1.0, True, "0", np.int64(3), np.bool_(True)])
def test_step_out_of_range_is_rejected(tiny_ragged_set, step):
    state = tiny_ragged_set.init_processor(2)
    with pytest.raises(DecodeInputError, match=r"step=.* must be an int in \[0, 3\)"):
        tiny_ragged_set.mask(np.zeros((2, 3), np.float32), state, step)
    with pytest.raises(DecodeInputError, match=r"step=.* must be an int in \[0, 3\)"):
        tiny_ragged_set.advance(state, np.zeros(2, np.int32), step)


def test_numpy_integer_steps_are_accepted(tiny_ragged_set):
    state = tiny_ragged_set.init_processor(2)
    py = tiny_ragged_set.mask(np.zeros((2, 3), np.float32), state, 0)
    np_step = tiny_ragged_set.mask(np.zeros((2, 3), np.float32), state, np.int32(0))
    np.testing.assert_array_equal(np.asarray(py), np.asarray(np_step))
    moved = tiny_ragged_set.advance(state, np.array([1, 1], np.int32), np.int64(0))
    assert bool(np.all(np.asarray(moved.valid)))


@pytest.mark.parametrize("logits, match", [
    (np.zeros((2, 2), np.float32), r"logits have shape \(2, 2\), expected \(2, 3\)"),
    (np.zeros((3, 3), np.float32), r"logits have shape \(3, 3\), expected \(2, 3\)"),
    (np.zeros((2, 1, 3), np.float32), r"logits have shape \(2, 1, 3\), expected \(2, 3\)"),
    (np.zeros((2, 3), np.int32), r"logits have dtype int32, expected a float"),
])
def test_bad_mask_logits_are_rejected(tiny_ragged_set, logits, match):
    with pytest.raises(DecodeInputError, match=match):
        tiny_ragged_set.mask(logits, tiny_ragged_set.init_processor(2), 0)


@pytest.mark.parametrize("tokens", [np.zeros(3, np.int32), np.zeros((2, 1), np.int32),
                                    np.zeros(2, np.float32), np.int32(1)])
def test_bad_advance_tokens_are_rejected(tiny_ragged_set, tokens):
    with pytest.raises(DecodeInputError, match=r"tokens have shape .* expected int of shape \(2,\)"):
        tiny_ragged_set.advance(tiny_ragged_set.init_processor(2), tokens, 0)


def test_lists_are_taken_as_arrays_and_ragged_ones_rejected(tiny_ragged_set):
    """Python lists of tokens and logits (`jnp.result_type` takes no list:
    a plain list of tokens raised jax's TypeError), the pair and the step
    processor alike."""
    state = tiny_ragged_set.init_processor(2)
    for pair in (tiny_ragged_set, tiny_ragged_set.processor(2)):
        moved = pair.advance(state, [1, 1], 0)
        np.testing.assert_array_equal(
            np.asarray(moved.node),
            np.asarray(tiny_ragged_set.advance(state, np.array([1, 1]), 0).node))
        np.testing.assert_array_equal(np.asarray(pair.mask([[0.0] * 3] * 2, state, 0)),
                                      np.asarray(tiny_ragged_set.mask(np.zeros((2, 3)), state, 0)))
        with pytest.raises(DecodeInputError, match=r"advance\(step=0\): tokens '\[1, \[2, 3\]\]' "
                                                   r"is not an array of numbers"):
            pair.advance(state, [1, [2, 3]], 0)
        with pytest.raises(DecodeInputError, match=r"logits .* is not an array of numbers"):
            pair.mask([[0.0] * 3, [0.0]], state, 0)


@pytest.mark.parametrize("batch", [0, -1, 2.0, True])
def test_bad_processor_batch_is_rejected(tiny_ragged_set, batch):
    with pytest.raises(DecodeInputError, match=r"batch_size=.*: expected an int >= 1"):
        tiny_ragged_set.init_processor(batch)


def test_a_state_from_another_set_allows_nothing_and_invalidates_its_row():
    """State ids out of range for the step (another compiled set's state, or
    a tampered one) used to be clamped by the gathers: the row stayed valid
    and allowed some other state's tokens, sequences outside the set."""
    import jax.numpy as jnp

    import static_compiler as sc

    big = sc.compile_constraints([(a, b, c) for a in range(5) for b in range(5)
                                  for c in range(5)], 5)
    small = sc.compile_constraints([(0, 1, 2), (1, 1, 1)], 5)
    state = big.init_processor(2)
    for t, tokens in enumerate([[4, 0], [4, 0]]):
        state = big.advance(state, jnp.array(tokens), t)
    assert np.asarray(state.node).tolist()[0] >= 2 and np.asarray(state.valid).all()
    for step in (2, jnp.int32(2)):  # static and traced steps
        masked = np.asarray(small.mask(jnp.zeros((2, 5)), state, step))
        assert (masked[0] == sc.SENTINEL_SCORE).all()  # state 24: not a state of `small`
        moved = small.advance(state, jnp.array([4, 2]), step)
        assert np.asarray(moved.valid).tolist() == [False, True]  # row 1: id 0 is in range
    negative = state._replace(node=jnp.array([-3, 0], jnp.int32))
    assert not bool(small.advance(negative, jnp.array([2, 2]), 2).valid[0])
    drafts = small.accept_drafts(state, jnp.array([[4], [2]]), 2)
    assert np.asarray(drafts[0]).tolist() == [0, 1]


def _random_state(compiled, rng, batch, step):
    """A state at `step`: rows walked along random members (some tokens off the set)."""
    state = compiled.init_processor(batch)
    for t in range(step):
        masked = np.asarray(compiled.mask(np.zeros((batch, compiled.vocab_size), np.float32),
                                          state, t))
        allowed = [np.flatnonzero(row > decode.SENTINEL_SCORE) for row in masked]
        tokens = np.asarray([int(rng.choice(a)) if a.size and rng.random() < 0.9
                             else int(rng.integers(-1, compiled.vocab_size + 1))
                             for a in allowed], np.int32)
        state = compiled.advance(state, tokens, t)
    return state


@pytest.mark.parametrize("kind, layout, with_subset", [
    ("fixed", "csr", False), ("fixed", "near_unary", True), ("ragged", "csr", True),
    ("ragged", "near_unary", False), ("fixed", "dense_rows", True), ("ragged", "unary", False)])
def test_step_processor_is_bit_identical_to_mask_and_advance(kind, layout, with_subset,
                                                            monkeypatch):
    """`compiled.processor(B)`: one program per step, bit-identical to
    `compiled.mask` / `advance` at every step, with and without a subset,
    and its fused advance_and_mask too; near_unary layers are searched by
    the unrolled binary search there (many exception states)."""
    import static_compiler as sc
    from static_compiler.backend import row_search

    monkeypatch.setattr(row_search, "BINARY_SEARCH_MIN", 0)  # the unrolled search, on small sets
    rng = np.random.default_rng([len(kind), len(layout), with_subset])
    items, end_token = make_set(kind)
    compiled = oracle.compile_set(items, 8, layout, end_token)
    kw = {}
    if with_subset:
        subs = [compiled.subset(rng.random(len(items)) < 0.5) for _ in range(2)]
        kw = dict(subset=sc.stack_subsets(subs), subset_index=np.array([0, 1, 1, 0, 1], np.int32))
    B = 5
    proc = compiled.processor(B, **kw)
    assert with_subset or compiled.processor(B) is proc
    for t in range(compiled.max_length):
        for _ in range(examples(1)):  # random states at step t
            state = _random_state(compiled, rng, B, t)
            logits = random_logits(rng, (B, compiled.vocab_size))
            tokens = np.asarray(rng.integers(-1, compiled.vocab_size + 1, B), np.int32)
            want = compiled.mask(logits, state, t, **kw)
            got = proc.mask(jnp.asarray(logits), state, t)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"step {t}")
            moved = proc.advance(state, jnp.asarray(tokens), t)
            for a, b in zip(moved, compiled.advance(state, tokens, t, **kw)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"step {t}")
            if t + 1 < compiled.max_length:
                nxt = random_logits(rng, (B, compiled.vocab_size))
                st, masked = proc.advance_and_mask(state, tokens, t, nxt)
                for a, b in zip(st, moved):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
                np.testing.assert_array_equal(np.asarray(masked),
                                              np.asarray(compiled.mask(nxt, moved, t + 1, **kw)))
    assert not row_search.BINARY_ROW_SEARCH.get()  # set only while tracing


def test_binary_row_search_matches_compare_all():
    """The unrolled binary search the processor traces equals searchsorted."""
    from static_compiler.backend import row_search
    rng = np.random.default_rng(0)
    for n in (1, 2, 65, 100, 1000):
        values = np.sort(rng.choice(5 * n, n, replace=False)).astype(np.int16)
        query = np.arange(-2, 5 * n + 2, dtype=np.int32)
        got = row_search.lower_bound(jnp.asarray(values), jnp.asarray(query), unrolled=True)
        np.testing.assert_array_equal(np.asarray(got), np.searchsorted(values, query))


def test_step_processor_rejects_bad_input_as_the_pair_does(tiny_ragged_set):
    proc = tiny_ragged_set.processor(2)
    state = proc.init_processor()
    for step in (-1, 3, 1.0, True, "0", np.int64(3)):
        with pytest.raises(DecodeInputError, match=r"step=.* must be an int in \[0, 3\)"):
            proc.mask(np.zeros((2, 3), np.float32), state, step)
        with pytest.raises(DecodeInputError, match=r"step=.* must be an int in \[0, 3\)"):
            proc.advance(state, np.zeros(2, np.int32), step)
    with pytest.raises(DecodeInputError, match=r"step=2 must be an int in \[0, 2\)"):
        proc.advance_and_mask(state, np.zeros(2, np.int32), 2, np.zeros((2, 3), np.float32))
    for logits, match in [
            (np.zeros((2, 2), np.float32), r"logits have shape \(2, 2\), expected \(2, 3\)"),
            (np.zeros((3, 3), np.float32), r"logits have shape \(3, 3\), expected \(2, 3\)"),
            (np.zeros((2, 3), np.int32), r"logits have dtype int32, expected a float")]:
        with pytest.raises(DecodeInputError, match=match):
            proc.mask(logits, state, 0)
        with pytest.raises(DecodeInputError, match=match):
            proc.advance_and_mask(state, np.zeros(2, np.int32), 0, logits)
    for tokens in (np.zeros(3, np.int32), np.zeros((2, 1), np.int32), np.zeros(2, np.float32),
                   np.int32(1)):
        with pytest.raises(DecodeInputError, match=r"tokens have shape .* expected int of shape"):
            proc.advance(state, tokens, 0)
    with pytest.raises(DecodeInputError, match=r"state has 3 rows: this processor is for "
                                               r"batch_size=2"):
        proc.mask(np.zeros((2, 3), np.float32), tiny_ragged_set.init_processor(3), 0)
    with pytest.raises(DecodeInputError, match=r"state fields"):
        proc.advance((jnp.zeros(2, jnp.int32), jnp.ones(3, bool), jnp.zeros(2, bool)),
                     np.zeros(2, np.int32), 0)
    for batch in (0, -1, 2.0, True):
        with pytest.raises(DecodeInputError, match=r"batch_size=.*: expected an int >= 1"):
            tiny_ragged_set.processor(batch)
    # numpy arrays and numpy integer steps work as in the pair
    np.testing.assert_array_equal(np.asarray(proc.mask(np.arange(6.).reshape(2, 3), state,
                                                       np.int32(0))),
                                  np.asarray(tiny_ragged_set.mask(np.arange(6.).reshape(2, 3),
                                                                  state, 0)))
