"""The bookkeeping of vLLM's persistent batch (V1 model runner) for a logits
processor: which request sits at each batch index, as vLLM's ``BatchUpdate``
reports requests added, removed and moved.

Each opted-in request gets a `Slot` and a state row of its own (from a free
list), kept for the request's life: a move changes only the batch index
that maps to the slot, never the device state (no row copies). The order of
a batch update is vLLM's documented one: removed, then added, then moved
(UNIDIRECTIONAL ``a -> b``: the request at a now sits at b; SWAP: the two
exchange). An added or moved request replaces whatever sat at its index.

Pure Python (no torch, no vLLM): tested against a brute-force model of the
batch (tests/integrations/vllm_engine/test_vllm_slots.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass(eq=False)
class Slot:
    """One opted-in request: its state `row` and what the processor keeps
    for it (`data`)."""

    row: int
    data: Any


def is_swap(direction) -> bool:
    """A move's direction is SWAP (vLLM's ``MoveDirectionality``, by name)."""
    return getattr(direction, "name", direction) == "SWAP"


class SlotTable:
    """batch index -> `Slot` of the opted-in requests, their state rows
    allocated from [0, capacity) (grown by doubling when all are taken:
    `grown` says by how much the caller must widen its state)."""

    def __init__(self, capacity: int):
        self.slots: dict = {}
        self.capacity = max(1, int(capacity))
        self._free = list(range(self.capacity - 1, -1, -1))

    def _row(self) -> int:
        if not self._free:
            old, self.capacity = self.capacity, 2 * self.capacity
            self._free = list(range(self.capacity - 1, old - 1, -1))
        return self._free.pop()

    def _drop(self, index: int) -> None:
        slot = self.slots.pop(index, None)
        if slot is not None:
            self._free.append(slot.row)

    def update(self, batch_update, start: Callable[..., Optional[Any]]) -> list:
        """Applies a ``BatchUpdate`` (None: nothing changed). start(row,
        params, output_ids) -> the data of an opted-in request
        (its state placed at `row`), or None for one left untouched.
        Returns the new slots."""
        if not batch_update:
            return []
        for index in batch_update.removed:
            self._drop(index)
        new = []
        for index, params, _, output in batch_update.added:
            self._drop(index)
            row = self._row()
            data = start(row, params, output)
            if data is None:
                self._free.append(row)
            else:
                self.slots[index] = slot = Slot(row, data)
                new.append(slot)
        for a, b, direction in batch_update.moved:
            at_a, at_b = self.slots.pop(a, None), self.slots.pop(b, None)
            if at_a is not None:
                self.slots[b] = at_a
            if at_b is not None:
                if is_swap(direction):
                    self.slots[a] = at_b
                else:  # (b's request was replaced)
                    self._free.append(at_b.row)
        return new
