"""`Artifact.warm`: after warming the batch sizes, beam sizes and
stacked-subset counts a server will see, no request within them compiles,
across a removal and an addition within capacity written by another process
and `reload()`ed, and every valid beam is a live item of its row's subset.
Compilations are counted from jax's own compile events, in the process
(`xla_compilations`) and per artifact (`Artifact.compilations`)."""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import sys

import helpers
import jax
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.compile_events import xla_compilations
from static_compiler.support.decode_types import WarmReport

V, L, N, M = 64, 4, 20_000, 8


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(rows, path updated by the mix test, an untouched copy, the loaded
    artifact warmed for B in {2, 16}, M = 8, up to 4 subsets, its report)."""
    rows = np.random.default_rng(0).integers(1, V, size=(N, L))
    compiled = sc.compile_constraints(rows, vocab_size=V, capacity=1.25, export_subsets=True,
                                      export_beam_sizes=(M,))
    path = tmp_path_factory.mktemp("warm") / "set.static"
    compiled.save(path)
    copy = path.parent / "copy.static"
    shutil.copytree(path, copy)
    art = serving.load(path)
    report = art.warm(batch_sizes=[2, 16], beam_sizes=[M], max_subsets=4)
    return rows, path, copy, art, report


def _update_in_another_process(path, **arrays):
    """`sc.update_artifact(path, ...)` run by a separate Python process."""
    np.savez(path.parent / "update.npz", **arrays)
    code = ("import sys, numpy as np, static_compiler as sc; a = np.load(sys.argv[2]); "
            "sc.update_artifact(sys.argv[1], **{k: a[k] for k in a.files})")
    subprocess.run([sys.executable, "-c", code, str(path), str(path.parent / "update.npz")],
                   check=True, capture_output=True, timeout=120)


def _requests(art, rows, gone: set, rng):
    """Decodes B in {2, 16} with 0-4 stacked subsets (beam search, and a
    mask / advance step), checking every valid beam against numpy: its
    tokens are a row its subset selected, and not removed."""
    for B in (2, 16):
        for R in range(5):
            sel = [rng.random(len(rows)) < 0.3 for _ in range(R)]
            index = rng.integers(0, max(R, 1), B).astype(np.int32)
            kw = {} if R == 0 else dict(subset=sc.stack_subsets([art.subset(s) for s in sel]),
                                        subset_index=index)
            state = art.init_beams(B, M)
            for t in range(art.max_length):  # logits on the host, then on the device
                logits = rng.standard_normal((B, M, V)).astype(np.float32)
                state = art.beam_step(state, logits if t % 2 else jax.device_put(logits), t, **kw)
            tokens, _, valid, _ = (np.asarray(x) for x in art.finalize(state))
            assert valid.any()
            for b in range(B):
                live = {tuple(r) for r in (rows if R == 0 else rows[sel[index[b]]])} - gone
                for m in np.flatnonzero(valid[b]):
                    assert tuple(tokens[b, m]) in live, (B, R, b, m)
            pstate = art.init_processor(B)
            masked = art.mask(rng.standard_normal((B, V)).astype(np.float32), pstate, 0, **kw)
            art.advance(pstate, np.argmax(np.asarray(masked), -1), 0, **kw)


def test_after_warm_the_request_mix_compiles_nothing_across_updates(saved):
    rows, path, _, art, report = saved
    assert isinstance(report, WarmReport) and report.compilations > 0
    assert report.subset_rows == 4 and report.batch_sizes == (2, 16)
    again = art.warm(batch_sizes=[16, 2], beam_sizes=[M], max_subsets=4)
    assert again.compilations == 0
    rng = np.random.default_rng(1)
    total, own = xla_compilations(), art.compilations()
    _requests(art, rows, set(), rng)
    # A removal, written by another process, reloaded between two decodes.
    gone_rows = rng.random(N) < 0.2
    _update_in_another_process(path, remove=gone_rows)
    removed = art.reload()
    assert removed is not art and removed._modules is art._modules
    assert removed.items.removal_tag
    gone = {tuple(r) for r in rows[gone_rows]}
    _requests(removed, rows, gone, rng)
    # Additions within capacity, by another process: same modules, same table shapes.
    added = np.random.default_rng(2).integers(1, V, size=(300, L))
    _update_in_another_process(path, add=added)
    grown = removed.reload()
    assert helpers.shares_the_modules(grown, art) and grown.items.num_items == N + 300
    _requests(grown, np.concatenate([rows, added]), gone - {tuple(r) for r in added}, rng)
    assert xla_compilations() == total
    assert art.compilations() == grown.compilations() == own


def test_padded_stacks_decode_as_unpadded(saved):
    rows, _, copy, art, _ = saved
    plain = serving.load(copy)  # not warmed: stacks go unpadded
    rng = np.random.default_rng(3)
    sel = [rng.random(N) < 0.5 for _ in range(2)]
    index = np.array([1, 0], np.int32)
    results = []
    for a in (art, plain):
        subset = sc.stack_subsets([a.subset(s) for s in sel])
        state = a.init_beams(2, M)
        for t in range(a.max_length):
            logits = np.random.default_rng(t).standard_normal((2, M, V)).astype(np.float32)
            state = a.beam_step(state, logits, t, subset=subset, subset_index=index)
        results.append([np.asarray(x) for x in a.finalize(state)])
    assert plain._warmth.pad_to is None and art._warmth.pad_to == 4
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


def test_background_warm_up(saved):
    _, _, _, art, _ = saved
    future = art.warm(1, background=True)  # a new batch size, all exported beam sizes
    assert isinstance(future, concurrent.futures.Future)
    report = future.result(timeout=120)
    assert report.compilations > 0 and report.beam_sizes == (M,)
    own, total = art.compilations(), xla_compilations()
    state = art.init_beams(1, M)
    for t in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, M, V), np.float32), t,
                              subset=art.subset(np.ones(N, bool)))
    jax.block_until_ready(art.finalize(state))
    assert art.compilations() == own and xla_compilations() == total


def test_bad_arguments_are_typed_errors(saved, tmp_path):
    _, _, _, art, _ = saved
    for kwargs, words in [(dict(batch_sizes=[0]), "batch_size"),
                          (dict(batch_sizes=[]), "empty"),
                          (dict(batch_sizes="2"), "batch"),
                          (dict(batch_sizes=[2], beam_sizes=[9]), "[8]"),
                          (dict(batch_sizes=[2], max_subsets=-1), "max_subsets"),
                          (dict(batch_sizes=[2], max_subsets=1.5), "max_subsets"),
                          (dict(batch_sizes=[2], background="yes"), "background")]:
        for background in (False, True):
            kwargs = {"background": background, **kwargs}
            with pytest.raises(DecodeInputError, match=words.replace("[", r"\[")):
                art.warm(**kwargs)
    compiled = sc.compile_constraints([[1, 2], [3, 4]], vocab_size=5, export_beam_sizes=(2,))
    compiled.save(tmp_path / "plain.static")
    plain = serving.load(tmp_path / "plain.static")
    with pytest.raises(DecodeInputError, match="no item subsets"):
        plain.warm([2], max_subsets=1)
    assert plain.compilations() == 0
