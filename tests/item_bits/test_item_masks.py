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
       threads=st.integers(1, 3), room=st.sampled_from([None, 0, 1000]),
       split=st.sampled_from([1, 100, 1 << 18]))
def test_row_selections_give_the_items_any_of_their_rows_is(seed, unique, extra, share, chunk,
                                                             threads, room, split):
    rng = np.random.default_rng(seed)
    items = index_of(rng, unique + extra, unique)
    selection = rng.random(items.num_items) < share
    want = np.zeros(unique, bool)
    want[items.row_item[selection]] = True
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(item_masks, "ITEM_CHUNK", chunk)
        patch.setattr(item_masks, "SPLIT_FROM", split)  # (1: a range per thread at any size)
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


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(0, 700), share=st.sampled_from(
    [0.0, 0.02, 0.5, 1.0]), unique=st.integers(1, 300), dtype=st.sampled_from(["int32", "int64"]))
def test_selected_rows_found_by_their_words_mark_their_items(seed, n, share, unique, dtype):
    """`bit_kernels.selection_words` then `mark_selected_words` (compiled,
    or its numpy twin without numba) sets exactly the bits of the selected
    rows' items, repeats included, into bits already set elsewhere; the
    words past the rows are zero whatever the buffer held."""
    from static_compiler.item_bits import bit_kernels

    rng = np.random.default_rng(seed)
    selection = rng.random(n) < share
    ids = rng.integers(0, unique, n).astype(dtype)
    buffer = np.full(n // 64 + 2, np.uint64(0xFFFFFFFFFFFFFFFF))  # (stale words)
    words = bit_kernels.selection_words(selection, buffer)
    assert words.shape == (-(-n // 64),)
    np.testing.assert_array_equal(
        np.unpackbits(words.view(np.uint8), bitorder="little").view(bool),
        np.concatenate([selection, np.zeros(64 * words.shape[0] - n, bool)]))
    before = rng.random(unique) < 0.1
    out = layer_walk.PackedBits.of(before)
    bit_kernels.mark_selected_words(words, ids, out.uint64())
    want = before.copy()
    want[ids[selection]] = True
    np.testing.assert_array_equal(out.bools(), want)
    assert not np.unpackbits(out.data, bitorder="little")[unique:].any()  # (none past the items)


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


class _Rows:
    """A `RowSource` over a bool mask, filled a range at a time (what a
    filter's `RowFilter` is to the packing), counting its calls."""

    def __init__(self, mask: np.ndarray):
        self.mask, self.num_rows, self.calls = mask, mask.shape[0], 0

    def fill(self, lo, hi, out, scratch=None):
        self.calls += 1
        out[:] = self.mask[lo:hi]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 900),
       share=st.sampled_from([0.0, 0.02, 0.5, 1.0]), chunk=st.sampled_from([1, 7, 8, 64, 1 << 24]),
       threads=st.integers(1, 3), lazy=st.booleans(), room=st.sampled_from([None, 0, 1000]))
def test_rows_in_item_order_are_packed_in_place_as_the_scatter_gives_them(
        seed, n, share, chunk, threads, lazy, room):
    rng = np.random.default_rng(seed)
    items = ItemIndex(row_item=np.arange(n, dtype=np.int32), num_unique=n)
    mask = rng.random(n) < share
    selection = _Rows(mask) if lazy else mask
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(item_masks, "ITEM_CHUNK", chunk)
        patch.setattr(layer_walk, "WALK_THREADS", threads)
        assert item_masks.rows_are_items(items)
        packed = item_masks.rows_item_bits(selection, items, "t", room, in_item_order=True)
        scattered = item_masks.rows_item_bits(mask, items, "t", room)
    np.testing.assert_array_equal(packed.bools(), mask)
    np.testing.assert_array_equal(packed.data, scattered.data)  # (zeros past n too)
    if lazy:  # (chunks of whole bytes: at most n / 8 + 1 calls, each a byte-aligned range)
        assert selection.calls == len(range(0, n, max(8, min(chunk, 1 << 24) // 8 * 8)))


def test_rows_are_items_only_for_a_sorted_input_without_duplicates(tmp_path, monkeypatch):
    n = 3 * (1 << 20) + 5  # (chunks of 2^20 rows, on two threads)
    ident = np.arange(n, dtype=np.int32)
    assert item_masks.rows_are_items(ItemIndex(row_item=ident, num_unique=n))
    np.save(tmp_path / "row_item.npy", ident)
    assert item_masks.rows_are_items(ItemIndex(row_item=np.load(tmp_path / "row_item.npy",
                                                                mmap_mode="r"), num_unique=n))
    for swap in ((1, 2), (n - 3, n - 2), ((1 << 20) - 1, 1 << 20)):  # (inner, last, across chunks)
        swapped = ident.copy()
        swapped[list(swap)] = swapped[list(swap[::-1])]
        assert not item_masks.rows_are_items(ItemIndex(row_item=swapped, num_unique=n)), swap
    assert not item_masks.rows_are_items(ItemIndex(row_item=ident[::-1].copy(), num_unique=n))
    dup = np.concatenate([ident[:10], ident[9:-1]])  # (a duplicate row: n rows, n - 1 items)
    assert not item_masks.rows_are_items(ItemIndex(row_item=dup, num_unique=n - 1))
    stale = ItemIndex(row_item=ident, num_unique=n, stale_rows=np.zeros(n, bool))
    assert not item_masks.rows_are_items(stale)
    assert not item_masks.rows_are_items(None)
    empty = ItemIndex(row_item=np.zeros(0, np.int32), num_unique=0)
    assert item_masks.rows_are_items(empty)
    # an addition's row -> item map, computed a range at a time (`PieceArray`: slices only)
    from static_compiler.support.arrays import joined
    lazy = joined(ident[:-5], ident[-5:])
    assert item_masks.rows_are_items(ItemIndex(row_item=lazy, num_unique=n))
    assert not item_masks.rows_are_items(ItemIndex(row_item=joined(ident[:-5], ident[-5:][::-1]),
                                                   num_unique=n))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), unique=st.integers(1, 3000), extra=st.integers(0, 500),
       share=st.sampled_from([0.0, 0.05, 0.5, 1.0]), crowd=st.booleans(),
       shift=st.sampled_from([3, 6, 9]), round_ids=st.sampled_from([1, 50, 1 << 20]),
       chunk=st.sampled_from([8, 100, 1 << 22]), threads=st.integers(1, 3),
       stale=st.booleans(), room=st.sampled_from([None, 5000]), lazy=st.booleans())
def test_row_masks_of_large_sets_scattered_by_buckets_give_the_same_bits(
        seed, unique, extra, share, crowd, shift, round_ids, chunk, threads, stale, room, lazy):
    """`bucket_scatter` (a bool row mask or a filter's rows once the items
    pass BUCKET_FROM, here every size): the bits the direct marking sets,
    in rounds, with buckets that fill (crowd: the selected rows' items in
    one bucket's range, so its thread goes on into bits of its own), stale
    rows."""
    from static_compiler.item_bits import bit_kernels, bucket_scatter
    if not bit_kernels.HAVE_NUMBA:
        pytest.skip("buckets are numba's path")
    rng = np.random.default_rng(seed)
    items = index_of(rng, unique + extra, unique)
    selection = rng.random(items.num_items) < share
    if crowd:
        selection |= items.row_item < min(unique, 1 << shift)
    if stale:  # (an item keeps a live row: its first one here)
        stale_rows = rng.random(items.num_items) < 0.2
        stale_rows[np.unique(items.row_item, return_index=True)[1]] = False
        items = ItemIndex(row_item=items.row_item, num_unique=unique, stale_rows=stale_rows)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layer_walk, "WALK_THREADS", threads)
        patch.setattr(bucket_scatter, "BUCKET_FROM", 1 << 60)
        want = item_masks.rows_item_bits(selection, items, "t", room)
        for name, value in (("BUCKET_FROM", 0), ("BUCKET_SHIFT", shift), ("BUCKET_SLACK", 0),
                            ("ROUND_IDS", round_ids), ("ROUND_CHUNK", chunk)):
            patch.setattr(bucket_scatter, name, value)
        rows = _Rows(selection)
        got = item_masks.rows_item_bits(rows if lazy else selection, items, "t", room)
    if lazy:  # (each chunk filled once, a ROUND_CHUNK range)
        assert rows.calls == len(range(0, items.num_items, chunk))
    np.testing.assert_array_equal(got.data, want.data)
    live = selection if not stale else selection & ~items.stale_rows
    oracle = np.zeros(unique, bool)
    oracle[items.row_item[live]] = True
    np.testing.assert_array_equal(got.bools(), oracle)


def test_a_full_bucket_sends_its_thread_to_bits_of_its_own(monkeypatch):
    """Rows that crowd one bucket's item range fill it: that thread marks
    its chunks directly (`bit_kernels.mark_selected_words`), the others go
    on by buckets; the bits are the same."""
    from static_compiler.item_bits import bit_kernels, bucket_scatter
    if not bit_kernels.HAVE_NUMBA:
        pytest.skip("buckets are numba's path")
    rng = np.random.default_rng(1)
    items = index_of(rng, 20_000, 16_000)
    selection = (items.row_item < 1000) | (rng.random(20_000) < 0.02)
    want = item_masks.rows_item_bits(selection, items, "t")
    marked = []
    mark = bit_kernels.mark_selected_words
    monkeypatch.setattr(bit_kernels, "mark_selected_words",
                        lambda *args: (marked.append(args[1].shape[0]), mark(*args)))
    for name, value in (("BUCKET_FROM", 0), ("BUCKET_SHIFT", 10), ("BUCKET_SLACK", 0),
                        ("ROUND_CHUNK", 1000)):
        monkeypatch.setattr(bucket_scatter, name, value)
    monkeypatch.setattr(layer_walk, "WALK_THREADS", 2)
    got = item_masks.rows_item_bits(selection, items, "t")
    np.testing.assert_array_equal(got.data, want.data)
    assert 0 < len(marked) <= 20  # (a filled thread marks the chunk where it filled, and the rest)


@pytest.mark.parametrize("num_rows, in_order", [(0, False), (1, False), (5, False), (4, True)])
def test_stacked_selections_a_row_to_a_thread_equal_each_row_alone(num_rows, in_order,
                                                                  monkeypatch):
    """`stacked_rows_item_bits` (each selection on one thread) gives each
    row's `rows_item_bits`, in the rows' order, room included."""
    rng = np.random.default_rng(num_rows)
    items = ItemIndex(row_item=np.arange(3000, dtype=np.int32), num_unique=3000) if in_order \
        else index_of(rng, 3000, 2000)
    rows = [rng.random(3000) < share for share in (0.0, 0.1, 0.5, 1.0, 0.02)[:num_rows]]
    monkeypatch.setattr(layer_walk, "WALK_THREADS", 2)
    got = item_masks.stacked_rows_item_bits(rows, items, "t", 4096, in_order)
    want = [item_masks.rows_item_bits(row, items, "t", 4096, in_order) for row in rows]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.data.shape == w.data.shape
        np.testing.assert_array_equal(g.data, w.data)
