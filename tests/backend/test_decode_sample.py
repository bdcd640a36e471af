"""Constrained sampling (`sc.sample`) against the oracle's exact distribution.

Exact checks: top_k=1 and a vanishing temperature both equal greedy decoding
(on logits without ties); every sample is a member of the set and carries
its path's summed log-probability. Statistical check: 20000 rows sharing one
seed draw with the frequencies `oracle.sample_distribution` predicts (each
within 5 standard deviations; the key is fixed, so the test is deterministic).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest

import static_compiler as sc
from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError

VOCAB, END = 6, 0
ITEMS = [(1,), (1, 2), (1, 2, 3), (2, 4), (2, 5), (3,), (3, 1, 1), (4, 4, 4), (5, 2)]
TIE_FREE = dict(nan=20, neginf=20)  # no dup / zero / +inf rows: no exact ties


@functools.lru_cache(maxsize=None)
def compiled_set():
    return oracle.compile_set(ITEMS, VOCAB, end_token=END)


CSET = oracle.ConstraintSet(ITEMS, VOCAB, END)


def run_sample(model, seeds, key=0, **kwargs):
    got = sc.sample(compiled_set(), model, jax.random.PRNGKey(key), batch_size=len(seeds),
                    carry=model.init_carry(seeds, 1), **kwargs)
    return tuple(np.asarray(x) for x in got)


@pytest.mark.parametrize("kwargs", [{"top_k": 1}, {"temperature": 1e-30}])
def test_greedy_limits_equal_greedy(kwargs):
    model = oracle.HashModel(VOCAB, **TIE_FREE)
    seeds = list(range(100, 108))
    tokens, scores, valid, lengths = run_sample(model, seeds, **kwargs)
    want = oracle.greedy(CSET, model, seeds)
    np.testing.assert_array_equal(valid, want.valid)
    np.testing.assert_array_equal(tokens, want.tokens)
    np.testing.assert_array_equal(lengths, want.lengths)
    np.testing.assert_allclose(scores, want.scores, rtol=1e-6, atol=1e-5)


FREQ_ROWS, FREQ_SEED, FREQ_TEMPERATURE, FREQ_TOP_K = 20000, 77, 2.5, 2


@pytest.mark.parametrize("knobs", [dict(dup=60), dict(nan=40, neginf=40, dup=30, zero_row=60)])
def test_sample_frequencies_match_the_exact_distribution(knobs):
    """Temperature 2.5 and top_k 2 (ties at the k-th weight kept); NaN and
    -inf logits make some paths dead ends, whose rows come back invalid."""
    model = oracle.HashModel(VOCAB, **knobs)
    n = FREQ_ROWS
    tokens, scores, valid, lengths = (x[:, 0] for x in run_sample(
        model, [FREQ_SEED] * n, key=3, temperature=FREQ_TEMPERATURE, top_k=FREQ_TOP_K))
    dist = oracle.sample_distribution(CSET, model, FREQ_SEED, FREQ_TEMPERATURE, FREQ_TOP_K)
    item_scores = oracle.sequence_scores(CSET, model, FREQ_SEED)
    assert (tokens[~valid] == sc.PAD_TOKEN).all() and (lengths[~valid] == 0).all()
    assert (scores[~valid] == sc.SENTINEL_SCORE).all()
    rows, first, counts = np.unique(tokens[valid], axis=0, return_index=True, return_counts=True)
    sampled = {}
    for row, i, count in zip(rows, first, counts):
        path = tuple(int(t) for t in row if t != sc.PAD_TOKEN)
        assert path in dist, f"sampled {path}, which has probability 0"
        item = path[:-1]
        assert item in CSET.items and path[-1] == END
        same = (tokens[valid] == row).all(axis=1)
        assert (lengths[valid][same] == len(item)).all()
        np.testing.assert_allclose(scores[valid][same], item_scores[item], rtol=1e-6, atol=1e-5)
        sampled[path] = count / n
    dead = 1.0 - sum(dist.values())  # mass of paths that reach no valid token
    tol = lambda p: 5 * np.sqrt(p * (1 - p) / n) + 1e-3
    assert abs((~valid).mean() - dead) <= tol(dead)
    for path, p in dist.items():
        assert abs(sampled.get(path, 0.0) - p) <= tol(p), (path, sampled.get(path, 0.0), p)


def test_valid_tokens_with_huge_negative_log_probs_are_sampled():
    """Every allowed token has log-prob about -3e38: lp / T overflows to
    -inf, yet the row must still draw one (weights are shifted by the best)."""
    compiled = oracle.compile_set([(1,), (2,)], 3)

    def logits_fn(last_tokens, step, carry):
        row = jnp.array([0.0, -3e38, -2.9e38], jnp.float32)
        return jnp.broadcast_to(row, last_tokens.shape + (3,)), carry

    got = sc.sample(compiled, logits_fn, jax.random.PRNGKey(0), batch_size=4, temperature=0.5)
    assert np.asarray(got.valid).all()
    assert (np.asarray(got.tokens)[:, 0, 0] == 2).all()
    np.testing.assert_array_equal(np.asarray(got.scores), np.float32(decode.MIN_VALID_SCORE))


def test_different_keys_give_different_samples():
    """Same program as the frequency test (no new compile)."""
    model = oracle.HashModel(VOCAB)
    draw = lambda key: run_sample(model, [5] * FREQ_ROWS, key=key, temperature=FREQ_TEMPERATURE,
                                  top_k=FREQ_TOP_K)[0]
    a, b = draw(1), draw(2)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, draw(1))


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": 0.0}, r"temperature=0.0: expected a finite float > 0"),
    ({"temperature": -1.0}, r"temperature=-1.0: expected a finite float > 0"),
    ({"temperature": float("nan")}, r"temperature=nan: expected a finite float"),
    ({"temperature": float("inf")}, r"temperature=inf: expected a finite float"),
    ({"temperature": "hot"}, r"temperature='hot': expected a finite float"),
    ({"temperature": 1e-39}, r"temperature=1e-39: expected at least 1.17"),
    ({"top_k": 0}, r"top_k=0: expected an int >= 1"),
    ({"top_k": 1.5}, r"top_k=1.5: expected an int >= 1"),
    ({"batch_size": 0}, r"batch_size=0: expected an int >= 1"),
    ({"start_token": "a"}, r"start_token='a': expected an int"),
])
def test_bad_sample_arguments_are_rejected(kwargs, match):
    args = dict(batch_size=2)
    args.update(kwargs)
    model = oracle.HashModel(VOCAB)
    with pytest.raises(DecodeInputError, match=match):
        sc.sample(compiled_set(), model, jax.random.PRNGKey(0), **args)


def test_non_callable_logits_fn_is_rejected():
    with pytest.raises(DecodeInputError, match=r"logits_fn=None: expected a callable"):
        sc.sample(compiled_set(), None, jax.random.PRNGKey(0), batch_size=1)
