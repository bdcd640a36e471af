"""Ranked subsets at decode time in jax: whether a candidate state has a
selected item at or below it, as a range count over the subset's item bits
in trie order (`static_compiler.item_bits.rank`, issue 54), instead of a
liveness bit per state (`live`). The jnp counterpart of
`torch_backend.rank_kernels`: the same algorithms over the same numpy
sources (`rank.ItemRanks`, `trie_ranges.range_layers`, `trie_order`).

* the arrays (`RankArrays`, `RangeArrays`, `RankedMask`, `ranked_mask`,
  `set_ranges`) are `jax_support.ranked_arrays`', which the served
  artifact's ranked modules take too (re-exported here);
* `child_live` / `end_live`: `live.child_live` / `live.end_live`'s answers
  for a `RankedMask` (`live` dispatches on the form). The decoders' states
  carry no offsets (a variable-length set's), so a state's own offset is
  searched up the layers above it (`node_offsets`), as the torch door does.

Conventions of the JAX gathers: static shapes, clamped reads (a candidate
outside its table reads some entry: it is invalid anyway); a state outside
[0, S_d) (a capacity's padding) reads an empty range, False. Index arrays
are int32 (positions and states of a set under 2^31; jax's default ints).
Every array is a pytree leaf, the structure (which layers accept, which
layout a layer's row pointers have) static: a new subset of the same set
and stack size runs the same program.
"""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
from jax import lax

from static_compiler.jax_support.ranked_arrays import (  # noqa: F401 (the reads' types, re-exported)
    RangeArrays,
    RankArrays,
    RankedMask,
    SetRanges,
    is_ranked,
    range_arrays,
    rank_arrays,
    ranked_mask,
    set_ranges,
)


def rank_at(t: RankArrays, rows, at):
    """int32 at.shape: set bits before positions `at` int32 (B, ...)
    (clamped to [0, size]) of rows `rows` (B,) (clamped to [0, R); None:
    row 0 for every position)."""
    R, W = t.words.shape
    C = t.counts.shape[1]
    at = jnp.clip(jnp.asarray(at, jnp.int32), 0, t.size)
    word = at >> 5  # (< W: the spare bit keeps it whole)
    keep = (jnp.uint32(1) << (at & 31).astype(jnp.uint32)) - jnp.uint32(1)
    if rows is None:
        row = jnp.zeros((), jnp.int32)
    else:
        row = jnp.clip(jnp.asarray(rows, jnp.int32), 0, R - 1)
        row = row.reshape(row.shape + (1,) * (at.ndim - row.ndim))
    flat = row * W + word
    value = jnp.take(t.words.reshape(-1), flat, mode="clip") & keep
    return (lax.population_count(value).astype(jnp.int32)
            + jnp.take(t.within.reshape(-1), flat, mode="clip").astype(jnp.int32)
            + jnp.take(t.counts.reshape(-1), row * C + (word >> 4), mode="clip"))


# ---------------------------------------------------------------------------
# Ranges and counts


def _next_rows(rows, x):
    """Row pointers of one layer at states x (in [0, S])."""
    if rows is None:
        return x
    if isinstance(rows, tuple):
        marks, extra = rows[:2]
        return x + jnp.take(extra, rank_at(marks, None, x), mode="clip")
    return jnp.take(rows, x, mode="clip")


def below(ranges: RangeArrays, depth: int, x):
    """`trie_ranges.below`: int32 x.shape, the items ending at or below
    `depth` under the states before x (clamped to [0, S_depth])."""
    x = jnp.clip(jnp.asarray(x, jnp.int32), 0, ranges.counts[depth])
    total = None
    for d in range(depth, ranges.depth):
        if ranges.accepting[d] is not None:
            here = rank_at(ranges.accepting[d], None, x)
            total = here if total is None else total + here
        x = _next_rows(ranges.rows[d], x)
    return x if total is None else total + x


def selected_before(mask: RankedMask, positions):
    """int32 positions.shape: the selected items at trie positions before
    `positions` (B, ...) in each row's subset (`RankedSubset.prefix`)."""
    if mask.added is None:
        return rank_at(mask.items, mask.rows, positions)
    j = jnp.searchsorted(mask.ranges.at, positions).astype(jnp.int32)
    return rank_at(mask.items, mask.rows, positions - j) + rank_at(mask.added, mask.rows, j)


def _parents(rows, x):
    """The states one layer up whose rows hold states x (the layer's row
    pointers `rows`, as `RangeArrays.rows`): a binary search over the row
    pointers, over a near_unary layer's exception starts, none for a unary
    layer (`rank_kernels._parents`)."""
    if rows is None:
        return x
    if isinstance(rows, tuple):  # row s starts at s + extra(exceptions below s)
        _, extra, states, starts = rows
        if states.shape[0] == 0:
            return x - extra[0]
        j = jnp.searchsorted(starts, x, side="right").astype(jnp.int32)
        shift = jnp.take(extra, j, mode="clip")
        last = jnp.take(states, j - 1, mode="clip")  # the last exception starting at or before x
        return jnp.where((j > 0) & (x < last + 1 + shift), last, x - shift)
    return jnp.searchsorted(rows, x, side="right").astype(jnp.int32) - 1


def node_offsets(ranges: RangeArrays, depth: int, node) -> Optional[Any]:
    """int32 node.shape: the offsets of states `node` at `depth`
    (`trie_ranges.offsets_of`: their ancestors' accepting states before
    them, a search up a layer per depth), None where no item ends above
    that depth (every fixed-length set)."""
    if not ranges.carries_offsets(depth):
        return None
    top = min(d for d in range(depth) if ranges.accepting[d] is not None)
    x = jnp.clip(jnp.asarray(node, jnp.int32), 0, jnp.maximum(ranges.counts[depth] - 1, 0))
    out = jnp.zeros(x.shape, jnp.int32)
    for d in range(depth - 1, top - 1, -1):
        x = jnp.clip(_parents(ranges.rows[d], x), 0, jnp.maximum(ranges.counts[d] - 1, 0))
        if ranges.accepting[d] is not None:
            out = out + rank_at(ranges.accepting[d], None, x + 1)
    return out


def _child_offsets(ranges: RangeArrays, step: int, node) -> Optional[Any]:
    """The offsets of the children of states `node` (depth `step`), None
    where the children need none."""
    if not ranges.carries_offsets(step + 1):
        return None
    own = node_offsets(ranges, step, node)
    own = jnp.zeros(jnp.shape(node), jnp.int32) if own is None else own
    x = jnp.clip(jnp.asarray(node, jnp.int32) + 1, 0, ranges.counts[step])
    return own + rank_at(ranges.accepting[step], None, x)


def _in_ranges(mask: RankedMask, lo, hi):
    """bool: a selected item in [lo, hi) (equal shapes) in each row's subset."""
    counts = selected_before(mask, jnp.stack([lo, hi], axis=-1))
    return counts[..., 1] > counts[..., 0]


def _rows_like(rows, x):
    """rows (B,) with x's trailing dims as ones."""
    return rows.reshape(rows.shape + (1,) * (x.ndim - rows.ndim))


def _first(mask: RankedMask, nxt):
    """bool nxt.shape: `RankedMask.first` of depth-1 states nxt in each
    row's subset (a state outside [0, S_1): False)."""
    R, S = mask.first.shape
    inside = (nxt >= 0) & (nxt < S)
    at = jnp.clip(_rows_like(jnp.asarray(mask.rows, jnp.int32), nxt), 0, R - 1) * S + \
        jnp.clip(nxt, 0, S - 1)
    return inside & jnp.take(mask.first.reshape(-1), at, mode="clip")


def child_live(mask: RankedMask, step: int, nxt, node=None, form: Optional[str] = None):
    """bool nxt.shape: the candidates' next states `nxt` (depth step + 1)
    have a selected item at or below them in each row's subset. node: the
    states they come from (leading dims of nxt's): a variable-length set's
    offsets are searched once per state, not per candidate (None: per
    candidate). form (with node): "consecutive", nxt[..., i + 1] ==
    nxt[..., i] + 1 (a csr / near_unary slice: K + 1 bounds a row, not
    2 K); "dense", a dense_rows step's V slots (-1: no child), the node's
    row's states in token order (V + 1 bounds a row, read back by
    nxt - first); None: any states. Step 0 reads `RankedMask.first`."""
    ranges, depth = mask.ranges, step + 1
    nxt = jnp.asarray(nxt, jnp.int32)
    if step == 0 and mask.first is not None:
        return _first(mask, nxt)
    if node is None:
        form = None
    off = None
    if ranges.carries_offsets(depth):
        if node is not None:
            off = _child_offsets(ranges, step, node)
            off = off.reshape(off.shape + (1,) * (nxt.ndim - off.ndim))
        else:
            off = node_offsets(ranges, depth, nxt)
    pointers = ranges.rows[step]
    if form == "dense" and pointers is not None and not isinstance(pointers, tuple):
        V = nxt.shape[-1]
        x = jnp.clip(jnp.asarray(node, jnp.int32), 0, jnp.maximum(ranges.counts[step] - 1, 0))
        first = jnp.take(pointers, x, mode="clip")[..., None]
        last = jnp.take(pointers, x + 1, mode="clip")[..., None]
        states = jnp.minimum(first + lax.iota(jnp.int32, V + 1), last)
        edges = below(ranges, depth, states)
        counts = selected_before(mask, edges if off is None else edges + off)
        live = counts[..., 1:] > counts[..., :-1]
        column = jnp.clip(nxt - first, 0, V - 1)
        return (nxt >= 0) & jnp.take_along_axis(live, column, axis=-1)
    if form == "consecutive":
        edges = below(ranges, depth, jnp.concatenate([nxt, nxt[..., -1:] + 1], axis=-1))
        counts = selected_before(mask, edges if off is None else edges + off)
        return counts[..., 1:] > counts[..., :-1]
    lo, hi = below(ranges, depth, nxt), below(ranges, depth, nxt + 1)
    if off is not None:
        lo, hi = lo + off, hi + off
    return _in_ranges(mask, lo, hi)


def end_live(mask: RankedMask, step: int, node):
    """bool node.shape: the item ending at states `node` (depth `step`) is
    in each row's subset (False where the state does not accept); all True
    where the set's subsets hold no end bits at that depth, as
    `live.end_live` answers."""
    ranges = mask.ranges
    node = jnp.asarray(node, jnp.int32)
    if not ranges.ends[step]:
        return jnp.ones(node.shape, bool)
    count = ranges.counts[step]
    inside = (node >= 0) & (node < count)
    x = jnp.clip(node, 0, count)
    if step == ranges.depth:
        accepts = inside
    elif ranges.accepting[step] is None:
        accepts = jnp.zeros(node.shape, bool)
    else:
        own = rank_at(ranges.accepting[step], None, jnp.stack([x, x + 1], axis=-1))
        accepts = inside & (own[..., 1] > own[..., 0])
    lo = below(ranges, step, x)  # an accepting state's own item: at lo
    off = node_offsets(ranges, step, node)
    if off is not None:
        lo = lo + off
    return accepts & _in_ranges(mask, lo, lo + 1)
