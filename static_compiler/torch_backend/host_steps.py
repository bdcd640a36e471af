"""The torch engine's processor pair on the CPU through the compiled host
loops (`static_compiler.host_kernels`): the tensors' numpy views handed to
one kernel call per step instead of tens of eager ops, the same results
bit for bit (tests/torch_backend/test_host_steps.py).

`TorchEngine` uses it for CPU tensors when numba is installed, outside
``torch.compile`` (which traces the ops instead), for subsets given as
`LiveBits` or ranked (`rank_kernels.RankedLive`: the kernels' range counts
read the placed tensors in place); everywhere else the ops in `ops` run.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from static_compiler.host_kernels import processor as host
from static_compiler.host_kernels import ranked as host_ranked
from static_compiler.torch_backend.kernels import LiveBits
from static_compiler.torch_backend.ops import ProcessorStep, RowColumns, TorchState
from static_compiler.torch_backend.rank_kernels import RangeTensors, RankedLive, RankTensors

BOUNDS_KEPT = 1 << 18
"""The fewest bytes of bounds a set's ranked reads keep (`HostSteps`)."""
BOUNDS_BYTES = 0.1
"""The share of a set's table bytes its ranked reads may keep as bounds
(the bounds below every state of its shallowest depths, `host_kernels.
ranked.host_ranges`; the issue's line for an index's growth): 1e5
names, 32 rows, ~100 children a row, the ranked mask 0.49 -> 0.19 ms."""


def _numpy(x: torch.Tensor, dtype) -> np.ndarray:
    return np.ascontiguousarray(x.numpy(), dtype)


def _bitmap(t: RankTensors) -> tuple:
    """(words int32, within int16, counts) (R, ...) of placed rank bits:
    views of the CPU tensors."""
    return tuple(np.ascontiguousarray(x.numpy()) for x in (t.words, t.within, t.counts))


def host_ranges(ranges: RangeTensors, kept: int) -> host_ranked.HostRanges:
    """A set's `RangeTensors` (CPU) packed for the kernels (once per set;
    kept: the most bounds kept, `host_kernels.ranked.host_ranges`)."""
    rows = tuple(None if r is None else r.numpy() if isinstance(r, torch.Tensor) else
                 (*_bitmap(r[0]), r[0].size, *(x.numpy() for x in r[1:])) for r in ranges.rows)
    accepting = tuple(None if a is None else (*_bitmap(a), a.size) for a in ranges.accepting)
    return host_ranked.host_ranges(rows, accepting, ranges.counts, ranges.at.numpy(),
                            ranges.num_items, kept)


class HostSteps:
    """A set's steps as the host kernels read them: one `HostLayer` per
    step 0..max_length - 1, views of the engine's CPU tables (no copy);
    bounds_kept: the most bytes of bounds its ranked subsets' reads keep
    (`host_kernels.ranked.host_ranges`; None: `BOUNDS_BYTES` of the
    tables' bytes, at least `BOUNDS_KEPT`)."""

    def __init__(self, plan, tables: tuple, bounds_kept: Optional[int] = None):
        self.plan = plan
        self.bounds_kept = bounds_kept if bounds_kept is not None else max(
            BOUNDS_KEPT, int(BOUNDS_BYTES * sum(t.numel() * t.element_size()
                                                for tabs in tables for t in tabs.values())))
        views = tuple({name: t.numpy() for name, t in tabs.items()} for tabs in tables)
        self.layers = tuple(host.HostLayer.of(plan, views, step, plan.count_at(step))
                            for step in range(plan.max_length))
        self._ranges: Optional[tuple] = None  # (RangeTensors, HostRanges): the set's, packed once
        self._ranked: Optional[tuple] = None  # (RankedLive, its views): the last one read

    @staticmethod
    def reads(sub) -> bool:
        """Whether the kernels read this subset form (None, `LiveBits` or
        `RankedLive`)."""
        return sub is None or isinstance(sub[0], (LiveBits, RankedLive))

    def _ranked_views(self, live: RankedLive) -> tuple:
        """(HostRanges, items, added or None, first) of a placed ranked
        subset: its set's ranges packed at the first one, its own tensors'
        views (kept for the last subset read: a request's steps reuse them)."""
        last = self._ranked
        if last is not None and last[0] is live:
            return last[1]
        packed = self._ranges
        if packed is None or packed[0] is not live.ranges:
            kept = self.bounds_kept // live.ranges.at.element_size()
            packed = self._ranges = (live.ranges, host_ranges(live.ranges, kept))
        ranked = live.ranked
        views = (packed[1], _bitmap(ranked.items),
                 None if ranked.added is None else _bitmap(ranked.added),
                 np.ascontiguousarray(live.first.numpy()))
        self._ranked = (live, views)
        return views

    def _subset(self, sub, step: int) -> host.HostSubset:
        if sub is None:
            return host.NO_BITS
        live, rows = sub
        if isinstance(live, RankedLive):
            ranges, items, added, first = self._ranked_views(live)
            return host.ranked_subset(ranges, step, live.ranges.ends[step], rows.numpy(), items,
                                      added, first)
        words = live.live[step].numpy() if step < self.plan.depth else None
        ends = live.ends[step]
        return host.host_subset(words, step in self.plan.slot_steps, self.plan.vocab_size,
                                None if ends is None else ends.numpy(), rows.numpy())

    def _rows(self, state: TorchState) -> tuple:
        return (_numpy(state.node, np.int64), _numpy(state.valid, np.bool_),
                _numpy(state.finished, np.bool_))

    def mask(self, state: TorchState, step: int, sub=None) -> torch.Tensor:
        """`ops.mask_at`: bool (B, V)."""
        plan = self.plan
        return torch.from_numpy(host.mask(self.layers[step], self._subset(sub, step),
                                          plan.vocab_size, plan.end_token, *self._rows(state)))

    def advance(self, state: TorchState, tokens: torch.Tensor, step: int,
                sub=None) -> TorchState:
        """`ops.advance_at`: the rows moved along tokens (B,)."""
        plan = self.plan
        moved = host.advance(self.layers[step], self._subset(sub, step), plan.vocab_size,
                             plan.end_token, *self._rows(state), _numpy(tokens, np.int64))
        return TorchState(*(torch.from_numpy(x) for x in moved))

    def processor_step(self, state: TorchState, tokens: Optional[torch.Tensor], step: int,
                       sub=None) -> ProcessorStep:
        """`ops.processor_step` (its columns hold no candidates: the next
        call's advance reads the tables, as cheap here as reading them
        back)."""
        if tokens is not None:
            state = self.advance(state, tokens, step - 1, sub)
        return ProcessorStep(state, self.mask(state, step, sub),
                             RowColumns(step, state.node, None if sub is None else sub[0], None))
