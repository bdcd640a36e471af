"""Item subsets: decode over some of a compiled set's items, no recompile.

A subset is a bit per state and depth: a state is live when some item of the
subset ends at or below it. Decoding then keeps only candidates whose next
state is live, and lets a beam take the end token only where its own item is
in the subset, which is exactly decoding the set compiled from those items
alone (same candidates, same order, same scores). The bits are computed on
the host from the children, one vectorized pass per layer (a cumulative sum
over each layer's edges; unary layers copy), and bit-packed into uint32
words, so every subset of one compiled set has the same shapes and reuses
the same compiled programs.

Arrays of a `Subset` with R subsets stacked (`stack_subsets`):

* ``live[d - 1]`` uint32 (R, ceil(S_d / 32)) for depths d = 1..depth: bit s
  of row r is set when state s at depth d is live in subset r;
* ``ends[d]`` uint32 (R, ceil(S_d / 32)) for d = 0..depth, or None where no
  state at depth d accepts: bit s is set when the item ending at state s is
  in the subset (variable-length sets only; fixed-length sets keep no ends).

Items are only expressible as states in a trie: after `minimize` or for
graph input, states are shared between items, and a subset is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional, Sequence

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import ItemIndex
from static_compiler.ir import Automaton


@dataclasses.dataclass(frozen=True, eq=False)
class Subset:
    """R item subsets of one compiled set, as liveness bits (see module doc).

    sizes int64 (R,): items (distinct sequences) in each subset;
    fingerprint: the compiled set's (`set_fingerprint`), checked when
    decoding, so a subset of another set is rejected."""

    live: tuple
    ends: tuple
    sizes: np.ndarray
    fingerprint: str

    @property
    def num_subsets(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of all bits, every subset."""
        return sum(w.nbytes for w in self.live + self.ends if w is not None)

    def bits_per_state(self, ir: Automaton) -> float:
        """Bits per state and subset (1.0 for a fixed-length set)."""
        return 8.0 * self.nbytes / self.num_subsets / max(1, ir.num_states)


def set_fingerprint(ir: Automaton) -> str:
    """A short content hash of the automaton (shapes, tokens, structure):
    equal for equal sets, so a subset only applies to the set it came from."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr((ir.vocab_size, ir.end_token, ir.num_final_states)).encode())
    for layer in ir.layers:
        for arr in (layer.indptr, layer.tokens, layer.targets, layer.accepting):
            if arr is not None:
                h.update(repr((arr.dtype.str, arr.shape)).encode())
                h.update(np.ascontiguousarray(arr).data)
            else:
                h.update(b"-")
    return h.hexdigest()


def check_subsettable(ir: Automaton, items: Optional[ItemIndex], where: str) -> ItemIndex:
    """The item index, or a ConstraintSetError saying why this set has none."""
    if items is None:
        raise ConstraintSetError(f"{where}: this set has no item index: item subsets need a set "
                                 "compiled from sequences (a graph or an IR has no items)")
    shared = [t for t, layer in enumerate(ir.layers) if not layer.implicit_targets]
    if shared:
        raise ConstraintSetError(f"{where}: layers {shared} share states between items (explicit "
                                 "targets, from the 'minimize' pass): an item subset cannot be "
                                 "expressed as live states; compile without 'minimize' to use "
                                 "subsets")
    return items


def unique_ids(ir: Automaton, items: ItemIndex, sequences, where: str) -> np.ndarray:
    """int64 (n,): the unique sequence (sorted order, as `ItemIndex`) each of
    `sequences` is, -1 for one not in the set. Walks the trie one depth at a
    time for all sequences at once (a binary search per depth over the
    layer's (state, token) keys)."""
    from static_compiler.frontend import as_token_matrix

    mat, lengths, _ = as_token_matrix(sequences)
    mat = mat.astype(np.int64)
    n = mat.shape[0]
    state = np.zeros(n, dtype=np.int64)
    ok = (lengths <= ir.depth) & ((mat >= 0) | (np.arange(mat.shape[1]) >= lengths[:, None])).all(1)
    ends = np.full(n, -1, dtype=np.int64)
    V = ir.vocab_size
    for t in range(min(ir.depth, mat.shape[1])):
        layer = ir.layers[t]
        walking = ok & (lengths > t)
        keys = np.repeat(np.arange(layer.num_states, dtype=np.int64), layer.branch()) * V + \
            layer.tokens.astype(np.int64)
        want = state * V + np.where(walking, mat[:, t], 0)
        e = np.minimum(np.searchsorted(keys, want), max(0, keys.shape[0] - 1))
        found = walking & (keys.shape[0] > 0) & (keys[e] == want)
        ok &= found | ~walking
        state = np.where(found, e, state)  # implicit targets: edge e enters state e
        if items.item_depth is not None:
            done = found & (lengths == t + 1)
            ends[done] = _terminal_lookup(ir, items, t + 1)[state[done]]
    if items.item_depth is None:
        ends = np.where(ok & (lengths == ir.depth), state, -1)
    return np.where(ok, ends, -1)


def _terminal_lookup(ir: Automaton, items: ItemIndex, depth: int) -> np.ndarray:
    """int64 (S_depth,): the unique sequence ending at each state, or -1."""
    out = np.full(ir.num_states_at(depth), -1, dtype=np.int64)
    at = items.item_depth == depth
    out[items.item_state[at]] = np.flatnonzero(at)
    return out


def _item_mask(selection, items: ItemIndex, where: str, ir: Optional[Automaton] = None
               ) -> np.ndarray:
    """bool (N',) over unique sequences: those some selected input row is
    (a bool mask (N,)), or those `selection` lists (token sequences)."""
    sel = selection if isinstance(selection, np.ndarray) else None
    if sel is None or sel.dtype != bool:
        if ir is None or (sel is not None and sel.ndim != 2):
            raise ConstraintSetError(f"{where}: selection has dtype "
                                     f"{getattr(sel, 'dtype', type(selection).__name__)}: expected "
                                     f"a bool mask of shape ({items.num_items},) over the input "
                                     "rows, or token sequences (a 2-D int array or a list)")
        ids = unique_ids(ir, items, selection, where)
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            raise ConstraintSetError(f"{where}: {missing.size} of {ids.size} sequences are not in "
                                     f"the compiled set (the first: sequence {int(missing[0])})")
        out = np.zeros(items.num_unique, dtype=bool)
        out[ids] = True
        return out
    n = items.num_items
    if sel.shape != (n,):
        raise ConstraintSetError(f"{where}: mask has shape {sel.shape}: expected ({n},), one "
                                 "entry per input row of the compiled set")
    out = np.zeros(items.num_unique, dtype=bool)
    out[items.row_item[sel]] = True
    return out


NEAR_UNARY_SHARE = 0.25
"""A layer whose states with other than one child are at most this share of
its states gets its liveness by one gather (each state's first child) and a
fix-up of those states; others by a cumulative sum over the edges."""


SLICE_MAX_EXCEPTIONS = 1 << 16
"""Up to this many exceptions, a near-unary layer copies the stretches
between them (a Python loop over stretches); past it, one gather."""


@dataclasses.dataclass(frozen=True)
class LayerWalk:
    """How liveness crosses one layer from its children (see `_child_live`):
    kind "unary" (state s has child s), "near" (`exceptions`: the states
    with other than one child, sorted) or "general"."""

    kind: str
    exceptions: Optional[np.ndarray] = None


def layer_walks(ir: Automaton) -> tuple:
    """One `LayerWalk` per layer: computed once per compiled set (O(edges))."""
    walks = []
    for layer in ir.layers:
        if layer.num_edges == layer.num_states and layer.accepting is None:
            # Every state of a trie layer without accepting states has a
            # child, so as many edges as states means one child each.
            walks.append(LayerWalk("unary"))
            continue
        ex = np.flatnonzero(layer.branch() != 1)
        walks.append(LayerWalk("near", ex) if ex.size <= NEAR_UNARY_SHARE * layer.num_states
                     else LayerWalk("general"))
    return tuple(walks)


def _child_live(layer, walk: LayerWalk, live_next: np.ndarray) -> np.ndarray:
    """bool (S,): states of `layer` with a live child (implicit targets:
    child e is state e of the next depth). May return `live_next` itself."""
    if walk.kind == "unary":
        return live_next
    indptr = layer.indptr
    if walk.kind == "near":
        ex = walk.exceptions
        if ex.size <= SLICE_MAX_EXCEPTIONS:
            # Between two exceptions, states s take child indptr[s], which
            # advances with s: one slice copy per stretch, no gather.
            live = np.empty(layer.num_states, dtype=bool)
            first = np.concatenate([[0], ex + 1])
            last = np.concatenate([ex, [layer.num_states]])
            for a, b in zip(first.tolist(), last.tolist()):
                if b > a:
                    c = int(indptr[a])
                    live[a:b] = live_next[c:c + b - a]
        else:
            live = live_next[np.minimum(indptr[:-1], live_next.shape[0] - 1)]
        if ex.size:
            start, end = indptr[ex].astype(np.int64), indptr[ex + 1].astype(np.int64)
            padded = np.append(live_next, False).view(np.uint8)
            bounds = np.empty(2 * ex.size, dtype=np.int64)
            bounds[0::2], bounds[1::2] = start, end
            # Pairs [start, end) then [end, next start): keep the first of each.
            any_child = np.maximum.reduceat(padded, bounds)[0::2].view(bool)
            live[ex] = any_child & (end > start)
        return live
    counts = np.zeros(live_next.shape[0] + 1, dtype=np.int32)
    np.cumsum(live_next, dtype=np.int32, out=counts[1:])
    return counts[indptr[1:]] > counts[indptr[:-1]]


def _pack(bits: np.ndarray) -> np.ndarray:
    """bool (S,) -> uint32 (ceil(S / 32),), bit s of word s // 32 = bits[s]."""
    words = -(-bits.shape[0] // 32)
    packed = np.zeros(4 * words, dtype=np.uint8)
    packed[:(bits.shape[0] + 7) // 8] = np.packbits(bits, bitorder="little")
    return packed.view("<u4").astype(np.uint32, copy=False)


def liveness(ir: Automaton, items: ItemIndex, item_live: np.ndarray,
             walks: Optional[tuple] = None) -> tuple[list, list]:
    """(live, ends): bool arrays per depth (see module doc; unpacked, some
    may be the same array), for unique sequences `item_live` bool (N',);
    walks: `layer_walks(ir)`, if already computed."""
    walks = layer_walks(ir) if walks is None else walks
    depth = ir.depth
    own: list = [None] * (depth + 1)  # own[d]: the state's own item is in the subset
    if items.item_depth is None:
        own[depth] = item_live
    else:
        for d in np.unique(items.item_depth):
            d = int(d)
            at = (items.item_depth == d) & item_live
            bits = np.zeros(ir.num_states_at(d), dtype=bool)
            bits[items.item_state[at]] = True
            own[d] = bits
        if own[depth] is None:
            own[depth] = np.zeros(ir.num_final_states, dtype=bool)
    live: list = [None] * (depth + 1)
    live[depth] = own[depth]
    for t in range(depth - 1, 0, -1):
        live[t] = _child_live(ir.layers[t], walks[t], live[t + 1])
        if own[t] is not None:
            live[t] = live[t] | own[t]
    ends = [own[d] if (d == depth or ir.layers[d].accepting is not None) and
            ir.end_token is not None else None for d in range(depth + 1)]
    return live[1:], ends


def make_subset(ir: Automaton, items: Optional[ItemIndex], selection, fingerprint: str,
                where: str = "subset", walks: Optional[tuple] = None) -> Subset:
    """One subset from a bool mask (N,) over the input rows."""
    items = check_subsettable(ir, items, where)
    item_live = _item_mask(selection, items, where, ir)
    live, ends = liveness(ir, items, item_live, walks)
    return Subset(live=tuple(_pack(b)[None, :] for b in live),
                  ends=tuple(None if b is None else _pack(b)[None, :] for b in ends),
                  sizes=np.array([int(item_live.sum())], dtype=np.int64),
                  fingerprint=fingerprint)


def stack_subsets(subsets: Sequence[Subset]) -> Subset:
    """R subsets of one set as one `Subset` (rows in order), for per-row
    subsets in one batch (`subset_index`)."""
    subsets = list(subsets)
    if not subsets or not all(isinstance(s, Subset) for s in subsets):
        raise ConstraintSetError(f"stack_subsets: expected a non-empty list of Subset, got "
                                 f"{[type(s).__name__ for s in subsets]}")
    prints = {s.fingerprint for s in subsets}
    if len(prints) > 1:
        raise ConstraintSetError("stack_subsets: the subsets come from different compiled sets "
                                 f"(fingerprints {sorted(prints)})")
    stack = lambda arrays: None if arrays[0] is None else np.concatenate(arrays, axis=0)
    return Subset(live=tuple(stack([s.live[i] for s in subsets])
                             for i in range(len(subsets[0].live))),
                  ends=tuple(stack([s.ends[i] for s in subsets])
                             for i in range(len(subsets[0].ends))),
                  sizes=np.concatenate([s.sizes for s in subsets]),
                  fingerprint=subsets[0].fingerprint)
