"""Rank over item bits and each state's items as one range of trie order
(`static_compiler.item_bits.rank`), against brute force: numpy prefix sums
for the ranks; for the ranges, the sets of `live_cases` (fixed and variable
length, every layout, capacity, additions, removals) read as Python tuples,
where a state's items are the sequences that start with its prefix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_cases import fuzz_settings, live_cases, updated

import static_compiler as sc
from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits import rank, trie_ranges
from static_compiler.item_bits.item_masks import rows_item_mask
from static_compiler.item_bits.state_order import InsertedOrder

# --------------------------------------------------------------------------
# ItemRanks


def prefix_counts(mask: np.ndarray) -> np.ndarray:
    """int64 (R, N + 1): the oracle's set bits before each position."""
    rows = mask.reshape(1, -1) if mask.ndim == 1 else mask
    return np.concatenate([np.zeros((rows.shape[0], 1), np.int64),
                           np.cumsum(rows, axis=1, dtype=np.int64)], axis=1)


EDGES = [0, 1, 31, 32, 33, 63, 64, 65, 511, 512, 513, 1023, 1024, 1025, 1536, 2049]


@st.composite
def masks(draw):
    n = draw(st.one_of(st.sampled_from(EDGES), st.integers(0, 2100)))
    rows = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["random", "sparse", "ones", "zeros", "runs"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "random":
        mask = rng.random((rows, n)) < draw(st.sampled_from([0.1, 0.5, 0.9]))
    elif kind == "sparse":
        mask = rng.random((rows, n)) < 0.002
    elif kind == "ones":
        mask = np.ones((rows, n), bool)
    elif kind == "zeros":
        mask = np.zeros((rows, n), bool)
    else:  # long runs crossing word and block edges
        mask = (np.arange(n) // draw(st.sampled_from([31, 64, 500, 513])) % 2).astype(bool)
        mask = np.broadcast_to(mask, (rows, n)).copy()
    return mask


@settings(max_examples=60, deadline=None)
@given(mask=masks(), seed=st.integers(0, 2**32 - 1), fine=st.booleans())
def test_rank_and_count_equal_prefix_sums(mask, seed, fine):
    ranks = rank.ItemRanks.of_mask(mask, fine=fine)
    assert (ranks.within is not None) == fine
    want = prefix_counts(mask)
    R, n = mask.shape
    every = np.arange(n + 1)
    for r in range(R):
        np.testing.assert_array_equal(ranks.rank(every, r), want[r])
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, n + 1, 200)
    hi = np.maximum(lo, rng.integers(0, n + 1, 200))
    edges = np.array([e for e in EDGES if e <= n])
    lo, hi = np.concatenate([lo, edges, np.zeros_like(edges)]), np.concatenate([hi, edges, edges])
    row = rng.integers(0, R, lo.shape[0])
    np.testing.assert_array_equal(ranks.count(lo, hi, row), want[row, hi] - want[row, lo])
    np.testing.assert_array_equal(ranks.totals(), mask.sum(axis=1))
    # packed words give the same ranks, whatever lies past the size
    words = np.zeros((R, -(-n // 32) + 1), np.uint32)
    words.view(np.uint8)[:, :-(-n // 8)] = np.packbits(mask, axis=1, bitorder="little")
    words[:, -1] = 0xFFFFFFFF
    if n % 32:
        words[:, n // 32] |= np.uint32(~((1 << (n % 32)) - 1) & 0xFFFFFFFF)
    again = rank.ItemRanks.of_words(words, n, fine=not fine)
    np.testing.assert_array_equal(again.counts, ranks.counts)
    np.testing.assert_array_equal(again.rank(every, R - 1), want[R - 1])


@pytest.mark.parametrize("fine", [False, True])
def test_a_single_row_and_stacked_rows_agree(fine):
    rng = np.random.default_rng(1)
    a, b = rng.random(1000) < 0.3, rng.random(1000) < 0.7
    stacked = rank.ItemRanks.stack([rank.ItemRanks.of_mask(a, fine=fine),
                                    rank.ItemRanks.of_mask(b, fine=fine)])
    both = rank.ItemRanks.of_mask(np.stack([a, b]), fine=fine)
    for got, want in [(stacked.words, both.words), (stacked.counts, both.counts),
                      (stacked.within, both.within)]:
        np.testing.assert_array_equal(got, want)
    extra = 0 if both.within is None else both.within.nbytes
    assert both.nbytes == both.words.nbytes + both.counts.nbytes + extra
    assert both.counts.dtype == np.uint32 and (both.within is None) != fine


@pytest.mark.parametrize("fine", [False, True])
def test_stacked_rows_of_a_large_set_packed_on_threads_equal_each_row_alone(fine):
    """Rows of 2^20 bits and more are packed on threads (each its own rows):
    the same words and counts as each row packed alone, cleared bits too."""
    rng = np.random.default_rng(3)
    size = rank._THREADED_BITS + 4099
    rows = rng.random((5, size)) < np.array([0.0, 0.01, 0.5, 0.99, 1.0])[:, None]
    gone_mask = rng.random(size) < 0.2
    gone = rank.ItemRanks.of_mask(gone_mask)
    both = rank.ItemRanks.of_mask(rows, gone, fine=fine)
    alone = rank.ItemRanks.stack([rank.ItemRanks.of_mask(r, gone, fine=fine) for r in rows])
    for got, want in [(both.words, alone.words), (both.counts, alone.counts),
                      (both.within, alone.within)]:
        np.testing.assert_array_equal(got, want)
    assert both.totals().tolist() == (rows & ~gone_mask).sum(axis=1).tolist()


@settings(max_examples=40, deadline=None)
@given(mask=masks(), fine=st.booleans(), split=st.sampled_from([8, 64, 1000, 4096]),
       clear=st.booleans())
def test_one_huge_row_packed_in_spans_on_threads_equals_it_packed_whole(mask, fine, split,
                                                                       clear):
    """A single row of _SPLIT_BITS bits or more is packed in spans on
    threads (spans of whole bytes): the same words, counts and word counts."""
    row = mask[0]
    gone = rank.ItemRanks.of_mask(np.roll(row, 3)) if clear else None
    whole = rank.ItemRanks.of_mask(row, gone, fine=fine)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rank, "_SPLIT_BITS", split)
        spans = rank.ItemRanks.of_mask(row, gone, fine=fine)
    for got, want in [(spans.words, whole.words), (spans.counts, whole.counts),
                      (spans.within, whole.within)]:
        np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(mask=masks(), fine=st.booleans())
def test_ranks_of_positions_equal_the_ranks_of_their_mask(mask, fine):
    row = mask[0]
    made = rank.ItemRanks.of_positions(np.flatnonzero(row), row.shape[0], fine=fine)
    want = rank.ItemRanks.of_mask(row, fine=fine)
    np.testing.assert_array_equal(made.words, want.words)
    np.testing.assert_array_equal(made.counts, want.counts)
    if fine:
        np.testing.assert_array_equal(made.within, want.within)


def test_cleared_bits_are_left_out():
    rng = np.random.default_rng(2)
    mask, gone = rng.random(777) < 0.5, rng.random(777) < 0.5
    ranks = rank.ItemRanks.of_mask(mask, cleared=rank.ItemRanks.of_mask(gone))
    np.testing.assert_array_equal(ranks.rank(np.arange(778)), prefix_counts(mask & ~gone)[0])


@pytest.mark.parametrize("call, message", [
    (lambda: rank.ItemRanks.of_mask(np.zeros(5, np.int8)), "expected bool"),
    (lambda: rank.ItemRanks.of_mask(np.zeros((1, 2, 3), bool)), "expected bool"),
    (lambda: rank.ItemRanks.of_words(np.zeros(1, np.uint32), 33), "W >= 2"),
    (lambda: rank.ItemRanks.of_words(np.zeros(2, np.int32), 33), "expected uint32"),
    (lambda: rank.ItemRanks.of_mask(np.zeros(5, bool)).rank([6]), r"expected \[0, 5\]"),
    (lambda: rank.ItemRanks.of_mask(np.zeros(5, bool)).rank([-1]), r"expected \[0, 5\]"),
    (lambda: rank.ItemRanks.of_mask(np.zeros(5, bool)).count([3], [2]), "lo > hi"),
    (lambda: rank.ItemRanks.of_mask(np.zeros(5, bool), rank.ItemRanks.of_mask(
        np.zeros(6, bool))), "expected 5"),
    (lambda: rank.ItemRanks.stack([rank.ItemRanks.of_mask(np.zeros(5, bool)),
                                   rank.ItemRanks.of_mask(np.zeros(6, bool))]), "expected one"),
    (lambda: rank.ItemRanks.stack([rank.ItemRanks.of_mask(np.zeros(5, bool)),
                                   rank.ItemRanks.of_mask(np.zeros(5, bool), fine=True)]),
     "expected one"),
    (lambda: rank.ItemRanks.of_positions(np.array([3, 2]), 5), "expected ascending distinct"),
    (lambda: rank.ItemRanks.of_positions(np.array([2, 2]), 5), "expected ascending distinct"),
    (lambda: rank.ItemRanks.of_positions(np.array([5]), 5), r"ints in \[0, 5\)"),
    (lambda: rank.ItemRanks.of_positions(np.array([-1]), 5), r"ints in \[0, 5\)"),
    (lambda: rank.ItemRanks.of_positions(np.array([0.5]), 5), "dtype float64"),
    (lambda: rank.ranked_subset(np.zeros(4, bool), InsertedOrder.empty(5)), "N' = 5"),
    (lambda: rank.ranked_subset_of_words(np.zeros((1, 1), np.uint32), InsertedOrder.empty(33)),
     r"shape \(1, 1\): expected uint32 \(R, W\), W >= 2"),
    (lambda: rank.ranked_subset_of_words(np.zeros(2, np.uint32), InsertedOrder.empty(33)),
     "expected uint32"),
    (lambda: rank.ranked_subset_of_words(np.zeros((1, 2), np.uint32), InsertedOrder.empty(33),
                                         rank.ItemRanks.of_mask(np.zeros(5, bool))),
     "removed has 5 bits: expected 33"),
])
def test_bad_inputs_are_refused_naming_the_value(call, message):
    with pytest.raises(ConstraintSetError, match=message):
        call()


# --------------------------------------------------------------------------
# Ranges over a compiled set


def prefixes(trie) -> list:
    """Per depth 0..L, each state's prefix (a tuple), from the tokens."""
    out = [[()]]
    for layer in trie.layers:
        indptr = np.asarray(layer.indptr).astype(np.int64)
        tokens = np.asarray(layer.tokens)
        parents = np.repeat(np.arange(layer.num_states), np.diff(indptr))
        out.append([out[-1][p] + (int(t),) for p, t in zip(parents, tokens[:indptr[-1]])])
    return out


def check_ranges(compiled, case) -> None:
    view = compiled._set_view
    items, trie = view.checked_items("test"), view.trie()
    layers = trie_ranges.range_layers(trie.layers, trie.num_final_states)
    order = trie_ranges.trie_order(items, layers)
    rows = case.all_rows
    sequence = {int(u): rows[i] for i, u in enumerate(np.asarray(items.row_item))}
    every = sorted(set(rows))  # trie order is Python's tuple order (a prefix first)
    assert [sequence[int(u)] for u in order[np.arange(order.count)]] == every
    masks = np.stack([rows_item_mask(s, items, "test") for s in case.subsets])
    ranked = rank.ranked_subset(masks, order, items.removed, fine=bool(len(every) % 2))
    # the same subsets from packed item bits (a row selection's scatter), bits past N' set
    words = np.full((masks.shape[0], -(-masks.shape[1] // 32) + 1), 0xFFFFFFFF, np.uint32)
    words.view(np.uint8)[:, :-(-masks.shape[1] // 8)] = np.packbits(masks, axis=1,
                                                                    bitorder="little")
    if masks.shape[1] % 8:
        words.view(np.uint8)[:, masks.shape[1] // 8] |= np.uint8((0xFF << (masks.shape[1] % 8)) & 0xFF)
    removed = None if items.removed is None else \
        rank.ItemRanks.of_mask(np.asarray(items.removed, bool))
    packed = rank.ranked_subset_of_words(words, order, removed, fine=bool(len(every) % 3))
    positions = np.arange(order.count + 1)
    for r in range(masks.shape[0]):
        np.testing.assert_array_equal(packed.prefix(positions, r), ranked.prefix(positions, r))
    picked = [case.subset_items(r) for r in range(len(case.subsets))]
    offsets = np.zeros(1, np.int64)
    for d, states in enumerate(prefixes(trie)):
        ids = np.arange(len(states))
        lo, hi = trie_ranges.state_ranges(layers, d, ids)
        np.testing.assert_array_equal(trie_ranges.state_ranges(layers, d, ids, offsets), (lo, hi))
        below = [[u for u in every if u[:d] == p] for p in states]
        assert [every[a:b] for a, b in zip(lo, hi)] == below
        accepts = np.ones(len(states), bool) if d == layers.depth else \
            np.zeros(len(states), bool) if trie.layers[d].accepting is None else \
            np.asarray(trie.layers[d].accepting[:len(states)], bool)
        assert accepts.sum() == sum(p in every for p in states)
        for r, chosen in enumerate(picked):
            got = ranked.count(lo, hi, r)
            np.testing.assert_array_equal(got, [sum(u in chosen for u in b) for b in below])
            own = ranked.count(lo[accepts], lo[accepts] + 1, r)  # an item's own position
            np.testing.assert_array_equal(own, [p in chosen for p, a in zip(states, accepts) if a])
        if d < layers.depth:  # what a decoder carries to the children
            parents = np.repeat(ids, np.diff(np.asarray(trie.layers[d].indptr)))
            offsets = trie_ranges.child_offsets(layers, d, offsets, ids)[parents]


@fuzz_settings(40)
@given(case=live_cases())
def test_every_state_counts_its_subset_items_in_one_range(case):
    compiled = sc.compile_constraints(case.rows, case.vocab, end_token=case.end,
                                      pipeline=__import__("oracle").pipeline_for(case.layout),
                                      capacity=case.capacity)
    check_ranges(updated(compiled, case), case)


@fuzz_settings(15)
@given(case=live_cases())
def test_ranges_read_from_tables_alone(case):
    L = max(len(r) for r in case.rows)
    shards = sc.Shards(np.asarray([list(r) + [-1] * (L - len(r)) for r in case.rows], np.int64),
                       partitions=2)
    compiled = sc.compile_constraints(shards, case.vocab, end_token=case.end,
                                      pipeline=__import__("oracle").pipeline_for(case.layout),
                                      capacity=case.capacity)
    check_ranges(updated(compiled, case), case)


@pytest.mark.parametrize("lengths", [(3, 7), (1, 9)])
def test_exception_rows_equal_a_near_unary_layers_row_pointers(lengths):
    """`ExceptionRows` (a rank over the exceptions) against the row pointers
    read from the tables (`NearRows`), every entry, at word and block edges."""
    from static_compiler.item_bits.layers import NearRows

    rng = np.random.default_rng(lengths[1])
    rows = [tuple(rng.integers(1, 9, rng.integers(*lengths)).tolist()) for _ in range(3000)]
    compiled = sc.compile_constraints(sc.Shards(np.asarray(
        [list(r) + [-1] * (max(map(len, rows)) - len(r)) for r in rows]), partitions=2), 9,
        end_token=0, pipeline=__import__("oracle").pipeline_for("near_unary"))
    trie = compiled._set_view.trie()
    near = [layer for layer in trie.layers if isinstance(layer.indptr, NearRows)]
    assert near and any(layer.num_states > 512 for layer in near)
    for layer in near:
        want = np.asarray(layer.indptr).astype(np.int64)
        got = trie_ranges.ExceptionRows(layer.indptr, layer.num_states)
        np.testing.assert_array_equal(got[np.arange(layer.num_states + 1)], want)


def test_a_variable_length_order_needs_its_layers():
    compiled = sc.compile_constraints([(1, 2), (1,)], 4, end_token=0)
    with pytest.raises(ConstraintSetError, match="needs its layers"):
        trie_ranges.trie_order(compiled._set_view.checked_items("test"))


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 5000])
def test_adopted_words_give_the_ranks_of_copied_ones(size):
    """`ItemRanks.of_words(..., adopt=True)` holds fresh words of the room
    `words_for(size)` as they are (no copy; stray bits past `size`
    cleared) and counts as a copy does; words of another width are copied."""
    rng = np.random.default_rng(size)
    room = rank.words_for(size)
    words = rng.integers(0, 2 ** 32, (2, room // 32), dtype=np.uint32)  # (bits past size too)
    want = rank.ItemRanks.of_words(words.copy(), size, fine=True)
    got = rank.ItemRanks.of_words(words, size, fine=True, adopt=True)
    assert got.words is words or np.shares_memory(got.words, words)
    for a, b in [(got.words, want.words), (got.counts, want.counts), (got.within, want.within)]:
        np.testing.assert_array_equal(a, b)
    narrow = rng.integers(0, 2 ** 32, (1, room // 32 - 1 if size % 512 < 480 else room // 32 + 1),
                          dtype=np.uint32)  # (wide enough for size, not the room's width)
    copied = rank.ItemRanks.of_words(narrow, size, adopt=True)
    assert not np.shares_memory(copied.words, narrow)
    np.testing.assert_array_equal(copied.counts, rank.ItemRanks.of_words(narrow, size).counts)
