"""The static plan and the tables of a compiled set as torch tensors.

`TorchPlan` is the compiler's `Plan` (its `StepPlan`s: a layout kind, the
static slice width, state counts, flags; `lowered.plan` is numpy-only)
with the steps whose subset bits are slot bits. It comes from the set's
`rules.set_view.SetFacts` (`torch_plan`: a saved artifact's manifest read by
`set_view.facts_of_manifest`, or a compiled set's plan), without importing
jax or the compiler. Tables become int32 / bool tensors once
(`torch_tables`): torch gathers need no narrower dtypes, and uint16 /
uint32 tables have no torch kernels on every device.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from static_compiler.lowered.plan import Plan
from static_compiler.rules.set_view import SetFacts


@dataclasses.dataclass(frozen=True)
class TorchPlan(Plan):
    """The compiler's `Plan` (vocab_size V, one `StepPlan` per layer,
    end_token) and slot_steps: the steps whose subset bits are slot bits of
    dense rows."""

    slot_steps: frozenset = frozenset()

    def count_at(self, step: int) -> int:
        """States at depth `step` (0..depth) as the tables hold them."""
        return self.steps[step].num_states if step < self.depth \
            else self.steps[-1].num_next_states


def torch_plan(facts: SetFacts) -> TorchPlan:
    """The `TorchPlan` of a set's `rules.set_view.SetFacts` (its plan and
    slot steps: a compiled set's, or an artifact's manifest's)."""
    plan = facts.plan
    return TorchPlan(plan.vocab_size, plan.steps, plan.end_token, frozenset(facts.slot_steps))


def _int32(arr) -> np.ndarray:
    arr = np.asarray(arr)
    return np.array(arr, dtype=bool if arr.dtype == np.bool_ else np.int32)  # a writable copy


def torch_tables(tables: Sequence[dict], device=None) -> tuple:
    """One dict of tensors per layer (int32, bool for ``accepting``) on
    `device`; `tables` in the current shape (`snapshot.read_tables` reads an
    older artifact's so)."""
    return tuple({name: torch.from_numpy(_int32(arr)).to(device) for name, arr in tabs.items()}
                 for tabs in tables)
