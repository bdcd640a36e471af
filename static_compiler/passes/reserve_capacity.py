"""`reserve-capacity`: room in every table for items added later.

`CompiledConstraints.update(add=...)` merges new items into the trie. The
plan records each layer's state count and slice width, so without room any
addition changes a table shape and every jitted program compiles again. This
pass gives each layer of a trie a capacity: `growth` times its states (and
edges: the next depth's states), rounded up to a multiple of 8, and, for
sliced layers, `growth` times its slice width k (at most V). The backend pads
the tables to it (`Layout.states_capacity`), so an update whose layers stay
within their capacity keeps the plan, and every compiled program serves it.

near_unary layers keep their form (one token per state, plus the rows of
the few states with other than one child): they reserve room for `growth`
times their exceptions as well, so room costs about `growth` times their
tables (turning them into csr, with a row pointer per state, cost 1.86x at
1e7 items). Unary layers stay unary; an addition that branches one, or gives
a near_unary layer more exceptions than its room, does not fit, and the
update then compiles the set anew (and says so).
Run it after choose-layout and before split-heavy, pad-branches and
pack-dtypes (so dtypes hold the padded counts). The root keeps one state.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton, LayoutKind
from static_compiler.ir.cost_model import packed
from static_compiler.passes.base import Pass

CAPACITY_MULTIPLE = 8
"""Reserved state and edge counts are rounded up to a multiple of this."""


def scaled(count: int, growth: float, limit: int) -> int:
    """min(limit, max(count, ceil(count * growth))) for count <= limit,
    exact where the float product overflows (growth 1e308) or the limit
    (V ** depth) is past any float."""
    if count * growth >= limit:  # float vs int compares exactly; inf >= any int
        return limit
    return max(count, math.ceil(count * growth))


def reserved_count(count: int, growth: float, limit: int) -> int:
    """The capacity reserved for `count` states (or edges) at `growth`:
    rounded up to a multiple of CAPACITY_MULTIPLE, at most `limit` (the most
    states the depth can hold)."""
    want = scaled(count, growth, limit)
    return min(limit, -(-want // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE)


def checked_growth(value, name: str) -> float:
    """`value` as a float when it is a finite real number >= 1.0; else
    PipelineError naming `name` (the option or argument) and the value. A
    bool is an int to Python, inf would overflow math.ceil and NaN fails
    every comparison, so each is refused here rather than deep in the pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or not value >= 1.0:
        raise PipelineError(f"{name}={value!r} ({type(value).__name__}): expected a finite "
                            "growth factor >= 1.0 (1.25 reserves 25 % more room)")
    return float(value)


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
        object.__setattr__(self, "growth", checked_growth(self.growth, "growth"))

    def run(self, ir: Automaton) -> Automaton:
        explicit = [t for t, layer in enumerate(ir.layers) if not layer.implicit_targets]
        if explicit:
            raise PipelineError(f"{self.name}: layers {explicit} share states (explicit targets, "
                                "e.g. after 'minimize' or from a graph): only a trie can take "
                                "items later; drop 'minimize' or this pass")
        caps = [1]
        for d in range(1, ir.depth + 1):  # a depth has at most V times its parent's states
            caps.append(caps[-1] if ir.layers[d - 1].layout.kind == LayoutKind.UNARY
                        else reserved_count(ir.num_states_at(d), self.growth,
                                            caps[-1] * ir.vocab_size))

        def reserve(t, layer, lay):
            k = lay.k
            if lay.kind.sliced:
                k = scaled(k, self.growth, ir.vocab_size)
            exceptions = 0
            if lay.kind == LayoutKind.NEAR_UNARY:
                exceptions = reserved_count(lay.exceptions, self.growth, caps[t])
            lay = dataclasses.replace(lay, k=k, exceptions=exceptions,
                                      states_capacity=caps[t], edges_capacity=caps[t + 1])
            return packed(layer, lay, ir.vocab_size, caps[t + 1])
        return self.map_layouts(ir, reserve)
