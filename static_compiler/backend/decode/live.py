"""Item subsets at decode time: liveness bits read per candidate.

A `LiveMask` holds the bit-packed liveness of R subsets (see
`static_compiler.item_bits.liveness`) and the subset each batch row decodes over. A
child candidate stays valid only when its next state is live; the end token
only where the beam's own item is in the subset. A lookup is one gather of
uint32 words (at a dense_rows step, of each beam's row of slot words), so
subsets are plain arguments: any subset of the same set reuses the compiled
program.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.layers import plan_bit_widths, slot_words
from static_compiler.item_bits.liveness import checked_subset_index
from static_compiler.lowered.plan import Plan
from static_compiler.support.decode_state import is_traced


class LiveMask(NamedTuple):
    """live: per depth d = 1..depth, uint32 (R, W_d); ends: per depth d =
    0..depth, uint32 (R, W_d) or None where no state accepts; rows: int32
    (B,), the subset of each batch row."""

    live: tuple
    ends: tuple
    rows: Any


def subset_live_mask(subset, fingerprint: str, subset_index, batch_size: int,
                     where: str) -> LiveMask:
    """The `LiveMask` of `subset` (a `liveness.Subset` of the set whose
    fingerprint is `fingerprint`: so it has that set's bit shapes) with
    `subset_index` ints (batch_size,) picking each row's subset (default:
    all rows subset 0, allowed only for a single subset); concrete indices
    are checked here, traced ones by the decoder. The subset's bits are put
    on the default device once (its `placements`, key ("jax", None))."""
    subset_index = checked_subset_index(subset, fingerprint, subset_index, batch_size, where)

    def put():
        with jax.ensure_compile_time_eval():
            return subset.placed(jax.device_put)

    live, ends = subset.placements.get(("jax", None), put)
    return LiveMask(live, ends, subset_index)


def check_live_mask(plan, mask: Optional[LiveMask], batch_size: int, where: str) -> None:
    """DecodeInputError unless `mask` is None or fits `plan` and the batch:
    uint32 words of the right widths per depth, one subset row per batch
    row, in range (checked when the rows are concrete)."""
    if mask is None:
        return
    if _ranked(mask):  # (a ranked subset's rows; its arrays were checked when placed)
        return check_rows_of(mask.rows, mask.items.words.shape[0], batch_size, where)
    if not isinstance(mask, LiveMask):
        raise DecodeInputError(f"{where}: subset is a {type(mask).__name__}: expected a LiveMask "
                               "(static_compiler.beam_search takes a Subset and subset_index)")
    depth = plan.depth
    widths = subset_widths(plan)
    if len(mask.live) != depth or len(mask.ends) != depth + 1:
        raise DecodeInputError(f"{where}: subset has {len(mask.live)} live and {len(mask.ends)} "
                               f"end bit arrays: expected {depth} and {depth + 1} for this set")
    rows = None
    for name, arrays, first in (("live", mask.live, 1), ("ends", mask.ends, 0)):
        for i, words in enumerate(arrays):
            if words is None:
                continue
            d = first + i
            want = widths[0 if name == "live" else 1][i]
            shape, dtype = getattr(words, "shape", None), getattr(words, "dtype", None)
            if dtype != np.uint32 or len(shape or ()) != 2 or shape[1] != want or \
                    (rows is not None and shape[0] != rows):
                raise DecodeInputError(f"{where}: subset {name} bits at depth {d} are {dtype} "
                                       f"{shape}: expected uint32 (R, {want}) with the same R "
                                       "everywhere: a subset of another set?")
            rows = shape[0]
    check_rows_of(mask.rows, rows, batch_size, where)


def check_rows_of(sel, num_subsets: int, batch_size: int, where: str) -> None:
    """DecodeInputError unless a subset form's rows `sel` are ints
    (batch_size,) in [0, num_subsets) (values checked when concrete)."""
    if getattr(sel, "shape", None) != (batch_size,) or \
            not jnp.issubdtype(getattr(sel, "dtype", np.float32), jnp.integer):
        raise DecodeInputError(f"{where}: subset_index has shape {getattr(sel, 'shape', None)} "
                               f"and dtype {getattr(sel, 'dtype', None)}: expected ints "
                               f"({batch_size},), one subset per batch row")
    if not is_traced(sel):
        values = np.asarray(sel)
        bad = np.flatnonzero((values < 0) | (values >= num_subsets))
        if bad.size:
            raise DecodeInputError(f"{where}: subset_index[{int(bad[0])}] = "
                                   f"{int(values[bad[0]])}: expected a subset in "
                                   f"[0, {num_subsets})")


subset_widths = plan_bit_widths
"""`item_bits.layers.plan_bit_widths`: the words per subset row of a plan's live
and ends bits."""


def live_mask_spec(plan: Plan, batch_size: int, num_subsets: int = 1) -> LiveMask:
    """A `LiveMask` of `jax.ShapeDtypeStruct`s: what `num_subsets` stacked
    subsets of a set with `plan`, decoded at `batch_size` rows, pass to a
    decoder (for compiling its program ahead, `search.beam_search`'s
    also_compile)."""
    live_w, ends_w = subset_widths(plan)
    words = lambda w: jax.ShapeDtypeStruct((num_subsets, w), jnp.uint32)
    return LiveMask(tuple(words(w) for w in live_w),
                    tuple(None if w is None else words(w) for w in ends_w),
                    jax.ShapeDtypeStruct((batch_size,), jnp.int32))


class BitsSlice(NamedTuple):
    """One step's bits inside its group's bits (`group_live`): words uint32
    (R, g * W), the step's W words of each row at offset pos * W (pos
    traced)."""

    words: Any
    pos: Any
    width: int


def _bits(words, rows, idx, offset=0):
    """bool idx.shape: bit idx of row rows[b] of `words` uint32 (R, W) (or
    a `BitsSlice`), starting `offset` words in; idx int32 (B, ...)
    (out-of-range indices read some bit: their candidates are invalid
    anyway)."""
    if isinstance(words, BitsSlice):
        offset = offset + words.pos * words.width
        words = words.words
    R, W = words.shape
    idx = jnp.asarray(idx, jnp.int32)
    base = (rows.astype(jnp.int32) * W + offset).reshape(rows.shape + (1,) * (idx.ndim - 1))
    word = jnp.take(words.reshape(-1), base + (idx >> 5), mode="clip")
    return ((word >> (idx & 31).astype(jnp.uint32)) & jnp.uint32(1)).astype(bool)


def child_live(mask: Optional[LiveMask], step: int, nxt, node=None, form=None):
    """bool nxt.shape: the candidates' next states (depth step + 1) are live
    (all True without a mask). A ranked subset's mask (`ranked.RankedMask`)
    counts its items below them (node: the states they come from, the
    leading dims of nxt's, or None; form: how nxt lie, see
    `ranked.child_live`)."""
    if mask is None:
        return jnp.ones(jnp.shape(nxt), bool)
    if _ranked(mask):
        from static_compiler.backend.decode import ranked
        return ranked.child_live(mask, step, nxt, node, form)
    return _bits(mask.live[step], mask.rows, nxt)


def dense_child_live(mask: Optional[LiveMask], step: int, node, vocab_size: int):
    """bool node.shape + (V,): which tokens of states `node` (depth `step`,
    a dense_rows step whose children have slot bits) lead to a live state
    (all True without a mask). Each beam reads its state's row of W =
    ceil(V / 32) slot words (one gather of rows) and unpacks it with
    shifts: no gather per candidate."""
    shape = jnp.shape(node) + (vocab_size,)
    if mask is None:
        return jnp.ones(shape, bool)
    words = mask.live[step]
    W = slot_words(vocab_size)
    node = jnp.asarray(node, jnp.int32)
    if isinstance(words, BitsSlice):  # the step's states come pos * states rows in
        node = node + words.pos * (words.width // W)
        words = words.words
    R, states = words.shape[0], words.shape[1] // W
    rows = mask.rows.astype(jnp.int32).reshape(mask.rows.shape + (1,) * (node.ndim - 1))
    row = jnp.take(words.reshape(R * states, W), rows * states + node, axis=0, mode="clip")
    bits = (row[..., None] >> lax.iota(jnp.uint32, 32)) & jnp.uint32(1)
    return bits.reshape(node.shape + (32 * W,))[..., :vocab_size].astype(bool)


def end_live(mask: Optional[LiveMask], step: int, node):
    """bool node.shape: the items ending at states `node` (depth `step`)
    are in the subset (all True without a mask or where none accepts)."""
    if mask is None:
        return jnp.ones(jnp.shape(node), bool)
    if _ranked(mask):
        from static_compiler.backend.decode import ranked
        return ranked.end_live(mask, step, node)
    if mask.ends[step] is None:
        return jnp.ones(jnp.shape(node), bool)
    return _bits(mask.ends[step], mask.rows, node)


def _ranked(mask) -> bool:
    """Whether `mask` is a ranked subset's (`ranked.RankedMask`): loaded
    only where one was made."""
    ranked = sys.modules.get("static_compiler.jax_support.ranked_arrays")
    return ranked is not None and isinstance(mask, ranked.RankedMask)


def is_ranked(mask) -> bool:
    """Whether a decoder's subset bits are a ranked subset's
    (`ranked.RankedMask`): those are read whole at every step, never
    packed or grouped (`step.run_inputs`)."""
    return _ranked(mask)


class PackedLive(NamedTuple):
    """A `LiveMask` for a packed run: each kind of bits concatenated over
    the run's steps (live: of the next depth; ends: of the step's depth),
    with static word offsets per step."""

    live: Any
    live_offsets: Any
    ends: Any
    end_offsets: Any
    rows: Any


def pack_live(plan, mask: LiveMask, steps) -> PackedLive:
    """The bits `steps` read, concatenated (one op per kind of bits)."""
    depth = plan.depth
    live, live_off, ends, end_off = [], [], [], []
    words = end_words = 0
    for t in steps:
        live_off.append(words)
        if t < depth:
            live.append(mask.live[t])
            words += mask.live[t].shape[1]
        end_off.append(end_words)
        if mask.ends[t] is not None:
            ends.append(mask.ends[t])
            end_words += mask.ends[t].shape[1]
    cat = lambda parts: jnp.concatenate(parts, axis=1) if parts else \
        jnp.zeros((mask.live[0].shape[0], 1), jnp.uint32)  # read by no valid candidate
    return PackedLive(cat(live), np.asarray(live_off, np.int32), cat(ends),
                      np.asarray(end_off, np.int32), mask.rows)


def packed_child_live(packed: Optional[PackedLive], index, nxt):
    """`child_live` at step `index` (traced) of a packed run."""
    if packed is None:
        return jnp.ones(jnp.shape(nxt), bool)
    return _bits(packed.live, packed.rows, nxt, jnp.take(packed.live_offsets, index))


def packed_end_live(packed: Optional[PackedLive], index, node):
    """`end_live` at step `index` (traced) of a packed run."""
    if packed is None:
        return jnp.ones(jnp.shape(node), bool)
    return _bits(packed.ends, packed.rows, node, jnp.take(packed.end_offsets, index))


class GroupedLive(NamedTuple):
    """A `LiveMask` for a `GroupedRun`: per group, its steps' live bits (of
    the next depth) and end bits concatenated along the words (None where
    the steps have none), as `grouped_live_view` reads them."""

    live: tuple
    ends: tuple
    rows: Any


def group_live(plan, mask: LiveMask, groups) -> GroupedLive:
    """The bits of each group of `groups` (a `GroupedRun`'s steps)
    concatenated: steps of a group have equal bit widths."""
    depth = plan.depth
    cat = lambda parts: parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    live, ends = [], []
    for members in groups:
        live.append(cat([mask.live[t] for t in members]) if members[0] < depth else None)
        ends.append(None if mask.ends[members[0]] is None
                    else cat([mask.ends[t] for t in members]))
    return GroupedLive(tuple(live), tuple(ends), mask.rows)


def grouped_live_view(grouped: Optional[GroupedLive], groups, g: int, pos) -> Optional[LiveMask]:
    """The `LiveMask` that step_candidates reads at group `g`'s first step
    for the step at position `pos` (traced) of the group: ``live[t]`` and
    ``ends[t]`` are `BitsSlice` views (the arrays themselves for a group of
    one)."""
    if grouped is None:
        return None
    t, n = groups[g][0], len(groups[g])

    def view(words):
        if words is None or n == 1:
            return words
        return BitsSlice(words, pos, words.shape[1] // n)

    return LiveMask({t: view(grouped.live[g])}, {t: view(grouped.ends[g])}, grouped.rows)
