"""`allowed`: the stateless mask from prefixes, against the oracle.

For every prefix length t and every layout, on random fixed-length and
variable-length sets: prefixes of items (and, past an item's end, the end
token repeated), the same with one token changed (mostly not in the set),
random tokens, and finished items followed by a token other than the end
token. The mask must equal the oracle's allowed tokens row for row.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import PROFILE

from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError

V = 12


@functools.lru_cache(maxsize=None)
def make_set(kind: str):
    rng = np.random.default_rng({"fixed": 11, "ragged": 12}[kind])
    if kind == "fixed":
        return oracle.random_set(rng, 40, 4, V), None
    return oracle.random_ragged_set(rng, 30, 4, V, end_token=0), 0


def expected(cset: oracle.ConstraintSet, prefix: tuple) -> np.ndarray:
    """bool (V,): the oracle's allowed tokens after `prefix`."""
    out = np.zeros(cset.vocab_size, bool)
    end = cset.end_token
    if end is not None and end in prefix:
        i = prefix.index(end)
        if cset.accepts(prefix[:i]) and all(tok == end for tok in prefix[i:]):
            out[end] = True
        return out
    out[list(cset.allowed(prefix))] = True
    return out


def prefixes_of_length(cset: oracle.ConstraintSet, rng, t: int, n: int) -> np.ndarray:
    """n prefixes of length t: a third from the set (items padded with the end
    token), a third of those with one token changed, a third random."""
    items = cset.sorted_items()
    end = cset.end_token
    rows = []
    for i in range(n):
        item = items[int(rng.integers(len(items)))]
        if end is not None:
            item = item + (end,) * (cset.max_length - len(item))
        row = list(item[:t])
        if i % 3 == 1 and t:
            row[int(rng.integers(t))] = int(rng.integers(V))
        elif i % 3 == 2:
            row = rng.integers(0, V, size=t).tolist()
        rows.append(row)
    if end is not None and t >= 2:  # a finished item, then a token that is not the end token
        short = [s for s in items if len(s) <= t - 2]
        if short:
            row = list(short[0]) + [end] * (t - len(short[0]))
            row[-1] = 1
            rows.append(row)
    return np.asarray(rows, np.int32).reshape(len(rows), t)


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
@pytest.mark.parametrize("layout", oracle.LAYOUTS)
def test_allowed_matches_oracle(kind, layout):
    items, end_token = make_set(kind)
    compiled = oracle.compile_set(items, V, layout, end_token)
    cset = oracle.ConstraintSet(items, V, end_token)
    rng = np.random.default_rng([oracle.LAYOUTS.index(layout), len(kind)])
    in_set = 0
    for t in range(compiled.max_length):
        prefixes = prefixes_of_length(cset, rng, t, 30)
        got = np.asarray(compiled.allowed(prefixes))
        assert got.dtype == np.bool_ and got.shape == (len(prefixes), V)
        for row, prefix in enumerate(prefixes.tolist()):
            np.testing.assert_array_equal(got[row], expected(cset, tuple(prefix)),
                                          err_msg=f"t={t} prefix={prefix}")
        in_set += int(got.any(axis=1).sum())
    assert in_set > 0


def test_allowed_under_jit_matches_eager():
    items, end_token = make_set("ragged")
    compiled = oracle.compile_set(items, V, "csr", end_token)
    cset = oracle.ConstraintSet(items, V, end_token)
    jitted = jax.jit(functools.partial(decode.allowed, compiled.plan))  # a program per t
    rng = np.random.default_rng(3)
    last = compiled.max_length - 1  # CI: the root, one step in, the last step
    for t in range(last + 1) if PROFILE == "slow" else (0, 1, last):
        prefixes = prefixes_of_length(cset, rng, t, 12)
        np.testing.assert_array_equal(np.asarray(jitted(compiled.lowered.device_tables, prefixes)),
                                      np.asarray(compiled.allowed(prefixes)))


def test_traced_out_of_range_tokens_allow_nothing():
    items, end_token = make_set("fixed")
    compiled = oracle.compile_set(items, V, "default", end_token)
    jitted = jax.jit(functools.partial(decode.allowed, compiled.plan))
    prefix = np.asarray([items[0][:2], [V, items[0][1]], [-1, 0]], np.int32)
    got = np.asarray(jitted(compiled.lowered.device_tables, prefix))
    assert got[0].any() and not got[1:].any()


def test_root_allows_the_first_tokens():
    compiled = oracle.compile_set([(1, 2), (3, 1), (3, 2)], 4)
    got = np.asarray(compiled.allowed(np.zeros((2, 0), np.int64)))
    assert got.tolist() == [[False, True, False, True]] * 2


@pytest.mark.parametrize("prefixes, match", [
    (np.zeros((2, 3), np.int32), r"prefixes have length t=3, expected t in \[0, 3\)"),
    (np.zeros((2, 1), np.float32), r"prefixes have shape \(2, 1\) dtype float32, expected an int"),
    (np.zeros((2, 1), bool), r"prefixes have shape \(2, 1\) dtype bool, expected an int"),
    (np.zeros(2, np.int32), r"prefixes have shape \(2,\) dtype int32, expected an int array"),
    (np.zeros((1, 2, 1), np.int32), r"prefixes have shape \(1, 2, 1\)"),
    (np.asarray([[1, 0], [1, 3]]), r"prefixes\[1, 1\]=3 is not a token in \[0, 3\)"),
    (np.asarray([[-1]]), r"prefixes\[0, 0\]=-1 is not a token in \[0, 3\)"),
])
def test_bad_prefixes_are_rejected(tiny_ragged_set, prefixes, match):
    with pytest.raises(DecodeInputError, match=match):
        tiny_ragged_set.allowed(prefixes)
    with pytest.raises(DecodeInputError, match=match):
        tiny_ragged_set.allowed(jnp.asarray(prefixes))
