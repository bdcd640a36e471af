"""Speculative decoding (`compiled.accept_drafts`) against the oracle.

Rows start at every decoding position, valid, invalid or finished, reached by
random walks through the set; each row's draft follows the set for a chosen
number of tokens and then takes a disallowed one (every divergence position,
and drafts fully inside the set, which for variable-length sets take the end
token). For every draft length n = 1..max_length the accepted counts and the
flags of the new state must equal the oracle's (`oracle.advance` token by
token, stopping at the first disallowed token or after the end token), and
the node of every row must be the one `advance` reaches after exactly the
accepted tokens. Every layout kind, fixed-length and variable-length sets,
eager, under jax.jit with a static and with a traced step; bad input is
rejected with DecodeInputError.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from static_compiler.errors import DecodeInputError
from static_compiler.support.decode_state import ProcessorState

BATCH = 12
VOCAB = 8


@functools.lru_cache(maxsize=None)
def make_set(kind: str):
    """(items, end_token): 'fixed' / 'ragged' have a unary last layer; the
    'shared' kinds share suffixes (for minimize); 'long-ragged' has items of
    1..5 tokens (max_length 6)."""
    rng = np.random.default_rng({"fixed": 11, "ragged": 12, "shared": 13, "shared-ragged": 14,
                                 "long-ragged": 15}[kind])
    if kind == "fixed":
        return oracle.random_then_unary(rng, 30, VOCAB), None
    if kind == "shared":
        return oracle.shared_suffix_set(rng, 30, VOCAB), None
    if kind == "shared-ragged":
        return oracle.shared_suffix_ragged_set(rng, VOCAB, 0), 0
    if kind == "long-ragged":
        return oracle.random_ragged_set(rng, 20, 5, VOCAB, 0), 0
    return oracle.ragged_then_unary(rng, 14, VOCAB, end_token=0), 0


@functools.lru_cache(maxsize=None)
def compiled_set(kind: str, layout: str, minimize: bool = False):
    items, end_token = make_set(kind)
    return (oracle.compile_set(items, VOCAB, layout, end_token, minimize),
            oracle.ConstraintSet(items, VOCAB, end_token))


def allowed_after(cset: oracle.ConstraintSet, row: oracle.ProcessorRow) -> tuple:
    """Tokens `oracle.advance` keeps `row` valid with."""
    if not row.valid or (row.finished and cset.end_token is None):
        return ()
    return (cset.end_token,) if row.finished else cset.allowed(row.prefix)


def oracle_accept(cset: oracle.ConstraintSet, row: oracle.ProcessorRow, draft, step: int):
    """(accepted, row after them): the longest allowed prefix of `draft` from
    `row` at position `step`, nothing after the end token or past max_length."""
    accepted = 0
    for j, tok in enumerate(draft):
        if not row.valid or row.finished or step + j >= cset.max_length:
            break
        moved = oracle.advance(cset, [row], [tok])[0]
        if not moved.valid:
            break
        row, accepted = moved, accepted + 1
    return accepted, row


def pick(rng, cset, row, follow: bool) -> int:
    """An allowed token of `row` (the end token only now and then) when
    `follow` and there is one; else a token the row does not allow (any token
    when it allows all)."""
    allowed = allowed_after(cset, row)
    if follow and allowed:
        children = [t for t in allowed if t != cset.end_token or row.finished]
        if children and rng.random() < 0.8:
            return int(rng.choice(children))
        return int(rng.choice(allowed))
    others = [t for t in range(cset.vocab_size) if t not in allowed]
    return int(rng.choice(others or range(cset.vocab_size)))


def start_rows(compiled, cset, rng, step: int):
    """BATCH rows at position `step` (random walks, 1 token in 12 disallowed),
    row 0 forced invalid, row 1 forced finished: (state, oracle rows)."""
    state = compiled.init_processor(BATCH)
    rows = [oracle.ProcessorRow() for _ in range(BATCH)]
    for t in range(step):
        tokens = np.asarray([pick(rng, cset, r, rng.random() > 1 / 12) for r in rows], np.int32)
        state = compiled.advance(state, tokens, t)
        rows = oracle.advance(cset, rows, tokens)
    rows[0] = oracle.ProcessorRow(rows[0].prefix, False, False)
    rows[1] = oracle.ProcessorRow(rows[1].prefix, True, True)
    node, valid, finished = (np.array(f) for f in state)
    valid[0], finished[0], node[0] = False, False, 0
    valid[1], finished[1], node[1] = True, True, 0
    return ProcessorState(jnp.asarray(node), jnp.asarray(valid), jnp.asarray(finished)), rows


def make_drafts(cset, rng, rows, n: int) -> np.ndarray:
    """int32 (B, n): row b follows the set for b % (n + 1) tokens, then takes a
    disallowed token (b % (n + 1) == n: the whole draft follows the set), then
    random tokens."""
    drafts = np.zeros((len(rows), n), np.int32)
    for b, row in enumerate(rows):
        diverge = b % (n + 1)
        for j in range(n):
            tok = pick(rng, cset, row, j < diverge) if j <= diverge else int(rng.integers(VOCAB))
            drafts[b, j] = tok
            row = oracle.advance(cset, [row], [tok])[0]
    return drafts


def check_against_oracle(compiled, cset, rng, accept_fn, step: int, state, rows,
                         lengths=None):
    """For every draft length n in `lengths` (default 1..max_length): counts,
    flags and nodes of accept_fn's answer vs the oracle and vs `advance`
    along the draft."""
    L = compiled.max_length
    drafts = make_drafts(cset, rng, rows, L)
    reached = [state]  # reached[j]: state after the first j draft tokens (advance, whole batch)
    for j in range(L - step):
        reached.append(compiled.advance(reached[-1], drafts[:, j], step + j))
    for n in lengths or range(1, L + 1):
        expect = [oracle_accept(cset, row, drafts[b, :n], step) for b, row in enumerate(rows)]
        want = np.asarray([k for k, _ in expect], np.int32)
        accepted, new = accept_fn(state, drafts[:, :n], step)
        msg = f"step {step}, n {n}, drafts {drafts[:, :n].tolist()}"
        assert np.asarray(accepted).dtype == np.int32 and np.shape(accepted) == (BATCH,)
        np.testing.assert_array_equal(np.asarray(accepted), want, err_msg=msg)
        np.testing.assert_array_equal(np.asarray(new.valid), [r.valid for _, r in expect],
                                      err_msg=msg)
        np.testing.assert_array_equal(np.asarray(new.finished), [r.finished for _, r in expect],
                                      err_msg=msg)
        nodes = [np.asarray(reached[k].node)[b] for b, k in enumerate(want)]
        np.testing.assert_array_equal(np.asarray(new.node), nodes, err_msg=msg)
    return drafts


@pytest.mark.parametrize("kind, layout, minimize", [
    *[(kind, layout, False) for kind in ("fixed", "ragged") for layout in oracle.LAYOUTS],
    ("shared", "csr", True), ("shared-ragged", "near_unary", True),
    ("long-ragged", "default", False), ("long-ragged", "mixed_csr", False)])
def test_accept_drafts_matches_oracle(kind, layout, minimize):
    compiled, cset = compiled_set(kind, layout, minimize)
    rng = np.random.default_rng([oracle.LAYOUTS.index(layout), len(kind), minimize])
    full = ended = 0
    for step in range(compiled.max_length):
        state, rows = start_rows(compiled, cset, rng, step)
        drafts = check_against_oracle(compiled, cset, rng, compiled.accept_drafts, step,
                                      state, rows)
        for b, row in enumerate(rows):  # the cases the test means to reach are reached
            k, after = oracle_accept(cset, row, drafts[b], step)
            ended += after.finished and not row.finished
            full += k == compiled.max_length - step or (after.finished and not row.finished)
    assert full > 0
    assert ended > 0 or cset.end_token is None


def test_under_jit_with_a_static_and_a_traced_step():
    """One program per (step, n) with a static step, per n with a traced one:
    few lengths, to keep compiling short."""
    compiled, cset = compiled_set("ragged", "csr")
    L = compiled.max_length
    rng = np.random.default_rng(7)
    static = jax.jit(compiled.accept_drafts, static_argnums=2)
    traced = jax.jit(compiled.accept_drafts)
    for step in range(L):
        state, rows = start_rows(compiled, cset, rng, step)
        check_against_oracle(compiled, cset, rng, static, step, state, rows, [L])
        check_against_oracle(compiled, cset, rng, lambda s, d, t: traced(s, d, jnp.int32(t)),
                             step, state, rows, [1, L])


def test_positions_past_the_last_step_are_rejected():
    """A fixed-length row at the last position accepts one token at most; a
    traced step outside [0, max_length) accepts nothing and keeps the state."""
    compiled = oracle.compile_set([(1, 2), (1, 3)], 4)
    state = compiled.advance(compiled.init_processor(1), np.array([1], np.int32), 0)
    accepted, new = compiled.accept_drafts(state, np.array([[2, 1, 1]]), 1)
    assert np.asarray(accepted).tolist() == [1]
    assert np.asarray(new.valid).tolist() == [True] and not np.asarray(new.finished).any()
    traced = jax.jit(compiled.accept_drafts)
    root = compiled.init_processor(1)
    for step in (-1, 2, 2 ** 31 - 1):
        accepted, new = traced(root, np.array([[1, 2]]), jnp.int32(step))
        assert np.asarray(accepted).tolist() == [0]
        for got, want in zip(new, root):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_traced_drafts_outside_the_vocabulary_are_not_accepted():
    compiled = oracle.compile_set([(1, 2, 3)], 4)
    accept = jax.jit(compiled.accept_drafts, static_argnums=2)
    drafts = jnp.asarray([[1, 2, 3], [-1, 2, 3], [1, 4, 3], [1, 2, 2 ** 31 - 1], [1, 2, -4]],
                         jnp.int32)
    accepted, new = accept(compiled.init_processor(5), drafts, 0)
    assert np.asarray(accepted).tolist() == [3, 0, 1, 2, 2]
    assert np.asarray(new.valid).all()


def test_empty_drafts_and_lists_are_accepted():
    compiled = oracle.compile_set([(1, 2), (2, 1)], 3)
    state = compiled.init_processor(2)
    accepted, new = compiled.accept_drafts(state, np.zeros((2, 0), np.int64), 0)
    assert np.asarray(accepted).tolist() == [0, 0]
    accepted, _ = compiled.accept_drafts(state, [[1, 2], [2, 2]], np.int64(0))
    assert np.asarray(accepted).tolist() == [2, 1]


@functools.lru_cache(maxsize=None)
def hypothesis_setup():
    compiled, cset = compiled_set("ragged", "mixed_near_unary")
    return (compiled, cset, jax.jit(compiled.accept_drafts),
            jax.jit(compiled.advance, static_argnums=2))


def choices_to_tokens(cset, rows, choices):
    """Walks `rows` along choices (one int per row and position): choice c
    takes allowed token c when there is one, else the token c % V."""
    tokens = []
    for j in range(len(choices[0])):
        col = []
        for b, row in enumerate(rows):
            allowed = allowed_after(cset, row)
            c = choices[b][j]
            col.append(allowed[c] if c < len(allowed) else c % cset.vocab_size)
        tokens.append(col)
        rows = oracle.advance(cset, rows, col)
    return np.asarray(tokens, np.int32).T.reshape(len(rows), -1), rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_walks_and_drafts_with_a_traced_step(data):
    compiled, cset, accept, advance = hypothesis_setup()
    B, n = 3, 3
    step = data.draw(st.integers(0, compiled.max_length - 1), label="step")
    choice = st.integers(0, 9)
    prefix = data.draw(st.lists(st.lists(choice, min_size=step, max_size=step),
                                min_size=B, max_size=B), label="prefix choices")
    rows = [oracle.ProcessorRow() for _ in range(B)]
    state = compiled.init_processor(B)
    if step:
        tokens, rows = choices_to_tokens(cset, rows, prefix)
        for t in range(step):
            state = advance(state, tokens[:, t], t)
    draft_choices = data.draw(st.lists(st.lists(choice, min_size=n, max_size=n),
                                       min_size=B, max_size=B), label="draft choices")
    drafts, _ = choices_to_tokens(cset, rows, draft_choices)
    accepted, new = accept(state, drafts, jnp.int32(step))
    expect = [oracle_accept(cset, row, drafts[b], step) for b, row in enumerate(rows)]
    assert np.asarray(accepted).tolist() == [k for k, _ in expect]
    assert np.asarray(new.valid).tolist() == [r.valid for _, r in expect]
    assert np.asarray(new.finished).tolist() == [r.finished for _, r in expect]


# --------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("drafts, match", [
    (np.array([[1, 3], [1, 2]]), r"drafts\[0, 1\]=3 is not a token in \[0, 3\)"),
    (np.array([[1, 2], [-1, 2]]), r"drafts\[1, 0\]=-1 is not a token in \[0, 3\)"),
    (jnp.array([[1, 2], [1, 7]]), r"drafts\[1, 1\]=7 is not a token"),
    (np.array([[1, 2 ** 40]] * 2), r"drafts\[0, 1\]=1099511627776 is not a token"),
    (np.zeros((3, 2), np.int32), r"drafts have shape \(3, 2\) dtype int32, expected int of "
                                 r"shape \(2, n\)"),
    (np.zeros(2, np.int32), r"drafts have shape \(2,\) dtype int32, expected int of shape"),
    (np.zeros((2, 1, 1), np.int32), r"drafts have shape \(2, 1, 1\)"),
    (np.int32(1), r"drafts have shape \(\) dtype int32"),
    (np.zeros((2, 2), np.float32), r"drafts have shape \(2, 2\) dtype float32, expected int"),
    (np.zeros((2, 2), bool), r"drafts have shape \(2, 2\) dtype bool, expected int"),
    ([[1, 2], [1]], r"drafts=\[\[1, 2\], \[1\]\]: expected int of shape \(2, n\)"),
])
def test_bad_drafts_are_rejected(tiny_ragged_set, drafts, match):
    with pytest.raises(DecodeInputError, match=r"accept_drafts\(step=0\): " + match):
        tiny_ragged_set.accept_drafts(tiny_ragged_set.init_processor(2), drafts, 0)


def test_bad_traced_drafts_are_rejected(tiny_ragged_set):
    with pytest.raises(DecodeInputError, match=r"drafts have shape \(2, 2\) dtype float32"):
        jax.jit(tiny_ragged_set.accept_drafts, static_argnums=2)(tiny_ragged_set.init_processor(2),
                                                      jnp.zeros((2, 2), jnp.float32), 0)


@pytest.mark.parametrize("step", [-1, 3, 1.0, True, "0", None, np.int64(3), np.bool_(True),
                                  np.array(3), jnp.zeros((1,), jnp.int32)])
def test_step_out_of_range_is_rejected(tiny_ragged_set, step):
    with pytest.raises(DecodeInputError, match=r"accept_drafts: step=.* must be an int in "
                                               r"\[0, 3\) or a traced integer scalar"):
        tiny_ragged_set.accept_drafts(tiny_ragged_set.init_processor(2), np.ones((2, 1), np.int32),
                                      step)


@pytest.mark.parametrize("step", [jnp.int32(3), jnp.int32(-1)])
def test_a_device_step_out_of_range_accepts_nothing(tiny_ragged_set, step):
    """A jax scalar step is not read back to the host: out of range, it
    accepts nothing and keeps the state, as a traced one does."""
    state = tiny_ragged_set.init_processor(2)
    accepted, new_state = tiny_ragged_set.accept_drafts(state, np.ones((2, 1), np.int32), step)
    assert np.asarray(accepted).tolist() == [0, 0]
    for a, b in zip(new_state, state):
        np.testing.assert_array_equal(a, b)


def test_traced_float_step_is_rejected(tiny_ragged_set):
    accept = jax.jit(tiny_ragged_set.accept_drafts)
    with pytest.raises(DecodeInputError, match=r"step=.*float32.*must be an int in \[0, 3\)"):
        accept(tiny_ragged_set.init_processor(2), np.ones((2, 1), np.int32), jnp.float32(0))


@pytest.mark.parametrize("state, match", [
    ((jnp.zeros(2, jnp.int32), jnp.ones(2, bool)), r"state is a tuple, expected a tuple of 3"),
    (ProcessorState(jnp.zeros(2, jnp.int32), jnp.ones(3, bool), jnp.zeros(2, bool)),
     r"state fields .* have shapes \[\(2,\), \(3,\), \(2,\)\], expected one shape \(batch,\)"),
    (ProcessorState(jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 1), bool),
                    jnp.zeros((2, 1), bool)), r"have shapes \[\(2, 1\), .*expected one"),
])
def test_bad_state_is_rejected(tiny_ragged_set, state, match):
    with pytest.raises(DecodeInputError, match=r"accept_drafts\(step=0\): .*" + match):
        tiny_ragged_set.accept_drafts(state, np.ones((2, 1), np.int32), 0)
