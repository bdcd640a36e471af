"""Beam search and greedy decoding against the brute-force oracle (tests/oracle.py).

Every result must equal the oracle's: tokens, valid flags and lengths
bit-for-bit, scores within 1e-5, for every layout kind. Compiles are the cost
(about a second each on CPU), so each test fixes one trie shape, batch, beam
count and tokens_per_beam, and hypothesis varies what does not change the
compiled program: the set's tokens (`oracle.relabel` keeps the trie shape),
the batch rows' seeds and the logits' special values (NaN, +-inf, ties,
huge), which the test model reads from `carry`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import assert_matches, decode_and_check
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError
from static_compiler.frontend import build_automaton
from static_compiler.ir import LAYOUT_KINDS

LAYOUTS = oracle.LAYOUTS
compile_set = oracle.compile_set


# --------------------------------------------------------------------------
# The oracle against itself (no jax)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), ragged=st.booleans())
def test_oracle_beam_search_is_exhaustive_when_beams_cover_the_set(seed, ragged):
    """With beams >= items and no pruning, beam search returns every item
    whose tokens are all valid, with the independently summed scores."""
    rng = np.random.default_rng(seed)
    if ragged:
        items = oracle.random_ragged_set(rng, 8, 4, 6, end_token=2)
        cset = oracle.ConstraintSet(items, 6, end_token=2)
    else:
        cset = oracle.ConstraintSet(oracle.random_set(rng, 10, 3, 5), 5)
    model = oracle.HashModel(cset.vocab_size, nan=20, neginf=20, dup=30, zero_row=30)
    row_seed = int(rng.integers(2 ** 32))
    res = oracle.beam_search(cset, model, [row_seed], beam_size=len(cset.items) + 3)
    expected = oracle.sequence_scores(cset, model, row_seed)
    got = {tuple(res.tokens[0, j, :res.lengths[0, j]]): res.scores[0, j]
           for j in np.flatnonzero(res.valid[0])}
    assert got.keys() == expected.keys()
    for item, score in expected.items():
        assert got[item] == score


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_oracle_greedy_equals_one_beam(seed):
    rng = np.random.default_rng(seed)
    cset = oracle.ConstraintSet(oracle.random_ragged_set(rng, 10, 4, 6, end_token=5), 6, 5)
    model = oracle.HashModel(6, nan=30, neginf=30, dup=40, zero_row=40, posinf_row=20)
    seeds = rng.integers(0, 2 ** 32, size=3)
    a, b = oracle.greedy(cset, model, seeds), oracle.beam_search(cset, model, seeds, 1)
    for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b)):
        np.testing.assert_array_equal(x, y)


def test_log_softmax_matches_float64_and_special_values():
    """decode.logprobs.safe_log_softmax vs a float64 reference: -inf exactly where the
    semantics say, finite values within 2e-6, never NaN."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 37)) * 4).astype(np.float32)
    x[1:8][rng.random((7, 37)) < 0.3] = np.nan
    x[8:16][rng.random((8, 37)) < 0.3] = -np.inf
    x[16:24][rng.random((8, 37)) < 0.1] = np.inf
    x[24] = np.nan
    x[25] = -np.inf
    x[26] = np.inf
    x[27] = 0.0
    x[28, :3] = [np.inf, np.nan, -np.inf]
    got = np.asarray(decode.logprobs.safe_log_softmax(x))
    assert not np.isnan(got).any()
    ref = np.full(x.shape, -np.inf)
    for r, row in enumerate(x.astype(np.float64)):
        row = np.where(np.isnan(row), -np.inf, row)
        if (row == np.inf).any():
            ref[r] = np.where(row == np.inf, -np.log((row == np.inf).sum()), -np.inf)
        elif (row > -np.inf).any():
            m = row.max()
            ref[r] = row - (m + np.log(np.exp(row - m).sum()))
    np.testing.assert_array_equal(got == -np.inf, ref == -np.inf)
    finite = ref > -np.inf
    np.testing.assert_allclose(got[finite], ref[finite], rtol=0, atol=2e-6)
    np.testing.assert_allclose(oracle.log_softmax32(x)[finite], ref[finite], rtol=0, atol=2e-6)


@pytest.mark.parametrize("V", [1, 15, 31, 32, 37, 48, 100, 2048])
def test_row_max_and_any_fold_to_the_reductions(V):
    """logprobs.row_max / row_any (halves combined elementwise, so constant
    logits fold cheaply) give jnp.max / jnp.any exactly, odd widths included."""
    from static_compiler.backend.decode.logprobs import row_any, row_max
    rng = np.random.default_rng(V)
    x = (rng.standard_normal((5, 3, V)) * 4).astype(np.float32)
    x[0] = -np.inf
    x[1][rng.random((3, V)) < 0.2] = np.inf
    x[2][rng.random((3, V)) < 0.5] = -np.inf
    got = np.asarray(jax.jit(row_max)(x))
    np.testing.assert_array_equal(got, x.max(axis=-1, keepdims=True))
    flags = x == np.inf
    np.testing.assert_array_equal(np.asarray(jax.jit(row_any)(flags)),
                                  flags.any(axis=-1, keepdims=True))


@pytest.mark.parametrize("N", [1, 2, 3, 5, 8, 9, 100, 4097])
def test_lower_bound_is_searchsorted_left(N):
    """row_search.lower_bound (the near_unary exception search on long lists)
    counts the entries below each query exactly as np.searchsorted(left),
    duplicates, the ends and values outside the list included."""
    from static_compiler.backend.row_search import lower_bound
    rng = np.random.default_rng(N)
    values = np.sort(rng.integers(0, 3 * N, N)).astype(np.int32)
    queries = np.concatenate([values, values - 1, values + 1, [-5, 3 * N + 5],
                              rng.integers(-2, 3 * N + 2, 64)]).astype(np.int32).reshape(1, -1)
    np.testing.assert_array_equal(np.asarray(jax.jit(lower_bound)(values, queries)),
                                  np.searchsorted(values, queries, side="left"))

# --------------------------------------------------------------------------
# Fixed trie shapes, every layout, hypothesis over tokens, seeds and logits


@dataclasses.dataclass(frozen=True)
class Family:
    """A trie shape and a decoding configuration: one compiled program per layout."""

    vocab_size: int
    make: object  # rng -> list of sequences (the shape; relabeled per example)
    batch: int
    beams: int
    tokens_per_beam: Optional[int] = None
    end_token: Optional[int] = None
    start_token: int = 0
    layouts: tuple = LAYOUTS  # the layouts CI runs (the slow test runs all)


def _wide_layer(rng):
    """Layer 1: state (0,) has all V = 6 children, the other states one each."""
    return [(0, t, 1) for t in range(6)] + [(s, 2, 3) for s in range(1, 5)] + [(5, 0, 0)]


FAMILIES = {
    "random": Family(8, lambda rng: oracle.random_then_unary(rng, 30, 8), batch=2, beams=6,
                     layouts=("dense_rows", "unary", "default")),
    "ragged": Family(8, lambda rng: oracle.ragged_then_unary(rng, 14, 8, end_token=0), batch=2,
                     beams=5, tokens_per_beam=2, end_token=0),
    "skewed": Family(16, lambda rng: oracle.random_set(rng, 60, 3, 16, skew=1.3), batch=3,
                     beams=70, tokens_per_beam=3, start_token=7,
                     layouts=("near_unary", "mixed_csr", "default")),
    "wide": Family(6, _wide_layer, batch=4, beams=9, layouts=("csr", "mixed_near_unary")),
}


@functools.lru_cache(maxsize=None)
def family_shape(name: str):
    """The frontend automaton of a family (fixed seed): its trie shape."""
    fam = FAMILIES[name]
    return build_automaton(fam.make(np.random.default_rng(1234)), fam.vocab_size,
                           end_token=fam.end_token)


knobs_strategy = st.fixed_dictionaries({
    "nan": st.sampled_from([0, 0, 30, 100]), "neginf": st.sampled_from([0, 30, 100]),
    "dup": st.sampled_from([0, 40, 56]), "zero_row": st.sampled_from([0, 0, 60, 256]),
    "posinf_row": st.sampled_from([0, 0, 40]), "huge_row": st.sampled_from([0, 0, 40])})


def check_family_example(family: str, layout: str, data):
    fam = FAMILIES[family]
    knobs = data.draw(knobs_strategy, label="knobs")
    if knobs["zero_row"] == 256:
        knobs["posinf_row"] = knobs["huge_row"] = 0
    model = oracle.HashModel(fam.vocab_size, **knobs)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="set seed"))
    items = oracle.relabel(family_shape(family), rng)
    seeds = data.draw(st.lists(st.integers(0, 2 ** 32 - 1), min_size=fam.batch,
                               max_size=fam.batch), label="row seeds")
    compiled = compile_set(items, fam.vocab_size, layout, fam.end_token)
    cset = oracle.ConstraintSet(items, fam.vocab_size, fam.end_token)
    decode_and_check(cset, compiled, model, seeds, fam.beams, fam.tokens_per_beam,
                     fam.start_token)


@pytest.mark.parametrize("family, layout", [(name, layout) for name, fam in FAMILIES.items()
                                            for layout in fam.layouts])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_beam_search_matches_oracle(family, layout, data):
    check_family_example(family, layout, data)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_beam_search_matches_oracle_every_layout_many_examples(family, layout, data):
    check_family_example(family, layout, data)


def test_every_layout_kind_is_exercised():
    """The CI families reach each kernel, with and without an end token:
    every kind is chosen for some layer under its forced pipeline, and mixed
    csr and near_unary layers under the mixed one."""
    seen = set()
    for name, fam in FAMILIES.items():
        items = list(family_shape(name).sequences())
        for layout in fam.layouts:
            steps = compile_set(items, fam.vocab_size, layout, fam.end_token).plan.steps
            seen |= {(s.kind, fam.end_token is not None) for s in steps if s.kind == layout}
            seen |= {("mixed_" + s.kind, fam.end_token is not None) for s in steps
                     if layout == "mixed_" + s.kind and s.light_k}
    kinds = set(LAYOUT_KINDS) | {"mixed_csr", "mixed_near_unary"}
    assert seen == {(kind, ragged) for kind in kinds for ragged in (False, True)}


GRID = [(1, 1, None, "dense_rows"), (4, 70, 30, "csr")]
GRID_SLOW = [(3, 13, 1, "near_unary"), (1, 2, 5, "default"), (2, 70, None, "unary"),
             (4, 3, 2, "dense_rows"), (2, 64, 8, "csr"), (3, 1, 1, "near_unary")]


@pytest.mark.parametrize("batch, beams, tokens_per_beam, layout",
                         GRID + [pytest.param(*g, marks=pytest.mark.slow) for g in GRID_SLOW])
def test_batch_and_beam_sizes(batch, beams, tokens_per_beam, layout):
    model = oracle.HashModel(8, nan=20, neginf=20, dup=40, zero_row=30)
    rng = np.random.default_rng(batch * 1000 + beams)
    for _ in range(4):
        items = oracle.relabel(family_shape("random"), rng)
        compiled = compile_set(items, 8, layout)
        seeds = rng.integers(0, 2 ** 32, size=batch)
        decode_and_check(oracle.ConstraintSet(items, 8), compiled, model, seeds, beams,
                         tokens_per_beam)


MINIMIZED = {"fixed": (lambda rng: oracle.shared_suffix_set(rng, 30, 8), None),
             "ragged": (lambda rng: oracle.shared_suffix_ragged_set(rng, 8, 0), 0)}


MINIMIZED_EXPLICIT = [("fixed", "csr"), ("fixed", "unary"), ("ragged", "near_unary"),
                      ("ragged", "dense_rows")]  # each kernel reads explicit targets
MINIMIZED_CI = [("ragged", "near_unary")]  # test_processor covers the other kernels' targets


@pytest.mark.parametrize("kind, layout", MINIMIZED_CI + [
    pytest.param(k, lay, marks=pytest.mark.slow) for k in MINIMIZED for lay in LAYOUTS
    if (k, lay) not in MINIMIZED_CI])
def test_minimized_sets_with_explicit_targets(kind, layout):
    """After `minimize`, states are shared and targets explicit: every
    kernel's explicit-target path (dense next table, sliced targets, unary
    targets) must still decode the same set."""
    make, end = MINIMIZED[kind]
    items = make(np.random.default_rng(31))
    compiled = compile_set(items, 8, layout, end, minimize=True)
    explicit = {s.kind for s in compiled.plan.steps if s.explicit_targets}
    assert explicit and ((kind, layout) not in MINIMIZED_EXPLICIT or layout in explicit), \
        compiled.plan.steps
    cset = oracle.ConstraintSet(items, 8, end)
    model = oracle.HashModel(8, nan=20, neginf=20, dup=40, zero_row=40)
    for seeds in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        decode_and_check(cset, compiled, model, seeds, beam_size=8, tokens_per_beam=3)


# --------------------------------------------------------------------------
# Adversarial sets and logits


@pytest.mark.parametrize("layout", ["default", pytest.param("csr", marks=pytest.mark.slow)])
def test_one_item_more_beams_than_items(layout):
    item = (2, 0, 1)
    cset = oracle.ConstraintSet([item], 3)
    got = decode_and_check(cset, compile_set([item], 3, layout), oracle.HashModel(3, dup=60),
                           [5, 6], beam_size=4)
    assert np.asarray(got.valid).tolist() == [[True, False, False, False]] * 2
    assert np.asarray(got.tokens)[:, 0].tolist() == [list(item)] * 2
    assert (np.asarray(got.tokens)[:, 1:] == sc.PAD_TOKEN).all()
    assert (np.asarray(got.scores)[:, 1:] == sc.SENTINEL_SCORE).all()


SMALL_SETS = {
    "V=2,L=1": ([(0,), (1,)], 2, 3, None),           # beams > items
    "V=2,all": (oracle.full_product(2, 3), 2, 3, 1),  # every sequence, one token per beam
    "L=1": ([(1,), (3,), (4,)], 5, 5, None),
}


@pytest.mark.parametrize("name, layout", [
    ("V=2,L=1", "default"), ("V=2,all", "csr"), ("L=1", "default"),
    *[pytest.param(n, lay, marks=pytest.mark.slow)
      for n in SMALL_SETS for lay in ("dense_rows", "csr", "near_unary")
      if (n, lay) != ("V=2,all", "csr")]])
def test_small_adversarial_sets(name, layout):
    items, vocab, beams, tpb = SMALL_SETS[name]
    cset = oracle.ConstraintSet(items, vocab)
    model = oracle.HashModel(vocab, nan=20, neginf=20, dup=60, zero_row=40)
    compiled = compile_set(items, vocab, layout)
    for seeds in ([1, 2], [3, 4], [5, 6], [7, 8]):
        decode_and_check(cset, compiled, model, seeds, beams, tpb)


def test_all_equal_logits_give_the_lexicographically_first_items():
    """Every score ties: ties go to the lower parent, then the lower token,
    so the beams hold the smallest items in lexicographic order."""
    rng = np.random.default_rng(7)
    items = oracle.relabel(family_shape("random"), rng)
    cset = oracle.ConstraintSet(items, 8)
    got = decode_and_check(cset, compile_set(items, 8), oracle.HashModel(8, zero_row=256), [1, 2],
                           beam_size=6)
    assert np.asarray(got.tokens)[0].tolist() == [list(s) for s in sorted(cset.items)[:6]]
    assert np.asarray(got.valid).all()


def test_all_nan_logits_leave_no_valid_beam():
    rng = np.random.default_rng(8)
    items = oracle.relabel(family_shape("random"), rng)
    got = decode_and_check(oracle.ConstraintSet(items, 8), compile_set(items, 8),
                           oracle.HashModel(8, nan=256), [1, 2], beam_size=6)
    assert not np.asarray(got.valid).any()
    assert (np.asarray(got.tokens) == sc.PAD_TOKEN).all()
    assert (np.asarray(got.scores) == sc.SENTINEL_SCORE).all()


def test_huge_negative_logits_keep_valid_sequences():
    """log-probs below SENTINEL_SCORE: both sequences stay valid, floored."""
    compiled = compile_set([(0,), (1,)], 2)

    def logits_fn(last_tokens, step, carry):
        return jnp.broadcast_to(jnp.array([0.0, -1e35]), last_tokens.shape + (2,)), carry

    got = sc.beam_search(compiled, logits_fn, batch_size=1, beam_size=3)
    assert np.asarray(got.valid).tolist() == [[True, True, False]]
    assert np.asarray(got.tokens)[0, :, 0].tolist() == [0, 1, sc.PAD_TOKEN]
    np.testing.assert_array_equal(
        np.asarray(got.scores),
        np.float32([[0.0, decode.MIN_VALID_SCORE, sc.SENTINEL_SCORE]]))


@pytest.mark.parametrize("knobs", [
    {"posinf_row": 256, "dup": 80},
    {"huge_row": 200, "dup": 40},
    {"nan": 100, "neginf": 100, "dup": 50},
])
def test_special_logits(knobs):
    rng = np.random.default_rng(9)
    items = oracle.relabel(family_shape("random"), rng)
    cset = oracle.ConstraintSet(items, 8)
    compiled = compile_set(items, 8)
    for seeds in ([11, 12], [13, 14], [15, 16], [17, 18]):
        decode_and_check(cset, compiled, oracle.HashModel(8, **knobs), seeds, beam_size=6)


@pytest.mark.parametrize("items, end_token, beams", [
    ([(1,), (1, 2), (1, 2, 3)], 0, 3),            # each item a prefix of the next
    ([(3,)], 0, 2),                               # a single one-token item
    pytest.param([(3,), (1, 2, 4), (2,), (1, 2), (0, 1)], 5, 4,  # end token above the others
                 marks=pytest.mark.slow),
    pytest.param([(1, 2, 3), (1, 2, 3, 3), (2, 2), (4,)], 5, 6,  # more beams than items
                 marks=pytest.mark.slow),
])
def test_ragged_sets(items, end_token, beams):
    cset = oracle.ConstraintSet(items, 6, end_token)
    compiled = compile_set(items, 6, "default", end_token)
    for knobs in ({"dup": 60}, {"zero_row": 256}, {"nan": 60, "neginf": 60}, {}):
        decode_and_check(cset, compiled, oracle.HashModel(6, **knobs), [1, 2, 3], beams)


def test_single_one_token_item_with_end_token():
    """The end token follows the item, then nothing: PAD_TOKEN, length 1."""
    compiled = compile_set([(3,)], 6, end_token=0)
    model = oracle.HashModel(6)
    got = sc.beam_search(compiled, model, batch_size=3, beam_size=2,
                         carry=model.init_carry([4, 5, 6], 2), carry_axes=model.carry_axes)
    assert np.asarray(got.tokens).tolist() == [[[3, 0], [sc.PAD_TOKEN, sc.PAD_TOKEN]]] * 3
    assert np.asarray(got.lengths).tolist() == [[1, 0]] * 3
    assert np.asarray(got.valid).tolist() == [[True, False]] * 3


@pytest.mark.parametrize("layout", ["csr", pytest.param("default", marks=pytest.mark.slow)])
def test_largest_uint16_vocabulary(layout):
    """V = 65536: tokens above 32767 live in uint16 tables and must not
    come back negative."""
    V = 1 << 16
    items = [(65535, 0), (65535, 32768), (32767, 65534), (32768, 1), (0, 65535)]
    compiled = compile_set(items, V, layout)
    assert {s.token_dtype for s in compiled.plan.steps} == {"uint16"}
    cset = oracle.ConstraintSet(items, V)
    for knobs in ({"dup": 1}, {"zero_row": 256}):
        got = decode_and_check(cset, compiled, oracle.HashModel(V, **knobs), [3], beam_size=6)
        assert np.asarray(got.valid).sum() == len(items)


def test_length_penalty_matches_oracle():
    """Re-ranking by GNMT-normalized score (short and long items compete)."""
    rng = np.random.default_rng(10)
    shape = build_automaton([(1,), (2,), (1, 2), (2, 1), (2, 3), (3, 3)], 5, end_token=0)
    model = oracle.HashModel(5, dup=40, nan=20)
    for _ in range(6):
        items = oracle.relabel(shape, rng)
        compiled = compile_set(items, 5, end_token=0)
        decode_and_check(oracle.ConstraintSet(items, 5, 0), compiled, model,
                         rng.integers(0, 2 ** 32, size=2), beam_size=5, length_penalty=0.8)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), vocab=st.integers(2, 12), length=st.integers(1, 4),
       num_items=st.integers(1, 60), skew=st.sampled_from([0.0, 1.5]), ragged=st.booleans(),
       batch=st.integers(1, 4), beams=st.sampled_from([1, 2, 7, 70]),
       tokens_per_beam=st.sampled_from([None, 1, 3]), layout=st.sampled_from(LAYOUTS))
def test_random_shapes(seed, vocab, length, num_items, skew, ragged, batch, beams,
                       tokens_per_beam, layout):
    """Sets of any shape (a compile per example, hence slow)."""
    rng = np.random.default_rng(seed)
    end = None
    if ragged and vocab > 2:
        end = int(rng.integers(vocab))
        items = oracle.random_ragged_set(rng, num_items, length, vocab, end)
    else:
        items = oracle.random_set(rng, num_items, length, vocab, skew)
    knobs = {"nan": 20, "neginf": 20, "dup": 30, "zero_row": 30, "posinf_row": 10, "huge_row": 10}
    decode_and_check(oracle.ConstraintSet(items, vocab, end), compile_set(items, vocab, layout, end),
                     oracle.HashModel(vocab, **knobs), rng.integers(0, 2 ** 32, size=batch), beams,
                     tokens_per_beam)


# --------------------------------------------------------------------------
# Greedy, jit, errors


def test_greedy_matches_oracle():
    """Shapes shared with test_batch_and_beam_sizes[1-1-None-dense_rows]: no new compile."""
    rng = np.random.default_rng(11)
    shape = family_shape("random")
    model = oracle.HashModel(8, nan=30, neginf=30, dup=50, zero_row=40)
    for _ in range(8):
        items = oracle.relabel(shape, rng)
        cset = oracle.ConstraintSet(items, 8)
        seeds = rng.integers(0, 2 ** 32, size=1)
        got = sc.greedy_decode(compile_set(items, 8, "dense_rows"), model, batch_size=1,
                               carry=model.init_carry(seeds, 1))
        assert_matches(got, oracle.greedy(cset, model, seeds))


def test_beam_search_inside_user_jit():
    """sc.beam_search in a user's jax.jit, and decode.beam_search with the
    tables as arguments of the user's jit (one program for every set of the
    same shapes), equal the oracle."""
    items, other = [(0, 1), (1, 0), (1, 2)], [(0, 2), (2, 0), (2, 1)]  # same trie shape
    compiled, other_compiled = compile_set(items, 3), compile_set(other, 3)
    model = oracle.HashModel(3, dup=40, nan=20)
    carry = model.init_carry([21, 22], 3)

    @jax.jit
    def user_fn(carry):
        return sc.beam_search(compiled, model, batch_size=2, beam_size=3, carry=carry,
                              carry_axes=model.carry_axes)

    @jax.jit
    def user_fn_tables(tables, carry):
        return decode.beam_search(compiled.plan, tables, model, batch_size=2, beam_size=3,
                                  carry=carry, carry_axes=model.carry_axes)

    assert_matches(user_fn(carry), oracle.beam_search(oracle.ConstraintSet(items, 3), model,
                                                      [21, 22], 3))
    for s, c in ((items, compiled), (other, other_compiled)):
        assert c.plan == compiled.plan
        assert_matches(user_fn_tables(c.lowered.tables, carry),
                       oracle.beam_search(oracle.ConstraintSet(s, 3), model, [21, 22], 3))


def test_custom_loop_with_traced_step_matches_oracle():
    """A user's own loop over `decode.beam_step` with a traced step (one
    jitted program, the switch path, as exported), reordering the model's
    per-beam state by `state.parent`, decodes what beam_search decodes."""
    rng = np.random.default_rng(13)
    items = oracle.relabel(family_shape("ragged"), rng)
    compiled = compile_set(items, 8, end_token=0)
    model = oracle.HashModel(8, nan=30, dup=40, zero_row=30)
    step_fn = jax.jit(functools.partial(decode.beam_step, compiled.plan,
                                        tokens_per_beam=2))
    for seeds in ([1, 2], [3, 4], [5, 6]):
        state = decode.init_beam_state(compiled.plan, 2, 5)
        carry = model.init_carry(seeds, 5)
        for t in range(compiled.max_length):
            logits, carry = model(state.last_tokens, t, carry)
            state = step_fn(compiled.lowered.device_tables, state, logits, jnp.int32(t))
            carry = dict(carry, h=jnp.take_along_axis(carry["h"], state.parent, axis=1))
        assert_matches(decode.finalize(state),
                       oracle.beam_search(oracle.ConstraintSet(items, 8, 0), model, seeds, 5, 2))


@pytest.fixture(scope="module")
def small():
    return compile_set([(0, 1), (1, 0), (1, 1)], 3)


def _const_logits(shape_fn, dtype=jnp.float32):
    def logits_fn(last_tokens, step, carry):
        return jnp.zeros(shape_fn(last_tokens.shape), dtype), carry
    return logits_fn


@pytest.mark.parametrize("logits_fn, match", [
    (_const_logits(lambda s: s + (2,)), r"logits have shape \(2, 3, 2\), expected \(2, 3, 3\)"),
    (_const_logits(lambda s: s), r"logits have shape \(2, 3\), expected \(2, 3, 3\)"),
    (_const_logits(lambda s: s + (3,), jnp.int32), "logits have dtype int32, expected a float"),
])
def test_bad_logits_are_rejected(small, logits_fn, match):
    with pytest.raises(DecodeInputError, match=match):
        sc.beam_search(small, logits_fn, batch_size=2, beam_size=3)


@pytest.mark.parametrize("kwargs, match", [
    ({"beam_size": 0}, r"beam_size=0: expected an int >= 1"),
    ({"beam_size": 2.0}, r"beam_size=2.0: expected an int >= 1"),
    ({"beam_size": True}, r"beam_size=True: expected an int >= 1"),
    ({"tokens_per_beam": 0}, r"tokens_per_beam=0: expected an int >= 1"),
    ({"batch_size": 0}, r"batch_size=0: expected an int >= 1"),
    ({"length_penalty": float("nan")}, r"length_penalty=nan: expected a finite float"),
    ({"start_token": 1.5}, r"start_token=1.5: expected an int"),
])
def test_bad_arguments_are_rejected(small, kwargs, match):
    args = dict(batch_size=1, beam_size=2)
    args.update(kwargs)
    with pytest.raises(DecodeInputError, match=match):
        sc.beam_search(small, _const_logits(lambda s: s + (3,)), **args)


@pytest.mark.parametrize("step", [-1, 2])
def test_beam_step_out_of_range_is_rejected(small, step):
    state = decode.init_beam_state(small.plan, 1, 2)
    with pytest.raises(DecodeInputError, match=rf"beam_step: step={step} must be an int in \[0, 2\)"):
        decode.beam_step(small.plan, small.lowered.tables, state, jnp.zeros((1, 2, 3)), step)


def test_non_callable_logits_fn_is_rejected(small):
    with pytest.raises(DecodeInputError, match=r"logits_fn=3: expected a callable"):
        sc.beam_search(small, 3, batch_size=1, beam_size=2)
    with pytest.raises(DecodeInputError, match=r"batch_size=0: expected an int >= 1"):
        sc.greedy_decode(small, _const_logits(lambda s: s + (3,)), batch_size=0)


def test_per_row_start_tokens_match_the_oracle_row_by_row():
    """start_token may be ints (B,): each row decodes as if alone with its own
    start token (the hash model reads it as the first token of the prefix)."""
    items = oracle.random_set(np.random.default_rng(3), 40, 3, 6)
    cset, compiled = oracle.ConstraintSet(items, 6), oracle.compile_set(items, 6)
    model, seeds, starts = oracle.HashModel(6), [11, 12, 13], np.array([0, 4, 5], np.int32)
    got = sc.beam_search(compiled, model, batch_size=3, beam_size=4, start_token=starts,
                         carry_axes=model.carry_axes, carry=model.init_carry(seeds, 4))
    for row, (seed, start) in enumerate(zip(seeds, starts)):
        want = oracle.beam_search(cset, model, [seed], 4, start_token=int(start))
        np.testing.assert_array_equal(np.asarray(got.tokens)[row], want.tokens[0])
        np.testing.assert_allclose(np.asarray(got.scores)[row], want.scores[0], rtol=1e-6,
                                   atol=1e-5)


@pytest.mark.parametrize("start", [np.zeros(3, np.int32), np.zeros((2, 1), np.int32),
                                   np.array([0.5, 1.0]), np.array([2 ** 31, 0]), True])
def test_bad_per_row_start_tokens_are_rejected(small, start):
    with pytest.raises(DecodeInputError, match=r"(?s)start_token=.*: expected an int or ints of shape "
                                               r"\(2,\)"):
        sc.beam_search(small, _const_logits(lambda s: s + (3,)), batch_size=2, beam_size=2,
                       start_token=start)


@pytest.mark.parametrize("packed", [True, False])
def test_exception_bounds_of_older_artifacts_decode_and_read_back_alike(packed, monkeypatch):
    """Tables of format version <= 5 hold a near_unary layer's exceptions as
    ex_bounds (X, 2); the readers turn them into ex_starts / ex_branch
    (`normalize.current_tables`), which the decoder, the packed runs and
    the readers take exactly as the set's own."""
    import dataclasses

    import static_compiler as sc
    from static_compiler.format.normalize import current_tables
    from static_compiler.lowered.tables import row_pointers
    from static_compiler.target.raising import automaton_from_tables

    rng = np.random.default_rng(8)
    rows = rng.integers(0, 9, size=(400, 5))
    rows[::7, 3:] = rows[::7, 3:] % 2  # some branching deep down
    compiled = sc.compile_constraints(
        rows, 9, pipeline="verify,choose-layout{force=near_unary},pad-branches,pack-dtypes")
    old = []
    for step, tabs in zip(compiled.plan.steps, compiled.lowered.tables):
        tabs = dict(tabs)
        if step.kind == "near_unary":
            starts = tabs.pop("ex_starts").astype(np.int64)
            ends = starts + tabs.pop("ex_branch")
            tabs["ex_bounds"] = np.stack([starts, ends], axis=1).astype(step.state_dtype)
        old.append(tabs)
    assert any("ex_bounds" in tabs for tabs in old)
    older = dataclasses.replace(compiled, lowered=dataclasses.replace(compiled.lowered,
                                                                tables=current_tables(old)))
    assert not any("ex_bounds" in tabs for tabs in older.lowered.tables)
    for a, b, step in zip(compiled.lowered.tables, older.lowered.tables, compiled.plan.steps):
        np.testing.assert_array_equal(row_pointers(step.kind, a, step.num_states),
                                      row_pointers(step.kind, b, step.num_states))
    layouts = [layer.layout for layer in compiled.ir.layers]
    assert automaton_from_tables(compiled.plan, layouts, older.lowered.tables,
                                 num_final_states=compiled.ir.num_final_states,
                                 num_sequences=compiled.ir.num_sequences) == compiled.ir
    from static_compiler.backend import kernels
    if not packed:  # every run through lax.switch, not one packed gather
        monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", -1)
    jax.clear_caches()
    model = oracle.HashModel(9)
    try:
        for tokens_per_beam in (None, 2):
            got, want = (sc.beam_search(c, model, batch_size=2, beam_size=6,
                                        tokens_per_beam=tokens_per_beam,
                                        carry=model.init_carry([3, 4], 6),
                                        carry_axes=model.carry_axes) for c in (older, compiled))
            np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
            np.testing.assert_array_equal(np.asarray(got.scores), np.asarray(want.scores))
    finally:
        jax.clear_caches()  # (traces made with the bound lowered)


UNROLLED_CI = {("random", "default"), ("random", "csr"), ("skewed", "near_unary")}  # each layout


@pytest.mark.parametrize("family, layout", [
    pytest.param(family, layout, marks=[] if (family, layout) in UNROLLED_CI else pytest.mark.slow)
    for family in ("random", "skewed") for layout in ("default", "csr", "near_unary")])
def test_unrolled_beam_search_matches_the_oracle(family, layout, monkeypatch):
    """GPU backends run a fixed-length set's beam search steps inline
    (`UNROLL_BACKENDS`): forced on this CPU, it still equals the oracle."""
    from static_compiler.backend.decode import search
    monkeypatch.setattr(search, "UNROLL_BACKENDS", ("cpu",))
    fam = FAMILIES[family]
    rng = np.random.default_rng(7)
    items = oracle.relabel(family_shape(family), rng)
    model = oracle.HashModel(fam.vocab_size, nan=20, neginf=20, dup=40, zero_row=30)
    compiled = compile_set(items, fam.vocab_size, layout)
    assert search.unrolled(compiled.plan)
    decode_and_check(oracle.ConstraintSet(items, fam.vocab_size), compiled, model,
                     rng.integers(0, 2 ** 32, size=fam.batch), fam.beams, fam.tokens_per_beam)
    ragged = FAMILIES["ragged"]
    assert not search.unrolled(compile_set(list(family_shape("ragged").sequences()),
                                           ragged.vocab_size, "default", ragged.end_token).plan)
