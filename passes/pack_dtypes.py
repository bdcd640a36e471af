"""`pack-dtypes`: the narrowest integer types that hold each layer's tokens
(uint16 when V <= 65536) and state ids / row pointers (int16, int32 or int64,
signed so -1 can mark a missing edge)."""

from __future__ import annotations

import dataclasses

from passes.base import Pass
from passes.cost_model import narrowest_signed, with_estimate
from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton


@dataclasses.dataclass(frozen=True)
class PackDtypesPass(Pass):
    name = "pack-dtypes"

    def run(self, ir: Automaton) -> Automaton:
        token_dtype = "uint16" if ir.vocab_size <= 1 << 16 else "int32"
        layers = []
        for t, layer in enumerate(ir.layers):
            if layer.layout is None:
                raise PipelineError(f"pack-dtypes: layer {t} has no layout; run choose-layout first")
            largest = max(layer.num_edges, layer.num_states, ir.num_states_at(t + 1))
            lay = dataclasses.replace(layer.layout, token_dtype=token_dtype,
                                      state_dtype=narrowest_signed(largest))
            layers.append(layer.replace(layout=with_estimate(layer, lay, ir.vocab_size)))
        return ir.with_layers(layers)
