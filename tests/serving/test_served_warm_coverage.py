"""What `Artifact.warm` covers, and what it counts: after a warm-up, the
logits-processor loop (init_processor, mask, allowed_tokens, advance at
every step on the state advance returned), `allowed` at every prefix
length, `finalize` / `beam_search` with any length penalty and the served
`beam_search` over a set with an end token compile nothing, also over
stacked subsets and after a removal; the warm-up's reported count equals
the compile events jax reported during it and `compilations()`; a
`max_subsets` past its bound is a typed error that leaves the artifact as
it was, and a warm-up that fails changes nothing. A tiny set (B and M
small): compilations are counted from jax's own events."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.decoding import warm_up
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.compile_events import xla_compilations
from static_compiler.serving import warm as warming

V, L, N, M, END = 16, 3, 200, 2, 0


def model(xp):
    """A model of numpy (`host_model`: made on the host, so the search's own
    programs are all that can compile) or of jax.numpy (for the compiled
    set's search, whose program traces it)."""
    def logits_fn(last, step, carry):
        x = xp.cos(xp.arange(V, dtype=xp.float32) * (step + 1.3) + xp.asarray(last)[..., None])
        return x.astype(xp.float32), carry

    return logits_fn


host_model = model(np)


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(0).integers(1, V, size=(N, L))


def _saved(rows, path):
    compiled = sc.compile_constraints(rows, vocab_size=V, end_token=END, capacity=1.5,
                                      export_subsets=True, export_beam_sizes=(M,))
    compiled.save(path)
    return path


def _loop(art, B, **kw):
    """The processor loop at B rows, every step on the state advance returned,
    allowed at every prefix length, and searches and finalize with length
    penalties."""
    out, state = [], art.init_processor(B)
    for t in range(art.max_length):
        x = art.mask(np.cos(np.arange(V, dtype=np.float32) * t)[None].repeat(B, 0), state, t,
                     **kw)
        out += [x, art.allowed_tokens(state, t, **kw)]
        state = art.advance(state, np.argmax(np.asarray(x), -1), t, **kw)
        out.append(art.allowed(np.ones((B, t), np.int32), **kw))
    for penalty in (0.0, 0.6, 1.7):
        result = art.beam_search(host_model, B, M, length_penalty=penalty, **kw)
        out += [result, art.finalize(art.init_beams(B, M), penalty)]
    return jax.block_until_ready(out)


def test_after_warm_the_loop_allowed_penalties_and_search_compile_nothing(rows, tmp_path):
    art = serving.load(_saved(rows, tmp_path / "set.static"))
    events = xla_compilations()
    report = art.warm([2], max_subsets=2)
    assert report.compilations > 0
    assert report.compilations == xla_compilations() - events == art.compilations()
    stacked = sc.stack_subsets([art.subset(np.arange(N) < 80), art.subset(np.arange(N) >= 60)])
    events, own = xla_compilations(), art.compilations()
    _loop(art, 2)
    _loop(art, 2, subset=stacked, subset_index=np.array([1, 0]))
    sc.update_artifact(art.path, remove=np.arange(N) % 4 == 0)  # a removal: the subset modules
    removed = art.reload()
    assert removed._modules is art._modules
    _loop(removed, 2)
    assert xla_compilations() == events and art.compilations() == own


def test_the_served_search_with_an_end_token_finds_the_compiled_sets_beams(rows, tmp_path):
    art = serving.load(_saved(rows, tmp_path / "set.static"))
    compiled = sc.load(art.path)
    for penalty in (0.0, 0.6):
        served = art.beam_search(host_model, 2, M, length_penalty=penalty)
        ref = sc.beam_search(compiled, model(jax.numpy), batch_size=2, beam_size=M,
                             length_penalty=penalty)
        for a, b in zip(served, ref):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_max_subsets_past_its_bound_is_typed_and_changes_nothing(rows, tmp_path):
    art = serving.load(_saved(rows, tmp_path / "set.static"))
    each = warming.subset_bytes(art.subset(np.zeros(N, bool)))
    bound = warming.PADDED_SUBSETS_MAX_BYTES // each
    for k in (bound + 1, 10 ** 12):
        for background in (False, True):
            with pytest.raises(DecodeInputError, match=rf"max_subsets={k}.*\[0, {bound}\]"):
                art.warm([2], max_subsets=k, background=background)
    assert art._warmth.pad_to is None and art.compilations() == 0
    stacked = sc.stack_subsets([art.subset(np.arange(N) < 50), art.subset(np.arange(N) > 9)])
    state = art.init_beams(2, M)
    art.beam_step(state, np.zeros((2, M, V), np.float32), 0, subset=stacked,
                  subset_index=np.array([0, 1]))  # (decoded as 2 stacked subsets)


def test_a_failed_warm_up_leaves_the_padding_as_it_was(rows, tmp_path, monkeypatch):
    art = serving.load(_saved(rows, tmp_path / "set.static"))
    art.warm([1], max_subsets=2)

    def fails(*args):
        raise MemoryError("dummy inputs")

    monkeypatch.setattr(warm_up, "_walk", fails)  # (after every check and the padding)
    with pytest.raises(MemoryError):
        art.warm([1], max_subsets=5)
    with pytest.raises(MemoryError):
        art.warm([1], max_subsets=6, background=True).result(timeout=60)
    assert art._warmth.pad_to == 2
