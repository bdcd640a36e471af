"""The static plan and the tables of a compiled set as torch tensors.

`TorchPlan` is the compiler's `Plan` (its `StepPlan`s: a layout kind, the
static slice width, state counts, flags; `backend.lowering` is numpy-only)
with the steps whose subset bits are slot bits. It comes from a saved
artifact's manifest (`plan_from_manifest`) or from a compiled set's plan
(`plan_from_steps`), without importing jax or the compiler. Tables become int32 / bool tensors once
(`torch_tables`): torch gathers need no narrower dtypes, and uint16 /
uint32 tables have no torch kernels on every device.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

from static_compiler.backend.lowering import Plan, StepPlan
from static_compiler.errors import ArtifactFormatError
from static_compiler.live.layers import slot_step

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

    def state_counts(self) -> tuple:
        """States per depth 0..depth."""
        return tuple(self.count_at(d) for d in range(self.depth + 1))


def _slot_steps(vocab_size: int, steps: Sequence[StepPlan], slots: bool) -> frozenset:
    if not slots:
        return frozenset()
    return frozenset(t for t, s in enumerate(steps)
                     if slot_step(s.kind, s.num_states, s.num_next_states, vocab_size))


def plan_from_steps(vocab_size: int, steps: Sequence, end_token: Optional[int],
                    slots: bool = True) -> TorchPlan:
    """A `TorchPlan` from the compiler's `StepPlan`s or the manifest's
    ``plan_steps`` dicts (read as `artifact.metadata.plan_from_metadata`
    reads them). slots: whether dense steps' subset bits are slot bits (a
    manifest's ``subset_bits == "dense_slots"``)."""
    try:
        steps = tuple(s if isinstance(s, StepPlan) else StepPlan(**s) for s in steps)
    except (TypeError, ValueError) as e:
        raise ArtifactFormatError(f"plan_steps do not describe a plan ({type(e).__name__}: "
                                  f"{e})") from None
    return TorchPlan(int(vocab_size), steps, None if end_token is None else int(end_token),
                     _slot_steps(vocab_size, steps, slots))


def plan_from_manifest(manifest) -> TorchPlan:
    """The `TorchPlan` a saved artifact's `Manifest` records."""
    return plan_from_steps(manifest.vocab_size, manifest.plan_steps, manifest.end_token,
                           slots=manifest.subset_bits == "dense_slots")


def _int32(arr) -> np.ndarray:
    arr = np.asarray(arr)
    return np.array(arr, dtype=bool if arr.dtype == np.bool_ else np.int32)  # a writable copy


def torch_tables(tables: Sequence[dict], device=None) -> tuple:
    """One dict of tensors per layer (int32, bool for ``accepting``) on
    `device`. near_unary layers of format version <= 5 (``ex_bounds`` (X,
    2)) get ``ex_starts`` / ``ex_branch`` instead."""
    out = []
    for tabs in tables:
        layer = {}
        for name, arr in tabs.items():
            if name == "ex_bounds":
                bounds = np.asarray(arr).astype(np.int64).reshape(-1, 2)
                layer["ex_starts"] = torch.from_numpy(_int32(bounds[:, 0]))
                layer["ex_branch"] = torch.from_numpy(_int32(bounds[:, 1] - bounds[:, 0]))
                continue
            layer[name] = torch.from_numpy(_int32(arr))
        out.append({name: t.to(device) for name, t in layer.items()})
    return tuple(out)
