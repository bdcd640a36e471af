"""The persistent batch's bookkeeping of the vLLM processor
(`integrations.vllm.slots.SlotTable`) against a brute-force model of vLLM's
batch: random sequences of requests added, removed, moved (UNIDIRECTIONAL
and SWAP), as vLLM's input batch makes them. Pure Python, runs without vLLM."""

from __future__ import annotations

import dataclasses
import enum

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_cases import condense

from static_compiler.integrations.vllm.slots import SlotTable


class Direction(enum.Enum):  # (vLLM's MoveDirectionality, matched by name)
    UNIDIRECTIONAL = 1
    SWAP = 2


@dataclasses.dataclass
class Update:  # vLLM's BatchUpdate's fields
    batch_size: int
    removed: list
    added: list
    moved: list


class Params:
    def __init__(self, request: int, opted: bool):
        self.request, self.opted = request, opted


def check(table: SlotTable, batch: list, rows_of: dict) -> None:
    """Every opted-in request of `batch` (index -> (request, opted) or None)
    is at its index with the state row it started on, rows are distinct and
    within the capacity, and nothing else is held."""
    want = {i: r for i, r in enumerate(batch) if r is not None and r[1]}
    assert sorted(table.slots) == sorted(want)
    for index, (request, _) in want.items():
        slot = table.slots[index]
        assert slot.data == request and rows_of[request] == slot.row
    rows = [s.row for s in table.slots.values()]
    assert len(set(rows)) == len(rows) and all(0 <= r < table.capacity for r in rows)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_slots_follow_a_batch_of_adds_removes_and_moves(data):
    table = SlotTable(data.draw(st.integers(1, 4)))
    batch: list = []  # the persistent batch, condensed as vLLM's input batch does
    rows_of: dict = {}
    next_request = 0

    def start(row, params, output):
        assert output == [params.request]  # (the list passed through)
        if not params.opted:
            return None
        rows_of[params.request] = row
        return params.request

    for _ in range(data.draw(st.integers(1, 12))):
        removed = sorted(data.draw(st.sets(st.sampled_from(range(len(batch))))
                                   if batch else st.just(set())), reverse=True)
        for index in removed:
            batch[index] = None
        free = sorted(removed)
        added = []
        for _ in range(data.draw(st.integers(0, 3))):
            opted = data.draw(st.booleans())
            index = free.pop(0) if free else len(batch)
            if index == len(batch):
                batch.append(None)
            batch[index] = (next_request, opted)
            added.append((index, Params(next_request, opted), None, [next_request]))
            next_request += 1
        moved = condense(batch, free, Direction.UNIDIRECTIONAL)
        # then a few swaps (vLLM's reordering of the batch)
        for _ in range(data.draw(st.integers(0, 2)) if len(batch) > 1 else 0):
            a, b = data.draw(st.lists(st.sampled_from(range(len(batch))), min_size=2,
                                      max_size=2, unique=True))
            batch[a], batch[b] = batch[b], batch[a]
            moved.append((a, b, Direction.SWAP))
        update = Update(len(batch), removed, added, moved)
        table.update(update if (removed or added or moved) else None, start)
        check(table, batch, rows_of)


def test_a_request_added_over_an_index_replaces_it_and_frees_its_row():
    table = SlotTable(1)
    start = lambda row, params, output: params.request if params.opted else None
    table.update(Update(1, [], [(0, Params(0, True), None, [])], []), start)
    assert table.slots[0].row == 0
    table.update(Update(1, [], [(0, Params(1, False), None, [])], []), start)
    assert table.slots == {}
    table.update(Update(1, [], [(0, Params(2, True), None, [])], []), start)
    assert table.slots[0].data == 2 and table.slots[0].row == 0 and table.capacity == 1


def test_rows_grow_when_every_one_is_taken():
    table = SlotTable(1)
    start = lambda row, params, output: params.request
    table.update(Update(3, [], [(i, Params(i, True), None, []) for i in range(3)], []), start)
    assert sorted(s.row for s in table.slots.values()) == [0, 1, 2] and table.capacity == 4
