"""The IR's text form printed: `print_ir` (deterministic, diff-friendly;
large layers elided to their first rows; `text.parse_ir` reads it back) and
`layer_stats`, the per-layer statistics it prints. Both read their argument's
attributes only (an `Automaton` or its `AutomatonSummary`, a `Layer` or its
`LayerSummary`), so the data types print themselves (`Automaton.to_text`)
through this module without it importing them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Union

if TYPE_CHECKING:
    from static_compiler.ir.summary import AutomatonSummary, LayerSummary
    from static_compiler.ir.types import Automaton, Layer

_ELIDE_EDGES = 4096
"""Automata with more edges than this print statistics and elide rows."""

_ELIDED_ROWS_PER_LAYER = 16


def layer_stats(layer: Union[Layer, "LayerSummary"]) -> dict[str, object]:
    """Statistics of one layer (or its summary): states, edges, max/mean
    branch, layout."""
    return {
        "states": layer.num_states,
        "edges": layer.num_edges,
        "max_branch": layer.max_branch,
        "mean_branch": layer.num_edges / layer.num_states if layer.num_states else 0.0,
        "accepting": layer.num_accepting,
        "targets": "implicit" if layer.implicit_targets else "explicit",
        "layout": layer.layout.to_text() if layer.layout else "none",
    }


def print_ir(a: Union[Automaton, "AutomatonSummary"], max_edges: int = _ELIDE_EDGES,
             rows_of: Optional[Callable[[int, int], Layer]] = None) -> str:
    """Text form of `a`; see the module docstring. Rows are printed in full
    when the automaton has at most `max_edges` edges, else the first
    `_ELIDED_ROWS_PER_LAYER` rows per layer and a count of the rest.

    rows_of(t, n): a `Layer` holding layer t's first n states and their
    edges (what is printed of it); default `a`'s own layers. With it, `a`
    may be an `AutomatonSummary` (a set whose IR lives in its tables,
    `target.raising.table_head`): the text equals the automaton's."""
    full = a.num_edges <= max_edges
    head = f"automaton vocab={a.vocab_size} depth={a.depth} sequences={a.num_sequences} " \
           f"final_states={a.num_final_states}"
    if a.end_token is not None:
        head += f" end_token={a.end_token}"
    lines = [head]
    for t, layer in enumerate(a.layers):
        st = layer_stats(layer)
        lines.append(
            f"layer {t}  states={st['states']} edges={st['edges']} "
            f"max_branch={st['max_branch']} mean_branch={st['mean_branch']:.3f} "
            f"targets={st['targets']} layout={st['layout']}")
        rows = layer.num_states if full else min(layer.num_states, _ELIDED_ROWS_PER_LAYER)
        shown = layer if rows_of is None else rows_of(t, rows)
        ip, tok = shown.indptr, shown.tokens
        tg = shown.target_array() if rows else None
        acc = shown.accepting_array()
        for s in range(rows):
            lo, hi = int(ip[s]), int(ip[s + 1])
            edges = " ".join(f"{int(tok[e])}->{int(tg[e])}" for e in range(lo, hi))
            mark = " accept" if acc[s] else ""
            lines.append(f"  s{s}{mark}:" + (f" {edges}" if edges else ""))
        if rows < layer.num_states:
            lines.append(f"  ... {layer.num_states - rows} more rows elided")
    return "\n".join(lines) + "\n"
