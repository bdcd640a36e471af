"""Partitioned, out-of-core trie build: catalogues larger than memory, built
in parts on any `concurrent.futures.Executor`.

    shards = sc.Shards(["part-000.npy", "part-001.npy"], partitions=16,
                       executor=ProcessPoolExecutor(2))
    compiled = sc.compile_constraints(shards, vocab_size=V)

1. Spill: the input (.npy shard files, memory-mapped, or (n, L) int arrays)
   is streamed once in chunks of `chunk_rows`, one executor task per shard
   file (arrays in this process); each chunk is checked (dtype, L, tokens in
   range: an error names the shard and row) and every row is appended to
   its shard's spill file for its partition: P contiguous ranges of the
   first token, so partitions follow the sorted order. The ranges hold
   about equal rows: their bounds come from the first tokens of a sample of
   rows (`partition_of_token`; equal ranges for uniform tokens), so skewed
   catalogues still split into P similar tasks (one first token is never
   split: its rows share a partition).
2. Build: each partition is sorted, deduplicated and turned into layers
   (`frontend.sort_unique_codes`, `automaton_from_sorted_codes`) by one
   executor task that reads its spill files and writes its layers back to
   disk, so tasks need only a shared directory (a process pool, or a Dask /
   Ray cluster's `Executor` over a shared file system).
3. Merge: partition p's states at every depth follow partition p - 1's, so
   the layers are the partitions' layers concatenated with their row
   pointers offset, and the item index is theirs with unique ids offset: the
   result equals `frontend.build_trie` of the same rows, array for array
   (tested).

Variable-length shards hold -1 past each row's end (and need end_token).
Peak memory is one chunk per worker while spilling and one partition per
worker while building; the merged layers and item index are written
through memory maps and reopened read-only (`_MergedArrays`), so they are
never all in memory. With a
process pool, use the "spawn" start method (jax is threaded; forking it can
deadlock) and an ``if __name__ == "__main__":`` guard in the script.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile
import time
from concurrent.futures import Executor
from typing import Callable, Optional, Union

import numpy as np

from static_compiler.dtypes import index_dtype_for, sort_code_dtype_for, token_dtype_for
from static_compiler.errors import BuildError, ConstraintSetError
from static_compiler.frontend import (automaton_from_sorted_codes, check_end_token,
                                      check_range, check_vocab_size, sort_unique_codes,
                                      terminal_states)
from static_compiler.ir import Automaton, AutomatonSummary, Layer, LayerSummary, frozen, verify
from static_compiler.liveness import ItemIndex

DEFAULT_CHUNK_ROWS = 1 << 20


@dataclasses.dataclass(frozen=True)
class Shards:
    """Input for `build_trie_partitioned` (and `compile_constraints`).

    sources: .npy file paths (memory-mapped, read in chunks) and/or int
    arrays (N_i, L), all of one L; rows are numbered across them in order.
    A list or tuple is opened up front (its files' spill tasks run on the
    executor); any other iterable (a generator of arrays) is consumed once,
    one source at a time in this process, so only the current one is ever
    in memory.
    partitions: P, ranges of the first token (of about equal rows) built
    separately.
    executor: runs the partition tasks (default: one after another in this
    process). workdir: where spill files go (default: the system's temp
    directory); removed afterwards. progress: called with one line per stage.
    """

    sources: tuple
    partitions: int = 16
    executor: Optional[Executor] = None
    workdir: Optional[Union[str, os.PathLike]] = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    progress: Optional[Callable[[str], None]] = None

    def __post_init__(self):
        if isinstance(self.sources, (str, os.PathLike, np.ndarray)):
            object.__setattr__(self, "sources", (self.sources,))
        elif isinstance(self.sources, (list, tuple)):
            object.__setattr__(self, "sources", tuple(self.sources))
        else:
            try:
                object.__setattr__(self, "sources", iter(self.sources))
            except TypeError:
                raise ConstraintSetError(f"Shards: sources is a {type(self.sources).__name__}: "
                                         "expected .npy paths or int arrays (a list, or an "
                                         "iterable consumed once)") from None
        for name in ("partitions", "chunk_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConstraintSetError(f"Shards: {name}={value!r}: expected an int >= 1")
        if isinstance(self.sources, tuple) and not self.sources:
            raise ConstraintSetError("Shards: no sources: expected .npy paths or int arrays")


def _say(shards: Shards, line: str) -> None:
    if shards.progress is not None:
        shards.progress(line)


def _open_source(source, index: int):
    """(array-like (N, L), name for errors)."""
    if isinstance(source, (str, os.PathLike)):
        name = f"shard {os.fspath(source)!r}"
        try:
            arr = np.load(os.fspath(source), mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise ConstraintSetError(f"{name}: not a readable .npy array ({e})") from None
    elif isinstance(source, np.ndarray):
        name, arr = f"shard {index} (an array)", source
    else:
        raise ConstraintSetError(f"shard {index}: a {type(source).__name__}: expected a .npy path "
                                 "or an int array (N, L)")
    if arr.ndim != 2 or arr.dtype.kind not in "iu" or arr.shape[1] < 1:
        raise ConstraintSetError(f"{name}: holds {arr.dtype}{list(arr.shape)}: expected a 2-D "
                                 "int array (N, L)")
    return arr, name


def _chunk_codes(chunk: np.ndarray, name: str, first_row: int, vocab_size: int,
                 end_token: Optional[int], code_dtype) -> tuple[np.ndarray, np.ndarray]:
    """(codes (n, L), lengths (n,) int32) of a chunk, after checking it
    (`frontend.check_range`, and that -1 padding only ends rows)."""
    chunk = np.asarray(chunk)
    ragged = bool(chunk.size) and int(chunk.min()) < 0
    lengths = np.full(chunk.shape[0], chunk.shape[1], dtype=np.int64)
    if ragged:
        padding = chunk < 0
        lengths = np.where(padding.any(axis=1), padding.argmax(axis=1), chunk.shape[1])
        inside = np.arange(chunk.shape[1])[None, :] < lengths[:, None]
        for bad, what in ((~padding & ~inside, "has a token after -1 padding: -1 may only "
                                               "follow a row's last token"),
                          (chunk < -1, "is padded with a value other than -1"),
                          (lengths[:, None] == 0, "is empty (every sequence needs a token)")):
            hit = np.flatnonzero(bad.any(axis=1))
            if hit.size:
                r = int(hit[0])
                raise ConstraintSetError(f"{name}, sequence {first_row + r}: {what} "
                                         f"({chunk[r].tolist()})")
    check_range(chunk, lengths, ragged, vocab_size, end_token, f"{name}, ", first_row)
    codes = np.empty(chunk.shape, dtype=code_dtype)
    np.add(chunk, 1, out=codes, casting="unsafe")
    if ragged:
        codes[~inside] = 0
    return codes, lengths.astype(np.int32)


def length_dtype(width: int) -> str:
    """dtype of the spilled row lengths: uint8 below 256 tokens a row."""
    return "uint8" if width < 1 << 8 else "int32"


def row_id_dtype(total_rows: Optional[int]) -> str:
    """dtype of the spilled row ids: uint32 up to 2**32 rows (5 bytes per
    row beside the codes with uint8 lengths, not 12); int64 when the total
    is not known yet (an iterable of sources)."""
    return "uint32" if total_rows is not None and total_rows <= 1 << 32 else "int64"


SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_ROWS = 4096


def partition_of_token(arrays: list, vocab_size: int, partitions: int) -> np.ndarray:
    """int64 (V,): the partition of each first token, non-decreasing, so
    partitions follow the sorted order, with about equal rows each.

    The first tokens of up to SAMPLE_BLOCKS evenly spaced blocks of
    SAMPLE_BLOCK_ROWS rows per array (a few pages of a memory-mapped shard)
    are counted, one added to every token (so unseen tokens spread evenly),
    and token t goes to partition floor(P * rows before t / all rows).
    Values outside [0, V) are clipped here; the spill's checks report them."""
    counts = np.ones(vocab_size, dtype=np.int64)
    for arr in arrays:
        n = arr.shape[0]
        starts = np.unique(np.linspace(0, max(n - SAMPLE_BLOCK_ROWS, 0), SAMPLE_BLOCKS,
                                       dtype=np.int64))
        for start in starts.tolist():
            first = np.asarray(arr[start:start + SAMPLE_BLOCK_ROWS, 0]).astype(np.int64)
            counts += np.bincount(np.clip(first, 0, vocab_size - 1), minlength=vocab_size)
    before = np.cumsum(counts) - counts
    return np.minimum(before * partitions // int(counts.sum()), partitions - 1)


def spill_source(work: str, index: int, source, first_row: int, partitions: int,
                 chunk_rows: int, vocab_size: int, end_token: Optional[int],
                 row_dtype: str, token_partition: np.ndarray) -> dict:
    """One source's spill task (module-level so that it pickles, for a .npy
    path; arrays are spilled in this process): its rows, checked chunk by
    chunk, appended to its own per-partition files `s{index}.p{p}.*`
    (codes, lengths in `length_dtype`, global row ids from `first_row` in
    `row_dtype`), each row in the partition `token_partition`
    (`partition_of_token`) gives its first token. Returns its rows,
    (shortest, longest) row length, rows per partition and the partitions
    it has rows in."""
    work = pathlib.Path(work)
    arr, name = _open_source(source, index)
    P, code_dtype = partitions, sort_code_dtype_for(vocab_size)
    lengths_as = length_dtype(arr.shape[1])
    files = {}
    shortest, longest = arr.shape[1], 0
    counts = np.zeros(P, dtype=np.int64)
    try:
        for start in range(0, arr.shape[0], chunk_rows):
            codes, lengths = _chunk_codes(arr[start:start + chunk_rows], name, start,
                                          vocab_size, end_token, code_dtype)
            if lengths.size:
                shortest = min(shortest, int(lengths.min()))
                longest = max(longest, int(lengths.max()))
            part = token_partition[codes[:, 0].astype(np.int64) - 1].astype(
                np.uint16 if P <= 1 << 16 else np.int64)
            rows = np.arange(first_row + start, first_row + start + codes.shape[0],
                             dtype=row_dtype)
            lengths = lengths.astype(lengths_as)
            counts += np.bincount(part, minlength=P)
            order = np.argsort(part, kind="stable")  # a radix sort for uint16
            bounds = np.searchsorted(part[order], np.arange(P + 1))
            for p in np.flatnonzero(np.diff(bounds)).tolist():
                take = order[bounds[p]:bounds[p + 1]]
                if p not in files:
                    files[p] = [open(work / f"s{index}.p{p}.{kind}", "wb")
                                for kind in ("codes", "lengths", "rows")]
                for f, arr_ in zip(files[p], (codes, lengths, rows)):
                    f.write(arr_[take].tobytes())
    finally:
        for group in files.values():
            for f in group:
                f.close()
    return {"index": index, "rows": int(arr.shape[0]), "lengths": (shortest, longest),
            "partitions": sorted(files), "counts": counts}


def _spill(shards: Shards, vocab_size: int, end_token: Optional[int],
           work: pathlib.Path) -> tuple[int, int, bool, list, str]:
    """Streams the input into per-source, per-partition spill files;
    (L, rows, ragged, spill results, row id dtype). A tuple of sources is
    opened first (rows numbered, first tokens sampled from all) and spilled
    by one task per source (paths on the executor, arrays here); an iterable
    is consumed one source at a time here (first tokens sampled from the
    first source)."""
    P, chunk = int(shards.partitions), int(shards.chunk_rows)
    if isinstance(shards.sources, tuple):
        opened = [_open_source(source, i) for i, source in enumerate(shards.sources)]
        width = opened[0][0].shape[1]
        for arr, name in opened:
            _check_width(arr, name, width)
        firsts = np.concatenate([[0], np.cumsum([arr.shape[0] for arr, _ in opened])]).tolist()
        token_partition = partition_of_token([arr for arr, _ in opened], vocab_size, P)
        del opened  # (memory maps: the tasks open their own)
        total = int(firsts[-1])
        row_dtype = row_id_dtype(total)
        tasks = [(str(work), i, source, firsts[i], P, chunk, vocab_size, end_token, row_dtype,
                  token_partition) for i, source in enumerate(shards.sources)]
        on_executor = [isinstance(source, (str, os.PathLike)) for source in shards.sources]
        results = _run(shards, spill_source, tasks, on_executor, "spilled source")
    else:
        results, total, width, token_partition = [], 0, None, None
        row_dtype = row_id_dtype(None)
        i = -1
        for source in shards.sources:  # (enumerate would keep the last source alive)
            i += 1
            arr, name = _open_source(source, i)
            width = arr.shape[1] if width is None else width
            _check_width(arr, name, width)
            if token_partition is None:
                token_partition = partition_of_token([arr], vocab_size, P)
            rows = arr.shape[0]
            del arr  # spill_source opens it again (a path: its own memory map)
            results.append(spill_source(str(work), i, source, total, P, chunk, vocab_size,
                                        end_token, row_dtype, token_partition))
            total += rows
            del source  # only the current source is held
            _say(shards, f"[partitioned build] spilled source {i + 1} ({total} rows so far)")
    if total == 0:
        raise ConstraintSetError("empty constraint set: the shards hold no rows")
    # Rows of different lengths (not merely shorter than the width: those
    # are one fixed length, as `frontend.build_trie` takes them too).
    spans = [r["lengths"] for r in results if r["rows"]]
    ragged = min(a for a, _ in spans) != max(b for _, b in spans)
    if ragged and end_token is None:
        raise ConstraintSetError("shards hold rows of different lengths (-1 padding): pass "
                                 "end_token=... to compile a variable-length set")
    return width, total, ragged, results, row_dtype


def _check_width(arr, name: str, width: int) -> None:
    if arr.shape[1] != width:
        raise ConstraintSetError(f"{name}: rows of length {arr.shape[1]}, the shards "
                                 f"before hold {width}")


def _read_spill(work: pathlib.Path, p: int, sources: list[int], kind: str, dtype) -> np.ndarray:
    """Partition p's spill files of `kind` from `sources`, concatenated."""
    parts = [np.fromfile(work / f"s{i}.p{p}.{kind}", dtype=dtype) for i in sources]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def build_partition(work: str, p: int, sources: list[int], width: int, vocab_size: int,
                    end_token: Optional[int], ragged: bool) -> dict:
    """One partition's task (run by the executor; module-level so that it
    pickles): reads its spill files (from the `sources` that have rows in
    it), builds its trie, writes the arrays under `work` and removes the
    codes and lengths it read (the merge reads the row ids); returns their
    counts."""
    work = pathlib.Path(work)
    codes = _read_spill(work, p, sources, "codes", sort_code_dtype_for(vocab_size))
    if codes.size == 0:
        return {"p": p, "unique": 0}
    codes = codes.reshape(-1, width)
    lengths = _read_spill(work, p, sources, "lengths", length_dtype(width)).astype(np.int64)
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
    for t, layer in enumerate(sub.layers):
        arrays[f"indptr{t}"] = layer.indptr
        arrays[f"tokens{t}"] = layer.tokens
        if layer.accepting is not None:
            arrays[f"accepting{t}"] = layer.accepting
    for key, arr in arrays.items():
        np.save(work / f"p{p}.{key}.npy", arr)
    return out


def _run(shards: Shards, task: Callable, tasks: list[tuple], on_executor: list[bool],
         what: str) -> list:
    """`task(*args)` for each of `tasks`, on the executor where on_executor
    says so (and one is given), else in this process; in order. A task's
    ConstraintSetError (bad input) is raised as it is; any other failure
    (a worker that died) as BuildError naming the task."""
    futures = [shards.executor.submit(task, *args) if shards.executor is not None and remote
               else None for args, remote in zip(tasks, on_executor)]
    results = []
    try:
        for number, (args, future) in enumerate(zip(tasks, futures)):
            try:
                results.append(task(*args) if future is None else future.result())
            except ConstraintSetError:
                raise
            except Exception as e:  # a worker died, or the task raised
                raise BuildError(f"partitioned build: {what.split()[-1]} {number} of "
                                 f"{len(tasks)} failed ({type(e).__name__}: {e})") from e
            _say(shards, f"[partitioned build] {what} {number + 1}/{len(tasks)}")
    finally:
        for future in futures:
            if future is not None:
                future.cancel()
    return results


class _MergedArrays:
    """The merge's outputs: .npy files under `root`, each written through a
    writable memory map, then reopened read-only (`sealed`), so the merged
    layers are never all in memory: pages come in when read and the kernel
    can drop them. `build_trie_partitioned` removes the directory at the
    end; the maps keep the files' data until the arrays are dropped."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        root.mkdir()
        self.bytes_written = 0

    def create(self, name: str, dtype, shape) -> np.ndarray:
        if int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype)
        return np.lib.format.open_memmap(self.root / f"{name}.npy", mode="w+", dtype=dtype,
                                         shape=shape)

    def sealed(self, name: str, arr: np.ndarray) -> np.ndarray:
        """`arr` (from `create`) flushed and reopened read-only; drop `arr`."""
        self.bytes_written += arr.nbytes
        if not isinstance(arr, np.memmap):
            return frozen(arr)
        arr.flush()
        return np.load(self.root / f"{name}.npy", mmap_mode="r")


def _merge(work: pathlib.Path, parts: list[dict], vocab_size: int, end_token: Optional[int],
           total: int, ragged: bool, sources: dict, row_dtype: str
           ) -> tuple[Automaton, ItemIndex, int]:
    """The partitions' layers and item indexes, concatenated (see module doc):
    each global array is created once as a memory-mapped file
    (`_MergedArrays`) and the partitions' pieces copied into it at their
    offsets (counts from the tasks' layer summaries); each piece's file is
    removed once copied. sources: partition -> the spill sources with rows
    in it; row_dtype: their row ids'. Returns the automaton, the item index
    and the bytes written."""
    parts = [part for part in parts if part["unique"]]
    merged = _MergedArrays(work / "merged")

    def load(part, key):
        return np.load(work / f"p{part['p']}.{key}.npy", mmap_mode="r")

    def consumed(part, key):
        os.unlink(work / f"p{part['p']}.{key}.npy")

    depth = max(part["depth"] for part in parts)
    # states[t][i] / edges[t][i]: partition i's states at depth t / edges of layer t.
    states = np.zeros((depth + 1, len(parts)), dtype=np.int64)
    edges = np.zeros((depth, len(parts)), dtype=np.int64)
    for i, part in enumerate(parts):  # from the tasks' layer summaries
        for t, layer in enumerate(part["layers"]):
            states[t, i], edges[t, i] = layer.num_states, layer.num_edges
        states[part["depth"], i] = part["final"]
    states[0, :] = 1
    state_offset = np.zeros_like(states)
    np.cumsum(states[:, :-1], axis=1, out=state_offset[:, 1:])
    edge_offset = np.zeros_like(edges)
    np.cumsum(edges[:, :-1], axis=1, out=edge_offset[:, 1:])
    tok_dtype = token_dtype_for(vocab_size)
    layers = []
    for t in range(depth):
        num_edges = int(edges[t].sum())
        num_states = 1 if t == 0 else int(states[t].sum())
        indptr = merged.create(f"indptr{t}", index_dtype_for(num_edges), (num_states + 1,))
        tokens = merged.create(f"tokens{t}", tok_dtype, (num_edges,))
        # (a new mapped file reads as zeros: rows no partition writes stay False)
        accepting = merged.create(f"accepting{t}", bool, (num_states,)) if t else None
        any_accepting = False
        indptr[0] = 0
        for i, part in enumerate(parts):
            e0, s0, d = int(edge_offset[t, i]), int(state_offset[t, i]), part["depth"]
            if t < d:
                tokens[e0:e0 + edges[t, i]] = load(part, f"tokens{t}")
                consumed(part, f"tokens{t}")
                if t and part["layers"][t].has_accepting:
                    accepting[s0:s0 + states[t, i]] = load(part, f"accepting{t}")
                    consumed(part, f"accepting{t}")
                    any_accepting = True
                if t:
                    rows = indptr[s0 + 1:s0 + 1 + states[t, i]]
                    np.add(load(part, f"indptr{t}")[1:], e0, out=rows, casting="unsafe")
                consumed(part, f"indptr{t}")
            elif t == d:  # its rows all end here: states without children
                indptr[s0 + 1:s0 + 1 + states[t, i]] = e0
                accepting[s0:s0 + states[t, i]] = True
                any_accepting = True
        if t == 0:
            indptr[1] = num_edges  # one root for every partition
        if accepting is not None:
            accepting = merged.sealed(f"accepting{t}", accepting) if any_accepting else None
        layers.append(Layer(indptr=merged.sealed(f"indptr{t}", indptr),
                            tokens=merged.sealed(f"tokens{t}", tokens), accepting=accepting))
        del indptr, tokens  # unmapped: written pages leave this process
    ir = Automaton(vocab_size=vocab_size, layers=tuple(layers),
                   num_final_states=int(states[depth].sum()),
                   num_sequences=sum(part["unique"] for part in parts), end_token=end_token)
    row_item = merged.create("row_item", np.int32, (total,))
    unique_offset = 0
    depths, terminal = [], []
    for i, part in enumerate(parts):
        rows = _read_spill(work, part["p"], sources[part["p"]], "rows", row_dtype)
        row_item[rows] = load(part, "inverse") + np.int32(unique_offset)
        consumed(part, "inverse")
        unique_offset += part["unique"]
        if ragged:
            d = np.asarray(load(part, "item_depth"))
            depths.append(d)
            terminal.append((load(part, "item_state") + state_offset[d, i]).astype(np.int32))
    row_item = merged.sealed("row_item", row_item)
    if not ragged:
        return ir, ItemIndex(row_item=row_item, num_unique=ir.num_sequences), merged.bytes_written
    return ir, ItemIndex(row_item=row_item, num_unique=ir.num_sequences,
                         item_depth=np.concatenate(depths),
                         item_state=np.concatenate(terminal)), merged.bytes_written


def merged_summary(parts: list[dict], vocab_size: int, end_token: Optional[int]
                   ) -> AutomatonSummary:
    """The `ir.AutomatonSummary` of the trie `_merge` makes of `parts` (the
    partition tasks' results), from their layer summaries alone: one root
    with every partition's first edges; at depth t, each partition's layer t,
    and the final states of partitions whose rows all end at t (childless
    accepting states there)."""
    parts = [part for part in parts if part["unique"]]
    depth = max(part["depth"] for part in parts)
    roots = sum(part["layers"][0].num_edges for part in parts)
    layers = [LayerSummary(1, roots, np.bincount([roots]))]
    for t in range(1, depth):
        states = edges = accepting = 0
        counts = np.zeros(1, dtype=np.int64)
        has = False
        for part in parts:
            if t < part["depth"]:
                layer = part["layers"][t]
                c = layer.branch_counts()
                counts = np.pad(counts, (0, max(0, c.size - counts.size)))
                counts[:c.size] += c
                states, edges = states + layer.num_states, edges + layer.num_edges
                accepting += layer.num_accepting
                has |= layer.has_accepting
            elif t == part["depth"]:
                states += part["final"]
                counts[0] += part["final"]
                accepting += part["final"]
                has = True
        layers.append(LayerSummary(states, edges, counts, accepting, has))
    return AutomatonSummary(vocab_size, tuple(layers),
                            sum(part["final"] for part in parts if part["depth"] == depth),
                            sum(part["unique"] for part in parts), end_token)


@dataclasses.dataclass(frozen=True)
class PartitionedBuild:
    """What `build_partitioned` returns: the merged trie (`ir`, memory-mapped
    arrays), its item index, and its `summary`, summed from the partitions'
    (`merged_summary`), from which `pipeline.plan_layouts` plans the
    layouts without reading the merged layers."""

    ir: Automaton
    items: ItemIndex
    summary: AutomatonSummary


def build_trie_partitioned(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                           ) -> tuple[Automaton, ItemIndex]:
    """`frontend.build_trie` of the rows `shards` holds, built in partitions
    (see module doc); equal to the monolithic build, array for array.

    Raises ConstraintSetError for bad input (naming the shard and row) and
    BuildError when a partition's task fails (naming the partition); spill
    files are removed either way."""
    built = build_partitioned(shards, vocab_size, end_token)
    return built.ir, built.items


def build_partitioned(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                      ) -> PartitionedBuild:
    """`build_trie_partitioned`, with the merged trie's summary."""
    if not isinstance(shards, Shards):
        raise ConstraintSetError(f"build_trie_partitioned: expected Shards, got "
                                 f"{type(shards).__name__}")
    vocab_size = check_vocab_size(vocab_size)
    end_token = check_end_token(end_token, vocab_size)
    root = None
    if shards.workdir is not None:
        root = pathlib.Path(shards.workdir)
        root.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="static-compiler-build-", dir=root))
    start = time.perf_counter()
    try:
        width, total, ragged, spilled, row_dtype = _spill(shards, vocab_size, end_token, work)
        size = sum(f.stat().st_size for f in work.iterdir())
        largest = int(sum(r["counts"] for r in spilled).max())
        _say(shards, f"[partitioned build] {total} rows in {shards.partitions} partitions "
                     f"(largest {largest} rows, {largest * shards.partitions / total:.2f}x the "
                     f"mean), {size / 2**20:.1f} MiB spilled, {time.perf_counter() - start:.1f} s")
        sources = {p: [r["index"] for r in spilled if p in r["partitions"]]
                   for p in range(int(shards.partitions))}
        tasks = [(str(work), p, sources[p], width, vocab_size, end_token, ragged)
                 for p in range(int(shards.partitions))]
        parts = _run(shards, build_partition, tasks, [True] * len(tasks), "built partition")
        ir, items, written = _merge(work, parts, vocab_size, end_token, total, ragged, sources,
                                    row_dtype)
        _say(shards, f"[partitioned build] merged: {ir.num_sequences} sequences, "
                     f"{ir.num_states} states, {written / 2**20:.1f} MiB written, "
                     f"{time.perf_counter() - start:.1f} s")
        return PartitionedBuild(ir, items, merged_summary(parts, vocab_size, end_token))
    finally:
        shutil.rmtree(work, ignore_errors=True)
