"""Step 1 of a partitioned build (`frontend.partitioned`): spill.

The input (.npy shard files, memory-mapped, or (n, L) int arrays) is
streamed once in chunks of `Shards.chunk_rows` (`spill_sources`), one
executor task per shard file (arrays in this process; `spill_source`);
each chunk is checked (dtype, L, tokens in range: an error names the shard
and row) and every row is appended to its shard's spill file for its
partition: P contiguous ranges of the first token, so partitions follow
the sorted order. The ranges hold about equal rows: their bounds come from
the first tokens of a sample of rows (`partition_of_token`; equal ranges
for uniform tokens), so skewed catalogues still split into P similar tasks
(one first token is never split: its rows share a partition).

Variable-length shards hold -1 past each row's end (and need end_token).
Peak memory is one chunk per worker. The spill files are written through
`array_files.CheckedWriter`: the partition tasks check what they read.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import check_range
from static_compiler.frontend.array_files import CheckedWriter
from static_compiler.frontend.build_tasks import run_tasks, say
from static_compiler.frontend.sequences import padded_lengths
from static_compiler.frontend.shards import Shards
from static_compiler.support.dtypes import sort_code_dtype_for
from static_compiler.support.mapped import release_pages


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
    lengths = padded_lengths(chunk, f"{name}, ", first_row)
    ragged = lengths is not None
    if not ragged:
        lengths = np.full(chunk.shape[0], chunk.shape[1], dtype=np.int64)
    check_range(chunk, lengths, ragged, vocab_size, end_token, f"{name}, ", first_row)
    codes = np.empty(chunk.shape, dtype=code_dtype)
    np.add(chunk, 1, out=codes, casting="unsafe")
    if ragged:
        codes[np.arange(chunk.shape[1])[None, :] >= lengths[:, None]] = 0
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


def spill_sources(shards: Shards, vocab_size: int, end_token: Optional[int],
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
        results = run_tasks(shards, spill_source, tasks, on_executor, "spilled source")
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
            say(shards, f"[partitioned build] spilled source {i + 1} ({total} rows so far)")
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
