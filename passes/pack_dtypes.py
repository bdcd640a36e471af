"""`pack-dtypes`: the narrowest integer types that hold each layer's tokens
(uint16 when V <= 65536) and state ids / row pointers (int16, int32 or int64,
signed so -1 can mark a missing edge).

choose-layout already records packed dtypes; this pass re-packs layouts that
came from elsewhere (a parsed IR dump, a pipeline without choose-layout's
defaults) and is idempotent."""

from __future__ import annotations

import dataclasses

from passes.base import Pass
from passes.cost_model import packed
from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton


@dataclasses.dataclass(frozen=True)
class PackDtypesPass(Pass):
    name = "pack-dtypes"

    def run(self, ir: Automaton) -> Automaton:
        layers = []
        for t, layer in enumerate(ir.layers):
            if layer.layout is None:
                raise PipelineError(f"pack-dtypes: layer {t} has no layout; run choose-layout first")
            lay = packed(layer, layer.layout, ir.vocab_size, ir.num_states_at(t + 1))
            layers.append(layer.replace(layout=lay))
        return ir.with_layers(layers)
