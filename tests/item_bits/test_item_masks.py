"""`item_bits.item_masks`: the items a selection of input rows picks, as bool
(N',) and as packed bits (what a fixed-length set's subset starts from),
against the brute-force scatter, with duplicate rows, every chunking and
thread count, a memory-mapped item index, removals and bad masks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits import item_masks, layer_walk
from static_compiler.items.index import ItemIndex


def index_of(rng, rows: int, unique: int) -> ItemIndex:
    """An item index of `rows` input rows over `unique` items (every item
    some row's, the rest duplicates), in a random order."""
    row_item = np.concatenate([np.arange(unique), rng.integers(0, unique, rows - unique)])
    return ItemIndex(row_item=rng.permutation(row_item).astype(np.int32), num_unique=unique)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), unique=st.integers(1, 700), extra=st.integers(0, 300),
       share=st.sampled_from([0.0, 0.01, 0.3, 1.0]), chunk=st.sampled_from([1, 7, 64, 1 << 24]),
       threads=st.integers(1, 3), room=st.sampled_from([None, 0, 1000]))
def test_row_selections_give_the_items_any_of_their_rows_is(seed, unique, extra, share, chunk,
                                                             threads, room):
    rng = np.random.default_rng(seed)
    items = index_of(rng, unique + extra, unique)
    selection = rng.random(items.num_items) < share
    want = np.zeros(unique, bool)
    want[items.row_item[selection]] = True
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(item_masks, "ITEM_CHUNK", chunk)
        patch.setattr(layer_walk, "WALK_THREADS", threads)
        np.testing.assert_array_equal(item_masks.rows_item_mask(selection, items, "t"), want)
        bits = item_masks.rows_item_bits(selection, items, "t", room)
    assert isinstance(bits, layer_walk.PackedBits) and bits.shape == (unique,)
    np.testing.assert_array_equal(bits.bools(), want)
    assert item_masks.count_items(bits) == int(want.sum())
    words = bits.words(room)  # padded to the room: zeros past the items
    assert words.shape[0] == -(-max(unique, room or 0) // 32)
    np.testing.assert_array_equal(layer_walk.PackedBits(words.view(np.uint8), unique).bools(),
                                  want)
    removed = rng.random(unique) < 0.4
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(item_masks, "ITEM_CHUNK", chunk)
        item_masks.drop_items(bits, removed)
    np.testing.assert_array_equal(bits.bools(), want & ~removed)
    assert item_masks.count_items(bits) == int((want & ~removed).sum())


def test_a_memory_mapped_item_index_gives_the_same_bits(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    items = index_of(rng, 5000, 4000)
    np.save(tmp_path / "row_item.npy", items.row_item)
    mapped = ItemIndex(row_item=np.load(tmp_path / "row_item.npy", mmap_mode="r"),
                       num_unique=4000)
    monkeypatch.setattr(item_masks, "ITEM_CHUNK", 64)
    selection = rng.random(5000) < 0.2
    np.testing.assert_array_equal(item_masks.rows_item_bits(selection, mapped, "t").bools(),
                                  item_masks.rows_item_mask(selection, items, "t"))


@pytest.mark.parametrize("fn", [item_masks.rows_item_mask, item_masks.rows_item_bits])
def test_bad_selections_are_refused_naming_shape_and_dtype(fn):
    items = index_of(np.random.default_rng(0), 10, 8)
    with pytest.raises(ConstraintSetError, match=r"shape \(9,\).*expected \(10,\)"):
        fn(np.zeros(9, bool), items, "Artifact.subset")
    with pytest.raises(ConstraintSetError, match=r"Artifact.subset.*dtype int64"):
        fn(np.zeros(10, np.int64), items, "Artifact.subset")
