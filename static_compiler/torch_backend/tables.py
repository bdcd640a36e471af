"""The static plan and the tables of a compiled set as torch tensors.

`StepInfo` is the part of the compiler's `StepPlan` the torch kernels read
(a layout kind, its static slice width, state counts, flags); `TorchPlan`
holds one per layer. Both come from a saved artifact's manifest
(`plan_from_manifest`) or from a compiled set's plan (`plan_from_steps`),
without importing the compiler. Tables become int32 / bool tensors once
(`torch_tables`): torch gathers need no narrower dtypes, and uint16 /
uint32 tables have no torch kernels on every device.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

from static_compiler.errors import ArtifactFormatError
from static_compiler.live.layers import slot_step

KINDS = ("dense_rows", "csr", "unary", "near_unary")
"""The layout kinds the compiler emits, all of which the kernels read."""


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Static facts about one decoding step (one layer).

    Attributes
    ----------
    kind : str
        Layout kind, one of `KINDS`.
    k : int
        Entries a csr / near_unary step reads per row (its widest row).
    num_states, num_next_states : int
        States at this depth and the next, as the (possibly padded) tables
        hold them.
    explicit_targets : bool
        The layer has a ``targets`` table (else a child is its edge index).
    has_accepting : bool
        The layer has an ``accepting`` table.
    light_k, wide_slots : int
        The mixed layout's light width and wide slots (0 when off).
    """

    kind: str
    k: int
    num_states: int
    num_next_states: int
    explicit_targets: bool
    has_accepting: bool
    light_k: int = 0
    wide_slots: int = 0


@dataclasses.dataclass(frozen=True)
class TorchPlan:
    """vocab_size V, steps (one `StepInfo` per layer), end_token (None for
    fixed-length sets) and slot_steps (steps whose subset bits are slot bits
    of dense rows)."""

    vocab_size: int
    steps: tuple
    end_token: Optional[int]
    slot_steps: frozenset

    @property
    def depth(self) -> int:
        return len(self.steps)

    @property
    def max_length(self) -> int:
        """Tokens in a decoded sequence, the end token included."""
        return self.depth + (0 if self.end_token is None else 1)

    def count_at(self, step: int) -> int:
        """States at depth `step` (0..depth) as the tables hold them."""
        return self.steps[step].num_states if step < self.depth \
            else self.steps[-1].num_next_states

    def state_counts(self) -> tuple:
        """States per depth 0..depth."""
        return tuple(self.count_at(d) for d in range(self.depth + 1))


def _slot_steps(vocab_size: int, steps: Sequence[StepInfo], slots: bool) -> frozenset:
    if not slots:
        return frozenset()
    return frozenset(t for t, s in enumerate(steps)
                     if slot_step(s.kind, s.num_states, s.num_next_states, vocab_size))


def plan_from_steps(vocab_size: int, steps: Sequence, end_token: Optional[int],
                    slots: bool = True) -> TorchPlan:
    """A `TorchPlan` from step records: the compiler's `StepPlan`s or the
    manifest's ``plan_steps`` dicts. slots: whether dense steps' subset bits
    are slot bits (a manifest's ``subset_bits == "dense_slots"``)."""
    infos = []
    for step in steps:
        get = step.get if isinstance(step, dict) else (lambda name, d=None, s=step: getattr(s, name, d))
        kind = get("kind")
        kind = getattr(kind, "value", kind)
        if kind not in KINDS:
            raise ArtifactFormatError(f"plan step of layout kind {kind!r}: expected one of {KINDS}")
        infos.append(StepInfo(kind=str(kind), k=int(get("k")), num_states=int(get("num_states")),
                              num_next_states=int(get("num_next_states")),
                              explicit_targets=bool(get("explicit_targets")),
                              has_accepting=bool(get("has_accepting")),
                              light_k=int(get("light_k", 0) or 0),
                              wide_slots=int(get("wide_slots", 0) or 0)))
    infos = tuple(infos)
    return TorchPlan(int(vocab_size), infos, None if end_token is None else int(end_token),
                     _slot_steps(vocab_size, infos, slots))


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
