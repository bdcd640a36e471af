"""`pad-branches`: round each sliced layer's k up to a hardware multiple (8 for
sublanes, 128 for TPU lanes), never past the vocabulary size, beyond which a
slice would read more than a dense row."""

from __future__ import annotations

import dataclasses

from passes.base import Pass
from passes.cost_model import with_estimate
from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton


@dataclasses.dataclass(frozen=True)
class PadBranchesPass(Pass):
    name = "pad-branches"
    multiple: int = 8

    def __post_init__(self):
        if self.multiple < 1:
            raise ValueError(f"multiple={self.multiple} must be >= 1")

    def run(self, ir: Automaton) -> Automaton:
        layers = []
        for t, layer in enumerate(ir.layers):
            lay = layer.layout
            if lay is None:
                raise PipelineError(f"pad-branches: layer {t} has no layout; run choose-layout first")
            if lay.kind in ("csr", "near_unary"):
                padded = -(-lay.k // self.multiple) * self.multiple
                lay = dataclasses.replace(lay, k=max(lay.k, min(padded, ir.vocab_size)))
                layer = layer.replace(layout=with_estimate(layer, lay, ir.vocab_size))
            layers.append(layer)
        return ir.with_layers(layers)
