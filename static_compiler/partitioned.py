"""Partitioned, out-of-core trie build: catalogues larger than memory, built
in parts on any `concurrent.futures.Executor`.

    shards = sc.Shards(["part-000.npy", "part-001.npy"], partitions=16,
                       executor=ProcessPoolExecutor(2))
    compiled = sc.compile_constraints(shards, vocab_size=V)

1. Spill: the input (.npy shard files, memory-mapped, or (n, L) int arrays)
   is streamed once in chunks of `chunk_rows`; each chunk is checked (dtype,
   L, tokens in range: an error names the shard and row) and every row is
   appended to the spill files of its partition: P equal ranges of the first
   token, so partitions follow the sorted order.
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
Peak memory is one chunk while spilling, one partition per worker while
building, and the merged layers (held in memory for now).
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
                                      check_vocab_size, sort_unique_codes, terminal_states)
from static_compiler.ir import Automaton, Layer, frozen
from static_compiler.liveness import ItemIndex

DEFAULT_CHUNK_ROWS = 1 << 20


@dataclasses.dataclass(frozen=True)
class Shards:
    """Input for `build_trie_partitioned` (and `compile_constraints`).

    sources: .npy file paths (memory-mapped, read in chunks) and/or int
    arrays (N_i, L), all of one L; rows are numbered across them in order.
    partitions: P, equal ranges of the first token built separately.
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
        else:
            object.__setattr__(self, "sources", tuple(self.sources))
        for name in ("partitions", "chunk_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConstraintSetError(f"Shards: {name}={value!r}: expected an int >= 1")
        if not self.sources:
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
    """(codes (n, L), lengths (n,) int32) of a chunk, after checking it."""
    chunk = np.asarray(chunk, dtype=np.int64)
    padding = chunk < 0
    lengths = np.where(padding.any(axis=1), padding.argmax(axis=1), chunk.shape[1])
    inside = np.arange(chunk.shape[1])[None, :] < lengths[:, None]
    problems = [
        (~padding & ~inside, "has a token after -1 padding: -1 may only follow a row's last "
                             "token"),
        (inside & (chunk >= vocab_size) | (chunk < -1),
         f"has a token outside the vocabulary [0, {vocab_size}) (or padding other than -1)"),
    ]
    if end_token is not None:
        problems.append((inside & (chunk == end_token),
                         f"holds the end token {end_token}, which the compiler adds itself"))
    for bad, what in problems:
        hit = np.flatnonzero(bad.any(axis=1))
        if hit.size:
            r = int(hit[0])
            raise ConstraintSetError(f"{name}, row {first_row + r}: {what} "
                                     f"({chunk[r].tolist()})")
    if (lengths == 0).any():
        r = int(np.flatnonzero(lengths == 0)[0])
        raise ConstraintSetError(f"{name}, row {first_row + r}: empty (every sequence needs a "
                                 "token)")
    codes = np.where(inside, chunk + 1, 0).astype(code_dtype)
    return codes, lengths.astype(np.int32)


def _spill(shards: Shards, vocab_size: int, end_token: Optional[int],
           work: pathlib.Path) -> tuple[int, int, bool]:
    """Streams the input into per-partition spill files; (L, rows, ragged)."""
    P = int(shards.partitions)
    code_dtype = sort_code_dtype_for(vocab_size)
    files = [{kind: open(work / f"p{p}.{kind}", "wb") for kind in ("codes", "lengths", "rows")}
             for p in range(P)]
    width, total, ragged = None, 0, False
    try:
        for index, source in enumerate(shards.sources):
            arr, name = _open_source(source, index)
            if width is None:
                width = arr.shape[1]
            elif arr.shape[1] != width:
                raise ConstraintSetError(f"{name}: rows of length {arr.shape[1]}, the shards "
                                         f"before hold {width}")
            for start in range(0, arr.shape[0], int(shards.chunk_rows)):
                codes, lengths = _chunk_codes(arr[start:start + int(shards.chunk_rows)], name,
                                              start, vocab_size, end_token, code_dtype)
                ragged |= bool((lengths != width).any())
                part = (codes[:, 0].astype(np.int64) - 1) * P // vocab_size
                rows = np.arange(total, total + codes.shape[0], dtype=np.int64)
                order = np.argsort(part, kind="stable")
                bounds = np.searchsorted(part[order], np.arange(P + 1))
                for p in np.flatnonzero(np.diff(bounds)):
                    take = order[bounds[p]:bounds[p + 1]]
                    files[p]["codes"].write(codes[take].tobytes())
                    files[p]["lengths"].write(lengths[take].tobytes())
                    files[p]["rows"].write(rows[take].tobytes())
                total += codes.shape[0]
            _say(shards, f"[partitioned build] spilled {name}: {total} rows so far")
    finally:
        for group in files:
            for f in group.values():
                f.close()
    if total == 0:
        raise ConstraintSetError("empty constraint set: the shards hold no rows")
    if ragged and end_token is None:
        raise ConstraintSetError("shards hold rows of different lengths (-1 padding): pass "
                                 "end_token=... to compile a variable-length set")
    return width, total, ragged


def build_partition(work: str, p: int, width: int, vocab_size: int,
                    end_token: Optional[int], ragged: bool) -> dict:
    """One partition's task (run by the executor; module-level so that it
    pickles): reads its spill files, builds its trie and writes the arrays
    under `work`; returns their counts."""
    work = pathlib.Path(work)
    codes = np.fromfile(work / f"p{p}.codes", dtype=sort_code_dtype_for(vocab_size))
    if codes.size == 0:
        return {"p": p, "unique": 0}
    codes = codes.reshape(-1, width)
    lengths = np.fromfile(work / f"p{p}.lengths", dtype=np.int32).astype(np.int64)
    codes, lengths, inverse = sort_unique_codes(codes, lengths, vocab_size, return_inverse=True)
    depth = int(lengths.max())
    sub = automaton_from_sorted_codes(codes[:, :depth], lengths, vocab_size, end_token)
    out = {"p": p, "unique": int(codes.shape[0]), "depth": depth,
           "final": sub.num_final_states}
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
    out["arrays"] = sorted(arrays)
    return out


def _run(shards: Shards, tasks: list[tuple]) -> list[dict]:
    """Runs `build_partition` over tasks on the executor (or inline)."""
    results = []
    if shards.executor is None:
        for args in tasks:
            results.append(build_partition(*args))
            _say(shards, f"[partitioned build] built partition {len(results)}/{len(tasks)}")
        return results
    futures = [(args[1], shards.executor.submit(build_partition, *args)) for args in tasks]
    for p, future in futures:
        try:
            results.append(future.result())
        except Exception as e:  # a worker died, or the task raised
            for _, other in futures:
                other.cancel()
            raise BuildError(f"partitioned build: partition {p} of {len(tasks)} failed "
                             f"({type(e).__name__}: {e})") from e
        _say(shards, f"[partitioned build] built partition {len(results)}/{len(tasks)}")
    return results


def _merge(work: pathlib.Path, parts: list[dict], vocab_size: int, end_token: Optional[int],
           total: int, ragged: bool) -> tuple[Automaton, ItemIndex]:
    """The partitions' layers and item indexes, concatenated (see module doc)."""
    parts = [part for part in parts if part["unique"]]
    load = lambda part, key: np.load(work / f"p{part['p']}.{key}.npy")
    depth = max(part["depth"] for part in parts)
    states = [[] for _ in range(depth + 1)]  # states[t][i]: partition i's states at depth t
    for part in parts:
        for t in range(depth + 1):
            if t == 0:
                count = 1
            elif t < part["depth"]:
                count = int(load(part, f"indptr{t}").shape[0]) - 1
            elif t == part["depth"]:
                count = part["final"]
            else:
                count = 0
            states[t].append(count)
    layers = []
    tok_dtype = token_dtype_for(vocab_size)
    for t in range(depth):
        rows, tokens, accepting = [], [], []
        for i, part in enumerate(parts):
            if t < part["depth"]:
                indptr = load(part, f"indptr{t}").astype(np.int64)
                rows.append(np.diff(indptr))
                tokens.append(load(part, f"tokens{t}"))
                key = f"accepting{t}"
                accepting.append(load(part, key) if key in part["arrays"] else
                                 np.zeros(states[t][i], bool))
            elif t == part["depth"]:  # its rows all end here: states without children
                rows.append(np.zeros(states[t][i], np.int64))
                accepting.append(np.ones(states[t][i], bool))
        branch = np.concatenate(rows)
        if t == 0:
            branch = np.array([branch.sum()])  # one root for every partition
            accepting = []
        edges = int(branch.sum())
        indptr = np.zeros(branch.shape[0] + 1, dtype=index_dtype_for(edges))
        np.cumsum(branch, out=indptr[1:])
        acc = np.concatenate(accepting) if accepting else None
        layers.append(Layer(indptr=frozen(indptr),
                            tokens=frozen(np.concatenate(tokens).astype(tok_dtype)),
                            accepting=frozen(acc) if acc is not None and acc.any() else None))
    ir = Automaton(vocab_size=vocab_size, layers=tuple(layers),
                   num_final_states=sum(states[depth]),
                   num_sequences=sum(part["unique"] for part in parts), end_token=end_token)
    row_item = np.empty(total, dtype=np.int32)
    unique_offset = 0
    depths, terminal = [], []
    for i, part in enumerate(parts):
        rows = np.fromfile(work / f"p{part['p']}.rows", dtype=np.int64)
        row_item[rows] = load(part, "inverse") + unique_offset
        unique_offset += part["unique"]
        if ragged:
            d = load(part, "item_depth")
            offsets = np.array([sum(states[t][:i]) for t in range(depth + 1)], np.int64)
            depths.append(d)
            terminal.append((load(part, "item_state") + offsets[d]).astype(np.int32))
    if not ragged:
        return ir, ItemIndex(row_item=row_item, num_unique=ir.num_sequences)
    return ir, ItemIndex(row_item=row_item, num_unique=ir.num_sequences,
                         item_depth=np.concatenate(depths), item_state=np.concatenate(terminal))


def build_trie_partitioned(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                           ) -> tuple[Automaton, ItemIndex]:
    """`frontend.build_trie` of the rows `shards` holds, built in partitions
    (see module doc); equal to the monolithic build, array for array.

    Raises ConstraintSetError for bad input (naming the shard and row) and
    BuildError when a partition's task fails (naming the partition); spill
    files are removed either way."""
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
        width, total, ragged = _spill(shards, vocab_size, end_token, work)
        spilled = sum(f.stat().st_size for f in work.iterdir())
        _say(shards, f"[partitioned build] {total} rows in {shards.partitions} partitions, "
                     f"{spilled / 2**20:.1f} MiB spilled, {time.perf_counter() - start:.1f} s")
        tasks = [(str(work), p, width, vocab_size, end_token, ragged)
                 for p in range(int(shards.partitions))]
        parts = _run(shards, tasks)
        ir, items = _merge(work, parts, vocab_size, end_token, total, ragged)
        _say(shards, f"[partitioned build] merged: {ir.num_sequences} sequences, "
                     f"{ir.num_states} states, {time.perf_counter() - start:.1f} s")
        return ir, items
    finally:
        shutil.rmtree(work, ignore_errors=True)
