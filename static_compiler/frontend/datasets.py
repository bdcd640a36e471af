"""Built-in constraint sets, deterministic from a seed, for demos, the main job
and benchmarks.

`DATASETS` maps a name to a builder ``(num_items, seed) -> Dataset``; add a
set by registering one more builder with `register_dataset`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pathlib
import unicodedata
from typing import Callable, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A constraint set ready for `compile_constraints`.

    Attributes:
      name: the dataset table key that built it.
      sequences: int (N, L) array, or a list of int sequences for ragged sets.
      vocab_size: V; every token is in [0, V).
      end_token: token ending variable-length sequences, None when fixed length.
      description: one line for reports.
    """

    name: str
    sequences: object
    vocab_size: int
    end_token: Optional[int] = None
    description: str = ""


def synthetic_sids(num_items: int, length: int = 8, vocab_size: int = 2048,
                   seed: int = 0) -> np.ndarray:
    """Uniform random Semantic IDs, the paper's synthetic benchmark sets.

    Returns an int32 (num_items, length) array of tokens drawn uniformly from
    [0, vocab_size) by numpy's PCG64 Generator seeded with `seed`, so the same
    arguments give the same array on every machine. Rows are NOT guaranteed
    unique (duplicates are rare for large V ** L and harmless: the compiler
    deduplicates). About 0.1 s per 1e6 items.
    """
    for name, value, low in (("num_items", num_items, 1), ("length", length, 1),
                             ("vocab_size", vocab_size, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"synthetic_sids: {name}={value!r}, expected an int >= {low}")
    if vocab_size > 2 ** 31:
        raise ValueError(f"synthetic_sids: vocab_size={vocab_size} does not fit int32 tokens "
                         f"(expected <= {2 ** 31})")
    rng = np.random.Generator(np.random.PCG64(seed))
    return rng.integers(0, vocab_size, size=(int(num_items), int(length)), dtype=np.int32)


SHARD_CHUNK_ROWS = 1 << 20


def write_synthetic_shards(directory, num_items: int, num_shards: int, length: int = 8,
                           vocab_size: int = 2048, seed: int = 0, dtype="int32",
                           in_trie_order: bool = False) -> list:
    """Writes `num_items` uniform random Semantic IDs as `num_shards` .npy
    files (`dtype` (n_i, length), shard-00000.npy ...) under `directory`,
    one chunk of SHARD_CHUNK_ROWS rows at a time (written through a memory
    map, never held whole), for partitioned builds at any size; dtype: an
    integer dtype that holds every token (uint16 halves int32's bytes for
    V <= 65536). Deterministic: chunk c of shard i is drawn from PCG64
    seeded with (seed, i, c), the same tokens whatever the dtype. Returns
    the paths, in order.

    in_trie_order: the rows distinct and sorted across the shards, so that
    input row i is item i of the compiled set (a catalogue stored in its
    trie's order: a subset's mask is its item bits as they are). Each chunk
    draws distinct keys over the first k tokens (V^k <= 2^63) in a range of
    its own (the chunks' ranges ascend), sorted; the other tokens are
    uniform. ValueError when V^L is under num_items."""
    for name, value in (("num_items", num_items), ("num_shards", num_shards),
                        ("length", length), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"write_synthetic_shards: {name}={value!r}, expected an int >= 1")
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu" or np.iinfo(dtype).max < vocab_size - 1:
        raise ValueError(f"write_synthetic_shards: dtype={dtype}: expected an integer dtype "
                         f"that holds tokens up to {vocab_size - 1}")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sizes = np.full(num_shards, num_items // num_shards, dtype=np.int64)
    sizes[:num_items % num_shards] += 1
    paths = []
    for i, n in enumerate(sizes.tolist()):
        path = directory / f"shard-{i:05d}.npy"
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n, length))
        for c, start in enumerate(range(0, n, SHARD_CHUNK_ROWS)):
            rows = min(SHARD_CHUNK_ROWS, n - start)
            rng = np.random.Generator(np.random.PCG64([seed, i, c]))
            if in_trie_order:
                first = int(sizes[:i].sum()) + start  # (the chunk's first row overall)
                block = _sorted_sids(rng, first, rows, num_items, length, vocab_size)
            else:
                block = rng.integers(0, vocab_size, size=(rows, length), dtype=np.int32)
            out[start:start + rows] = block.astype(dtype, copy=False)
        out.flush()
        del out
        os.replace(tmp, path)
        paths.append(path)
    return paths


def _sorted_sids(rng, first: int, rows: int, num_items: int, length: int,
                 vocab_size: int) -> np.ndarray:
    """int32 (rows, length): rows first .. first + rows of `num_items`
    distinct sorted Semantic IDs (`write_synthetic_shards`' in_trie_order):
    distinct keys drawn over the first k tokens in this stretch's share of
    [0, V^k), sorted, then written out as tokens (most significant first);
    the other L - k tokens uniform."""
    k = 1
    while k < length and vocab_size ** (k + 1) <= 2 ** 63:
        k += 1
    space = vocab_size ** k
    if space < num_items:
        raise ValueError(f"write_synthetic_shards: in_trie_order needs V^L >= num_items "
                         f"distinct rows; V^L = {space} < {num_items}")
    lo, hi = space * first // num_items, space * (first + rows) // num_items
    if hi - lo < 2 * rows:  # (a dense range: drawn without replacement)
        keys = np.sort(rng.choice(hi - lo, rows, replace=False)).astype(np.int64) + lo
    else:
        keys = np.unique(rng.integers(lo, hi, rows, dtype=np.int64))
        while keys.shape[0] < rows:  # (rare repeats: drawn again until distinct)
            more = rng.integers(lo, hi, rows - keys.shape[0], dtype=np.int64)
            keys = np.unique(np.concatenate([keys, more]))
    out = np.empty((rows, length), np.int32)
    for t in range(k - 1, -1, -1):
        keys, out[:, t] = np.divmod(keys, vocab_size)
    out[:, k:] = rng.integers(0, vocab_size, size=(rows, length - k), dtype=np.int32)
    return out


DEFAULT_DATASET = "synthetic-sids"
DEFAULT_NUM_ITEMS = 1_000_000
"""The main job's default set: 1e6 synthetic Semantic IDs, L = 8, V = 2048."""


def _synthetic_sids_dataset(num_items: int, seed: int) -> Dataset:
    return Dataset(name="synthetic-sids",
                   sequences=synthetic_sids(num_items, length=8, vocab_size=2048, seed=seed),
                   vocab_size=2048,
                   description=f"{num_items} uniform random Semantic IDs, L=8, V=2048, seed={seed}")


UNICODE_END_TOKEN = 0
"""Token id of the end token in `unicode_names` (words are 1..V-1)."""


@functools.lru_cache(maxsize=1)
def unicode_names() -> tuple[tuple[tuple[int, ...], ...], int, int, tuple[str, ...]]:
    """Every Unicode character name in Python's `unicodedata`, word-tokenized.

    Names (``unicodedata.name(chr(cp))`` for cp in 0..0x10FFFF, characters
    without a name skipped) are split on spaces; each distinct word is one
    token. Token 0 (`UNICODE_END_TOKEN`) is the end token; words get ids
    1..V-1 by descending frequency, ties alphabetical, so the ids depend only
    on the Unicode version (``unicodedata.unidata_version``). Unicode 14.0
    (Python 3.11): 138,552 names of 1..15 words, V = 118,235; branching is
    strongly skewed ("CJK UNIFIED IDEOGRAPH-4E00" makes one state with
    ~90k children). About a second on one core, cached.

    Returns:
      (sequences, vocab_size, end_token, id_to_word): sequences a tuple of int
      tuples in code-point order; id_to_word a tuple of str with
      id_to_word[0] == "<end>".
    """
    names = [name for name in (unicodedata.name(chr(cp), None) for cp in range(0x110000)) if name]
    words = [name.split(" ") for name in names]
    counts = collections.Counter(w for ws in words for w in ws)
    id_to_word = ("<end>",) + tuple(sorted(counts, key=lambda w: (-counts[w], w)))
    word_id = {w: i for i, w in enumerate(id_to_word)}
    sequences = tuple(tuple(word_id[w] for w in ws) for ws in words)
    return sequences, len(id_to_word), UNICODE_END_TOKEN, id_to_word


def _unicode_names_dataset(num_items: int, seed: int) -> Dataset:
    """All names when num_items covers them, else a seeded random subset
    (in code-point order) over the same vocabulary."""
    sequences, vocab_size, end_token, _ = unicode_names()
    if num_items < len(sequences):
        rng = np.random.Generator(np.random.PCG64(seed))
        keep = np.sort(rng.choice(len(sequences), size=num_items, replace=False))
        sequences = tuple(sequences[i] for i in keep)
    return Dataset(name="unicode-names", sequences=sequences, vocab_size=vocab_size,
                   end_token=end_token,
                   description=f"{len(sequences)} Unicode character names (unicodedata "
                               f"{unicodedata.unidata_version}), one token per word, "
                               f"V={vocab_size}, end token {end_token}")


DATASETS: dict = {"synthetic-sids": _synthetic_sids_dataset,
                  "unicode-names": _unicode_names_dataset}
"""name -> builder(num_items: int, seed: int) -> Dataset."""


def register_dataset(name: str, builder: Callable[[int, int], Dataset]) -> None:
    """Adds a builder to `DATASETS` (a name may be registered once)."""
    if name in DATASETS:
        raise ValueError(f"dataset {name!r} is already registered")
    DATASETS[name] = builder


def load_dataset(name: str, num_items: int = DEFAULT_NUM_ITEMS, seed: int = 0) -> Dataset:
    """Builds the named built-in set. Raises ValueError naming the known sets."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(DATASETS)}")
    return DATASETS[name](num_items, seed)
