"""Logits wider than the set's vocabulary (a model's padded vocabulary:
V = 50257 tokens in logits of 50304 columns) on every door that takes
logits: the library (`mask`, `beam_step`, `sc.beam_search`,
`greedy_decode`, `sample`, the step processor), the served artifact
(`mask`, `beam_step`, `beam_search`) and the torch backend (`mask`,
`beam_step`, `beam_search`). One rule (`arguments.check_logits_shape`):
width W >= V is accepted; the columns >= V are padding, never allowed and
not part of the log_softmax, so every result equals the one of the first V
columns, and a mask comes back W wide with SENTINEL_SCORE there. The
padding columns here hold +inf, NaN and large logits: any leak into a
candidate or the normalisation would change the beams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints

V, PAD, B, M = 11, 5, 2, 3
W = V + PAD
ROWS = np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1], [5, 6, 7], [5, 9, 10], [10, 10, 10]])


def _wide(logits: np.ndarray) -> np.ndarray:
    """`logits` (..., V) with PAD padding columns: +inf, NaN and large values."""
    pad = np.tile(np.array([np.inf, np.nan, 1e6, 50.0, -np.inf], np.float32),
                  logits.shape[:-1] + (1,))
    return np.concatenate([logits, pad], axis=-1)


TABLE = np.random.default_rng(3).standard_normal((3, V, V)).astype(np.float32)


def _fn(wide: bool, xp=jnp):
    """A stand-in model: logits of the last token at each step, V or W wide."""
    table = xp.asarray(_wide(TABLE) if wide else TABLE)
    return lambda last, step, carry: (table[step][last], carry)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    compiled = sc.compile_constraints(ROWS, V, export_beam_sizes=(M,), export_subsets=True)
    path = tmp_path_factory.mktemp("padded") / "set.sc"
    compiled.save(path)
    return compiled, serving.load(path), TorchConstraints.load(path)


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_library_doors(sets):
    compiled = sets[0]
    _same(sc.beam_search(compiled, _fn(True), batch_size=B, beam_size=M),
          sc.beam_search(compiled, _fn(False), batch_size=B, beam_size=M))
    _same(sc.greedy_decode(compiled, _fn(True), batch_size=B),
          sc.greedy_decode(compiled, _fn(False), batch_size=B))
    key = jax.random.PRNGKey(0)
    _same(sc.sample(compiled, _fn(True), key, batch_size=B),
          sc.sample(compiled, _fn(False), key, batch_size=B))
    state = compiled.init_beams(B, M)
    logits = TABLE[0][np.asarray(state.last_tokens)]
    _same(compiled.beam_step(state, _wide(logits), 0), compiled.beam_step(state, logits, 0))
    proc_state = compiled.init_processor(B)
    narrow = TABLE[0][:B]
    for mask in (lambda x, st, t: compiled.mask(x, st, t),
                 lambda x, st, t: compiled.mask(x, st, jnp.int32(t)),   # the traced step
                 lambda x, st, t: compiled.processor(B).mask(x, st, t)):
        got, want = np.asarray(mask(_wide(narrow), proc_state, 0)), \
            np.asarray(mask(narrow, proc_state, 0))
        assert got.shape == (B, W)
        np.testing.assert_array_equal(got[:, :V], want)
        assert (got[:, V:] == sc.SENTINEL_SCORE).all()
    proc = compiled.processor(B)
    tokens = np.array([1, 5], np.int32)
    (moved, got), (_, want) = (proc.advance_and_mask(proc_state, tokens, 0, x)
                               for x in (_wide(TABLE[1][:B]), TABLE[1][:B]))
    assert np.asarray(got).shape == (B, W) and (np.asarray(got)[:, V:] == sc.SENTINEL_SCORE).all()
    np.testing.assert_array_equal(np.asarray(got)[:, :V], np.asarray(want))


def test_served_doors(sets):
    compiled, art, _ = sets
    _same(art.beam_search(_fn(True), B, M), art.beam_search(_fn(False), B, M))
    _same(art.beam_search(_fn(True), B, M), sc.beam_search(compiled, _fn(False), batch_size=B,
                                                           beam_size=M))
    state = art.init_beams(B, M)
    logits = TABLE[0][np.asarray(state.last_tokens)]
    _same(art.beam_step(state, _wide(logits), 0), art.beam_step(state, logits, 0))
    sub = art.subset(np.arange(len(ROWS)) % 2 == 0)
    st = art.init_processor(B)
    for kwargs in ({}, {"subset": sub}):
        got = np.asarray(art.mask(_wide(TABLE[0][:B]), st, 0, **kwargs))
        assert got.shape == (B, W) and (got[:, V:] == sc.SENTINEL_SCORE).all()
        np.testing.assert_array_equal(got[:, :V], np.asarray(art.mask(TABLE[0][:B], st, 0,
                                                                      **kwargs)))


def test_torch_doors(sets):
    _, _, tc = sets
    fn_wide, fn = _fn(True, torch), _fn(False, torch)
    wide_result, result = tc.beam_search(fn_wide, B, M), tc.beam_search(fn, B, M)
    _same(wide_result, result)
    state = tc.init_beams(B, M)
    logits = torch.from_numpy(TABLE[0])[state.last_tokens]
    _same(tc.beam_step(state, torch.from_numpy(_wide(logits.numpy())), 0),
          tc.beam_step(state, logits, 0))
    st = tc.init_processor(B)
    got = tc.mask(torch.from_numpy(_wide(TABLE[0][:B])), st, 0)
    assert got.shape == (B, W) and (got[:, V:] == sc.SENTINEL_SCORE).all()
    assert torch.equal(got[:, :V], tc.mask(torch.from_numpy(TABLE[0][:B]), st, 0))


def test_narrower_logits_are_still_refused_on_every_door(sets):
    compiled, art, tc = sets
    narrow = np.zeros((B, V - 1), np.float32)
    message = rf"logits have shape \({B}, {V - 1}\), expected \({B}, {V}\) .*or more columns"
    for call in (lambda: compiled.mask(narrow, compiled.init_processor(B), 0),
                 lambda: art.mask(narrow, art.init_processor(B), 0),
                 lambda: tc.mask(torch.from_numpy(narrow), tc.init_processor(B), 0)):
        with pytest.raises(DecodeInputError, match=message):
            call()
    with pytest.raises(DecodeInputError, match=r"logits have shape \(2, 3, 11, 1\)"):
        sc.beam_search(compiled, lambda last, step, carry: (jnp.zeros((B, M, V, 1)), carry),
                       batch_size=B, beam_size=M)
