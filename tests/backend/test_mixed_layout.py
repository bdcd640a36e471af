"""The mixed layout's reads (`decode.candidates.mixed_children`) against a numpy reference.

Beam search relies on one promise: each beam's list holds its best
W = min(keep, k) children (score descending, ties to the lower token), and
equal scores appear in token order inside a list. Both of its paths must
keep it: the wide slots (at most `wide_slots` heavy beams per batch row) and
the fallback that reads k entries for every beam. Decoding end to end with
mixed layouts is checked against the beam-search oracle in test_decode.py
("mixed_csr", "mixed_near_unary") and in the artifact tests.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest

from static_compiler import compile_constraints
from static_compiler.backend import decode

F32 = np.float32


def _compile(kind: str, light_k: int, wide_slots: int, seed: int):
    rng = np.random.default_rng(seed)
    items = oracle.random_set(rng, 120, 3, 12, skew=1.4)
    return compile_constraints(items, 12, pipeline=f"choose-layout{{force={kind}}},split-heavy"
                                                   f"{{light-k={light_k},wide-slots={wide_slots}}}")


def _reference(layer, node, expanding, logprobs, scores, width):
    """Per (b, m): the best `width` children as [(score, token, next)], ordered
    by score descending then token."""
    targets = layer.target_array()
    out = {}
    for (b, m), s in np.ndenumerate(node):
        cands = []
        for e in range(layer.indptr[s], layer.indptr[s + 1]):
            tok, lp = int(layer.tokens[e]), logprobs[b, m, layer.tokens[e]]
            if expanding[b, m] and lp > -np.inf:
                score = max(F32(scores[b, m] + lp), F32(decode.MIN_VALID_SCORE))
                cands.append((float(score), tok, int(targets[e])))
        out[b, m] = sorted(cands, key=lambda c: (-c[0], c[1]))[:width]
    return out


@pytest.mark.parametrize("kind", ["csr", "near_unary"])
@pytest.mark.parametrize("light_k, wide_slots, keep", [(1, 1, 3), (2, 2, 30), (3, 64, 2)])
def test_mixed_children_keep_each_beams_best_children_on_both_paths(kind, light_k, wide_slots,
                                                                    keep):
    compiled = _compile(kind, light_k, wide_slots, seed=light_k)
    layer, t = compiled.ir.layers[1], 1
    sp, tables = compiled.plan.steps[t], compiled.lowered.device_tables[t]
    assert sp.light_k == light_k and sp.k > light_k
    width = min(keep, sp.k)
    fn = jax.jit(functools.partial(decode.candidates.mixed_children, sp, keep=keep))
    rng = np.random.default_rng(7)
    paths = set()
    for B, M in [(2, 6), (3, 8), (1, 1), (1, 3)] * 4:  # few shapes: few compiles
        node = rng.integers(0, layer.num_states, size=(B, M)).astype(np.int32)
        expanding = rng.random((B, M)) < 0.8
        logits = rng.integers(0, 3, size=(B, M, 12)).astype(F32)  # few levels: ties
        logits[rng.random(logits.shape) < 0.15] = -np.inf
        scores = rng.integers(-2, 1, size=(B, M)).astype(F32)
        lp = decode.logprobs.LogProbs.of(jnp.asarray(logits))
        c, child_lp = fn(tables, jnp.asarray(node), jnp.asarray(expanding), lp, jnp.asarray(scores))
        tokens, nxt, valid = (np.asarray(x) for x in c)
        assert tokens.shape == (B, M, width)
        got_scores = np.asarray(decode.logprobs.add_logprob(jnp.asarray(scores)[..., None], child_lp))
        want = _reference(layer, node, expanding, np.asarray(lp.all()), scores, width)
        for (b, m), ref in want.items():
            got = [(float(got_scores[b, m, j]), int(tokens[b, m, j]), int(nxt[b, m, j]))
                   for j in range(width) if valid[b, m, j]]
            assert sorted(got, key=lambda c: (-c[0], c[1])) == ref, (b, m)
            for a, z in zip(got, got[1:]):  # equal scores: lower token first
                assert a[0] != z[0] or a[1] < z[1], got
        heavy = expanding & (np.diff(layer.indptr)[node] > light_k)
        paths.add("fallback" if (heavy.sum(axis=1) > min(wide_slots, M)).any() else "wide")
    want_paths = {"wide"} if wide_slots >= 8 else {"wide", "fallback"}
    assert paths == want_paths
