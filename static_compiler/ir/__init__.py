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

The package, lowest first: `printer` (the text form printed, and
`layer_stats`: it reads attributes only, so the types print through it),
`types` (the data types), `summary` (what planning reads without the
arrays), `row_checks` (the checks of a layer's rows on arrays, which the
saved tables' checker runs a chunk at a time), `verify` (the verifier),
`text` (the parser).
Public: the package's names (``from static_compiler.ir import Automaton``,
`__all__`); its modules are internal. numpy only, no jax.
"""

# (`verify` is also the name of its module: bound here, so importing the
# module `ir.verify` elsewhere never shadows the function)
from static_compiler.ir.verify import count_sequences, verify
from static_compiler.support.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("AutomatonSummary", "LayerPiece", "LayerSummary"), "summary"),
    **dict.fromkeys(("_ELIDE_EDGES", "_ELIDED_ROWS_PER_LAYER", "layer_stats", "print_ir"), "printer"),
    "parse_ir": "text",
    **dict.fromkeys(("LAYOUT_KINDS", "Automaton", "Layer", "Layout", "LayoutKind",
                     "enumerate_sequences", "frozen"), "types"),
}
"""Public name -> the module of this package that defines it (imported on
first use, so a reader of `types` alone, such as the serving loader through
`lowered.plan`, loads no parser or summary)."""

__all__ = [
    "Automaton", "AutomatonSummary", "LAYOUT_KINDS", "Layer", "LayerPiece", "LayerSummary",
    "Layout", "LayoutKind", "count_sequences", "enumerate_sequences", "frozen", "layer_stats",
    "parse_ir", "print_ir", "verify",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
