"""What planning reads of an automaton without its arrays: per layer the
counts, branch histogram, accepting count and layout (`LayerSummary`,
`AutomatonSummary`: the layout passes and the cost model run on these for a
set built in pieces) and a layer's piece from one partition (`LayerPiece`)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np

from static_compiler.ir.types import Automaton, Layer, Layout, _Layered


@dataclasses.dataclass(frozen=True, eq=False)
class LayerSummary:
    """What the layout passes and the cost model read of a layer, without
    its arrays: counts, the branch histogram, accepting states, targets, and
    the layout. A partitioned build sums its partitions' summaries, so the
    passes plan the merged layers' layouts without reading them
    (`pipeline.plan_layouts`).

    counts: int64 (max_branch + 1,), at b the states with b children."""

    num_states: int
    num_edges: int
    counts: np.ndarray
    num_accepting: int = 0
    has_accepting: bool = False
    implicit_targets: bool = True
    layout: Optional[Layout] = None

    @classmethod
    def of(cls, layer: Layer) -> "LayerSummary":
        return cls(layer.num_states, layer.num_edges, layer.branch_counts(),
                   layer.num_accepting, layer.has_accepting, layer.implicit_targets,
                   layer.layout)

    def branch_counts(self) -> np.ndarray:
        return self.counts

    @property
    def max_branch(self) -> int:
        nonzero = np.flatnonzero(self.counts)
        return int(nonzero[-1]) if nonzero.size else 0

    def replace(self, **changes) -> "LayerSummary":
        return dataclasses.replace(self, **changes)

    def __eq__(self, other):
        if not isinstance(other, LayerSummary):
            return NotImplemented
        trim = lambda c: np.trim_zeros(np.asarray(c, np.int64), "b")
        return (self.num_states, self.num_edges, self.num_accepting, self.has_accepting,
                self.implicit_targets, self.layout) == \
            (other.num_states, other.num_edges, other.num_accepting, other.has_accepting,
             other.implicit_targets, other.layout) and \
            np.array_equal(trim(self.counts), trim(other.counts))

    __hash__ = None


@dataclasses.dataclass(frozen=True, eq=False)
class AutomatonSummary(_Layered):
    """An `Automaton` with `LayerSummary` layers: what `pipeline.plan_layouts`
    runs the layout passes over (vocab_size, depth, num_states_at,
    with_layers, as the passes use an Automaton)."""

    vocab_size: int
    layers: tuple
    num_final_states: int
    num_sequences: int
    end_token: Optional[int] = None

    @classmethod
    def of(cls, ir: "Automaton") -> "AutomatonSummary":
        return cls(ir.vocab_size, tuple(LayerSummary.of(layer) for layer in ir.layers),
                   ir.num_final_states, ir.num_sequences, ir.end_token)

    def __eq__(self, other):
        if not isinstance(other, AutomatonSummary):
            return NotImplemented
        return (self.vocab_size, self.num_final_states, self.num_sequences, self.end_token) == \
            (other.vocab_size, other.num_final_states, other.num_sequences, other.end_token) \
            and len(self.layers) == len(other.layers) and \
            all(a == b for a, b in zip(self.layers, other.layers))

    __hash__ = None


@dataclasses.dataclass(frozen=True, eq=False)
class LayerPiece:
    """A contiguous run of one tree layer's states and their edges: what a
    partitioned build hands the lowering one partition at a time
    (`target.lowering.lower_pieces`), so a merged layer is never built.

    The run holds the layer's states [state_offset, state_offset +
    num_states) and edges [edge_offset, edge_offset + num_edges); the
    pieces of a layer come in order and tile it. Targets are implicit (edge
    i enters state i at the next depth).

    branch: children per state, uint (num_states,), or an int for all of
      them (1: a unary run, 0: states where every sequence ends).
    tokens: (num_edges,) int, the edge labels in layer order.
    accepting: bool (num_states,), a bool for all of them, or None (none).
    """

    state_offset: int
    edge_offset: int
    num_states: int
    num_edges: int
    branch: Union[np.ndarray, int]
    tokens: np.ndarray
    accepting: Union[np.ndarray, bool, None] = None

    def indptr(self) -> np.ndarray:
        """int64 (num_states + 1,): the run's row pointers, offset to the
        layer's edge ids (from edge_offset)."""
        if isinstance(self.branch, (int, np.integer)):
            return self.edge_offset + int(self.branch) * np.arange(self.num_states + 1,
                                                                    dtype=np.int64)
        out = np.empty(self.num_states + 1, dtype=np.int64)
        out[0] = self.edge_offset
        np.cumsum(self.branch, dtype=np.int64, out=out[1:])
        out[1:] += self.edge_offset
        return out

    def accepting_array(self) -> Optional[np.ndarray]:
        """bool (num_states,), or None when no state of the run accepts."""
        if self.accepting is None or self.accepting is False:
            return None
        if self.accepting is True:
            return np.ones(self.num_states, dtype=bool)
        return self.accepting
