"""`pack-dtypes`: the narrowest integer types that hold each layer's tokens
(uint16 when V <= 65536) and state ids / row pointers (int16, int32 or int64,
signed so -1 can mark a missing edge); the rules are `static_compiler.support.dtypes`.

choose-layout already records packed dtypes; this pass re-packs layouts that
came from elsewhere (a parsed IR dump, a pipeline without choose-layout's
defaults) and is idempotent."""

from __future__ import annotations

import dataclasses

from static_compiler.ir import Automaton
from static_compiler.ir.cost_model import packed
from static_compiler.passes.base import Pass


@dataclasses.dataclass(frozen=True)
class PackDtypesPass(Pass):
    name = "pack-dtypes"
    layout_only = True

    def run(self, ir: Automaton) -> Automaton:
        return self.map_layouts(ir, lambda t, layer, lay: packed(layer, lay, ir.vocab_size,
                                                                 ir.num_states_at(t + 1)))
