"""Additions written straight into a set's lowered tables: what
`CompiledConstraints.update(add=...)` does when the merged trie fits the
plan the set was compiled with (capacity reserved, see
`additions.fit_problems`).

The added sequences are placed in the trie as for the automaton merge
(`additions.place_additions`: per depth the old ids the new states go
before, the old edge positions the new edges go before, their tokens and
parents). From those, each layer's tables are written once, in their own
dtypes and padded sizes, equal to lowering the merged automaton
(`target.lowering.lower`), without building it: the automaton merge holds
int64 row pointers and branch counts for every layer (unary and near_unary
layers' tables have neither) and lowering then copies every table again;
at 1e7 items that was 0.45 s of an addition of 1e4. Here a unary layer
costs one copy of its tokens with the new ones inserted, a near_unary layer
the same plus its exception list (recomputed from the old exceptions and
the states that gain edges, a chunk of old exceptions at a time), a csr
layer its row pointers and tokens, a dense layer its (S, V) table
renumbered. Each large table is an `arrays.PieceArray` whose rows are
computed from the old table on demand: computed whole for a version in
memory, or a range at a time as an artifact's update writes it (1e9 items:
never whole in memory). The merged summary (counts, branch histogram,
accepting states) is updated from the states that changed, so the fit is
known before any table is written.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_compiler.compiler_items.additions import Insertions, LayerInsertion, count_at_most, inserted
from static_compiler.errors import ConstraintSetError
from static_compiler.ir import AutomatonSummary, LayerSummary, LayoutKind
from static_compiler.lowered.tables import EXCEPTION_TABLES, exception_rows
from static_compiler.support.arrays import PieceArray, materialized, search_sorted, table_array
from static_compiler.support.dtypes import branch_dtype_for
from static_compiler.support.mapped import release_pages
from static_compiler.target.lowering import exception_entries


@dataclasses.dataclass(frozen=True, eq=False)
class MergedSummary:
    """What `merged_summary` returns: the merged trie's summary (counts,
    branch histograms, accepting counts, the old layouts), and per layer
    the most children of a state that gained some (0 where none did) and
    the states with other than one child (None where the layer's layout is
    not near_unary), as `additions.fit_problems` reads them."""

    summary: AutomatonSummary
    widest: tuple
    exceptions: tuple


def merged_summary(outline, placed: Insertions, num_sequences: int) -> MergedSummary:
    """The summary of the trie `outline` (the compiled automaton or its
    summary) with the sequences `placed` in it (their depth must be the
    trie's), from the states that change: nothing is read per state."""
    layers, widest, exceptions = [], [], []
    for t, (layer, old, change) in enumerate(zip(outline.layers, placed.layers, placed.at)):
        gaining, gained = change.gains
        is_old, old_ids = _old_ids(change, gaining)
        branch = gained.astype(np.int64)
        branch[is_old] += (np.asarray(old.indptr[old_ids + 1]).astype(np.int64) -
                           np.asarray(old.indptr[old_ids]).astype(np.int64))
        counts = np.asarray(layer.branch_counts(), np.int64)
        counts = np.concatenate([counts, np.zeros(max(0, int(branch.max(initial=0)) + 1 -
                                                      counts.shape[0]), np.int64)])
        np.subtract.at(counts, branch[is_old] - gained[is_old], 1)
        np.add.at(counts, branch, 1)
        counts[0] += change.new_states.shape[0] - int(np.count_nonzero(~is_old))
        counts = np.trim_zeros(counts, "b") if counts.any() else counts[:1]
        num_states = layer.num_states + change.new_states.shape[0]
        accepting = layer.has_accepting or (t > 0 and change.ending.size > 0)
        layers.append(LayerSummary(
            num_states, layer.num_edges + change.edge_at.shape[0], counts,
            layer.num_accepting + (_newly_accepting(old, change) if accepting else 0),
            accepting, layer.implicit_targets, layer.layout))
        widest.append(int(branch.max(initial=0)))
        near = layer.layout is not None and layer.layout.kind == LayoutKind.NEAR_UNARY
        exceptions.append(num_states - int(counts[1:2].sum()) if near else None)
    summary = AutomatonSummary(outline.vocab_size, tuple(layers),
                               outline.num_final_states + placed.at[-1].new_states.shape[0],
                               num_sequences, outline.end_token)
    return MergedSummary(summary, tuple(widest), tuple(exceptions))


def _old_ids(change: LayerInsertion, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool, int64) for new ids `states` (ascending): which were states
    before the merge, and the old ids of those."""
    new_ids = change.new_ids
    before = np.searchsorted(new_ids, states)  # new states before each
    is_old = np.ones(states.shape[0], bool)
    if new_ids.size:
        is_old = new_ids[np.minimum(before, new_ids.shape[0] - 1)] != states
    return is_old, (states - before)[is_old]


def _newly_accepting(old, change: LayerInsertion) -> int:
    """How many of the states where added sequences end did not accept
    before (new states, and old ones that did not)."""
    ending = np.unique(change.ending)
    is_old, old_ids = _old_ids(change, ending)
    was = 0 if old.accepting is None else \
        int(np.count_nonzero(np.asarray(old.accepting)[old_ids]))
    return ending.shape[0] - was


def merged_tables(tables: tuple, outline, merged: MergedSummary, placed: Insertions,
                  lazy: bool = False) -> tuple:
    """The tables of the merged trie (one dict per layer, as `lower` makes
    them for `merged.summary`'s layouts), written from the old `tables` of
    the trie `outline` and the sequences `placed`; a layer nothing changed
    keeps its dict. Only for a merge that fits (`additions.fit_problems`
    found nothing): the padded sizes are the old tables'. lazy: the large
    tables as `arrays.PieceArray`s, computed a range of rows at a time (an
    artifact's update streams them into its files), else read-only arrays."""
    out = []
    for t, (tabs, was, now, change) in enumerate(zip(tables, outline.layers,
                                                     merged.summary.layers, placed.at)):
        below = placed.at[t + 1]
        if not (change.new_states.size or change.edge_at.size or below.new_states.size or
                change.ending.size):
            out.append(tabs)
            continue
        if not was.implicit_targets:
            raise ConstraintSetError("update(add=...): a layer with explicit targets cannot "
                                     "take additions")
        new = _layer_tables(tabs, was, now, change, recycle=not lazy)
        if not lazy:
            new = {name: materialized(arr) for name, arr in new.items()}
            for arr in new.values():
                arr.flags.writeable = False
        out.append(new)
    return tuple(out)


def _layer_tables(tabs: dict, was, now, change: LayerInsertion, recycle: bool) -> dict:
    """One layer's merged tables (see `merged_tables`): `was` / `now` the
    layer's summary (or automaton layer) before / after; the large ones as
    `PieceArray`s; recycle: the exception tables are a new in-memory version's
    (`arrays.table_array`), not chunks streamed to files."""
    lay = now.layout
    tok_dt, st_dt = np.dtype(lay.token_dtype), np.dtype(lay.state_dtype)
    num_states, num_edges = lay.padded_counts(now.num_states, now.num_edges)
    new_tokens = change.tokens.astype(tok_dt)
    new = {}
    if lay.kind == LayoutKind.DENSE_ROWS:
        new["next"] = _dense_rows(tabs["next"], was, now, change, num_states, st_dt)
    elif lay.kind == LayoutKind.CSR:
        new["indptr"] = _row_pointers(tabs["indptr"], now, change, num_states + 1, st_dt)
        new["tokens"] = inserted(tabs["tokens"], was.num_edges, change.edge_at, new_tokens,
                                 num_edges, 0)
    elif lay.kind == LayoutKind.UNARY:
        new["tokens"] = inserted(tabs["tokens"], was.num_edges, change.edge_at, new_tokens,
                                 num_states, 0)
    elif lay.kind == LayoutKind.NEAR_UNARY:
        new["tokens"] = inserted(tabs["tokens"], was.num_edges, change.edge_at, new_tokens,
                                 num_edges, 0)
        new.update(_merged_exceptions(tabs, was, now, change, num_states, recycle))
    else:
        raise ConstraintSetError(f"update(add=...): cannot write a {lay.kind} layer")
    if now.has_accepting:
        acc = tabs.get("accepting")
        acc = np.zeros(was.num_states, bool) if acc is None else acc
        new["accepting"] = _accepting(acc, was.num_states, change, num_states)
    return new


def _dense_rows(old, was, now, change: LayerInsertion, num_states: int, st_dt) -> PieceArray:
    """A dense layer's (S, V) table after `change`: old rows at their new
    ids, their children renumbered (s + #(new states at or before s)),
    new rows empty, then the new edges."""
    new_ids, parent = change.new_ids, change.parent
    children = change.edge_at + np.arange(change.edge_at.shape[0])  # new edge j's child
    # the shift per old child id, and a last entry 0 so that -1 (no child) stays -1
    shift = np.append(count_at_most(change.edge_at, 0, max(was.num_edges, 1) - 1, st_dt),
                      np.zeros(1, st_dt))

    def fill(out, start, stop):
        out[:] = -1
        real = max(0, min(stop, now.num_states) - start)
        if real:
            ids = np.arange(start, start + real)
            fresh = new_ids[(new_ids >= start) & (new_ids < start + real)] - start
            kept = np.ones(real, bool)
            kept[fresh] = False
            old_ids = (ids - count_at_most(new_ids, start - 1, start + real - 2))[kept]
            rows = np.asarray(old[old_ids])
            out[:real][kept] = rows + shift[rows]
            sel = (parent >= start) & (parent < start + real)
            out[parent[sel] - start, change.tokens[sel]] = children[sel]

    return PieceArray((num_states, old.shape[1]), st_dt, fill)


def _row_pointers(old, now, change: LayerInsertion, size: int, st_dt) -> PieceArray:
    """A csr layer's row pointers after `change`: entry i (new ids) is
    old[i - #(new states before i)] + #(new edges of states before i),
    then the edge count for the padding."""
    new_ids, parent = change.new_ids, change.parent

    def fill(out, start, stop):
        real = max(0, min(stop, now.num_states + 1) - start)
        if real:
            before = count_at_most(new_ids, start - 1, start + real - 2)
            gained = count_at_most(parent, start - 1, start + real - 2)
            src = np.arange(start, start + real) - before
            out[:real] = np.asarray(old[src[0]:src[-1] + 1])[src - src[0]] + gained
            release_pages(old, src[0] * old.itemsize, (src[-1] + 1) * old.itemsize)
        out[real:] = now.num_edges

    return PieceArray(size, st_dt, fill)


def _accepting(old, count: int, change: LayerInsertion, size: int) -> PieceArray:
    """A layer's accepting table after `change`: new states inserted (not
    accepting), then the states where added sequences end."""
    base = inserted(old, count, change.new_states, False, size, False)
    ending = np.unique(change.ending)

    def fill(out, start, stop):
        base.fill_rows(out, start, stop)
        out[ending[(ending >= start) & (ending < stop)] - start] = True

    return PieceArray(size, bool, fill)


EXCEPTION_CHUNK = 1 << 22
"""Old exceptions `_merged_exceptions` reads at a time."""


def _merged_exceptions(tabs: dict, was, now, change: LayerInsertion, num_states: int,
                       recycle: bool) -> dict:
    """A near_unary layer's exception tables after `change` (ex_states,
    ex_starts, ex_branch, padded to its room), written a chunk of old
    exceptions at a time (1e9 states have ~6e7 exceptions: no int64 copy
    of them). Only the new states and those gaining edges can change
    branch: each is an exception after the merge iff its branch is not
    one, and replaces its old entry if it had one."""
    lay = now.layout
    st_dt = np.dtype(lay.state_dtype)
    ex_table = tabs["ex_states"]
    real = search_sorted(ex_table, was.num_states)
    rows = {name: tabs[name] for name in EXCEPTION_TABLES if name in tabs}
    gaining, gained = change.gains
    cand = np.union1d(change.new_ids, gaining)  # new ids, ascending
    is_old, old_ids = _old_ids(change, cand)
    at = search_sorted(ex_table[:real], old_ids)
    hit = at < real
    hit[hit] = np.asarray(ex_table[at[hit]]) == old_ids[hit]
    branch = np.zeros(cand.shape[0], np.int64)
    branch[is_old] = 1
    dropped = at[hit]  # old exceptions whose entry a candidate's replaces
    if dropped.size:
        branch[np.flatnonzero(is_old)[hit]] = exception_rows(
            {name: np.asarray(arr)[dropped] for name, arr in rows.items()})[1]
    branch[np.searchsorted(cand, gaining)] += gained
    keep = branch != 1
    cand, branch = cand[keep], branch[keep]
    # where each goes in the old list: after the old exceptions below its old position
    place = search_sorted(ex_table[:real], cand - np.searchsorted(change.new_ids, cand))
    room = exception_entries(lay, real - dropped.shape[0] + cand.shape[0])
    out_states = table_array(room, st_dt, num_states, recycle)  # padding: past every state
    branch_dt = branch_dtype_for(lay.widest_branch(now.max_branch))
    out_branch = table_array(room, branch_dt, 0, recycle)
    out_starts = table_array(room, st_dt, now.num_edges, recycle)
    cursor, extra = 0, 0  # entries written; children past one per state so far
    for start in range(0, max(real, 1), EXCEPTION_CHUNK):
        stop = min(real, start + EXCEPTION_CHUNK)
        ids = np.asarray(ex_table[start:stop]).astype(np.int64)
        ids += np.searchsorted(change.new_states, ids, side="right")  # new ids
        kids = exception_rows({name: arr[start:stop] for name, arr in rows.items()})[1]
        gone = dropped[(dropped >= start) & (dropped < stop)] - start
        ids, kids = np.delete(ids, gone), np.delete(kids, gone)
        mine = (place >= start) & ((place < stop) | (stop == real))
        where = np.searchsorted(ids, cand[mine])
        ids, kids = np.insert(ids, where, cand[mine]), np.insert(kids, where, branch[mine])
        end = cursor + ids.shape[0]
        out_states[cursor:end] = ids
        out_branch[cursor:end] = kids
        steps = np.cumsum(kids - 1)
        out_starts[cursor:end] = ids + extra + np.concatenate([[0], steps[:-1]])
        extra += int(steps[-1]) if steps.size else 0
        cursor = end
    for arr in (out_states, out_branch, out_starts):
        arr.flags.writeable = False
    return {"ex_states": out_states, "ex_starts": out_starts, "ex_branch": out_branch}
