"""`pad-branches`: round each sliced layer's k up to a hardware multiple (8 for
sublanes, 128 for TPU lanes), never past the vocabulary size, beyond which a
slice would read more than a dense row. A mixed layout's light_k is rounded
the same way; when it reaches k the layer is no longer mixed. A split-heavy
before it plans its light_k for this pass's `multiple` (`SplitHeavyPass.wired`)."""

from __future__ import annotations

import dataclasses

from static_compiler.ir import Automaton
from static_compiler.ir.cost_model import DEFAULT_PAD_MULTIPLE, padded_width, with_estimate
from static_compiler.passes.base import Pass


@dataclasses.dataclass(frozen=True)
class PadBranchesPass(Pass):
    name = "pad-branches"
    layout_only = True
    multiple: int = DEFAULT_PAD_MULTIPLE

    def __post_init__(self):
        if self.multiple < 1:
            raise ValueError(f"multiple={self.multiple} must be >= 1")

    def run(self, ir: Automaton) -> Automaton:
        def pad(t, layer, lay):  # noqa: ARG001 (the per-layer map's signature)
            if not lay.kind.sliced:
                return lay
            k = padded_width(lay.k, self.multiple, ir.vocab_size)
            light = padded_width(lay.light_k, self.multiple, ir.vocab_size) if lay.mixed else 0
            lay = dataclasses.replace(lay, k=k, light_k=light if light < k else 0,
                                      wide_slots=lay.wide_slots if light < k else 0)
            return with_estimate(layer, lay, ir.vocab_size)
        return self.map_layouts(ir, pad)
