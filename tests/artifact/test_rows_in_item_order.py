"""The manifest's "rows_in_item_order" (format version 17): written by every
save with an item index (true for a sorted catalogue without duplicates,
false otherwise, recomputed by an addition, kept by a removal), checked
against items/row_item.npy at load by every reader, trusted by the loaded
set (no second pass over the map), and recorded by `upgrade`."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import edit_manifest

import static_compiler as sc
from static_compiler import errors, serving
from static_compiler.format import spec as fmt
from static_compiler.rules import set_view

V = 16
HAVE_TORCH = importlib.util.find_spec("torch") is not None
"""The torch door's reader is checked where torch is installed (not in the
newest environment)."""


def _torch_load(path) -> list:
    if not HAVE_TORCH:
        return []
    from static_compiler.torch_backend import TorchConstraints
    return [TorchConstraints.load(path)]


def sorted_rows(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.unique(rng.integers(0, V, (n, 4)), axis=0)


def save(rows, path, **options):
    return sc.compile_constraints(rows, V, export_beam_sizes=(4,), export_subsets=True,
                                  **options).save(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    rows = sorted_rows()
    shuffled = rows[np.random.default_rng(1).permutation(rows.shape[0])]
    return {"sorted": save(rows, root / "sorted"), "shuffled": save(shuffled, root / "shuffled"),
            "repeated": save(np.concatenate([rows, rows[:5]]), root / "repeated"),
            "plain": sc.compile_constraints(rows, V, export_beam_sizes=(4,)).save(root / "plain"),
            "rows": rows}


def test_a_save_records_whether_row_i_is_item_i(saved):
    assert serving.read_manifest(saved["sorted"]).rows_in_item_order is True
    assert serving.read_manifest(saved["shuffled"]).rows_in_item_order is False
    assert serving.read_manifest(saved["repeated"]).rows_in_item_order is False  # (duplicates)
    assert serving.read_manifest(saved["plain"]).rows_in_item_order is None  # (no item index)


def test_a_loaded_set_takes_the_record_without_reading_the_map(saved, monkeypatch):
    """Every reader's view answers from the manifest: the order check is
    never run, and ranked subsets of the sorted set pack the mask as it is."""
    def refused(_items):
        raise AssertionError("rows_are_items read the map again")

    monkeypatch.setattr(set_view, "rows_are_items", refused)
    mask = np.arange(saved["rows"].shape[0]) % 3 == 0
    for kind, want in (("sorted", True), ("shuffled", False)):
        for held in [sc.load(saved[kind]), serving.load(saved[kind])] + _torch_load(saved[kind]):
            assert held._set_view.rows_in_item_order() is want
        art = serving.load(saved[kind])
        assert int(art.ranked_subset(mask).sizes[0]) == int(mask.sum())


def test_a_true_record_over_rows_out_of_order_is_refused_at_load(saved, tmp_path):
    """A manifest resealed to claim order its map does not have (or beside
    stale rows) is an ArtifactFormatError naming the key, from every
    reader: a ranked subset would otherwise pick other items."""
    import shutil
    path = tmp_path / "claimed"
    shutil.copytree(saved["shuffled"], path)
    edit_manifest(path, lambda m: m.update(rows_in_item_order=True))
    match = r"rows_in_item_order is true, but row_item is not 0, 1, \.\.\., \d+"
    with pytest.raises(errors.ArtifactFormatError, match=match):
        serving.load(path)
    with pytest.raises(errors.ArtifactFormatError, match=match):
        sc.load(path)
    if HAVE_TORCH:
        from static_compiler.torch_backend import TorchConstraints
        with pytest.raises(errors.ArtifactFormatError, match=match):
            TorchConstraints.load(path)


@pytest.mark.parametrize("value, match", [
    (1, r"\['rows_in_item_order'\] is 1 \(int\), expected bool or NoneType"),
    ("yes", r"\['rows_in_item_order'\] is 'yes' \(str\), expected bool or NoneType"),
])
def test_a_record_of_the_wrong_type_is_named(saved, tmp_path, value, match):
    import shutil
    path = tmp_path / "typed"
    shutil.copytree(saved["sorted"], path)
    edit_manifest(path, lambda m: m.update(rows_in_item_order=value))
    with pytest.raises(errors.ArtifactFormatError, match=match):
        serving.read_manifest(path)


def test_a_record_without_an_item_index_is_refused(saved, tmp_path):
    import shutil
    path = tmp_path / "plain"
    shutil.copytree(saved["plain"], path)
    edit_manifest(path, lambda m: m.update(rows_in_item_order=False))
    with pytest.raises(errors.ArtifactFormatError,
                       match=r"rows_in_item_order is False without an item index"):
        serving.read_manifest(path)


def test_updates_keep_the_record_true(saved, tmp_path):
    """A removal keeps the rows (the record kept); an addition appends rows
    for new items (recomputed), an addition of a removed item adds a stale
    row (false)."""
    import shutil
    path = tmp_path / "updated"
    shutil.copytree(saved["sorted"], path)
    rows = saved["rows"]
    sc.update_artifact(path, remove=rows[:2])
    assert serving.read_manifest(path).rows_in_item_order is True
    sc.update_artifact(path, add=rows[:1])  # (removed, added back: a stale row)
    assert serving.read_manifest(path).rows_in_item_order is False
    art = serving.load(path)
    assert art.manifest.format_version == fmt.FORMAT_VERSION


def test_upgrade_records_it_for_an_older_artifact(saved, tmp_path):
    import shutil
    for kind, want in (("sorted", True), ("shuffled", False)):
        path = tmp_path / kind
        shutil.copytree(saved[kind], path)
        edit_manifest(path, lambda m: (m.update(format_version=16), m.pop("rows_in_item_order")))
        assert serving.read_manifest(path).rows_in_item_order is None
        assert serving.load(path)._set_view.rows_in_item_order() is want  # (from the map)
        sc.upgrade_artifact(path)
        manifest = serving.read_manifest(path)
        assert (manifest.format_version, manifest.rows_in_item_order) == \
            (fmt.FORMAT_VERSION, want)
