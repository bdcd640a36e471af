"""`reserve-capacity`: room in every table for items added later.

`CompiledConstraints.update(add=...)` merges new items into the trie. The
plan records each layer's state count and slice width, so without room any
addition changes a table shape and every jitted program compiles again. This
pass gives each layer of a trie a capacity: `growth` times its states (and
edges: the next depth's states), rounded up to a multiple of 8, and, for
sliced layers, `growth` times its slice width k (at most V). The backend pads
the tables to it (`Layout.states_capacity`), so an update whose layers stay
within their capacity keeps the plan, and every compiled program serves it.

near_unary layers become csr: their rows are implied by state ids, so they
cannot leave room. Unary layers stay unary; an addition that branches one
does not fit, and the update then compiles the set anew (and says so).
Run it after choose-layout and before split-heavy, pad-branches and
pack-dtypes (so dtypes hold the padded counts). The root keeps one state.
"""

from __future__ import annotations

import dataclasses
import math

from static_compiler.cost_model import packed
from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton, LayoutKind
from static_compiler.passes.base import Pass

CAPACITY_MULTIPLE = 8
"""Reserved state and edge counts are rounded up to a multiple of this."""


def reserved_count(count: int, growth: float) -> int:
    """The capacity reserved for `count` states (or edges) at `growth`."""
    want = max(count, math.ceil(count * growth))
    return -(-want // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE


@dataclasses.dataclass(frozen=True)
class ReserveCapacityPass(Pass):
    """Options:
      growth: capacity as a multiple of today's counts (>= 1): 1.25 leaves
        room for 25 % more states at every depth, and 25 % wider slices.
    """

    name = "reserve-capacity"
    layout_only = True
    growth: float = 1.25

    def __post_init__(self):
        if not self.growth >= 1.0:
            raise ValueError(f"growth={self.growth} must be >= 1")

    def run(self, ir: Automaton) -> Automaton:
        explicit = [t for t, layer in enumerate(ir.layers) if not layer.implicit_targets]
        if explicit:
            raise PipelineError(f"{self.name}: layers {explicit} share states (explicit targets, "
                                "e.g. after 'minimize' or from a graph): only a trie can take "
                                "items later; drop 'minimize' or this pass")
        caps = [1]
        for d in range(1, ir.depth + 1):  # a depth has at most V times its parent's states
            caps.append(caps[-1] if ir.layers[d - 1].layout.kind == LayoutKind.UNARY
                        else min(reserved_count(ir.num_states_at(d), self.growth),
                                 caps[-1] * ir.vocab_size))

        def reserve(t, layer, lay):
            k = lay.k
            kind = LayoutKind.CSR if lay.kind == LayoutKind.NEAR_UNARY else lay.kind
            if kind.sliced:
                k = min(ir.vocab_size, max(k, math.ceil(k * self.growth)))
            lay = dataclasses.replace(lay, kind=kind, k=k, exceptions=0,
                                      states_capacity=caps[t], edges_capacity=caps[t + 1])
            return packed(layer, lay, ir.vocab_size, caps[t + 1])
        return self.map_layouts(ir, reserve)
