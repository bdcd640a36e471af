"""Item subsets of a compiled set: decode over some of its items, with no
recompile (`CompiledConstraints.subset`, `stack_subsets`).

The bits, their layout and how they are computed are in
`static_compiler.item_bits.liveness` (shared with the serving loader); this module
adds what needs the compiled automaton: the set's fingerprint and finding
token sequences in it (the subset factory every front door shares is
`static_compiler.rules.set_view`).
Items are only expressible as states in a trie: after `minimize` or for
graph input, states are shared between items, and a subset is refused.

A trie below is anything with the automaton's `vocab_size`, `end_token`,
`num_final_states` and `layers` (each with indptr, tokens, accepting,
num_states, num_edges, branch()): an `ir.Automaton`, or a `TableTrie` of a
set held in its tables (`layers.TableLayer`s), which is never rebuilt.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits import item_masks, state_order
from static_compiler.item_bits.layers import TableLayer, find_in_rows, layer_walks  # noqa: F401 (API)
from static_compiler.item_bits.liveness import (  # noqa: F401 (API: Subset, bit_layout, ...)
    BitLayout,
    Subset,
    bit_layout,
    rows_item_live,
    rows_item_mask,
    stack_subsets,
    subset_of_items,
)
from static_compiler.items.index import ItemIndex  # noqa: F401 (API)
from static_compiler.rules import set_view
from static_compiler.rules.set_view import TableTrie  # noqa: F401 (API)
from static_compiler.support.arrays import npy_chunks
from static_compiler.support.mapped import release_pages


def set_fingerprint(plan, tables, digests: Optional[dict] = None) -> str:
    """A short content hash of a lowered set: its static `plan` (layouts,
    counts padded to a reserved capacity, dtypes) and every table, so a
    subset only applies to the set (and the bit layout) it came from; equal
    for equal builds (a `Shards` build and the monolithic one, a set and its
    artifact read back).

    Each table enters as its `table_digest`, the sha256 an artifact's
    manifest records for the table's file: digests {(layer, name): hex}
    gives those known (a set read back from an artifact: no table is read,
    where hashing 15 GB took 30 s at 1e9); the others are hashed from the
    tables, in chunks, so a set held in its tables (or memory-mapped ones)
    is never copied whole nor rebuilt as an automaton."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr(plan).encode())
    for t, tabs in enumerate(tables):
        for name in sorted(tabs):
            digest = (digests or {}).get((t, name)) or table_digest(tabs[name])
            h.update(repr((t, name, digest)).encode())
    return h.hexdigest()


def table_digest(arr) -> str:
    """Hex sha256 of the bytes `np.save` writes for `arr` (its header, then
    its data in C order): what an artifact's manifest records for the
    table's file. Hashed FINGERPRINT_CHUNK_BYTES at a time; a mapped
    table's pages are dropped as they are read (12 GB at 1e9)."""
    h = hashlib.sha256()
    for chunk in npy_chunks(arr, FINGERPRINT_CHUNK_BYTES, release_pages):
        h.update(chunk)
    return h.hexdigest()


FINGERPRINT_CHUNK_BYTES = 1 << 22
"""Bytes hashed at a time by `table_digest`."""


def check_subsettable(ir, items: Optional[ItemIndex], where: str) -> ItemIndex:
    """The item index, or a ConstraintSetError saying why this set has none
    (`ir`: the automaton or its summary: only the layers' implicit_targets
    are read; `set_view.check_subsettable`)."""
    return set_view.check_subsettable(items, [not layer.implicit_targets for layer in ir.layers],
                                      where)


def unique_ids(ir, items: ItemIndex, sequences) -> np.ndarray:
    """int64 (n,): the unique sequence (sorted order, as `ItemIndex`) each of
    `sequences` is, -1 for one not in the set. Walks the trie one depth at a
    time for LOOKUP_CHUNK sequences at once (a binary search per depth
    within the rows of the layer), in sorted order, so each chunk's
    searches read neighbouring rows; a memory-mapped layer's pages are
    dropped after each chunk (1e6 lookups touch every page of a 1e9 set)."""
    from static_compiler.frontend import as_token_matrix

    mat, lengths, _ = as_token_matrix(sequences)
    mat = mat.astype(np.int64)
    order = np.lexsort(mat.T[::-1]) if mat.shape[0] > LOOKUP_CHUNK else \
        np.arange(mat.shape[0])
    ends = np.full(mat.shape[0], -1, dtype=np.int64)
    terminals: dict = {}  # depth -> `item_masks.items_ending_at`, built once
    for start in range(0, mat.shape[0], LOOKUP_CHUNK):
        at = order[start:start + LOOKUP_CHUNK]
        ends[at] = _walk_down(ir, items, mat[at], lengths[at], terminals)
        for layer in ir.layers:
            release_pages(layer.tokens)
        if items.state_item is not None:  # (4 GB at 1e9, its pages hit at random)
            release_pages(items.state_item)
    return ends


LOOKUP_CHUNK = 1 << 16
"""Sequences `unique_ids` looks up at a time."""


def _walk_down(ir, items: ItemIndex, mat: np.ndarray, lengths: np.ndarray,
               terminals: dict) -> np.ndarray:
    """`unique_ids` of the sequences `mat` int64 (n, L) (-1 past
    `lengths`); terminals: {depth: `item_masks.items_ending_at`} filled as needed."""
    n = mat.shape[0]
    state = np.zeros(n, dtype=np.int64)
    ok = (lengths <= ir.depth) & ((mat >= 0) | (np.arange(mat.shape[1]) >= lengths[:, None])).all(1)
    ends = np.full(n, -1, dtype=np.int64)
    for t in range(min(ir.depth, mat.shape[1])):
        layer = ir.layers[t]
        walking = ok & (lengths > t)
        at = np.flatnonzero(walking)
        e, hit = find_in_rows(layer.indptr, layer.tokens, state[at], mat[at, t])
        found = np.zeros(n, dtype=bool)
        found[at[hit]] = True
        ok &= found | ~walking
        state[at[hit]] = e[hit]  # implicit targets: edge e enters state e
        if items.item_depth is not None:
            done = found & (lengths == t + 1)
            if t + 1 not in terminals:
                terminals[t + 1] = item_masks.items_ending_at(items, t + 1,
                                                               ir.num_states_at(t + 1))
            ends[done] = terminals[t + 1][state[done]]
    if items.item_depth is None:
        ends = np.where(ok & (lengths == ir.depth), state, -1)
        order = state_order.item_order(items)
        if order is not None:  # (states ascending: neighbouring pages)
            ends[ends >= 0] = order[ends[ends >= 0]]
    return np.where(ok, ends, -1)


def item_mask(selection, items: ItemIndex, where: str, ir, layout: BitLayout):
    """The unique sequences some selected input row is (a bool mask (N,):
    as `rows_item_live` gives them for `layout`), or bool (N',): those
    `selection` lists (token sequences of `ir`): a compiled set's
    `SetView` lookup."""
    sel = selection if isinstance(selection, np.ndarray) else None
    if sel is not None and (sel.dtype == bool or sel.ndim != 2):
        return rows_item_live(sel, items, layout, where)
    ids = unique_ids(ir, items, selection)
    missing = np.flatnonzero(ids < 0)
    if missing.size:
        raise ConstraintSetError(f"{where}: {missing.size} of {ids.size} sequences are not in "
                                 f"the compiled set (the first: sequence {int(missing[0])})")
    out = np.zeros(items.num_unique, dtype=bool)
    out[ids] = True
    return out


def liveness(ir, items: ItemIndex, item_live: np.ndarray,
             walks: Optional[tuple] = None) -> tuple[list, list]:
    """`liveness.liveness` of the automaton's trie (unpacked bits per depth)."""
    from static_compiler.item_bits import liveness as core

    return core.liveness(ir.layers, ir.num_final_states, ir.end_token, items, item_live, walks)


def removal(items: ItemIndex, remove, automaton, where: str = "update") -> tuple[np.ndarray, dict]:
    """(removed bool (N',), report) after taking out the items `remove`
    picks (a bool mask (N,) over the input rows, or token sequences, looked
    up in `automaton()`, a function so that a mask needs no automaton) on
    top of `items.removed`. report: {"removed", "already_removed",
    "absent"}: sequences not in the set are counted, not an error, but
    rows that cannot be sequences of it (a token outside the vocabulary,
    the end token inside, another length than a fixed-length set's) raise
    ConstraintSetError, as additions do. Holds one new bool array besides
    `items.removed` (1 GB each at 1e9)."""
    before, absent = items.removed, 0
    if isinstance(remove, np.ndarray) and (remove.dtype == bool or remove.ndim != 2):
        out = rows_item_mask(remove, items, where)  # (a new array)
        picked = int(np.count_nonzero(out))
        already = 0 if before is None else sum(
            int(np.count_nonzero(out[a:a + COUNT_CHUNK] & before[a:a + COUNT_CHUNK]))
            for a in range(0, out.shape[0], COUNT_CHUNK))
        if before is not None:
            np.logical_or(out, before, out=out)
    else:
        from static_compiler.frontend.sequences import PaddedRows, as_token_matrix, check_set_rows

        mat, lengths, ragged = as_token_matrix(remove)
        trie = automaton()
        check_set_rows(mat, lengths, ragged, trie, f"{where}: removed")
        ids = unique_ids(trie, items, PaddedRows(mat, lengths))
        absent = int((ids < 0).sum())
        ids = np.unique(ids[ids >= 0])
        picked = int(ids.size)
        already = 0 if before is None else int(np.count_nonzero(before[ids]))
        out = np.zeros(items.num_unique, dtype=bool) if before is None else np.array(before)
        out[ids] = True
    return out, {"removed": picked - already, "already_removed": already, "absent": absent}


COUNT_CHUNK = 1 << 24
"""Entries `removal` compares at a time."""
