"""Integer dtype rules, in one place: which numpy dtype holds token ids,
sort codes, IR row pointers / state ids, and the packed state ids of the
backend's tables.

Every rule picks the narrowest type that holds every value it must, because
the decoder's tables are read at every beam of every step: halving a table's
bytes halves the memory traffic of its gathers. numpy and the standard
library only, so the IR and the frontends can use it without loading jax.
"""

from __future__ import annotations

import numpy as np

_UINT16_VALUES = 1 << 16
"""Values a uint16 holds: 0 .. 65535."""

MAX_VOCAB_SIZE = np.iinfo(np.int32).max
"""The largest vocabulary: the decoder reads and compares token ids as int32,
so a larger id would wrap (2**32 + 1 would become 1)."""


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every token id 0..vocab_size-1 fits (V <= 65536), else int32.

    Token ids are never negative, so the common vocabularies (up to 65536)
    take two bytes a token. Larger ones take int32, not uint32: jax indexes
    and compares in int32, so a uint32 table would be converted on every read."""
    return np.dtype(np.uint16) if vocab_size <= _UINT16_VALUES else np.dtype(np.int32)


def sort_code_dtype_for(vocab_size: int) -> np.dtype:
    """Dtype of the frontend's sort codes (token + 1, 0 past a row's end):
    uint16 while V + 1 < 65536, else uint32.

    The codes hold 0..V, one more value than the tokens, and are only sorted
    on the host, so an unsigned type of the next width is enough."""
    return np.dtype(np.uint16) if vocab_size + 1 < _UINT16_VALUES else np.dtype(np.uint32)


def index_dtype_for(n: int) -> np.dtype:
    """Dtype of the IR's row pointers and targets for values 0..n: int32
    while n < 2**31 - 1, else int64.

    The IR is the compiler's working form: numpy indexes fastest with
    int32/int64, and narrower types are chosen later, per layer, for the
    tables the backend builds (`state_dtype_for`)."""
    return np.dtype(np.int32) if n < np.iinfo(np.int32).max else np.dtype(np.int64)


def state_dtype_for(max_value: int) -> np.dtype:
    """Narrowest signed dtype (int16, int32 or int64) holding -1..max_value,
    for the backend's row pointers and state ids.

    Signed, because -1 marks a missing edge in dense_rows tables; int16 is
    the narrowest it picks. Raises ValueError when max_value does not fit
    int64."""
    for dtype in (np.int16, np.int32, np.int64):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"{max_value} does not fit in int64")


def branch_dtype_for(max_branch: int) -> np.dtype:
    """Narrowest unsigned dtype (uint8, uint16 or uint32) holding child
    counts 0..max_branch: a near_unary layer's `ex_branch` table and a
    partition's per-state branch counts (1 byte each in most layers, not
    the 4-8 of row pointers). int64 past uint32."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_branch <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)
