"""`pad-branches`: round each sliced layer's k up to a hardware multiple (8 for
sublanes, 128 for TPU lanes), never past the vocabulary size, beyond which a
slice would read more than a dense row. A mixed layout's light_k is rounded
the same way; when it reaches k the layer is no longer mixed."""

from __future__ import annotations

import dataclasses

from static_compiler.passes.base import Pass
from static_compiler.cost_model import with_estimate
from static_compiler.ir import Automaton


@dataclasses.dataclass(frozen=True)
class PadBranchesPass(Pass):
    name = "pad-branches"
    multiple: int = 8

    def __post_init__(self):
        if self.multiple < 1:
            raise ValueError(f"multiple={self.multiple} must be >= 1")

    def _padded(self, k: int, vocab_size: int) -> int:
        return max(k, min(-(-k // self.multiple) * self.multiple, vocab_size))

    def run(self, ir: Automaton) -> Automaton:
        def pad(t, layer, lay):
            if lay.kind not in ("csr", "near_unary"):
                return lay
            k = self._padded(lay.k, ir.vocab_size)
            light = self._padded(lay.light_k, ir.vocab_size) if lay.mixed else 0
            lay = dataclasses.replace(lay, k=k, light_k=light if light < k else 0,
                                      wide_slots=lay.wide_slots if light < k else 0)
            return with_estimate(layer, lay, ir.vocab_size)
        return self.map_layouts(ir, pad)
