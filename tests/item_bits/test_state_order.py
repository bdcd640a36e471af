"""`item_bits.state_order.InsertedOrder` (a fixed-length set's final states'
items after additions, held as the additions) against the dense array it
stands for: lookups, the conversion from a version-8 `state_item`, further
insertions and the packed item mask (from a bool or a packed one), on random
orders grown by insertion."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from static_compiler.item_bits import layer_walk, liveness
from static_compiler.item_bits.state_order import InsertedOrder


def grown(rng, base: int, batches) -> tuple:
    """(InsertedOrder, the same order as an int32 array) of `base` items
    after additions of `batches` items each, placed at random."""
    order, dense = InsertedOrder.empty(base), np.arange(base, dtype=np.int32)
    for k in batches:
        before = np.sort(rng.integers(0, order.count + 1, k))  # old ids the new states precede
        new_ids = order.count + np.arange(k)
        states = before + np.arange(k)  # new ids of the new states
        order = order.with_insertions(before, states, new_ids)
        dense = np.insert(dense, before, new_ids.astype(np.int32))
    return order, dense


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), base=st.integers(0, 300),
       batches=st.lists(st.integers(0, 40), max_size=4))
def test_insertions_stand_for_the_dense_order(seed, base, batches):
    rng = np.random.default_rng(seed)
    order, dense = grown(rng, base, batches)
    assert order.count == dense.shape[0]
    np.testing.assert_array_equal(order[np.arange(order.count)], dense)
    again = InsertedOrder.of_array(dense, chunk=7)  # chunks carry the expected id on
    np.testing.assert_array_equal(again[np.arange(again.count)], dense)
    assert again.at.shape[0] <= order.at.shape[0]
    live = rng.random(order.count) < 0.3
    want = layer_walk.PackedBits.of(live[dense]).words(order.count)
    packed = layer_walk.PackedBits.of(live, room=order.count + 100)
    for chunk in (64, 128, 1 << 20):
        got = liveness.final_item_live(order, live.copy()) if chunk == 1 << 20 else \
            order.live_bits(live, chunk)
        np.testing.assert_array_equal(got.words(order.count), want)
        # the item mask given as packed bits (`item_masks.rows_item_bits`)
        np.testing.assert_array_equal(order.live_bits(packed, chunk).words(order.count), want)
    np.testing.assert_array_equal(liveness.final_item_live(dense, live).words(order.count), want)


def test_a_permutation_not_grown_by_insertion_still_has_an_order():
    dense = np.array([3, 0, 4, 1, 2], np.int32)
    order = InsertedOrder.of_array(dense)
    np.testing.assert_array_equal(order[np.arange(5)], dense)
    assert order.at.tolist() == [0, 2] and sorted(order.item.tolist()) == [3, 4]
