"""Item subsets through an exported artifact (`export_subsets=True`):
`Artifact.subset` computes the same bits from the artifact's own tables and
item index, and the subset modules decode bit-identically to the library
(`sc.beam_search`, `mask`, `advance` with the same subsets), with no new
compilation for new subsets."""

from __future__ import annotations

import json
import shutil

import helpers
import jax.numpy as jnp
import numpy as np
import oracle
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ArtifactFormatError, ConstraintSetError, DecodeInputError
from static_compiler.format import snapshot
from static_compiler.format import spec as fmt
from static_compiler.lowered import plan as plan_lib

BEAMS = 5
SAVED = ["fixed", "ragged", "ragged-capacity"]


def saved_as(*kinds):
    """Indirect parameters for `saved`: the sets `kinds` in the default run,
    every other one only under `-m slow` (for checks that do not depend on
    the set's kind: one saved set shows them)."""
    slow = lambda kind: pytest.param(kind, marks=pytest.mark.slow)
    return pytest.mark.parametrize("saved", [k if k in kinds else slow(k) for k in SAVED],
                                   indirect=True)


@pytest.fixture(scope="module", params=SAVED)
def saved(request, tmp_path_factory):
    return helpers.saved_kind(request.param, tmp_path_factory.mktemp("art"), BEAMS, 3, export_tokens_per_beam=2)




def test_artifact_subsets_equal_the_librarys(saved):
    items, compiled, art, _ = saved
    rng = np.random.default_rng(1)
    masks = [rng.random(len(items)) < 0.4, np.zeros(len(items), bool), rng.random(len(items)) < 0.8]
    by_art = sc.stack_subsets([art.subset(m) for m in masks])
    by_lib = sc.stack_subsets([compiled.subset(m) for m in masks])
    for a, b in zip(by_art.live + by_art.ends, by_lib.live + by_lib.ends):
        assert (a is None and b is None) or np.array_equal(a, b)
    index = np.array([2, 0, 1, 2])
    seeds = [5, 6, 7, 8]
    model = oracle.HashModel(compiled.vocab_size, dup=40)
    want = sc.beam_search(compiled, model, batch_size=4, beam_size=BEAMS, tokens_per_beam=2,
                          carry=model.init_carry(seeds, BEAMS), carry_axes=model.carry_axes,
                          subset=by_lib, subset_index=index)
    from static_compiler.backend.decode import reorder_carry
    state, carry = art.init_beams(4, BEAMS), model.init_carry(seeds, BEAMS)
    for t in range(art.max_length):
        logits, carry = model(state.last_tokens, jnp.int32(t), carry)
        state = art.beam_step(state, logits, t, subset=by_art, subset_index=index)
        carry = reorder_carry(carry, state.parent, _axes(model, carry), None)
    for got, exp in zip(art.finalize(state), want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
    # New subsets run the same deserialized, compiled module.
    name = fmt.subset_module_name(fmt.beam_module_name("beam_step", BEAMS))
    zeros = np.zeros((4, BEAMS, art.vocab_size), np.float32)
    sizes = []
    for _ in range(2):
        again = sc.stack_subsets([art.subset(rng.random(len(items)) < 0.5) for _ in range(3)])
        art.beam_step(art.init_beams(4, BEAMS), zeros, 0, subset=again, subset_index=index)
        sizes.append(art._modules[name]._call._cache_size())
    assert sizes[0] == sizes[1]


def _axes(model, carry):
    from static_compiler.backend.decode.carry import resolve_carry_axes
    return resolve_carry_axes(carry, model.carry_axes, 4, BEAMS, None)


def test_artifact_mask_and_advance_with_subsets_equal_the_librarys(saved):
    items, compiled, art, _ = saved
    rng = np.random.default_rng(2)
    masks = [rng.random(len(items)) < 0.5, rng.random(len(items)) < 0.5]
    by_art = sc.stack_subsets([art.subset(m) for m in masks])
    by_lib = sc.stack_subsets([compiled.subset(m) for m in masks])
    index = np.array([0, 1, 1])
    lib_state, art_state = compiled.init_processor(3), art.init_processor(3)
    for t in range(art.max_length):
        logits = rng.standard_normal((3, art.vocab_size)).astype(np.float32)
        want = compiled.mask(logits, lib_state, t, subset=by_lib, subset_index=index)
        got = art.mask(logits, art_state, t, subset=by_art, subset_index=index)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        allowed = [np.flatnonzero(np.asarray(want)[b] > sc.SENTINEL_SCORE) for b in range(3)]
        tokens = np.array([int(rng.choice(a)) if a.size else 0 for a in allowed], np.int32)
        lib_state = compiled.advance(lib_state, tokens, t, subset=by_lib, subset_index=index)
        art_state = art.advance(art_state, tokens, t, subset=by_art, subset_index=index)
        for a, b in zip(art_state, lib_state):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@saved_as("ragged-capacity")
def test_subset_errors(saved):
    items, compiled, art, _ = saved
    one = art.subset(np.ones(len(items), bool))
    state = art.init_beams(2, BEAMS)
    logits = np.zeros((2, BEAMS, art.vocab_size), np.float32)
    with pytest.raises(DecodeInputError, match="made from another compiled set"):
        art.beam_step(state, logits, 0, subset=compiled.subset(np.ones(len(items), bool)))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 3: expected a subset in \[0, 1\)"):
        art.beam_step(state, logits, 0, subset=one, subset_index=np.array([0, 3]))
    with pytest.raises(DecodeInputError, match="2 stacked subsets: pass subset_index"):
        art.beam_step(state, logits, 0, subset=sc.stack_subsets([one, one]))
    with pytest.raises(ConstraintSetError, match=rf"shape \(3,\): expected \({len(items)},\)"):
        art.subset(np.ones(3, bool))


def test_artifacts_without_subsets_say_so(tmp_path):
    compiled = sc.compile_constraints([[1, 2], [2, 3]], 4, export_beam_sizes=(2,))
    compiled.save(tmp_path / "a")
    art = serving.load(tmp_path / "a")
    assert art.items is None and art.manifest.item_files is None
    assert not any(name.endswith("_subset") or "_subset_" in name for name in art.manifest.modules)
    with pytest.raises(DecodeInputError, match="has no item index"):
        art.subset(np.ones(2, bool))
    minimized = oracle.shared_suffix_set(np.random.default_rng(0), 6, 8)
    with pytest.raises(ConstraintSetError, match="'minimize' pass"):
        sc.compile_constraints(minimized, 8, pipeline=oracle.pipeline_for("default", True),
                               export_subsets=True)


@saved_as("ragged-capacity")
def test_a_manifest_missing_a_subset_module_is_rejected(saved, tmp_path):
    import shutil
    _, _, _, path = saved
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["modules"].pop("mask_subset")
    manifest["files"].pop("modules/mask_subset.jaxexport")
    (copy / "modules/mask_subset.jaxexport").unlink()
    manifest.pop(fmt.MANIFEST_DIGEST_KEY, None)
    (copy / "manifest.json").write_bytes(fmt.seal_manifest(manifest))
    with pytest.raises(ArtifactFormatError, match="mask_subset"):
        serving.load(copy)


@saved_as("ragged-capacity")
def test_a_tampered_item_index_is_rejected(saved, tmp_path):
    import hashlib
    import shutil
    _, compiled, _, path = saved
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    rel = fmt.item_file("row_item")
    row_item = np.load(copy / rel)
    row_item[0] = compiled.ir.num_sequences  # out of range
    np.save(copy / rel, row_item)
    manifest = json.loads((copy / "manifest.json").read_text())
    data = (copy / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest.pop(fmt.MANIFEST_DIGEST_KEY, None)
    (copy / "manifest.json").write_bytes(fmt.seal_manifest(manifest))
    with pytest.raises(ArtifactFormatError, match=r"items: row_item must be ints in \[0, "):
        serving.load(copy)


# -- new versions: `static-compiler update` and Artifact.reload ---------------


def _serve(art, batch: int = 2):
    state = art.init_beams(batch, BEAMS)
    zeros = np.zeros((batch, BEAMS, art.vocab_size), np.float32)
    for t in range(art.max_length):
        state = art.beam_step(state, zeros, t)
    return art.finalize(state)


def _decoded(result) -> set:
    tokens, valid, lengths = (np.asarray(x) for x in (result.tokens, result.valid, result.lengths))
    return {tuple(int(t) for t in tokens[b, j, :lengths[b, j]])
            for b, j in zip(*np.nonzero(valid))}


@saved_as("fixed", "ragged-capacity")
def test_cli_update_and_reload_take_items_out_without_recompiling(saved, tmp_path, capsys):
    import shutil

    from static_compiler.cli import main
    items, compiled, _, path = saved
    copy = tmp_path / "v"
    shutil.copytree(path, copy)
    old = serving.load(copy)
    before = _decoded(_serve(old))
    assert before
    gone = sorted(before)[:2]
    np.save(tmp_path / "gone.npy", np.array([list(g) for g in gone]) if len({len(g) for g in gone}) == 1
            else np.array([np.isin(np.arange(len(items)), compiled.item_index(gone))])[0])
    assert main(["update", str(copy), "--remove", str(tmp_path / "gone.npy")]) == 0
    assert "2 items removed, 0 already removed, 0 not in the set" in capsys.readouterr().out
    name = fmt.beam_module_name("beam_step", BEAMS)
    sub_name = fmt.subset_module_name(name)
    new = old.reload()
    assert new is not old and new._modules is old._modules and new._tables == old._tables
    assert new._set_view.trie() is old._set_view.trie()  # the same host tables: built once
    assert new.reload() is new  # nothing changed since
    after = _decoded(_serve(new))  # compiles the subset module once
    assert not after & set(gone) and after
    cache = new._modules[sub_name]._call._cache_size()
    more = np.isin(np.arange(len(items)), compiled.item_index(sorted(after)[:1]))
    np.save(tmp_path / "more.npy", more)
    assert main(["update", str(copy), "--remove", str(tmp_path / "more.npy")]) == 0
    newer = new.reload()  # a second version: same module, nothing compiles
    assert newer is not new and newer._modules is new._modules
    _serve(newer)
    assert newer._modules[sub_name]._call._cache_size() == cache
    # The old object keeps serving the version it loaded (double buffering).
    assert _decoded(_serve(old)) == before
    # And a fresh load sees the new version.
    assert not _decoded(_serve(serving.load(copy))) & set(gone)


@saved_as("ragged-capacity")
def test_update_needs_subsets_is_locked_and_leaves_the_old_version_on_failure(saved, tmp_path,
                                                                             monkeypatch):
    import shutil

    from static_compiler import artifact
    from static_compiler.artifact import writer
    from static_compiler.errors import ArtifactBusyError
    from static_compiler.lifecycle.update import update_removed
    items, _, _, path = saved
    plain = tmp_path / "plain"
    sc.compile_constraints([[1, 2], [2, 3]], 4, export_beam_sizes=(2,)).save(plain)
    with pytest.raises(DecodeInputError, match="has no item index"):
        update_removed(plain, np.ones(2, bool))
    copy = tmp_path / "v"
    shutil.copytree(path, copy)
    with artifact.update_lock(copy):
        with pytest.raises(ArtifactBusyError, match="being updated by another process"):
            update_removed(copy, np.ones(len(items), bool))
    before = (copy / "manifest.json").read_bytes()

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_swap_in", crash)
    with pytest.raises(OSError, match="disk full"):
        update_removed(copy, np.ones(len(items), bool))
    assert (copy / "manifest.json").read_bytes() == before
    serving.load(copy)  # still the old, valid version
    assert not list(tmp_path.glob(".v.tmp-*"))


def test_reload_after_an_addition_within_capacity_shares_the_modules(tmp_path):
    """A saved set with reserved capacity, a version with more items saved
    over it: reload reads the new tables (same shapes) beside the old ones,
    shares the deserialized modules, compiles nothing, and decodes exactly
    what the library decodes for that version; the old object keeps its own."""
    rng = np.random.default_rng(8)
    items = oracle.random_ragged_set(rng, 30, 4, 7, end_token=0)
    base, extra = items[:20], items[20:]
    compiled = sc.compile_constraints(base, 7, end_token=0, export_beam_sizes=(BEAMS,),
                                      export_subsets=True, capacity=2.0)
    path = tmp_path / "set.static"
    compiled.save(path)
    old = serving.load(path)
    before = _serve(old)
    name = fmt.beam_module_name("beam_step", BEAMS)
    cache = old._modules[name]._call._cache_size()
    version = compiled.update(add=extra)
    assert version.build.last_update["grew"] == []
    version.save(path, overwrite=True)
    new = old.reload()
    assert helpers.shares_the_modules(new, old) and new.num_sequences == version.ir.num_sequences
    zeros = lambda tokens, step, carry: (jnp.zeros(tokens.shape + (7,), jnp.float32), carry)
    want = sc.beam_search(version, zeros, batch_size=2, beam_size=BEAMS)
    got = _serve(new)
    assert _decoded(got) == _decoded(want) and _decoded(got) & set(extra)
    for field in ("tokens", "valid", "lengths"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    # All-equal logits: the artifact may differ by 1 ulp in a score (a known
    # fusion difference, see the README), so scores are compared to 1e-6.
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-6)
    assert new._modules[name]._call._cache_size() == cache  # nothing compiled
    for a, b in zip(_serve(old), before):  # the old version still serves its own tables
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # An addition past the capacity changes table shapes: reload refuses it.
    grown = version.update(add=oracle.random_ragged_set(rng, 200, 4, 7, end_token=0))
    assert grown.build.last_update["grew"]
    grown.save(path, overwrite=True)
    with pytest.raises(sc.errors.ArtifactVersionError, match="load it anew"):
        new.reload()


def _serve_subset(art, mask, batch: int = 1):
    sub = art.subset(mask)
    state = art.init_beams(batch, BEAMS)
    zeros = np.zeros((batch, BEAMS, art.vocab_size), np.float32)
    for t in range(art.max_length):
        state = art.beam_step(state, zeros, t, subset=sub)
    return _decoded(art.finalize(state))


def test_cli_update_add_keeps_the_modules_within_capacity_and_exports_past_it(tmp_path, capsys):
    from static_compiler.cli import main
    path = tmp_path / "set.static"
    items = helpers.saved_with_capacity(path, BEAMS)
    rng = np.random.default_rng(5)
    old = serving.load(path)
    added = np.array([[8, 8, 8, 1], [8, 8, 7, 2], [0, 8, 8, 3]])
    np.save(tmp_path / "add.npy", added)
    np.save(tmp_path / "gone.npy", items[:2])
    assert main(["update", str(path), "--add", str(tmp_path / "add.npy"),
                 "--remove", str(tmp_path / "gone.npy")]) == 0
    out = capsys.readouterr().out
    assert "3 items added" in out and "modules kept" in out and "2 items removed" in out
    new = old.reload()
    assert helpers.shares_the_modules(new, old) and new.items.num_items == len(items) + 3
    only_added = np.arange(len(items) + 3) >= len(items)
    assert _serve_subset(new, only_added) == {tuple(r) for r in added.tolist()}
    assert _serve_subset(new, np.arange(len(items) + 3) < 2) == set()  # removed
    assert serving.load(path).fingerprint == new.fingerprint
    # Past the capacity: the modules are exported anew, reload refuses, load serves it.
    many = np.array(oracle.random_set(rng, 300, 4, 9))
    np.save(tmp_path / "many.npy", many)
    assert main(["update", str(path), "--add", str(tmp_path / "many.npy")]) == 0
    assert "grew past the capacity, modules exported anew" in capsys.readouterr().out
    with pytest.raises(sc.errors.ArtifactVersionError):
        new.reload()
    fresh = serving.load(path)
    mask = np.zeros(fresh.items.num_items, bool)
    mask[-1] = True
    assert _serve_subset(fresh, mask) == {tuple(many[-1].tolist())}


@saved_as("ragged-capacity")
def test_cli_update_needs_something_to_do_and_checks_added_sequences(saved, tmp_path, capsys):
    import shutil

    from static_compiler.cli import main
    _, compiled, _, path = saved
    copy = tmp_path / "v"
    shutil.copytree(path, copy)
    assert main(["update", str(copy)]) != 0
    assert "nothing to do" in capsys.readouterr().err
    np.save(tmp_path / "bad.npy", np.array([[99] * compiled.ir.depth]))
    assert main(["update", str(copy), "--add", str(tmp_path / "bad.npy")]) != 0
    assert "99" in capsys.readouterr().err
    assert snapshot.read_manifest(copy).seal() == snapshot.read_manifest(path).seal()


@saved_as("fixed", "ragged-capacity")
def test_load_compiled_rebuilds_the_saved_set_and_update_artifact_matches_the_library(saved,
                                                                                     tmp_path):
    import shutil
    items, compiled, _, path = saved
    again = sc.load(path)
    assert again.ir == compiled.ir and again.plan == compiled.plan
    assert again.build.pipeline == compiled.build.pipeline and again.export_options.beam_sizes == (BEAMS,)
    np.testing.assert_array_equal(again.items.row_item, compiled.items.row_item)
    assert again.fingerprint == compiled.fingerprint
    copy = tmp_path / "v"
    shutil.copytree(path, copy)
    extra = [items[0][:-1] + (1,)] if compiled.ir.end_token is None else [(1, 2, 3, 4, 5)]
    report = sc.update_artifact(copy, add=extra)
    want = compiled.update(add=extra)
    assert {k: report[k] for k in want.build.last_update} == want.build.last_update
    assert sc.load(copy).ir == want.ir


V4_ARTIFACT = helpers.DATA / "artifact_v4_subsets"


def _serve_subsets(art, subset, index, seeds, model):
    """The artifact's beam_step loop (4 beams) over `subset`, finalized."""
    from static_compiler.backend.decode.carry import reorder_carry, resolve_carry_axes
    state, carry = art.init_beams(len(seeds), 4), model.init_carry(seeds, 4)
    for t in range(art.max_length):
        logits, carry = model(state.last_tokens, jnp.int32(t), carry)
        state = art.beam_step(state, logits, t, subset=subset, subset_index=index)
        axes = resolve_carry_axes(carry, model.carry_axes, len(seeds), 4, None)
        carry = reorder_carry(carry, state.parent, axes, None)
    return art.finalize(state)


def _library_decode(compiled, subset, index, seeds, model):
    return sc.beam_search(compiled, model, batch_size=len(seeds), beam_size=4,
                          carry=model.init_carry(seeds, 4), carry_axes=model.carry_axes,
                          subset=subset, subset_index=index)


def test_a_version_4_artifact_serves_subsets_from_per_state_bits(tmp_path):
    """An artifact written by format version 4 (tests/data/README.md): its
    subset modules take per-state bits everywhere, so the loader builds
    them so, and it decodes exactly what a set compiled today does with the
    same subsets (slot bits at its dense steps). A removal keeps its
    modules and their layout; an addition past its capacity exports anew."""
    path = tmp_path / "v4.static"
    shutil.copytree(V4_ARTIFACT, path)
    sids = np.load(V4_ARTIFACT.parent / "artifact_v4_subsets_sids.npy")
    compiled = sc.compile_constraints(sids, 8, export_beam_sizes=(4,), export_subsets=True)
    assert plan_lib.slot_steps(compiled.plan)  # today's layout differs at those depths
    art = serving.load(path)
    assert (art.manifest.format_version, art.manifest.subset_bits) == (4, "per_state")
    rng = np.random.default_rng(4)
    masks = [rng.random(len(sids)) < 0.3, rng.random(len(sids)) < 0.6]
    by_art = sc.stack_subsets([art.subset(m) for m in masks])
    by_lib = sc.stack_subsets([compiled.subset(m) for m in masks])
    assert [w.shape for w in by_art.live] != [w.shape for w in by_lib.live]
    index, seeds = np.array([1, 0, 1]), [3, 4, 5]
    model = oracle.HashModel(8, dup=40)
    want = _library_decode(compiled, by_lib, index, seeds, model)
    for got, exp in zip(_serve_subsets(art, by_art, index, seeds, model), want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))

    gone = rng.random(len(sids)) < 0.2
    sc.update_artifact(path, remove=gone)
    art = serving.load(path)
    assert (art.manifest.format_version, art.manifest.subset_bits) == \
        (fmt.FORMAT_VERSION, "per_state")
    near = {table.name for table in art.manifest.tables if table.name.startswith("ex_")}
    assert near == {"ex_states", "ex_bounds"}  # the old modules' tables, kept as they were
    after = compiled.update(remove=gone)
    by_art = sc.stack_subsets([art.subset(m) for m in masks])
    by_lib = sc.stack_subsets([after.subset(m) for m in masks])
    want = _library_decode(after, by_lib, index, seeds, model)
    for got, exp in zip(_serve_subsets(art, by_art, index, seeds, model), want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))

    extra = rng.integers(0, 8, size=(40, 4))
    assert sc.update_artifact(path, add=extra)["modules"] == "exported"
    art = serving.load(path)
    assert art.manifest.subset_bits == "dense_slots"
    grown = after.update(add=extra)
    masks = [rng.random(len(grown.items.row_item)) < 0.5]
    want = _library_decode(grown, grown.subset(masks[0]), None, seeds, model)
    for got, exp in zip(_serve_subsets(art, art.subset(masks[0]), None, seeds, model), want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))


@saved_as("ragged-capacity")
def test_new_artifacts_record_slot_bits_and_a_bad_record_is_refused(saved, tmp_path):
    _, _, art, path = saved
    assert art.manifest.subset_bits == "dense_slots"
    copy = tmp_path / "copy.static"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / fmt.MANIFEST_FILE).read_text())
    for value, message in (("slots", r"\['subset_bits'\] is 'slots': expected one of "
                                     r"\['per_state', 'dense_slots'\]"),
                           (None, r"manifest.json has no key 'subset_bits'"),
                           (3, r"\['subset_bits'\] is 3 \(int\), expected str")):
        edited = dict(manifest)
        if value is None:
            edited.pop("subset_bits")
        else:
            edited["subset_bits"] = value
        (copy / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(edited))
        with pytest.raises(ArtifactFormatError, match=message):
            serving.load(copy)


@saved_as("ragged-capacity")
def test_the_trie_and_bit_layout_are_built_once_per_set(saved, monkeypatch):
    """Row pointers from the tables and the slot layout are O(edges) (0.65 s
    at 1e7 items): Artifact.subset builds them on first use only (its
    `SetView`)."""
    from static_compiler.rules import set_view
    items, _, _, path = saved
    art = serving.load(path)
    calls = []
    built = set_view.table_layers
    monkeypatch.setattr(set_view, "table_layers", lambda *a: calls.append(1) or built(*a))
    for seed in range(3):
        art.subset(np.random.default_rng(seed).random(len(items)) < 0.5)
    assert len(calls) <= 1  # (none where the load's ranked ranges, begun at once, built it)
