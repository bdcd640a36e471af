"""`choose-layout`: per layer, pick a layout from the cost model under a memory budget.

Each layer starts at its fastest layout (fewest candidates per beam: unary
when every state has one child, dense_rows for fan-out near V, then
near_unary or csr). While the total exceeds `memory-budget`, the layer whose
next-slower layout saves the most bytes moves to it. Layouts carry the
narrowest dtypes (as pack-dtypes would choose), so the budget is checked
against the exact bytes the backend will allocate; when even the smallest
layouts do not fit, MemoryBudgetError says how many bytes they need.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from static_compiler.errors import MemoryBudgetError
from static_compiler.ir import LAYOUT_KINDS, Automaton, Layer, Layout
from static_compiler.ir.cost_model import (
    DEFAULT_DENSE_MAX_OVERHEAD,
    DEFAULT_DENSE_THRESHOLD,
    applicable_layouts,
    candidate_layouts,
)
from static_compiler.passes.base import ByteSize, Pass


def suggested_budget(needed: float) -> ByteSize:
    """The power of two of bytes at or above `needed` (16GiB for 11.6 GiB)."""
    return ByteSize(1 << max(0, math.ceil(math.log2(max(needed, 1)))))


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


@dataclasses.dataclass(frozen=True)
class ChooseLayoutPass(Pass):
    """Options:
      memory_budget: bytes all layer tables may take together.
      dense_threshold: a layer is considered for dense_rows when its max
        branch reaches this fraction of the vocabulary...
      dense_max_overhead: ...and its dense table costs at most this many
        times the bytes of its csr layout.
      force: a layout kind every layer takes where that kind can serve it
        (unary needs one child per state, near_unary a state that has not);
        for tests and experiments. Layers it cannot serve keep the cost
        model's choice.
    """

    name = "choose-layout"
    layout_only = True
    memory_budget: ByteSize = ByteSize(2 << 30)
    dense_threshold: float = DEFAULT_DENSE_THRESHOLD
    dense_max_overhead: float = DEFAULT_DENSE_MAX_OVERHEAD
    force: str = ""

    def __post_init__(self):
        if self.memory_budget <= 0:
            raise ValueError(f"memory-budget={self.memory_budget} must be positive")
        if not 0.0 < self.dense_threshold:
            raise ValueError(f"dense-threshold={self.dense_threshold} must be > 0")
        if not 0.0 < self.dense_max_overhead:
            raise ValueError(f"dense-max-overhead={self.dense_max_overhead} must be > 0")
        if self.force and self.force not in LAYOUT_KINDS:
            raise ValueError(f"force={self.force!r} is not a layout kind {LAYOUT_KINDS}")

    def advice(self, needed: float, pipeline: Optional[Callable[[ByteSize], str]] = None) -> str:
        """How to give this pass a budget for `needed` bytes (the next power
        of two at or above them): the CLI flag, the pipeline option, and the
        Python call (`pipeline(size)`: the whole spec with that budget)."""
        size = suggested_budget(needed)
        spec = dataclasses.replace(self, memory_budget=size).spec()
        python = f"pipeline=\"{pipeline(size)}\"" if pipeline else f"{spec} in pipeline=..."
        return (f"raise the budget, e.g. to {size}: `static-compiler compile ... "
                f"--memory-budget {size}` (or {spec} in --pipeline), in Python "
                f"compile_constraints(..., {python})")

    def check_partial(self, bound: int, built: int, partitions: int, rows_built: int,
                      rows: int, pipeline: Optional[Callable[[ByteSize], str]] = None
                      ) -> None:
        """MemoryBudgetError when `bound`, a lower bound of the smallest
        layouts' bytes that `built` of `partitions` partitions (`rows_built`
        of `rows` input rows) already prove (`cost_model.tables_lower_bound`),
        exceeds the budget: a partitioned build stops there, before building
        the rest. The value it suggests scales the bound to all the rows,
        with a quarter more for what a lower bound leaves out."""
        if bound <= self.memory_budget:
            return
        whole = bound * rows / max(rows_built, 1)
        raise MemoryBudgetError(
            f"memory-budget={self.memory_budget} ({int(self.memory_budget)} bytes) is too small "
            f"for this partitioned build: the {built} of {partitions} partitions built so far "
            f"({rows_built} of {rows} rows) already need at least {bound} bytes of tables "
            f"({_gib(bound)}; about {_gib(whole)} for all the rows), so the build stopped "
            f"before the rest; {self.advice(1.25 * whole, pipeline)}")

    def _options(self, layer: Layer, vocab_size: int, num_next_states: int) -> list[Layout]:
        if self.force:
            forced = applicable_layouts(layer, vocab_size, num_next_states).get(self.force)
            if forced is not None:
                return [forced]
        return candidate_layouts(layer, vocab_size, num_next_states, self.dense_threshold,
                                 self.dense_max_overhead)

    def run(self, ir: Automaton) -> Automaton:
        options = [self._options(layer, ir.vocab_size, ir.num_states_at(t + 1))
                   for t, layer in enumerate(ir.layers)]
        choice = [0] * len(options)
        total = sum(opts[0].estimated_bytes for opts in options)
        while total > self.memory_budget:
            best, best_saving = None, 0
            for t, opts in enumerate(options):
                for j in range(choice[t] + 1, len(opts)):
                    saving = opts[choice[t]].estimated_bytes - opts[j].estimated_bytes
                    if saving > best_saving:
                        best, best_saving = (t, j), saving
            if best is None:
                smallest = sum(min(o.estimated_bytes for o in opts) for opts in options)
                raise MemoryBudgetError(
                    f"memory-budget={self.memory_budget} ({int(self.memory_budget)} bytes) is too "
                    f"small: the smallest layouts need {smallest} bytes ({_gib(smallest)}); "
                    + self.advice(smallest))
            t, j = best
            choice[t] = j
            total -= best_saving
        return ir.with_layers(layer.replace(layout=opts[c])
                              for layer, opts, c in zip(ir.layers, options, choice))
