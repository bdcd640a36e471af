"""The automaton IR: a layered, acyclic, deterministic automaton in CSR arrays.

Layer t holds the transitions consumed at decoding step t: they leave the
`num_states` states at depth t and enter states at depth t + 1. Layer 0 leaves
the single root state. The states at depth `depth` (after the last layer) are
the *final* states and all accept.

Per layer (all numpy arrays, never node objects):

* ``indptr``  int32/int64 (num_states + 1,): row pointers into the edge arrays.
* ``tokens``  unsigned/signed int (num_edges,): edge labels, strictly increasing
  within each row.
* ``targets`` int (num_edges,) or ``None``: the state at depth t + 1 each edge
  enters. ``None`` means *implicit*: edge i enters state i (a tree, where the
  edge order of layer t is the state order of depth t + 1).
* ``accepting`` bool (num_states,) or ``None``: states at depth t that may end
  a sequence (variable-length sets). ``None`` means none do.
* ``layout``: a `Layout` chosen by the `choose-layout` pass, ``None`` before.

Everything is immutable: dataclasses are frozen and arrays are marked
read-only, so passes return new automata instead of editing one in place.
The text form (`Automaton.to_text`, `parse_ir`) is deterministic and parses
back to an equal automaton when no rows were elided.

The package: `types` (the data types), `summary` (what planning reads
without the arrays), `verify` (the verifier), `text` (printer and parser).
Everything is imported from here (``from static_compiler.ir import
Automaton``); numpy only, no jax.
"""

from static_compiler.ir.summary import (AutomatonSummary, LayerPiece, LayerSummary,
                                        layer_stats)
from static_compiler.ir.text import parse_ir, print_ir
from static_compiler.ir.types import (_ELIDE_EDGES, _ELIDED_ROWS_PER_LAYER, LAYOUT_KINDS,  # noqa: F401
                                      Automaton, Layer, Layout, LayoutKind,
                                      enumerate_sequences, frozen)
from static_compiler.ir.verify import count_sequences, verify

__all__ = [
    "Automaton", "AutomatonSummary", "LAYOUT_KINDS", "Layer", "LayerPiece", "LayerSummary",
    "Layout", "LayoutKind", "count_sequences", "enumerate_sequences", "frozen", "layer_stats",
    "parse_ir", "print_ir", "verify",
]
