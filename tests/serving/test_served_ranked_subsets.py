"""Ranked subsets through an exported artifact (format version 16: the
``_ranked`` modules of an artifact saved with export_subsets=True):
`Artifact.ranked_subset` decodes with every served verb bit for bit as
`Artifact.subset` of the same selection and as the library's ranked
subset (beam steps with per-row stacked subsets, the served beam search,
mask, advance, allowed); on the live fuzz's sets (layouts, fixed and
variable length, capacity, additions, removals) against the compiled
set's `subset`; a new ranked subset compiles nothing after
`warm(ranked=True)`; an artifact without ranked modules, a version whose
range tables changed since the export (additions) and another set's
subset are refused naming what to do.
"""

from __future__ import annotations

import json
import shutil

import helpers
import jax
import numpy as np
import pytest
from hypothesis import given
from live_cases import CI_EXAMPLES, compile_case, fuzz_settings, live_cases, paths, updated

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import DecodeInputError
from static_compiler.format import spec as fmt

BEAMS = 5


def _same(a, b, where) -> None:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb), where
    for i, (x, y) in enumerate(zip(la, lb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str((where, i)))


@pytest.fixture(scope="module", params=["fixed", "ragged-capacity"])
def saved(request, tmp_path_factory):
    return helpers.saved_kind(request.param, tmp_path_factory.mktemp("art"), BEAMS, 5)


def _search(door, model, subset, index, batch: int, **options):
    state = door.init_beams(batch, BEAMS)
    for t in range(door.max_length):
        logits = model(np.asarray(state.last_tokens), t)
        state = door.beam_step(state, logits, t, subset=subset, subset_index=index, **options)
    return door.finalize(state)


def _model(vocab: int, seed: int):
    table = np.random.default_rng(seed).normal(size=(16, vocab + 1, vocab)).astype(np.float32)
    return lambda last, t: table[t][np.clip(last, 0, vocab)]


def test_served_ranked_subsets_decode_as_subsets_and_as_the_librarys(saved):
    items, compiled, art, _ = saved
    assert art.manifest.exports_ranked
    rng = np.random.default_rng(1)
    masks = np.stack([rng.random(len(items)) < 0.4, np.zeros(len(items), bool),
                      rng.random(len(items)) < 0.8])
    ranked, subset = art.ranked_subset(masks), sc.stack_subsets([art.subset(m) for m in masks])
    library = compiled.ranked_subset(masks)
    index = np.array([2, 0, 1, 2])
    model = _model(art.vocab_size, 3)
    want = _search(art, model, subset, index, 4)
    _same(_search(art, model, ranked, index, 4), want, "served beam steps")
    _same(_search(compiled, model, library, index, 4), want, "library beam steps")
    one = art.ranked_subset(masks[0])
    _same(art.beam_search(lambda last, t, c: (model(np.asarray(last), t), c), 2, BEAMS,
                          subset=one),
          art.beam_search(lambda last, t, c: (model(np.asarray(last), t), c), 2, BEAMS,
                          subset=art.subset(masks[0])), "served beam_search")
    # the processor pair and allowed, per row
    rows = np.array([0, 2, 2])
    mine = theirs = art.init_processor(3)
    for t in range(art.max_length):
        logits = rng.standard_normal((3, art.vocab_size)).astype(np.float32)
        want = art.mask(logits, theirs, t, subset=subset, subset_index=rows)
        _same(art.mask(logits, mine, t, subset=ranked, subset_index=rows), want, ("mask", t))
        allowed = [np.flatnonzero(np.asarray(want)[b] > sc.SENTINEL_SCORE) for b in range(3)]
        tokens = np.array([int(rng.choice(a)) if a.size else 0 for a in allowed], np.int32)
        theirs = art.advance(theirs, tokens, t, subset=subset, subset_index=rows)
        mine = art.advance(mine, tokens, t, subset=ranked, subset_index=rows)
        _same(mine, theirs, ("advance", t))
    prefixes = np.asarray([list(items[i][:1]) for i in range(4)], np.int32)
    _same(art.allowed(prefixes, subset=ranked, subset_index=index),
          art.allowed(prefixes, subset=subset, subset_index=index), "allowed")


@fuzz_settings(max(2, CI_EXAMPLES // 4))
@given(case=live_cases())
def test_served_ranked_subsets_on_the_live_fuzz(case, tmp_path_factory):
    """Every layout, capacity, additions and removals: a saved version's
    served ranked subsets decode as the compiled version's subsets."""
    c = updated(compile_case(case, export_beam_sizes=(3,)), case)
    path = tmp_path_factory.mktemp("fuzz") / "set.static"
    c.save(path)
    art = serving.load(path)
    stacked = np.stack(case.subsets)
    ranked, subset = art.ranked_subset(stacked), sc.stack_subsets([c.subset(m)
                                                                    for m in case.subsets])
    n = len(case.subset_index)
    model = _model(case.vocab, n)
    index = np.asarray(case.subset_index, np.int32)
    state_a = state_b = art.init_beams(n, 3)
    for t in range(art.max_length):
        logits = model(np.asarray(state_b.last_tokens), t)
        state_a = art.beam_step(state_a, logits, t, subset=ranked, subset_index=index)
        state_b = c.beam_step(state_b, logits, t, subset=subset, subset_index=index)
        _same(state_a.tokens, state_b.tokens, ("tokens", t))
        _same(state_a.node, state_b.node, ("node", t))
    drafts = np.asarray(paths(case.all_rows, case, c.max_length), np.int32)
    rows = np.resize(index, drafts.shape[0])
    mine, theirs = art.init_processor(drafts.shape[0]), c.init_processor(drafts.shape[0])
    for t in range(art.max_length):
        _same(art.allowed_tokens(mine, t, subset=ranked, subset_index=rows),
              c.allowed_tokens(theirs, t, subset=subset, subset_index=rows), ("allowed", t))
        mine = art.advance(mine, drafts[:, t], t, subset=ranked, subset_index=rows)
        theirs = c.advance(theirs, drafts[:, t], t, subset=subset, subset_index=rows)


def test_after_warm_ranked_a_new_ranked_subset_compiles_nothing(saved):
    items, _, art, _ = saved
    report = art.warm([2], max_subsets=3, ranked=True)
    assert report.compilations > 0
    before = art.compilations()
    rng = np.random.default_rng(4)
    model = _model(art.vocab_size, 1)
    for _ in range(2):
        one = art.ranked_subset(rng.random(len(items)) < 0.5)
        _search(art, model, one, None, 2)
        three = art.ranked_subset(np.stack([rng.random(len(items)) < 0.5 for _ in range(3)]))
        _search(art, model, three, np.array([2, 1]), 2)
        state = art.init_processor(2)
        art.advance(state, np.zeros(2, np.int32), 0, subset=three, subset_index=np.array([0, 2]))
    assert art.compilations() == before
    with pytest.raises(DecodeInputError, match=r"warm: ranked='yes': expected a bool"):
        art.warm([2], ranked="yes")


def test_bad_ranked_subsets_are_refused_naming_what_to_do(saved, tmp_path):
    items, compiled, art, path = saved
    state = art.init_beams(2, BEAMS)
    logits = np.zeros((2, BEAMS, art.vocab_size), np.float32)
    with pytest.raises(DecodeInputError, match="the ranked subset was made from another set"):
        art.beam_step(state, logits, 0, subset=compiled.ranked_subset(np.ones(len(items), bool)))
    stacked = art.ranked_subset(np.ones((2, len(items)), bool))
    with pytest.raises(DecodeInputError, match="2 stacked subsets: pass subset_index"):
        art.beam_step(state, logits, 0, subset=stacked)
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 2: expected a subset in "):
        art.beam_step(state, logits, 0, subset=stacked, subset_index=np.array([0, 2]))
    # an artifact written before format version 16 has no ranked modules: re-export adds them
    copy = tmp_path / "older"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for name in [n for n in manifest["modules"] if "_ranked" in n]:
        rel = manifest["modules"].pop(name)["file"]
        manifest["files"].pop(rel)
        (copy / rel).unlink()
    manifest.pop(fmt.MANIFEST_DIGEST_KEY, None)
    (copy / "manifest.json").write_bytes(fmt.seal_manifest(manifest))
    older = serving.load(copy)
    assert not older.manifest.exports_ranked
    with pytest.raises(DecodeInputError, match=r"exports no ranked-subset modules .*"
                                               r"static-compiler re-export"):
        older.beam_step(state, logits, 0, subset=older.ranked_subset(np.ones(len(items), bool)))
    with pytest.raises(DecodeInputError, match="exports no ranked-subset modules"):
        older.warm([1], ranked=True)
    from static_compiler.cli import main
    assert main(["re-export", str(copy)]) == 0
    again = serving.load(copy)
    _same(_search(again, _model(art.vocab_size, 2), again.ranked_subset(np.ones(len(items), bool)),
                  None, 2),
          _search(art, _model(art.vocab_size, 2), art.subset(np.ones(len(items), bool)), None, 2),
          "re-exported")


def test_additions_export_the_ranked_modules_anew_and_reload_shares_the_rest(
        tmp_path, capsys, monkeypatch):
    """`static-compiler update --add` within capacity keeps the modules
    (same tables) but the ranked ones, which take the grown trie's range
    tables: exported anew, and `reload` shares every other module and the
    warm state. By another jax than the modules' the ranked ones are kept,
    and a ranked subset is refused naming `static-compiler re-export`."""
    from static_compiler.cli import main
    from static_compiler.serving import runtime
    path = tmp_path / "set.static"
    items = helpers.saved_with_capacity(path, BEAMS)
    old = serving.load(path)
    np.save(tmp_path / "add.npy", np.array([[8, 8, 8, 1], [8, 8, 7, 2], [0, 8, 8, 3]]))
    assert main(["update", str(path), "--add", str(tmp_path / "add.npy")]) == 0
    assert "modules kept" in capsys.readouterr().out
    new = old.reload()
    assert helpers.shares_the_modules(new, old)
    assert not any(new._modules[name] is old._modules[name] for name in old._modules
                   if fmt.is_ranked_module(name))
    everything = np.ones(len(items) + 3, bool)
    model = _model(9, 5)
    for art in (new, serving.load(path)):
        _same(_search(art, model, art.ranked_subset(everything), None, 1),
              _search(art, model, art.subset(everything), None, 1), "after the addition")
    # another jax than the modules': the ranked modules kept, a ranked subset refused
    monkeypatch.setattr(runtime, "running_versions", lambda: ("0.0.1", "0.0.1"))
    np.save(tmp_path / "more.npy", np.array([[8, 8, 8, 2]]))
    assert main(["update", str(path), "--add", str(tmp_path / "more.npy")]) == 0
    monkeypatch.undo()
    art = serving.load(path)
    state, logits = art.init_beams(1, BEAMS), np.zeros((1, BEAMS, 9), np.float32)
    with pytest.raises(DecodeInputError, match=r"ranked-subset modules take the range tables of "
                                               r"the version they were exported with.*re-export"):
        art.beam_step(state, logits, 0, subset=art.ranked_subset(np.ones(len(items) + 4, bool)))
    assert main(["re-export", str(path)]) == 0
    art = serving.load(path)
    everything = np.ones(len(items) + 4, bool)
    _same(_search(art, model, art.ranked_subset(everything), None, 1),
          _search(art, model, art.subset(everything), None, 1), "after re-export")
