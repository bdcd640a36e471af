"""Checking a saved set's tables a chunk at a time (`check_tables`): what
`ir.verify` checks of the automaton rebuilt from them (`read.read_automaton`),
without rebuilding it, so `static-compiler verify` of a 1e9 set holds a few
chunks of rows, never an automaton (about 36 GB there) nor its enumerated
sequences.

Per layer of a trie (implicit targets: child e is state e of the next depth),
read `CHECK_CHUNK` states (and, past wide rows, about as many edges) at a time
and checked by the checks `ir.verify` runs on an IR's arrays
(`ir.row_checks`, one code for every verify path, one message):
row pointers that start at 0 and never decrease, tokens in [0, V) that are
not the end token and rise strictly within each row, no dead state (no child
and not accepting), a dense table that numbers children in order, near-unary
exception entries whose row starts are those their states imply and padding
past them, states padded to a reserved capacity that hold no edge and accept
nothing; then per layer its edges are the next depth's states and its layout
fits (slices as wide as its widest row, a unary layer's one child, a
near-unary layer's exception count, dtypes that hold its ids and tokens); the
branch histograms, counts and accepting states the manifest records are the
tables' (`metadata.summary_from_metadata`); the sequences, the final and the
accepting states, are counted for the caller to compare with the manifest's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_compiler.artifact.metadata import (
    automaton_from_metadata,
    plan_from_metadata,
    summary_from_metadata,
)
from static_compiler.errors import IRVerificationError
from static_compiler.format.snapshot import Snapshot, read_tables
from static_compiler.ir import LayoutKind
from static_compiler.ir.row_checks import (
    check_accepting_has_end,
    check_exceptions,
    check_implicit_targets,
    check_numbered_in_order,
    check_padding,
    check_row_span,
    check_rows,
)
from static_compiler.ir.verify import check_layout
from static_compiler.item_bits.layers import TableLayer, row_range, state_ranges
from static_compiler.lowered.tables import exception_rows
from static_compiler.support.arrays import search_sorted
from static_compiler.support.mapped import release_pages

CHECK_CHUNK = 1 << 22
"""States (and, past wide rows, about as many edges) read at a time."""


def check_artifact(snap: Snapshot) -> dict:
    """The check behind every verify path (`artifact.load_checked`,
    `static-compiler verify`, `decode --check-tables`): a trie's tables a
    chunk at a time (`check_tables`: bounded memory, a 1e9 set too), a set
    with explicit targets (a minimized one) rebuilt whole and verified
    (`metadata.automaton_from_metadata`: `ir.verify`). Returns
    {"num_sequences": the sequences its tables accept, "recorded": the
    manifest's count, "how": which of the two ran} (the caller compares
    the counts); raises
    IRVerificationError or ArtifactFormatError naming the layer and state
    that break an invariant."""
    if not any(step["explicit_targets"] for step in snap.manifest.plan_steps):
        return dict(check_tables(snap), how="checked a chunk at a time")
    ir = automaton_from_metadata(dataclasses.asdict(snap.manifest), read_tables(snap),
                                 where=f"artifact {str(snap.path)!r}")
    return {"num_sequences": ir.num_sequences, "recorded": int(snap.manifest.num_sequences),
            "how": "rebuilt and verified whole"}


def require_valid(snap: Snapshot) -> None:
    """`check_artifact`, raising IRVerificationError where the tables accept
    another number of sequences than the manifest records."""
    counted = check_artifact(snap)
    if counted["num_sequences"] != counted["recorded"]:
        raise IRVerificationError(f"artifact {str(snap.path)!r}: num_sequences="
                                  f"{counted['recorded']}, but the layers accept "
                                  f"{counted['num_sequences']} sequences")


def check_tables(snap: Snapshot) -> dict:
    """Checks an open artifact's tables layer by layer, a chunk at a time
    (see the module doc). Returns {"num_sequences": the sequences its
    tables accept, "recorded": the manifest's count} (the caller compares
    them); raises IRVerificationError naming the layer
    and state that break an invariant, ArtifactFormatError where the
    manifest's summary disagrees with the tables, and ValueError for a set
    with explicit targets (a minimized one: `read.read_automaton` checks
    those whole)."""
    where = f"artifact {str(snap.path)!r}"
    metadata = dataclasses.asdict(snap.manifest)
    tables = read_tables(snap)
    plan, _ = plan_from_metadata(metadata, where)
    summary = summary_from_metadata(metadata, tables, where)
    if any(step.explicit_targets for step in plan.steps):
        raise ValueError(f"{where}: explicit targets (a minimized set): check it whole")
    V, end = plan.vocab_size, plan.end_token
    if summary.layers[0].num_states != 1:
        raise IRVerificationError(f"{where}: layer 0 has {summary.layers[0].num_states} states: "
                                  "expected exactly 1 (the root)")
    sequences = int(summary.num_final_states)
    for t, (step, info, tabs) in enumerate(zip(plan.steps, summary.layers, tables)):
        at = f"{where}: layer {t}"
        layer = TableLayer(step.kind.value, tabs, info.num_states, True, info.layout)
        next_states = summary.num_final_states if t + 1 == len(tables) else \
            summary.layers[t + 1].num_states
        check_implicit_targets(at, t + 1, info.num_edges, next_states)
        check_accepting_has_end(at, info.num_accepting, end)
        if step.kind == LayoutKind.NEAR_UNARY:
            _check_exceptions(at, tabs, layer, step.num_states)
        largest_token = _check_rows(at, layer, V, end, step.kind)
        _check_padding(at, step.kind, tabs, info.num_states, info.num_edges, step.num_states)
        _check_layout(at, info, largest_token, next_states, V)
        sequences += info.num_accepting
    return {"num_sequences": sequences, "recorded": int(summary.num_sequences)}


def _chunks(layer: TableLayer, kind: LayoutKind) -> list:
    """Ranges of CHECK_CHUNK states, cut again where a csr or dense layer's
    rows pass CHECK_CHUNK edges."""
    wide = kind in (LayoutKind.CSR, LayoutKind.DENSE_ROWS)
    return state_ranges(layer.num_states, CHECK_CHUNK, layer.indptr if wide else None,
                        layer.num_edges)


def _check_rows(at: str, layer: TableLayer, V: int, end, kind: LayoutKind) -> int:
    """A layer's rows checked a chunk at a time (`ir.row_checks.check_rows`,
    what `ir.verify` checks of them); returns its largest token."""
    largest = 0
    tokens = layer.tables["tokens"] if kind != LayoutKind.DENSE_ROWS else None
    accepting = layer.tables.get("accepting")
    S = layer.num_states
    if S:
        check_row_span(at, int(row_range(layer.indptr, 0, 0)[0]),
                       int(row_range(layer.indptr, S, S)[0]), layer.num_edges)
    for a, b in _chunks(layer, kind):
        rows = row_range(layer.indptr, a, b)
        first, last = int(rows[0]), int(rows[-1])
        if kind == LayoutKind.DENSE_ROWS:
            nxt = np.asarray(layer.tables["next"][a:b])
            present = nxt >= 0
            tok = np.nonzero(present)[1]
            check_numbered_in_order(at, nxt[present], first)
        else:
            tok = np.asarray(tokens[first:last])
            release_pages(tokens, first * tokens.itemsize, last * tokens.itemsize)
        check_rows(at, rows, tok, None if accepting is None else np.asarray(accepting[a:b]),
                   vocab_size=V, end_token=end, first_state=a)
        largest = max(largest, int(tok.max(initial=0)))
    return largest


def _check_exceptions(at: str, tabs: dict, layer: TableLayer, padded_states: int) -> None:
    """A near_unary layer's exception entries a chunk at a time
    (`ir.row_checks.check_exceptions`: ascending ids below its states, row
    starts those the ids imply, padding entries past them)."""
    ex = tabs["ex_states"]
    real = search_sorted(ex, layer.num_states)
    extra = 0  # children past one per state of the exceptions so far
    for a in range(0, ex.shape[0], CHECK_CHUNK):
        ids = np.asarray(ex[a:a + CHECK_CHUNK]).astype(np.int64)
        starts, branch = exception_rows({k: v[a:a + CHECK_CHUNK] for k, v in tabs.items()
                                         if k.startswith("ex_")})
        extra = check_exceptions(at, ids, starts, branch, num_states=layer.num_states,
                                 real=min(max(real - a, 0), ids.shape[0]),
                                 padding_id=padded_states,
                                 previous_id=int(ex[a - 1]) if a else -1, extra=extra)


def _check_padding(at: str, kind: LayoutKind, tabs: dict, states: int, edges: int,
                   padded_states: int) -> None:
    """States past the trie's (padding to a reserved capacity) hold no edge
    and accept nothing (`ir.row_checks.check_padding`), a chunk at a time."""
    acc = tabs.get("accepting")
    for a in range(states, padded_states, CHECK_CHUNK):
        b = min(padded_states, a + CHECK_CHUNK)
        if kind == LayoutKind.CSR:
            row_ends = np.asarray(tabs["indptr"][a + 1:b + 1])
        elif kind == LayoutKind.DENSE_ROWS:
            row_ends = np.where((np.asarray(tabs["next"][a:b]) >= 0).any(axis=1), -1, edges)
        else:  # unary rows are the states'; near_unary padding is checked with its entries
            row_ends = None
        check_padding(at, states, edges, row_ends, None if acc is None else np.asarray(acc[a:b]))


def _check_layout(at: str, info, largest_token: int, next_states: int, V: int) -> None:
    """The layer's layout fits it (`ir.verify.check_layout`), from its
    summary (the histogram checked against the tables) and largest token."""
    if info.layout is None:
        return
    counts = info.counts
    ones = int(counts[1]) if counts.shape[0] > 1 else 0
    check_layout(at, info.layout, V, max_branch=info.max_branch,
                 non_unit=info.num_states - ones, num_states=info.num_states,
                 num_edges=info.num_edges, num_next_states=next_states,
                 largest_token=largest_token)
