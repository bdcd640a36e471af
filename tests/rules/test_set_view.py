"""One numpy set view (`rules.set_view.SetView`) behind the three front doors:
the compiled set, the served artifact and the torch backend compute the same
subsets (the same words) and the same base subset after a removal; a
subset's device copies are made once per device (`Subset.placements`); a bad
selection is refused with one wording that names the door."""

from __future__ import annotations

import numpy as np
import oracle
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.rules.set_view import SetView, facts_of_manifest

torch = pytest.importorskip("torch")
from static_compiler.torch_backend import TorchConstraints, live_bits  # noqa: E402

BEAMS = 2


def _words(subset):
    return [None if w is None else np.asarray(w) for w in subset.live + subset.ends]


def _assert_same_words(a, b):
    assert len(a.live) == len(b.live) and len(a.ends) == len(b.ends)
    for x, y in zip(_words(a), _words(b)):
        assert (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y))
    assert np.array_equal(a.sizes, b.sizes)


@pytest.fixture(scope="module", params=["fixed", "ragged-capacity"])
def doors(request, tmp_path_factory):
    """(rows, compiled version after a removal, its artifact, the torch backend
    of both, the removal mask)."""
    rng = np.random.default_rng(7)
    if request.param == "fixed":
        rows, vocab, end, capacity = oracle.random_set(rng, 40, 4, 6, skew=1.0), 6, None, None
    else:
        rows, vocab, end = oracle.random_ragged_set(rng, 30, 4, 7, end_token=0), 7, 0
        capacity = 1.5
    rows = rows + rows[:2]  # duplicate rows are one item
    compiled = sc.compile_constraints(rows, vocab, end_token=end, export_beam_sizes=(BEAMS,),
                                      export_subsets=True, capacity=capacity)
    removed = np.arange(len(rows)) % 5 == 1
    version = compiled.update(remove=removed)
    path = tmp_path_factory.mktemp("set_view") / "set.static"
    version.save(path)
    art = serving.load(path)
    return (rows, version, art, TorchConstraints.load(path),
            TorchConstraints.from_compiled(version), removed)


def test_the_three_doors_subsets_of_one_selection_hold_the_same_words(doors):
    rows, version, art, torch_art, torch_compiled, _ = doors
    rng = np.random.default_rng(1)
    for selection in (rng.random(len(rows)) < 0.5, np.ones(len(rows), bool),
                      np.zeros(len(rows), bool)):
        want = version.subset(selection)
        for door in (art, torch_art, torch_compiled):
            got = door.subset(selection)
            _assert_same_words(got, want)
            assert got.fingerprint == door.fingerprint


def test_the_base_subset_after_a_removal_is_the_same_at_every_door(doors):
    rows, version, art, torch_art, torch_compiled, removed = doors
    base = version._set_view.base_subset()
    assert base is not None and base.sizes[0] < len(set(map(tuple, rows)))
    for door_base in (art._set_view.base_subset(), torch_art._set_view.base_subset(),
                      torch_compiled._set_view.base_subset()):
        _assert_same_words(door_base, base)
    # the removed items are out: the base equals a subset of the rows kept
    _assert_same_words(version.subset(~removed), base)
    assert torch_compiled._set_view.base_subset() is base  # one view: computed once


def test_the_manifest_and_the_compiled_plan_give_the_same_facts(doors):
    _, version, art, torch_art, _, _ = doors
    from_manifest = facts_of_manifest(art.manifest)
    compiled_facts = version._set_view.facts
    assert from_manifest.plan == version.plan
    assert from_manifest.slot_steps == compiled_facts.slot_steps
    assert from_manifest.state_counts == compiled_facts.state_counts
    assert from_manifest.num_final_states == compiled_facts.num_final_states
    assert torch_art.plan.slot_steps == frozenset(compiled_facts.slot_steps)


def test_a_subsets_device_copies_are_made_once_per_device(doors):
    rows, version, art, torch_art, _, _ = doors
    subset = version.subset(np.arange(len(rows)) % 2 == 0)
    first = live_bits(subset, "cpu")
    puts = subset.placements.puts
    assert live_bits(subset, "cpu") is first and subset.placements.puts == puts

    state = version.init_processor(1)
    logits = np.zeros((1, version.vocab_size), np.float32)
    version.mask(logits, state, 0, subset=subset)
    puts = subset.placements.puts
    version.mask(logits, state, 0, subset=subset)
    assert subset.placements.puts == puts and ("jax", None) in subset.placements

    served = art.subset(np.arange(len(rows)) % 2 == 0)
    art_state = art.init_processor(1)
    art.mask(logits, art_state, 0, subset=served)
    puts = served.placements.puts
    art.mask(logits, art_state, 0, subset=served)
    assert served.placements.puts == puts == 1


def test_a_bad_selection_is_refused_naming_the_door(doors):
    rows, version, art, torch_art, torch_compiled, _ = doors
    ragged = [[True, False], [True]]
    for door, name in ((art, "Artifact.subset"), (torch_art, "TorchConstraints.subset")):
        with pytest.raises(ConstraintSetError, match=rf"{name}: selection .* is not an array"):
            door.subset(ragged)
    wrong = np.ones(len(rows) + 1, bool)
    for door, name in ((version, "CompiledConstraints.subset"), (art, "Artifact.subset"),
                       (torch_art, "TorchConstraints.subset"),
                       (torch_compiled, "TorchConstraints.subset")):
        with pytest.raises(ConstraintSetError, match=name):
            door.subset(wrong)


def test_an_artifact_without_items_says_so_at_both_doors(tmp_path):
    compiled = sc.compile_constraints([[1, 2], [2, 3]], 4, export_beam_sizes=(BEAMS,))
    compiled.save(tmp_path / "a")  # (no export_subsets: no item index saved)
    for door, name in ((serving.load(tmp_path / "a"), "Artifact.subset"),
                       (TorchConstraints.load(tmp_path / "a"), "TorchConstraints.subset")):
        with pytest.raises(DecodeInputError, match=rf"{name}: artifact .* has no item index"):
            door.subset(np.ones(2, bool))
        assert door._set_view.base_subset() is None


def test_versions_by_removal_share_the_trie_and_layout_not_the_base(doors):
    rows, version, _, _, _, _ = doors
    again = version.update(remove=np.arange(len(rows)) % 7 == 3)
    view, next_view = version._set_view, again._set_view
    assert isinstance(next_view, SetView) and next_view is not view
    assert next_view.trie() is view.trie()
    assert next_view.bit_layout("test") is view.bit_layout("test")
    assert next_view.fingerprint != view.fingerprint  # the removal tag differs
    assert next_view.base_subset().sizes[0] < view.base_subset().sizes[0]
