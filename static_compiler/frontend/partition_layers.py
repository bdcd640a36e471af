"""Steps 2 and 3 of a partitioned build (`frontend.partitioned`): each
partition's layers, built by its task and merged.

2. Build: each partition is sorted, deduplicated and turned into layers
   (`frontend.sort_unique_codes`, `automaton_from_sorted_codes`) by one
   executor task (`build_partition`) that reads its spill files and writes
   its layers back to disk in a compact form (tokens, one narrow branch
   count per state, none for a unary layer: `keeps_branch`), so tasks need
   only a shared directory (a process pool, or a Dask / Ray cluster's
   `Executor` over a shared file system). Each task returns its layers'
   summaries; their sums describe the merged trie
   (`partitioned.merged_summary`), so the layout passes plan it unread.
3. Merge (`BuiltPartitions`): partition p's states at every depth follow
   partition p - 1's, so a merged layer is the partitions' layers
   concatenated, their row pointers offset (`BuiltPartitions.pieces`: one
   `ir.LayerPiece` per partition), and the item index is theirs with
   unique ids offset, gathered a window of rows at a time
   (`BuiltPartitions.items`), so it is never all in memory.
   `BuiltPartitions.trie` merges the pieces into the trie, equal to
   `frontend.build_trie` of the same rows, array for array (tested).

Peak memory is one partition per worker while building. Every file read
is checked against its writer's record (`array_files.read_checked`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Callable, Optional

import numpy as np

from static_compiler.frontend import automaton_from_sorted_codes, sort_unique_codes, terminal_states
from static_compiler.frontend.array_files import ArrayFiles, npy_array, read_checked, save_checked
from static_compiler.frontend.spill import length_dtype
from static_compiler.ir import Automaton, AutomatonSummary, Layer, LayerPiece, LayerSummary, verify
from static_compiler.items.index import ItemIndex
from static_compiler.support.dtypes import (
    branch_dtype_for,
    index_dtype_for,
    sort_code_dtype_for,
    token_dtype_for,
)


def _read_spill(work: pathlib.Path, p: int, sources: list[int], kind: str, dtype,
                records: dict) -> np.ndarray:
    """Partition p's spill files of `kind` from `sources`, checked against
    their `records` (`read_checked`) and concatenated."""
    parts = [read_checked(work / f"s{i}.p{p}.{kind}", records[f"s{i}.p{p}.{kind}"]).view(dtype)
             for i in sources]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def build_partition(work: str, p: int, sources: list[int], width: int, vocab_size: int,
                    end_token: Optional[int], ragged: bool, records: dict) -> dict:
    """One partition's task (run by the executor; module-level so that it
    pickles): reads its spill files (from the `sources` that have rows in
    it; checked against their writers' `records`, by name), builds its
    trie, writes its layers under `work` in a compact form (per layer the
    tokens, the branch of each state in `branch_dtype_for`, left out where
    every state has one child, and the accepting flags) and removes the
    codes and lengths it read (the merge reads the row ids); returns its
    layers' summaries and its files' records (`save_checked`) by name."""
    work = pathlib.Path(work)
    codes = _read_spill(work, p, sources, "codes", sort_code_dtype_for(vocab_size), records)
    if codes.size == 0:
        return {"p": p, "unique": 0, "files": {}}
    codes = codes.reshape(-1, width)
    lengths = _read_spill(work, p, sources, "lengths", length_dtype(width),
                          records).astype(np.int64)
    for i in sources:  # read: their disk space goes to this partition's layers
        for kind in ("codes", "lengths"):
            os.unlink(work / f"s{i}.p{p}.{kind}")
    codes, lengths, inverse = sort_unique_codes(codes, lengths, vocab_size, return_inverse=True)
    depth = int(lengths.max())
    sub = automaton_from_sorted_codes(codes[:, :depth], lengths, vocab_size, end_token)
    verify(sub)  # each part here, in parallel: the merged trie's layouts are planned unread
    out = {"p": p, "unique": int(codes.shape[0]), "depth": depth,
           "final": sub.num_final_states,
           "layers": [LayerSummary.of(layer) for layer in sub.layers]}
    arrays = {"inverse": inverse}
    if ragged:
        arrays.update(item_depth=lengths.astype(np.int32),
                      item_state=terminal_states(codes[:, :depth], lengths))
    for t, (layer, summary) in enumerate(zip(sub.layers, out["layers"])):
        if t and keeps_branch(summary):  # (the root's is its edge count)
            arrays[f"branch{t}"] = layer.branch().astype(branch_dtype_for(summary.max_branch))
        arrays[f"tokens{t}"] = layer.tokens
        if layer.accepting is not None:
            arrays[f"accepting{t}"] = layer.accepting
    out["files"] = {f"p{p}.{key}.npy": save_checked(work / f"p{p}.{key}.npy", arr)
                    for key, arr in arrays.items()}
    return out


def keeps_branch(layer: LayerSummary) -> bool:
    """Whether a partition's layer keeps a branch count per state: not when
    every state has exactly one child (a unary layer)."""
    return not (layer.max_branch == 1 and layer.num_edges == layer.num_states)


@dataclasses.dataclass(frozen=True)
class BuiltPartitions:
    """The partitions' tries, on disk under `work` (see `build_partition`),
    while `partitions_built` holds them: their summed `summary`, their
    layers as `LayerPiece`s (`pieces`, what the lowering and `trie` merge)
    and the item index (`items`). Each piece is read once: its files are
    removed as it is handed out. Every file read is checked against its
    writer's record in `records` (by name: `read_checked`)."""

    work: pathlib.Path
    parts: tuple  # the task results of the partitions with rows, in order
    vocab_size: int
    end_token: Optional[int]
    total: int
    ragged: bool
    row_dtype: str
    summary: AutomatonSummary
    source_rows: tuple  # rows of each source, in order
    source_counts: np.ndarray  # int64 (sources, P): source i's rows in partition p
    records: dict  # file name -> (size, crc) as written (spill row ids, partition layers)
    progress: Optional[Callable[[str], None]] = None

    def say(self, line: str) -> None:
        """A progress line (`Shards.progress`)."""
        if self.progress is not None:
            self.progress(f"[partitioned build] {line}")

    @property
    def depth(self) -> int:
        return max(part["depth"] for part in self.parts)

    @functools.cached_property
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(states, edges) int64 (depth + 1, parts): partition i's states at
        depth t (the root counted once per part) and edges of layer t, from
        the tasks' layer summaries."""
        states = np.zeros((self.depth + 1, len(self.parts)), dtype=np.int64)
        edges = np.zeros_like(states)
        for i, part in enumerate(self.parts):
            for t, layer in enumerate(part["layers"]):
                states[t, i], edges[t, i] = layer.num_states, layer.num_edges
            states[part["depth"], i] = part["final"]
        return states, edges

    def _check(self, name: str, keep: bool = True) -> Optional[np.ndarray]:
        """`read_checked` of the file `name` under `work`."""
        return read_checked(self.work / name, self.records[name], keep)

    def _load(self, part: dict, key: str) -> np.ndarray:
        name = f"p{part['p']}.{key}.npy"
        arr = npy_array(self._check(name))
        os.unlink(self.work / name)  # read: its disk space goes to the merged tables
        return arr

    def pieces(self, t: int):
        """Layer t's `LayerPiece`s, one per partition (one for the root
        layer: its single state's edges are every partition's first ones)."""
        parts = self.parts
        if t == 0:
            tokens = np.concatenate([self._load(part, "tokens0") for part in parts])
            yield LayerPiece(0, 0, 1, tokens.shape[0], np.array([tokens.shape[0]]), tokens)
            self.say("merged layer 0")
            return
        states, edges = self.counts
        s0, e0 = 0, 0
        for i, part in enumerate(parts):
            d, ns, ne = part["depth"], int(states[t, i]), int(edges[t, i])
            if t < d:
                layer = part["layers"][t]
                branch = self._load(part, f"branch{t}") if keeps_branch(layer) else 1
                accepting = self._load(part, f"accepting{t}") if layer.has_accepting else None
                yield LayerPiece(s0, e0, ns, ne, branch, self._load(part, f"tokens{t}"),
                                 accepting)
            elif t == d:  # its rows all end here: states without children
                yield LayerPiece(s0, e0, ns, 0, 0, np.zeros(0, token_dtype_for(self.vocab_size)),
                                 True)
            s0, e0 = s0 + ns, e0 + ne
        self.say(f"merged layer {t}: {s0} states, {e0} edges")

    def trie(self, files: ArrayFiles) -> Automaton:
        """The merged trie (memory-mapped layers): equal to
        `frontend.build_trie` of the rows, array for array."""
        layers = []
        tok_dtype = token_dtype_for(self.vocab_size)
        for t, layer in enumerate(self.summary.layers):
            indptr = files.writer(f"indptr{t}", index_dtype_for(layer.num_edges),
                                  (layer.num_states + 1,))
            tokens = files.writer(f"tokens{t}", tok_dtype, (layer.num_edges,))
            accepting = files.writer(f"accepting{t}", bool, (layer.num_states,)) \
                if layer.has_accepting else None
            indptr.append(np.zeros(1, np.int64))
            for piece in self.pieces(t):
                indptr.append(piece.indptr()[1:])
                tokens.append(piece.tokens)
                if accepting is not None:
                    acc = piece.accepting_array()
                    accepting.append(np.zeros(piece.num_states, bool) if acc is None else acc)
            layers.append(Layer(indptr=indptr.close(), tokens=tokens.close(),
                                accepting=None if accepting is None else accepting.close()))
        return Automaton(vocab_size=self.vocab_size, layers=tuple(layers),
                         num_final_states=self.summary.num_final_states,
                         num_sequences=self.summary.num_sequences, end_token=self.end_token)

    ITEM_WINDOW_ROWS = 1 << 24

    def items(self, files: ArrayFiles) -> ItemIndex:
        """The item index: each input row's unique id, and for variable
        length each unique sequence's depth and terminal state.

        row_item is written front to back (`ArrayFiles`), a window of
        ITEM_WINDOW_ROWS rows of one source at a time: each partition's
        rows from that window (a slice of its sorted spill of row ids) and
        their ids (the same slice of its `inverse`, read from the file)
        are scattered into the window, so memory holds one window, not the
        whole index, and no mapped page is touched at random. The spilled
        row ids and the inverses are checked (`read_checked`, a chunk at a
        time) before they are mapped or read."""
        P = self.source_counts.shape[1]
        unique_offset = np.zeros(P, dtype=np.int64)  # partition p's first unique id
        inverse_at = {}  # partition p -> (path, byte offset of its inverse's data)
        offset = 0
        for part in self.parts:
            unique_offset[part["p"]] = offset
            offset += part["unique"]
            path = self.work / f"p{part['p']}.inverse.npy"
            self._check(path.name, keep=False)
            inverse_at[part["p"]] = (path, np.load(path, mmap_mode="r").offset)
        # Where source i's rows start in partition p's inverse (spilled in source order).
        inverse_start = np.zeros_like(self.source_counts)
        np.cumsum(self.source_counts[:-1], axis=0, out=inverse_start[1:])
        row_item = files.writer("row_item", np.int32, (self.total,))
        first_row = 0
        for i, rows_i in enumerate(self.source_rows):
            spills = {}
            for p in np.flatnonzero(self.source_counts[i]).tolist():
                self._check(f"s{i}.p{p}.rows", keep=False)
                spills[p] = np.memmap(self.work / f"s{i}.p{p}.rows", dtype=self.row_dtype,
                                      mode="r")
            for lo in range(first_row, first_row + rows_i, self.ITEM_WINDOW_ROWS):
                hi = min(lo + self.ITEM_WINDOW_ROWS, first_row + rows_i)
                window = np.empty(hi - lo, dtype=np.int32)
                for p, spill in spills.items():
                    a, b = np.searchsorted(spill, [lo, hi])  # (its rows ascend)
                    if a == b:
                        continue
                    path, data = inverse_at[p]
                    first = int(inverse_start[i, p]) + int(a)
                    ids = np.fromfile(path, dtype=np.int32, count=int(b - a),
                                      offset=data + 4 * first)
                    window[np.asarray(spill[a:b]).astype(np.int64) - lo] = \
                        ids + np.int32(unique_offset[p])
                row_item.append(window)
            del spills
            first_row += rows_i
        row_item = row_item.close()
        if not self.ragged:
            return ItemIndex(row_item=row_item, num_unique=self.summary.num_sequences)
        states = self.counts[0]
        state_offset = np.zeros_like(states)
        np.cumsum(states[:, :-1], axis=1, out=state_offset[:, 1:])
        depths, terminal = [], []
        for i, part in enumerate(self.parts):
            d = self._load(part, "item_depth")
            depths.append(d)
            terminal.append((self._load(part, "item_state") + state_offset[d, i])
                            .astype(np.int32))
        return ItemIndex(row_item=row_item, num_unique=self.summary.num_sequences,
                         item_depth=np.concatenate(depths), item_state=np.concatenate(terminal))
