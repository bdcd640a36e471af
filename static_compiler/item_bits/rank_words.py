"""The rank bits' host kernels (numba; `rank.ItemRanks` calls them):
`position_words` sets the bits at ascending positions (a near_unary
layer's exception marks) and `word_counts` counts a row's bits per word
within its block of 16 words and per block, one pass each (`block_counts`
is numpy's, for ranks without word counts). Each kernel has a
numpy twin (`*_numpy`: the same arguments, the same output; what runs
without numba, tests/api/test_missing_packages.py). Imported on first use,
not by `rank` at import (numba loads with it: `jit`)."""

from __future__ import annotations

import numpy as np

from static_compiler.item_bits.jit import HAVE_NUMBA, njit, uint64


@njit(nogil=True, cache=True, inline="always")
def _popcount(x):
    """Set bits of x (uint64)."""
    x = x - ((x >> uint64(1)) & uint64(0x5555555555555555))
    x = (x & uint64(0x3333333333333333)) + ((x >> uint64(2)) & uint64(0x3333333333333333))
    x = (x + (x >> uint64(4))) & uint64(0x0F0F0F0F0F0F0F0F)
    return (x * uint64(0x0101010101010101)) >> uint64(56)


@njit(nogil=True, cache=True)
def position_words(at, size, words):
    """Sets bit p of uint32 `words` (zeroed, > (size - 1) / 32 of them) for
    each p of `at` (ints); returns -1, or the index of the first entry that
    is not ascending, distinct and in [0, size) (the bits before it set)."""
    prev = -1
    for i in range(at.shape[0]):
        p = np.int64(at[i])
        if p <= prev or p >= size:
            return i
        words[p >> 5] |= np.uint32(1) << np.uint32(p & 31)
        prev = p
    return -1


@njit(nogil=True, cache=True)
def word_counts(words, within, per_block, first_block, n):
    """For blocks [first_block, first_block + n) of 16 words of uint32
    `words`: within (uint16, one per word) the set bits of its block before
    each word, per_block (uint64) each block's set bits."""
    for b in range(first_block, first_block + n):
        acc = uint64(0)
        for j in range(b * 16, b * 16 + 16):
            within[j] = acc
            acc += _popcount(uint64(words[j]))
        per_block[b] = acc


# ---------------------------------------------------------------------------
# The same kernels in numpy (what runs without numba), and the block counts
# of a row without word counts (`ItemRanks` without `within`).


LANE_BYTES = np.uint64(0x00FF00FF00FF00FF)
"""The even bytes of a uint64: four 16-bit lanes' low bytes."""
LANE_SUM16 = np.uint64(0x0001000100010001)
"""A multiplier that sums a uint64's four 16-bit lanes into the top one
(and each lane into those above it: `rank_words.word_counts_numpy`)."""


def block_counts(words64: np.ndarray) -> np.ndarray:
    """uint64 (..., blocks): set bits per block of `words64` uint64 (...,
    blocks * 8). Byte popcounts summed as four 16-bit lanes, then the lanes
    by one multiply (a block's count <= 512 fits 16 bits): no reduction over
    a small axis, which numpy runs an order of magnitude slower."""
    pc = np.bitwise_count(words64)  # uint8, one per word, 8 per block
    lanes = pc.view(np.uint64)  # (one uint64 per block: its 8 byte counts)
    pairs = (lanes & LANE_BYTES) + ((lanes >> np.uint64(8)) & LANE_BYTES)
    return (pairs * LANE_SUM16) >> np.uint64(48)


def position_words_numpy(at, size, words):
    at = np.asarray(at)
    if at.size:
        wide = at.astype(np.int64, copy=False)
        bad = np.flatnonzero(np.concatenate(([wide[0] < 0], wide[1:] <= wide[:-1])) |
                             (wide >= size))
        if bad.size:
            position_words_numpy(at[:bad[0]], size, words)
            return int(bad[0])
        word = wide >> 5
        bits = np.left_shift(np.uint32(1), (wide & 31).astype(np.uint32))
        first = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
        words[word[first]] |= np.bitwise_or.reduceat(bits, first)
    return -1


def word_counts_numpy(words, within, per_block, first_block, n):
    # word popcounts as uint16 lanes, four to a uint64: one multiply gives each lane
    # the sum of the lanes below and at it; a block's four groups add their carries
    part = words[first_block * 16:(first_block + n) * 16]
    lanes = np.bitwise_count(part).astype(np.uint16).view(np.uint64).reshape(n, 4)
    upto = lanes * LANE_SUM16
    totals = upto >> np.uint64(48)
    carry = np.zeros_like(totals)
    for g in range(1, 4):
        np.add(carry[:, g - 1], totals[:, g - 1], out=carry[:, g])
    within[first_block * 16:(first_block + n) * 16] = \
        (upto - lanes + carry * LANE_SUM16).view(np.uint16).reshape(-1)
    per_block[first_block:first_block + n] = carry[:, 3] + totals[:, 3]


if not HAVE_NUMBA:  # the kernels are their numpy twins
    position_words, word_counts = position_words_numpy, word_counts_numpy
