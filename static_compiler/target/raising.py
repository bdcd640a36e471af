"""Raising: the tables of a lowered set read back as IR (numpy only; for
reading artifacts back, checking them and printing them): the whole
automaton, checked (`automaton_from_tables`, the inverse of
`target.lowering.lower`), or a large layer's first rows (`table_head`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from static_compiler.errors import IRVerificationError
from static_compiler.ir import Automaton, Layer, Layout, LayoutKind, verify
from static_compiler.ir.row_checks import check_exceptions, check_numbered_in_order, check_padding
from static_compiler.lowered.plan import Plan, StepPlan
from static_compiler.lowered.tables import EXCEPTION_TABLES, exception_rows, row_pointers
from static_compiler.support.arrays import search_sorted


def table_head(step: StepPlan, tabs: dict, rows: int) -> Layer:
    """A `Layer` holding a lowered layer's first `rows` states and their
    edges, read from its tables alone (a few entries of each): what the IR
    text prints of a large layer (`ir.print_ir` rows_of), so a set lowered
    from pieces prints without rebuilding its automaton."""
    indptr = row_pointers(step.kind, tabs, rows)
    if step.kind == LayoutKind.DENSE_ROWS:
        nxt = np.asarray(tabs["next"][:rows])
        tokens = np.nonzero(nxt >= 0)[1]
        targets = nxt[nxt >= 0].astype(np.int64)
    else:
        tokens = np.asarray(tabs["tokens"][:indptr[-1]])
        targets = np.asarray(tabs["targets"][:indptr[-1]]).astype(np.int64) \
            if step.explicit_targets else None
    accepting = np.asarray(tabs["accepting"][:rows]) if "accepting" in tabs else None
    return Layer(indptr=indptr, tokens=tokens, targets=targets, accepting=accepting)


def _layer_from_tables(t: int, step: StepPlan, layout: Layout, tabs: dict, where: str,
                       counts: Optional[tuple] = None) -> Layer:
    kind = step.kind
    if kind == LayoutKind.DENSE_ROWS:
        nxt = np.asarray(tabs["next"])
        rows, tokens = np.nonzero(nxt >= 0)
        indptr = row_pointers(kind, tabs, step.num_states)
        targets = nxt[rows, tokens].astype(np.int64)
    elif kind == LayoutKind.CSR:
        indptr = row_pointers(kind, tabs, step.num_states)
        tokens = np.asarray(tabs["tokens"])
        targets = None
    elif kind == LayoutKind.UNARY:
        tokens = np.asarray(tabs["tokens"])
        indptr = row_pointers(kind, tabs, tokens.shape[0])
        targets = None
    elif kind == LayoutKind.NEAR_UNARY:
        tokens = np.asarray(tabs["tokens"])
        ex = np.asarray(tabs["ex_states"]).astype(np.int64)
        shapes = [np.shape(tabs[name]) for name in EXCEPTION_TABLES if name in tabs]
        if ex.ndim != 1 or shapes != [(ex.shape[0],)] * 2 or \
                (ex.size and (ex.min() < 0 or ex.max() > step.num_states)):
            raise IRVerificationError(f"{where}: layer {t} ex_states and its row tables have "
                                      f"shapes {ex.shape} / {shapes} or ids outside "
                                      f"[0, {step.num_states}]")
        # Reserved room: the trie's states come first (the rest have no
        # children), and exception entries past its own are padding.
        n = counts[0] if layout.reserved and counts is not None and \
            isinstance(counts[0], (int, np.integer)) and 0 <= counts[0] <= step.num_states \
            else step.num_states
        check_exceptions(f"{where}: layer {t}", ex, *exception_rows(tabs), num_states=n,
                         real=search_sorted(ex, n), padding_id=step.num_states)
        indptr = row_pointers(kind, tabs, n)
        indptr = np.concatenate([indptr, np.full(step.num_states - n, indptr[-1])])
        targets = None
    else:
        raise IRVerificationError(f"{where}: layer {t} has layout kind {kind!r}, expected one of "
                                  f"{', '.join(LayoutKind)}")
    if kind != LayoutKind.DENSE_ROWS and step.explicit_targets:
        targets = np.asarray(tabs["targets"]).astype(np.int64)
    if targets is not None and not step.explicit_targets:
        check_numbered_in_order(f"{where}: layer {t}", targets, 0)
        targets = None
    accepting = np.asarray(tabs["accepting"]) if "accepting" in tabs else None
    tokens = np.asarray(tokens)
    if layout.reserved:
        indptr, tokens, accepting = _unpadded(t, kind, indptr, tokens, accepting, counts, where)
    return Layer(indptr=indptr, tokens=tokens.astype(layout.token_dtype),
                 targets=targets, accepting=accepting, layout=layout)


def _unpadded(t: int, kind: str, indptr, tokens, accepting, counts, where: str):
    """A padded layer's arrays cut to its `counts` (states, edges), after
    checking that the padding holds nothing: padded states have no edges
    and accept nothing."""
    if counts is None:
        raise IRVerificationError(f"{where}: layer {t} is padded to a reserved capacity, and "
                                  "its state and edge counts are not given")
    states, edges = counts
    if not all(isinstance(n, (int, np.integer)) for n in counts):
        raise IRVerificationError(f"{where}: layer {t} counts {counts!r}: expected ints")
    padded_states = indptr.shape[0] - 1
    if not 0 <= states <= padded_states or not 0 <= edges <= tokens.shape[0]:
        raise IRVerificationError(f"{where}: layer {t} has {states} states / {edges} edges, its "
                                  f"tables {padded_states} / {tokens.shape[0]}")
    check_padding(f"{where}: layer {t}", states, edges,
                  indptr[states + 1:] if kind != LayoutKind.UNARY else None,
                  None if accepting is None else accepting[states:])
    return (indptr[:states + 1], tokens[:edges if kind != LayoutKind.UNARY else states],
            None if accepting is None else accepting[:states])


def automaton_from_tables(plan: Plan, layouts: Sequence[Layout], tables, *,
                          num_final_states: int, num_sequences: int,
                          where: str = "tables", counts: Optional[Sequence] = None
                          ) -> Automaton:
    """The automaton that `plan`, the per-layer `layouts` and `tables` (one
    dict of numpy arrays per layer, as `lower` makes them) describe, checked
    with `ir.verify`: the inverse of `lower`, equal to the lowered IR.
    counts: (states, edges) per layer, needed for tables padded to a
    reserved capacity (the padding is checked empty and cut off).

    Raises IRVerificationError (naming `where` and the layer) when the tables
    do not form a valid automaton."""
    if not len(plan.steps) == len(layouts) == len(tables):
        raise IRVerificationError(f"{where}: {len(plan.steps)} plan steps, {len(layouts)} layouts "
                                  f"and {len(tables)} table layers; expected one of each per layer")
    counts = [None] * len(tables) if counts is None else list(counts)
    layers = tuple(_layer_from_tables(t, step, layout, tabs, where, n)
                   for t, (step, layout, tabs, n) in enumerate(zip(plan.steps, layouts, tables,
                                                                   counts)))
    ir = Automaton(vocab_size=plan.vocab_size, layers=layers, num_final_states=num_final_states,
                   num_sequences=num_sequences, end_token=plan.end_token)
    verify(ir)
    return ir
