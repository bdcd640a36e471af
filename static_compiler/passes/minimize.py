"""`minimize`: merge equivalent states layer by layer (suffix sharing, a DAFSA),
when the cost model says the result is smaller, or always with `force=true`.

The algorithm is `static_compiler.ir.merge_states` (the graph frontend runs it
too); see there for how states are grouped and why merging can cost bytes.
Run it before choose-layout (it rejects an IR that already has layouts).
"""

from __future__ import annotations

import dataclasses

from static_compiler.ir import Automaton
from static_compiler.ir.merge_states import minimize_automaton
from static_compiler.passes.base import Pass


@dataclasses.dataclass(frozen=True)
class MinimizePass(Pass):
    """Options:
      force: keep the minimized automaton even when the cost model says it
        is not smaller (explicit targets outweigh the merged states).
    """

    name = "minimize"
    force: bool = False

    def run(self, ir: Automaton) -> Automaton:
        return minimize_automaton(ir, self.force)[0]
