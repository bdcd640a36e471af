"""Built-in constraint sets, deterministic from a seed, for demos, the main job
and benchmarks.

`DATASETS` maps a name to a builder ``(num_items, seed) -> Dataset``; add a
set by registering one more builder with `register_dataset`.
"""

from __future__ import annotations

import dataclasses
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


DEFAULT_DATASET = "synthetic-sids"
DEFAULT_NUM_ITEMS = 1_000_000
"""The main job's default set: 1e6 synthetic Semantic IDs, L = 8, V = 2048."""


def _synthetic_sids_dataset(num_items: int, seed: int) -> Dataset:
    return Dataset(name="synthetic-sids",
                   sequences=synthetic_sids(num_items, length=8, vocab_size=2048, seed=seed),
                   vocab_size=2048,
                   description=f"{num_items} uniform random Semantic IDs, L=8, V=2048, seed={seed}")


DATASETS: dict = {"synthetic-sids": _synthetic_sids_dataset}
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
