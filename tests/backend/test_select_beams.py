"""`decode.selection.select_beams` paths agree exactly.

The CPU path (`_select_checked`: one flat top-k, checked, with a fallback)
and the shortcut for pruning that cannot bind must pick the same (score,
parent, slot) as the per-beam top-k path (`_select_pruned`) on every input:
ties, invalid candidates at SENTINEL_SCORE, and one beam holding most of the
best candidates (the fallback).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from static_compiler.backend import decode
from static_compiler.backend.decode import selection


def _reference(scores: np.ndarray, beam_size: int, tokens_per_beam):
    """numpy: per beam the best tokens_per_beam (score desc, slot asc), then
    the best beam_size overall (score desc, parent asc, slot asc)."""
    B, M, K = scores.shape
    out = []
    for b in range(B):
        cands = []
        for m in range(M):
            order = sorted(range(K), key=lambda k: (-scores[b, m, k], k))
            cands += [(-scores[b, m, k], m, k) for k in order[:tokens_per_beam or K]]
        cands.sort()
        out.append(cands[:beam_size])
    return out


def _as_lists(top, parent, col, real):
    top, parent, col, real = (np.asarray(x) for x in (top, parent, col, real))
    return [[(-top[b, i], parent[b, i], col[b, i]) for i in range(top.shape[1]) if real[b, i]]
            for b in range(top.shape[0])]


@st.composite
def score_arrays(draw):
    B = draw(st.integers(1, 3))
    M = draw(st.integers(1, 9))
    K = draw(st.integers(1, 12))
    levels = draw(st.sampled_from([3, 50]))  # few levels: many ties
    values = np.asarray(draw(st.lists(st.integers(0, levels), min_size=B * M * K,
                                      max_size=B * M * K)), dtype=np.float32)
    scores = values.reshape(B, M, K) - float(levels)
    invalid = np.asarray(draw(st.lists(st.booleans(), min_size=B * M * K, max_size=B * M * K)))
    scores[invalid.reshape(B, M, K)] = decode.SENTINEL_SCORE
    if draw(st.booleans()):  # one beam far ahead of the others: it holds most winners
        scores[:, draw(st.integers(0, M - 1))] += 100.0
    beam_size = draw(st.integers(1, M * K + 3))
    tokens_per_beam = draw(st.one_of(st.none(), st.integers(1, K + 2)))
    return scores, beam_size, tokens_per_beam


@settings(max_examples=150, deadline=None)
@given(score_arrays())
def test_select_beams_matches_reference(case):
    scores, beam_size, tokens_per_beam = case
    got = jax.jit(decode.selection.select_beams, static_argnums=(1, 2))(jnp.asarray(scores), beam_size,
                                                               tokens_per_beam)
    want = _reference(scores, beam_size, tokens_per_beam)
    assert _as_lists(*got) == want
    real = np.asarray(got[3])
    assert np.all(np.asarray(got[0])[~real] == decode.SENTINEL_SCORE)


@pytest.mark.parametrize("lead, list_decides", [(0.0, True), (2.0, True), (50.0, False)])
def test_checked_path_equals_pruned_path(lead, list_decides):
    """The CPU path and the per-beam path return identical arrays when the
    winners are spread over beams, when beam 3 leads and holds more than
    tokens_per_beam of the flat winners (the list still decides), and when
    it holds the whole list (the per-beam fallback runs)."""
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((2, 70, 512)).astype(np.float32)
    valid = rng.random(scores.shape) >= 0.3
    scores[:, 3] += lead
    scores[~valid] = decode.SENTINEL_SCORE
    order = np.argsort(-scores.reshape(2, -1), axis=-1, kind="stable") // 512
    held_in_top = np.stack([(order[b, :70] == 3).sum() for b in range(2)])
    kept_in_list = np.stack([sum(min((order[b, :280] == m).sum(), 30) for m in range(70))
                             for b in range(2)])
    assert bool(np.all(kept_in_list >= 70)) == list_decides
    if lead:
        assert np.all(held_in_top > 30)
    checked = selection._select_checked(jnp.asarray(scores), 70, 30)
    pruned = selection._select_pruned(jnp.asarray(scores), 70, 30)
    for a, b in zip(checked, pruned):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
