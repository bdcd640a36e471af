"""One log-softmax, the same bits wherever it runs: the
library's jitted search over a model whose logits are compile-time constants
and a served artifact's beam_step, fed the same logits as arguments, give
bit-identical scores. Before the optimization barrier in `LogProbs.of`, XLA
folded the constant logits' log-softmax at compile time, whose exp / log
round apart from the compiled kernels' (1 ulp with all-equal logits, V = 7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.backend.decode.logprobs import LogProbs

ROWS = {
    "all-equal": lambda V: np.zeros(V, np.float32),
    "constant": lambda V: np.full(V, 3.7, np.float32),
    "tied top": lambda V: np.where(np.arange(V) % 3 == 0, 4.0, -1.0).astype(np.float32),
    "tiny": lambda V: np.full(V, 1e-30, np.float32),
    "subnormal": lambda V: (np.arange(V) * np.float32(1e-45)).astype(np.float32),
    "huge": lambda V: np.full(V, 3e38, np.float32),
    "huge spread": lambda V: np.linspace(-3e38, 3e38, V).astype(np.float32),
    "nan and -inf": lambda V: np.concatenate([[np.nan, -np.inf],
                                              np.arange(V - 2) % 5]).astype(np.float32),
    "+inf": lambda V: np.where(np.arange(V) % 4 == 1, np.inf, 1.0).astype(np.float32),
}


@pytest.mark.parametrize("V", [7, 33, 300])
@pytest.mark.parametrize("row", sorted(ROWS))
def test_constant_and_argument_logits_give_the_same_log_probs(V, row):
    x = ROWS[row](V)[None, :]
    as_constant = jax.jit(lambda: LogProbs.of(jnp.asarray(x)).all())()
    as_argument = jax.jit(lambda y: LogProbs.of(y).all())(x)
    np.testing.assert_array_equal(np.asarray(as_constant), np.asarray(as_argument))
    assert not np.isnan(np.asarray(as_argument)).any()


@pytest.fixture(scope="module", params=[7, 300])
def served(request, tmp_path_factory):
    V = request.param
    sids = np.random.default_rng(0).integers(0, V, (60, 3))
    compiled = sc.compile_constraints(sids, vocab_size=V, export_beam_sizes=(5,))
    path = tmp_path_factory.mktemp("bits") / "set.static"
    compiled.save(path)
    return compiled, serving.load(path)


@pytest.mark.parametrize("row", sorted(ROWS))
def test_a_served_beam_step_gives_the_librarys_bits(served, row):
    compiled, art = served
    V, M = compiled.vocab_size, 5
    logits = np.broadcast_to(ROWS[row](V), (1, M, V))
    want = sc.beam_search(compiled, lambda t, s, c: (jnp.asarray(logits), c), batch_size=1,
                          beam_size=M)
    state = art.init_beams(1, M)
    for t in range(art.max_length):
        state = art.beam_step(state, logits, t)
    got = art.finalize(state)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
