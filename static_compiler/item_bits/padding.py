"""Padded stacks of item subsets, the rule every door's warm-up keeps:
after `warm(max_subsets=K)` every stack of up to K subsets is decoded as K
subsets (one shape, nothing compiled per count), and K is bounded by the
bytes such a padded stack holds. numpy only: the torch backend, the served
artifact and the compiled set share it without importing jax.
"""

from __future__ import annotations

import numpy as np

from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.item_bits.liveness import Subset
from static_compiler.support.decode_state import check_int

PADDED_SUBSETS_MAX_BYTES = 64 << 20
"""The most bytes of subset bits a padded stack may hold (64 MiB), which
bounds `warm(max_subsets=K)`: after the warm-up every stack of 2..K subsets
(on the served artifact, 1..K) is decoded as K subsets, so each such stack
holds K x (one subset's bits, uint32 words per depth) on the host, copies
them to the device, and the decoders read them per row; K is at most this
budget over one subset's bytes (`check_max_subsets`)."""


def subset_bytes(subset: Subset) -> int:
    """Bytes of one of `subset`'s stacked subsets: its bits (uint32 words
    per depth, arrays shared by depths counted once) and its size."""
    arrays = {id(w): w for w in subset.live + subset.ends if w is not None}
    total = sum(w.nbytes for w in arrays.values()) + subset.sizes.nbytes
    return -(-total // max(subset.num_subsets, 1))


def check_max_subsets(max_subsets, set_view, where: str) -> tuple:
    """(K, an empty subset of the set or None) for `warm(max_subsets=K)`:
    K an int in [0, bound], bound = PADDED_SUBSETS_MAX_BYTES // (one
    subset's bytes), since every stack of up to K subsets is padded to K
    (see PADDED_SUBSETS_MAX_BYTES); K > 0 needs item subsets. Builds the
    empty subset (all bits zero, what the warm-up decodes over) only for
    K > 0. Raises DecodeInputError naming K, the bound and why, before
    anything changes or compiles."""
    k = check_int("max_subsets", max_subsets, low=0)
    if not k:
        return 0, None
    try:
        items = set_view.checked_items(where)
    except (ConstraintSetError, DecodeInputError) as err:
        raise DecodeInputError(f"{where}: max_subsets={k}: this set has no item subsets, "
                               f"expected max_subsets=0 ({err})") from None
    empty = set_view.subset(np.zeros(items.num_items, bool), where)
    each = subset_bytes(empty)
    bound = max(1, PADDED_SUBSETS_MAX_BYTES // each)
    if k > bound:
        raise DecodeInputError(
            f"{where}: max_subsets={k}: expected an int in [0, {bound}]: after the warm-up every "
            f"stack of up to max_subsets subsets is padded to max_subsets subsets of {each} bytes "
            f"each (their bits), and {bound} of them fill the "
            f"{PADDED_SUBSETS_MAX_BYTES >> 20} MiB a padded stack may hold "
            "(item_bits.padding.PADDED_SUBSETS_MAX_BYTES)")
    return k, empty


def pad_subsets(subset: Subset, num_subsets: int) -> Subset:
    """`subset` (R stacked subsets) with num_subsets - R empty subsets
    appended (all bits zero, size 0), so stacks of any R <= num_subsets
    decode through one shape (uint32 (num_subsets, words) per depth) and
    never compile again. Rows pick their subset by the same subset_index,
    in [0, R), so the results are those of the unpadded stack. Depths that
    share an array share the padded one; returns `subset` when R is
    already num_subsets."""
    R = subset.num_subsets
    if num_subsets < R:
        raise DecodeInputError(f"pad_subsets: {R} stacked subsets, padded to {num_subsets}: "
                               f"expected at least {R}")
    if num_subsets == R:
        return subset
    done: dict = {}

    def pad(w):
        if w is not None and id(w) not in done:
            done[id(w)] = np.concatenate([w, np.zeros((num_subsets - R,) + w.shape[1:], w.dtype)])
        return None if w is None else done[id(w)]

    return Subset(live=tuple(pad(w) for w in subset.live), ends=tuple(pad(w) for w in subset.ends),
                  sizes=np.concatenate([subset.sizes, np.zeros(num_subsets - R, subset.sizes.dtype)]),
                  fingerprint=subset.fingerprint)
