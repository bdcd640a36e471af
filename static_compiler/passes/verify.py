"""`verify`: checks every IR invariant (static_compiler.ir.verify) and returns
the IR unchanged."""

import dataclasses

from static_compiler.ir import Automaton, verify
from static_compiler.passes.base import Pass


@dataclasses.dataclass(frozen=True)
class VerifyPass(Pass):
    name = "verify"

    def run(self, ir: Automaton) -> Automaton:
        verify(ir)
        return ir
