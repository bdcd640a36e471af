"""What a run measures: the methods, the sweeps, the constraint sets (`CellSpec`,
uniform or Zipf-skewed) and the decode configuration (`Config`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from static_compiler.frontend.datasets import synthetic_sids

ALL_METHODS = ("static", "static_mask", "unconstrained", "host_trie", "exact_bsearch",
               "approx_bsearch", "hash_bitmap")
BASE_METHODS = ("static", "static_mask", "unconstrained")
SWEEPS = ("items", "vocab", "skew", "branch")
GPU_ITEMS = 2 * 10 ** 7
GPU_METHODS = ("static", "unconstrained", "host_trie", "exact_bsearch")
PAPER_TPU_ADDED_MS = 0.033
"""The paper's per-step overhead of STATIC on TPU v6e (|C| = 2e7, V = 2048,
batch 2, beams 70): the goal of a --gpu run."""
ZIPF_EXPONENT = 1.0


def zipf_sids(num_items: int, length: int, vocab_size: int, exponent: float = ZIPF_EXPONENT,
              seed: int = 0) -> np.ndarray:
    """int32 (num_items, length): every position drawn independently with
    P(token v) proportional to 1 / (v + 1) ** exponent (token 0 the most
    frequent), from numpy's PCG64 seeded with `seed`."""
    if num_items < 1 or length < 1 or vocab_size < 1:
        raise ValueError(f"zipf_sids: num_items={num_items}, length={length}, "
                         f"vocab_size={vocab_size}; expected all >= 1")
    rng = np.random.Generator(np.random.PCG64(seed))
    cdf = np.cumsum(1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** exponent)
    cdf /= cdf[-1]
    u = rng.random((int(num_items), int(length)))
    return np.minimum(np.searchsorted(cdf, u, side="right"), vocab_size - 1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """One constraint set: `dataset` is "uniform" or "zipf"."""

    dataset: str
    items: int
    vocab: int
    length: int
    seed: int = 0

    def sequences(self) -> np.ndarray:
        if self.dataset == "uniform":
            return synthetic_sids(self.items, length=self.length, vocab_size=self.vocab,
                                  seed=self.seed)
        if self.dataset == "zipf":
            return zipf_sids(self.items, self.length, self.vocab, seed=self.seed)
        raise ValueError(f"unknown dataset {self.dataset!r}, expected 'uniform' or 'zipf'")

    @property
    def label(self) -> str:
        return f"{self.dataset} |C|={self.items:.0e} V={self.vocab} L={self.length}"


SWEEP_METHODS = ("static", "unconstrained")
"""Methods re-timed across the cells of a sweep (`measure_sweep`)."""


@dataclasses.dataclass
class Config:
    """The decode configuration of a run (the paper's by default) and how it is timed."""

    batch: int = 2
    beams: int = 70
    tokens_per_beam: Optional[int] = 30
    length: int = 8
    repeats: int = 10
    method_budget_s: float = 60.0
    approx_top_n: int = 50
    bitmap_bits: int = 32
    seed: int = 0
    build_child: bool = True
    decode_methods: tuple = ALL_METHODS
    compile_threads: int = 2


