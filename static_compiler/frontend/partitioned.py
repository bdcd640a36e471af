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
   disk in a compact form (tokens, one narrow branch count per state, none
   for a unary layer), so tasks need only a shared directory (a process
   pool, or a Dask / Ray cluster's `Executor` over a shared file system).
   Each task returns its layers' summaries; their sums describe the merged
   trie (`merged_summary`), so the layout passes plan it unread.
3. Merge (`partitions_built` yields the built partitions, `BuiltPartitions`):
   partition p's states at every depth follow partition p - 1's, so a
   merged layer is the partitions' layers concatenated, their row pointers
   offset (`BuiltPartitions.pieces`: one `ir.LayerPiece` per partition),
   and the item index is theirs with unique ids offset. `compile_constraints`
   lowers the pieces straight into the tables (`lowering.lower_pieces`), so
   the merged trie (some 36 bytes per item at L = 8, against 12 in the
   tables) never exists; `build_trie_partitioned` merges them into the trie
   (`BuiltPartitions.trie`), equal to `frontend.build_trie` of the same
   rows, array for array (tested), as are the tables to `lower` of it.

Variable-length shards hold -1 past each row's end (and need end_token).
Peak memory is one chunk per worker while spilling and one partition per
worker while building; the merged tables (or layers) are written with file
writes and reopened read-only as memory maps (`ArrayFiles`), and the item
index is gathered a window of rows at a time (`BuiltPartitions.items`), so
none of them is ever all in memory.

Every file one task writes and another reads (spill files, partition
layers) is checked when read against the size and CRC-32 its writer
recorded while writing (`CheckedWriter`, `read_checked`): a flipped byte, a
truncated or a deleted file fails the build with BuildError naming the file,
never compiles into another set. The work directory records its owner
(host, pid, start time): a build removes those of builds that died
(SIGKILL) in the same parent directory (`remove_stale_builds`).
With a process pool, use the "spawn" start method (jax is threaded; forking
it can deadlock) and an ``if __name__ == "__main__":`` guard in the script:
each worker re-imports the main module (without the guard the pool breaks,
and the BuildError says so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import pathlib
import shutil
import socket
import tempfile
import time
import zlib
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterator, Optional, Union

import numpy as np

from static_compiler.dtypes import (branch_dtype_for, index_dtype_for, sort_code_dtype_for,
                                   token_dtype_for)
from static_compiler import processes
from static_compiler.errors import BuildError, ConstraintSetError
from static_compiler.frontend import (automaton_from_sorted_codes, check_end_token,
                                      check_range, check_vocab_size, sort_unique_codes,
                                      terminal_states)
from static_compiler.ir import (Automaton, AutomatonSummary, Layer, LayerPiece, LayerSummary,
                                frozen, verify)
from static_compiler.live.liveness import ItemIndex
from static_compiler.mapped import release_pages

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
            release_pages(arr)  # (a fault maps far more of a shard than the block: 5 GiB at 1e9)
            counts += np.bincount(np.clip(first, 0, vocab_size - 1), minlength=vocab_size)
    before = np.cumsum(counts) - counts
    return np.minimum(before * partitions // int(counts.sum()), partitions - 1)


# Files passed between tasks: checked when read against what was written.

CHECK_CHUNK_BYTES = 16 << 20


class CheckedWriter:
    """A binary file written front to back that keeps its size and CRC-32
    (zlib, some 5 GB/s: a few % of a build's time; a flipped byte or a
    truncation is always caught) as the bytes go out, so nothing is read
    back to checksum it. `close` returns the record (size, crc) that
    `read_checked` checks the file against in the task that reads it."""

    def __init__(self, path: pathlib.Path):
        self.path, self.size, self.crc = path, 0, 0
        self.file = open(path, "wb")

    def write(self, data) -> None:
        """Appends an array (any shape, written in C order) or bytes."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1)
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.file.write(view)
        self.size += view.nbytes

    def close(self) -> tuple[int, int]:
        self.file.close()
        return self.size, self.crc


def save_checked(path: pathlib.Path, arr: np.ndarray) -> tuple[int, int]:
    """`np.save` of `arr` (a .npy 1.0 file, C order) through a
    `CheckedWriter`; its record (size, crc)."""
    arr = np.ascontiguousarray(arr)
    writer = CheckedWriter(path)
    try:
        np.lib.format.write_array_header_1_0(writer,
                                             np.lib.format.header_data_from_array_1_0(arr))
        writer.write(arr)
    finally:
        record = writer.close()
    return record


def read_checked(path: pathlib.Path, record: tuple[int, int], keep: bool = True
                 ) -> Optional[np.ndarray]:
    """The bytes (uint8 (size,)) of a file another task wrote, checked
    against its writer's record (size, crc): BuildError naming the file
    when it is missing, of another size or altered since (a flipped byte
    would compile into another set). Read in CHECK_CHUNK_BYTES chunks
    straight into the array returned, so the file is held once; with keep
    False into one reused chunk (a check before the file is memory-mapped)
    and None is returned."""
    size, crc = record
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise BuildError(f"{path}: missing: a task of this build wrote {size} bytes there "
                         "(was the work directory cleaned while the build ran?)") from None
    with f:
        found = os.fstat(f.fileno()).st_size
        if found != size:
            raise BuildError(f"{path}: {found} bytes, expected the {size} its task wrote "
                             "(truncated or overwritten since)")
        out = np.empty(size if keep else min(size, CHECK_CHUNK_BYTES), np.uint8)
        got = 0
        for start in range(0, size, CHECK_CHUNK_BYTES):
            n = min(CHECK_CHUNK_BYTES, size - start)
            chunk = memoryview(out)[start:start + n] if keep else memoryview(out)[:n]
            if f.readinto(chunk) != n:
                raise BuildError(f"{path}: shorter than the {size} bytes its task wrote "
                                 "(truncated while read)")
            got = zlib.crc32(chunk, got)
    if got != crc:
        raise BuildError(f"{path}: CRC-32 {got:08x}, expected {crc:08x} as its task wrote it: "
                         "the file was altered since (disk or file system corruption?)")
    return out if keep else None


def npy_array(data: np.ndarray) -> np.ndarray:
    """The array of an .npy file's bytes (uint8, from `read_checked`), a
    view of them (no copy)."""
    head = io.BytesIO(data[:10 + (1 << 16)].tobytes())  # (magic, length, header <= 64 KiB)
    version = np.lib.format.read_magic(head)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran_order, dtype = read_header(head)
    arr = data[head.tell():].view(dtype)
    return arr.reshape(shape, order="F" if fortran_order else "C")


def spill_source(work: str, index: int, source, first_row: int, partitions: int,
                 chunk_rows: int, vocab_size: int, end_token: Optional[int],
                 row_dtype: str, token_partition: np.ndarray) -> dict:
    """One source's spill task (module-level so that it pickles, for a .npy
    path; arrays are spilled in this process): its rows, checked chunk by
    chunk, appended to its own per-partition files `s{index}.p{p}.*`
    (codes, lengths in `length_dtype`, global row ids from `first_row` in
    `row_dtype`), each row in the partition `token_partition`
    (`partition_of_token`) gives its first token. Returns its rows,
    (shortest, longest) row length, rows per partition, the partitions it
    has rows in and each file's record (`CheckedWriter`) by name."""
    work = pathlib.Path(work)
    arr, name = _open_source(source, index)
    P, code_dtype = partitions, sort_code_dtype_for(vocab_size)
    lengths_as = length_dtype(arr.shape[1])
    files = {}
    shortest, longest = arr.shape[1], 0
    counts = np.zeros(P, dtype=np.int64)
    records = {}
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
                    files[p] = [CheckedWriter(work / f"s{index}.p{p}.{kind}")
                                for kind in ("codes", "lengths", "rows")]
                for f, arr_ in zip(files[p], (codes, lengths, rows)):
                    f.write(arr_[take])
    finally:
        for group in files.values():
            for f in group:
                records[f.path.name] = f.close()
    return {"index": index, "rows": int(arr.shape[0]), "lengths": (shortest, longest),
            "partitions": sorted(files), "counts": counts, "files": records}


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


def _run(shards: Shards, task: Callable, tasks: list[tuple], on_executor: list[bool],
         what: str) -> list:
    """`task(*args)` for each of `tasks`, on the executor where on_executor
    says so (and one is given), else in this process; in order. A task's
    ConstraintSetError (bad input) is raised as it is; any other failure
    (a worker that died, a broken pool) as BuildError naming the task."""
    futures, results = [], []
    number = 0
    try:
        for number, (args, remote) in enumerate(zip(tasks, on_executor)):
            futures.append(shards.executor.submit(task, *args)
                           if shards.executor is not None and remote else None)
        for number, (args, future) in enumerate(zip(tasks, futures)):
            results.append(task(*args) if future is None else future.result())
            _say(shards, f"[partitioned build] {what} {number + 1}/{len(tasks)}")
    except ConstraintSetError:
        raise
    except Exception as e:  # a worker died, or the task raised
        why = ""
        if isinstance(e, BrokenProcessPool):
            why = (": a worker process died (killed, out of memory) or could not start; a "
                   "'spawn' or 'forkserver' pool re-imports the main module in every worker, "
                   "so a script's build code must sit under `if __name__ == \"__main__\":`")
        raise BuildError(f"partitioned build: {what.split()[-1]} {number} of {len(tasks)} "
                         f"failed ({type(e).__name__}: {e}){why}") from e
    finally:
        for future in futures:
            if future is not None:
                future.cancel()
    return results


class ArrayFiles:
    """Arrays written front to back into .npy files under `root` (the
    writers `backend.lowering.lower_pieces` takes), with plain file writes, so
    the pages go to the page cache and never count in this process's RSS;
    each is reopened read-only as a memory map when closed. The caller
    removes the directory once done: the maps keep the files' data until
    the arrays are dropped (POSIX), so the merged tables are never all in
    memory."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        root.mkdir()
        self.bytes_written = 0

    def writer(self, name: str, dtype, shape: tuple) -> "NpyFileWriter":
        return NpyFileWriter(self, self.root / f"{name}.npy", np.dtype(dtype), tuple(shape))


class NpyFileWriter:
    """One array of `ArrayFiles`: an .npy header, then rows as appended."""

    FILL_ROWS = 1 << 20

    def __init__(self, files: ArrayFiles, path: pathlib.Path, dtype: np.dtype, shape: tuple):
        self.files, self.path, self.dtype, self.shape = files, path, dtype, shape
        self.rows = 0
        self.file = open(path, "wb")
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                        "shape": shape})

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if values.shape[1:] != self.shape[1:] or self.rows + values.shape[0] > self.shape[0]:
            raise BuildError(f"{self.path.name}: rows of shape {values.shape} after "
                             f"{self.rows}, for an array {self.shape}")
        if values.size:
            self.file.write(memoryview(values.reshape(-1)).cast("B"))
        self.rows += values.shape[0]

    def close(self, fill=0) -> np.ndarray:
        """The array, read-only: rows not appended hold `fill`."""
        while self.rows < self.shape[0]:
            n = min(self.shape[0] - self.rows, self.FILL_ROWS)
            self.append(np.full((n,) + self.shape[1:], fill, dtype=self.dtype))
        self.file.close()
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.files.bytes_written += nbytes
        if nbytes == 0:  # (an empty file cannot be mapped)
            return frozen(np.zeros(self.shape, self.dtype))
        return np.load(self.path, mmap_mode="r")


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


def merged_summary(parts: list[dict], vocab_size: int, end_token: Optional[int]
                   ) -> AutomatonSummary:
    """The `ir.AutomatonSummary` of the trie `BuiltPartitions.trie` merges of `parts` (the
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
    with partitions_built(shards, vocab_size, end_token) as built:
        files = ArrayFiles(built.work / "merged")
        ir, items = built.trie(files), built.items(files)
        _say(shards, f"[partitioned build] merged: {ir.num_sequences} sequences, "
                     f"{ir.num_states} states, {files.bytes_written / 2**20:.1f} MiB written")
        return PartitionedBuild(ir, items, built.summary)


# Work directories of builds that died.

WORK_PREFIX = "static-compiler-build-"
OWNER_FILE = "owner"


def _owner() -> str:
    """What a work directory's OWNER_FILE holds: "host pid start"."""
    return f"{socket.gethostname()} {os.getpid()} {processes.start_time(os.getpid()) or '-'}"


def _owner_died(owner: str) -> bool:
    """Whether the build an OWNER_FILE names (`_owner`) is no longer
    running: it ran on this host, and its pid is not running or now names
    a process started at another time. Another host's build (a shared file
    system) or one not read whole is taken as running."""
    fields = owner.split()
    if len(fields) != 3 or fields[0] != socket.gethostname() or not fields[1].isdigit():
        return False
    pid = int(fields[1])
    if pid == 0:
        return False
    try:
        if not processes.alive(pid):
            return True
    except OverflowError:  # not a pid
        return False
    start = processes.start_time(pid)
    return fields[2] != "-" and start is not None and start != fields[2]


def remove_stale_builds(parent: pathlib.Path) -> list[str]:
    """Removes the work directories in `parent` of builds that died without
    cleaning up (SIGKILL, power loss: their `finally` never ran), as
    `artifact.recover_stale` does for artifacts: `WORK_PREFIX*`
    directories whose OWNER_FILE names a process gone (`_owner_died`).
    Those without one (older builds, or one being created now) and those
    of live builds are left alone. Returns the names removed."""
    removed = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(WORK_PREFIX) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            owner = (entry / OWNER_FILE).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if _owner_died(owner):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def partitions_built(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                     ) -> Iterator[BuiltPartitions]:
    """Spills `shards` and builds every partition (see module doc), then
    yields the partitions (`BuiltPartitions`) for the caller to merge: into
    a trie (`BuiltPartitions.trie`) or straight into tables
    (`backend.lowering.lower_pieces` of `BuiltPartitions.pieces`). The work
    directory (under `Shards.workdir`, or the system's temp directory) is
    removed on exit, whatever happens, and those of builds there that died
    first (`remove_stale_builds`).

    Raises ConstraintSetError for bad input (naming the shard and row) and
    BuildError when a partition's task fails (naming the partition), or
    a file passed between tasks is missing or altered (naming the file)."""
    if not isinstance(shards, Shards):
        raise ConstraintSetError(f"build_trie_partitioned: expected Shards, got "
                                 f"{type(shards).__name__}")
    vocab_size = check_vocab_size(vocab_size)
    end_token = check_end_token(end_token, vocab_size)
    if shards.workdir is not None:
        root = pathlib.Path(shards.workdir)
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = pathlib.Path(tempfile.gettempdir())
    for name in remove_stale_builds(root):
        _say(shards, f"[partitioned build] removed {root / name}: the work directory of a "
                     "build that died")
    work = pathlib.Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=root))
    start = time.perf_counter()
    try:
        (work / OWNER_FILE).write_text(_owner())
        width, total, ragged, spilled, row_dtype = _spill(shards, vocab_size, end_token, work)
        size = sum(f.stat().st_size for f in work.iterdir())
        largest = int(sum(r["counts"] for r in spilled).max())
        _say(shards, f"[partitioned build] {total} rows in {shards.partitions} partitions "
                     f"(largest {largest} rows, {largest * shards.partitions / total:.2f}x the "
                     f"mean), {size / 2**20:.1f} MiB spilled, {time.perf_counter() - start:.1f} s")
        sources = {p: [r["index"] for r in spilled if p in r["partitions"]]
                   for p in range(int(shards.partitions))}
        spill_records = {name: record for r in spilled for name, record in r["files"].items()}
        tasks = [(str(work), p, sources[p], width, vocab_size, end_token, ragged,
                  {f"s{i}.p{p}.{kind}": spill_records[f"s{i}.p{p}.{kind}"]
                   for i in sources[p] for kind in ("codes", "lengths")})
                 for p in range(int(shards.partitions))]
        parts = _run(shards, build_partition, tasks, [True] * len(tasks), "built partition")
        _say(shards, f"[partitioned build] built, {time.perf_counter() - start:.1f} s")
        records = {name: record for name, record in spill_records.items()
                   if name.endswith(".rows")}
        for part in parts:
            records.update(part["files"])
        yield BuiltPartitions(work, tuple(part for part in parts if part["unique"]), vocab_size,
                              end_token, total, ragged, row_dtype,
                              merged_summary(parts, vocab_size, end_token),
                              tuple(r["rows"] for r in spilled),
                              np.stack([r["counts"] for r in spilled]), records,
                              shards.progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
