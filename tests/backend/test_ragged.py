"""Variable-length sets end to end: every decoded beam is a member followed by
the end token then PAD_TOKEN, lengths exclude the end token, finished beams
keep their score and stop expanding (a final score is exactly the item's
summed log-probs with its end token, and PAD follows the end token), ending competes with continuing ("NEW"
vs "NEW YORK"), the GNMT length penalty re-ranks final beams; all checked
against the brute-force oracle (tests/oracle.py), also for minimized sets
(explicit targets) and on every layout."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.frontend import build_automaton

END = 0


def bigram_logits(last_tokens, step, table):
    """logits_fn of `BigramModel`: the table (V, V) rides in the carry, so one
    compiled beam search serves every table of a shape."""
    return table[last_tokens], table


class BigramModel:
    """Logits depend only on the last token: float32 table (V, V), row = last
    token, so tests can set exact probabilities. `logprobs(seed, start,
    prefix)` is the oracle's model interface; decode with
    ``logits_fn=bigram_logits, carry=model.carry``."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float32)
        self.carry = jnp.asarray(self.table)

    def logprobs(self, seed, start_token, prefix):
        return oracle.log_softmax32(self.table[((start_token,) + tuple(prefix))[-1]])


def bigram(V: int, probs: dict, floor: float = -1e9) -> BigramModel:
    """Table with logit log(p) for probs[(last, next)] = p, `floor` elsewhere."""
    table = np.full((V, V), floor, dtype=np.float32)
    for (last, nxt), p in probs.items():
        table[last, nxt] = np.log(p)
    return BigramModel(table)


def check_ragged_result(result, cset: oracle.ConstraintSet, model, seeds, start_token=0):
    """Invariants of a ragged beam-search result, independent of beam order:
    members, end token then PAD, lengths, scores = summed log-probs of the
    item and its end token (finished beams kept their score), no duplicates."""
    tokens, scores = np.asarray(result.tokens), np.asarray(result.scores)
    valid, lengths = np.asarray(result.valid), np.asarray(result.lengths)
    B, M, T = tokens.shape
    assert T == cset.depth + 1
    for b in range(B):
        item_scores = oracle.sequence_scores(cset, model, int(seeds[b]), start_token)
        seen = set()
        for j in range(M):
            if not valid[b, j]:
                assert (tokens[b, j] == sc.PAD_TOKEN).all() and lengths[b, j] == 0
                assert scores[b, j] == sc.SENTINEL_SCORE
                continue
            n = int(lengths[b, j])
            item = tuple(int(t) for t in tokens[b, j, :n])
            assert item in cset.items, f"row {b} beam {j}: {item} is not in the set"
            assert END not in item
            assert tokens[b, j, n] == cset.end_token
            assert (tokens[b, j, n + 1:] == sc.PAD_TOKEN).all()
            np.testing.assert_allclose(scores[b, j], item_scores[item], rtol=1e-6, atol=1e-5)
            assert item not in seen
            seen.add(item)


def assert_equals_oracle(got, want: oracle.Result):
    np.testing.assert_array_equal(np.asarray(got.valid), want.valid)
    np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens)
    np.testing.assert_array_equal(np.asarray(got.lengths), want.lengths)
    np.testing.assert_allclose(np.asarray(got.scores), want.scores, rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------
# "NEW" and "NEW YORK": ending is a token the model scores like any other

NEW, YORK, CITY, JERSEY, BOS = 1, 2, 3, 4, 5
CITIES = [(NEW,), (NEW, YORK), (NEW, YORK, CITY), (NEW, JERSEY), (YORK,), (YORK, CITY)]


@pytest.mark.parametrize("pipeline", [None, "minimize{force=true},choose-layout,pad-branches,"
                                            "pack-dtypes"])
@pytest.mark.parametrize("after_new, want_top", [
    ({END: 0.7, YORK: 0.2, JERSEY: 0.1}, (NEW,)),                # stop after NEW
    ({END: 0.1, YORK: 0.6, JERSEY: 0.3}, (NEW, YORK)),           # continue, then stop
])
def test_prefix_item_can_end_or_continue(pipeline, after_new, want_top):
    V = 6
    probs = {(BOS, NEW): 0.9, (BOS, YORK): 0.1, (YORK, END): 0.8, (YORK, CITY): 0.2,
             (CITY, END): 1.0, (JERSEY, END): 1.0}
    probs.update({(NEW, tok): p for tok, p in after_new.items()})
    model = bigram(V, probs)
    compiled = sc.compile_constraints(CITIES, V, end_token=END, pipeline=pipeline)
    if pipeline:
        assert any(not layer.implicit_targets for layer in compiled.ir.layers)
    cset = oracle.ConstraintSet(CITIES, V, END)
    got = sc.beam_search(compiled, bigram_logits, batch_size=1, beam_size=4, start_token=BOS,
                         carry_axes=None, carry=model.carry)
    assert_equals_oracle(got, oracle.beam_search(cset, model, [0], 4, start_token=BOS))
    check_ragged_result(got, cset, model, [0], start_token=BOS)
    top = np.asarray(got.tokens)[0, 0]
    n = len(want_top)
    assert tuple(top[:n]) == want_top and top[n] == END and (top[n + 1:] == sc.PAD_TOKEN).all()
    assert int(np.asarray(got.lengths)[0, 0]) == n


# --------------------------------------------------------------------------
# Many random ragged sets (one compile per layout: relabel keeps the shape)


@functools.lru_cache(maxsize=None)
def _ragged_shape():
    """A ragged trie: 16 random items of 1..5 tokens plus prefixes of them,
    with a chain where every item is a prefix of the next."""
    items = oracle.random_ragged_set(np.random.default_rng(21), 16, 5, 9, end_token=END)
    items += [tuple(range(1, n + 1)) for n in range(1, 6)]
    return build_automaton(items, 9, end_token=END)


@settings(max_examples=15, deadline=None)
@given(layout=st.sampled_from(["default", "dense_rows"]),
       relabel_seed=st.integers(0, 2 ** 32 - 1),
       seeds=st.lists(st.integers(0, 2 ** 32 - 1), min_size=2, max_size=2),
       knobs=st.sampled_from([{}, {"dup": 80}, {"nan": 40, "neginf": 40}, {"zero_row": 256}]))
def test_random_ragged_sets_decode_to_members(layout, relabel_seed, seeds, knobs):
    """Relabeled tokens keep the trie shape, so each layout compiles once."""
    items = oracle.relabel(_ragged_shape(), np.random.default_rng(relabel_seed))
    pipeline = None if layout == "default" else \
        f"choose-layout{{force={layout}}},pad-branches,pack-dtypes"
    compiled = sc.compile_constraints(items, 9, end_token=END, pipeline=pipeline)
    cset = oracle.ConstraintSet(items, 9, END)
    model = oracle.HashModel(9, **knobs)
    got = sc.beam_search(compiled, model, batch_size=2, beam_size=5,
                         carry_axes=model.carry_axes, carry=model.init_carry(seeds, 5))
    assert_equals_oracle(got, oracle.beam_search(cset, model, seeds, 5))
    check_ragged_result(got, cset, model, seeds)


def test_single_one_token_item_minimized_with_more_beams():
    compiled = sc.compile_constraints([(4,)], 6, end_token=END,
                                      pipeline="minimize{force=true},choose-layout,pack-dtypes")
    assert compiled.max_length == 2
    model = oracle.HashModel(6)
    got = sc.beam_search(compiled, model, batch_size=2, beam_size=3,
                         carry_axes=model.carry_axes, carry=model.init_carry([1, 2], 3))
    cset = oracle.ConstraintSet([(4,)], 6, END)
    assert_equals_oracle(got, oracle.beam_search(cset, model, [1, 2], 3))
    assert np.asarray(got.tokens)[:, 0].tolist() == [[4, END]] * 2
    assert np.asarray(got.valid).tolist() == [[True, False, False]] * 2
    check_ragged_result(got, cset, model, [1, 2])


# --------------------------------------------------------------------------
# Length penalty


def test_length_penalty_reranks_final_beams():
    """SHORT = (1,) beats LONG = (2, 3, 4, 5) on summed log-prob, LONG wins
    once scores are divided by ((5 + length) / 6) ** penalty (GNMT) with a
    large enough penalty."""
    V, S = 8, 7
    model = bigram(V, {(S, 1): 0.5, (S, 2): 0.5, (1, END): 0.74, (1, 6): 0.26,
                       (2, 3): 0.82, (3, 4): 0.82, (4, 5): 0.82, (5, END): 0.82,
                       (5, 6): 0.18, (4, 6): 0.18, (3, 6): 0.18, (2, 6): 0.18})
    items = [(1,), (2, 3, 4, 5)]
    compiled = sc.compile_constraints(items, V, end_token=END)
    cset = oracle.ConstraintSet(items, V, END)
    raw = oracle.sequence_scores(cset, model, 0, S)
    assert raw[(1,)] > raw[(2, 3, 4, 5)]
    firsts = {}
    for penalty in (0.0, 2.0):
        got = sc.beam_search(compiled, bigram_logits, batch_size=1, beam_size=2, start_token=S,
                             length_penalty=penalty, carry_axes=None, carry=model.carry)
        assert_equals_oracle(got, oracle.beam_search(cset, model, [0], 2, start_token=S,
                                                     length_penalty=penalty))
        lengths = np.asarray(got.lengths)[0]
        want = {n: raw[item] / ((5 + n) / 6) ** penalty for item, n in ((items[0], 1),
                                                                          (items[1], 4))}
        np.testing.assert_allclose(np.asarray(got.scores)[0], [want[n] for n in lengths],
                                   rtol=1e-5)
        firsts[penalty] = int(lengths[0])
    assert firsts == {0.0: 1, 2.0: 4}
