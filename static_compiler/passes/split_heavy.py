"""`split-heavy`: the mixed layout for skewed levels.

A csr or near_unary layer reads k entries (its widest state's branch) for
every beam. On a skewed level almost every state has a few children and a
handful have hundreds; this pass gives such layers a small `light_k` read by
every beam and `wide_slots` slots per batch row that read the rest of a
heavy state's row (`ir.Layout`; the backend falls back to k reads for every
beam, exactly, when a row has more heavy beams than slots). The tables do
not change, only the reads: the choice is the cost model's
(`cost_model.mixed_light_k`), or forced with `light-k`.

Run it after choose-layout and before pad-branches, which rounds k and
light_k up to its `multiple` (and drops the mix when the rounded light_k
reaches k). The cost model plans for those rounded widths: split-heavy picks
light_k among multiples of its own `multiple` option, which it takes from
the first pad-branches after it in the pipeline unless set (see
`SplitHeavyPass.wired`), so the read ratio it checks is the one the backend
gets.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from static_compiler.ir import Automaton
from static_compiler.ir.cost_model import DEFAULT_PAD_MULTIPLE, mixed_light_k
from static_compiler.passes.base import Pass
from static_compiler.passes.pad_branches import PadBranchesPass


@dataclasses.dataclass(frozen=True)
class SplitHeavyPass(Pass):
    """Options:
      wide_slots: heavy beams per batch row read in full without the fallback.
      beams: the beam count the cost model plans for (the paper's 70).
      max_read_ratio: mix a layer only if a row then reads at most this
        fraction of the entries it reads unmixed.
      light_k: force this light_k on every sliced layer whose k exceeds it
        (0: the cost model chooses); for tests and experiments.
      multiple: the multiple pad-branches will round k and light_k to; the
        cost model picks light_k among its multiples and plans for the
        padded k. 0: the `multiple` of the first pad-branches after this
        pass in the pipeline, or pad-branches' default when none follows.
    """

    name = "split-heavy"
    layout_only = True
    wide_slots: int = 4
    beams: int = 70
    max_read_ratio: float = 0.5
    light_k: int = 0
    multiple: int = 0

    def __post_init__(self):
        for option in ("wide_slots", "beams"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option.replace('_', '-')}={getattr(self, option)} must be >= 1")
        if not 0.0 < self.max_read_ratio <= 1.0:
            raise ValueError(f"max-read-ratio={self.max_read_ratio} must be in (0, 1]")
        if self.light_k < 0:
            raise ValueError(f"light-k={self.light_k} must be >= 0 (0: chosen by the cost model)")
        if self.multiple < 0:
            raise ValueError(f"multiple={self.multiple} must be >= 0 (0: pad-branches' multiple)")

    def wired(self, later: Sequence[Pass]) -> "SplitHeavyPass":
        """With `multiple` unset, takes it from the first pad-branches in `later`."""
        pad = next((p for p in later if isinstance(p, PadBranchesPass)), None)
        if self.multiple or pad is None:
            return self
        return dataclasses.replace(self, multiple=pad.multiple)

    def run(self, ir: Automaton) -> Automaton:
        multiple = self.multiple or DEFAULT_PAD_MULTIPLE

        def split(t, layer, lay):  # noqa: ARG001 (the per-layer map's signature)
            if not lay.kind.sliced:
                return lay
            light = self.light_k or mixed_light_k(layer, lay.k, ir.vocab_size, self.beams,
                                                  self.wide_slots, self.max_read_ratio, multiple)
            mixed = 0 < light < lay.k
            return dataclasses.replace(lay, light_k=light if mixed else 0,
                                       wide_slots=self.wide_slots if mixed else 0)
        return self.map_layouts(ir, split)
