"""Item subsets as liveness bits: the numpy core that the library
(`static_compiler.compiler_items.subsets`) and the serving loader share.

A subset is a bit per state and depth: a state is live when some item of the
subset ends at or below it. Decoding keeps only candidates whose next state
is live, and lets a beam take the end token only where its own item is in the
subset, which is exactly decoding the set compiled from those items alone.
The bits are computed on the host from the children, one vectorized pass per
layer (`static_compiler.item_bits.layer_walk`: unary layers share their children's
bits, near-unary layers copy the stretches between their exceptions, others
take a cumulative sum over the edges; large layers a range at a time), and
bit-packed into uint32 words, so every subset of one compiled set
has the same shapes and reuses the same compiled programs.

Arrays of a `Subset` with R subsets stacked (`stack_subsets`):

* ``live[d - 1]`` uint32 (R, ceil(S_d / 32)) for depths d = 1..depth: bit s
  of row r (bit s % 32 of word s // 32) is set when state s at depth d is
  live in subset r. Where the step from depth d - 1 reads dense rows, the
  bits are instead *slot bits* in (state, token) order, uint32 (R, S_{d-1} *
  W) with W = ceil(V / 32): bit v of row s (bit v % 32 of word s * W + v //
  32) is set when state s's child by token v is live. A beam then reads its
  state's W words (one gather of a row) and unpacks them with shifts,
  instead of one gather per candidate: that step lists V candidates per
  beam. Where layer d is unary (state s's one child is state s), depth d's
  bits are depth d + 1's: one array, held once (`Subset.nbytes`);
* ``ends[d]`` uint32 (R, ceil(S_d / 32)) for d = 0..depth, or None where no
  state at depth d accepts: bit s is set when the item ending at state s is
  in the subset (variable-length sets only).

A trie is given as its layers (`TrieLayer`s or `ir.Layer`s; how they are
read: `static_compiler.item_bits.layers`); how a set's subsets are laid out and
computed is its `BitLayout` (`bit_layout`, built once per set).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Optional, Sequence, overload

import numpy as np

from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.item_bits import item_masks, layer_walk
from static_compiler.item_bits.item_masks import rows_item_mask  # noqa: F401  (callers take it here)
from static_compiler.item_bits.layers import LayerWalk, TrieLayer, dense_slots, layer_walks, shared_depths
from static_compiler.item_bits.placements import Placements
from static_compiler.item_bits.state_order import final_states_live, item_order
from static_compiler.items.index import ItemIndex

if TYPE_CHECKING:  # (ranked subsets are the torch door's: a serving process never loads them)
    from static_compiler.item_bits.rank import RankedSubset


def warm_kernels_in_background() -> None:
    """Starts loading the compiled kernels subsets run (`bit_kernels.warm`)
    on a daemon thread: a loader with an item index calls it, so numba's
    start-up overlaps what the caller does before its first subset. Once
    per process (a server reloading its artifact starts no more threads)."""
    def warm() -> None:
        from static_compiler.item_bits import bit_kernels, bucket_scatter
        bit_kernels.warm()
        if bit_kernels.HAVE_NUMBA:
            bucket_scatter.warm()

    with _WARMED_LOCK:
        if _WARMED:
            return
        thread = threading.Thread(target=warm, name="static-compiler-warm-kernels", daemon=True)
        _WARMED.append(thread)
    thread.start()


def wait_for_kernels(timeout: Optional[float] = None) -> bool:
    """Waits (at most `timeout` seconds) for the kernel loading that
    `warm_kernels_in_background` started, if any; True once none runs. The
    loading imports numba, holding the GIL for most of a second or more: a
    loop timed meanwhile measures its GIL waits, not its own steps (a
    benchmark of steady calls waits here first)."""
    with _WARMED_LOCK:
        thread = _WARMED[0] if _WARMED else None
    if thread is None:
        return True
    thread.join(timeout)
    return not thread.is_alive()


_WARMED: list = []  # the loading thread, once started
_WARMED_LOCK = threading.Lock()


def final_item_live(state_item, item_live: np.ndarray, room=None) -> layer_walk.PackedBits:
    """`state_order.final_states_live` a range of ITEM_CHUNK states at a time."""
    return final_states_live(state_item, item_live, item_masks.ITEM_CHUNK, room)


@dataclasses.dataclass(frozen=True, eq=False)
class Subset:
    """R item subsets of one compiled set, as liveness bits (see module doc).

    Every subset of one set has the same shapes, so decoding over any of
    them reuses the same compiled programs. S_d below is the number of
    states at depth d as the set's tables hold them, V the vocabulary size.

    Attributes
    ----------
    live : tuple of numpy.ndarray
        One array per depth d = 1..depth, uint32 (R, ceil(S_d / 32)): bit s
        of row r is set when state s at depth d is live in subset r. Where
        the step from depth d - 1 reads dense rows, slot bits instead,
        uint32 (R, S_{d-1} * ceil(V / 32)). Two depths may hold the same
        array (a unary layer); it counts once in `nbytes`.
    ends : tuple of numpy.ndarray or None
        One entry per depth d = 0..depth, uint32 (R, ceil(S_d / 32)): bit s
        is set when the item ending at state s is in the subset; None where
        no state at depth d accepts (every entry None but the last for a
        fixed-length set, all None without an end token).
    sizes : numpy.ndarray
        int64 (R,): items (distinct sequences) in each subset.
    fingerprint : str
        The compiled set's (`set_fingerprint`), checked when decoding, so a
        subset of another set is rejected.
    num_subsets : int
        R, the number of subsets held (``sizes.shape[0]``).
    placements : Placements
        Its bits' device copies, made once per device (`item_bits.placements`).
    """

    live: tuple
    ends: tuple
    sizes: np.ndarray
    fingerprint: str
    placements: Placements = dataclasses.field(default_factory=Placements, init=False,
                                               repr=False, compare=False)

    @property
    def num_subsets(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of all bits, every subset (an array two depths share counts once)."""
        return sum(w.nbytes for w in self.arrays())

    def arrays(self) -> list:
        """The distinct bit arrays (two depths may share one), in order."""
        seen: dict = {}
        for w in self.live + self.ends:
            if w is not None:
                seen.setdefault(id(w), w)
        return list(seen.values())

    def placed(self, put) -> tuple[tuple, tuple]:
        """(live, ends) with `put` (e.g. jax.device_put) applied once per
        distinct array, so depths that share bits share the placed copy."""
        done = {id(w): put(w) for w in self.arrays()}
        at = lambda arrays: tuple(None if w is None else done[id(w)] for w in arrays)
        return at(self.live), at(self.ends)

    def bits_per_state(self, num_states: int) -> float:
        """Bits per state and subset, over a set of `num_states` states (1.0
        for a fixed-length set)."""
        return 8.0 * self.nbytes / self.num_subsets / max(1, num_states)


@dataclasses.dataclass(frozen=True, eq=False)
class SlotStep:
    """A step whose children get slot bits: present, its `dense_slots`;
    children, the next layer seen from the slots (a `TrieLayer` whose
    states are the slots, absent ones without children) with its walk, so
    the slot bits come straight from the depth below; None where the next
    depth is the last or itself has slot bits (then they are scattered from
    its per-state bits)."""

    present: np.ndarray
    children: Optional[TrieLayer] = None
    walk: Optional[LayerWalk] = None


def slot_step_of(present: np.ndarray, next_layer) -> SlotStep:
    """The `SlotStep` of a dense step with `present` slots whose children
    lie in `next_layer` (None: no layer to walk from, see `SlotStep`)."""
    if next_layer is None:
        return SlotStep(present)
    flat = present.reshape(-1)
    # Slot k starts where the edge after the present slots before k starts:
    # its own edge's children if present, an empty row otherwise.
    before = np.cumsum(flat, dtype=np.int64) - flat
    indptr = np.asarray(next_layer.indptr)
    starts = np.append(np.take(indptr, before), indptr[np.count_nonzero(flat)])
    children = TrieLayer(starts.astype(indptr.dtype, copy=False))
    return SlotStep(present, children, layer_walks([children])[0])


@dataclasses.dataclass(frozen=True, eq=False)
class BitLayout:
    """How the subsets of one set are computed and laid out, built once per
    set (`bit_layout`, O(edges)): walks, one `LayerWalk` per layer; slots,
    {t: `SlotStep`} for the steps whose children get slot bits
    (`slot_step`); state_counts, the states per depth 0..depth the bits
    cover (the tables', larger than the trie's where capacity is reserved),
    or None for the trie's; shared, the depths that hold the next depth's
    bits (`shared_depths`)."""

    walks: tuple
    slots: dict
    state_counts: Optional[tuple] = None
    shared: frozenset = frozenset()


def bit_layout(layers: Sequence, dense_tables: Optional[dict] = None,
               state_counts: Optional[Sequence] = None) -> BitLayout:
    """The `BitLayout` of a trie's `layers`, with dense_tables {t: the
    `next` table int (rows, V) of each step t whose children get slot bits}
    (None: per-state bits everywhere, as artifacts before format version 5
    take them)."""
    dense_tables = dense_tables or {}
    walk_below = lambda t: t + 1 < len(layers) and t + 1 not in dense_tables
    slots = {t: slot_step_of(dense_slots(nxt), layers[t + 1] if walk_below(t) else None)
             for t, nxt in dense_tables.items()}
    counts = None if state_counts is None else tuple(int(n) for n in state_counts)
    return BitLayout(layer_walks(layers), slots, counts,
                     shared_depths(layers, tuple(slots), counts))


def liveness(layers: Sequence, num_final_states: int, end_token: Optional[int],
             items: ItemIndex, item_live: np.ndarray, walks: Optional[tuple] = None
             ) -> tuple[list, list]:
    """(live, ends): bool arrays per depth (see module doc; per state,
    unpacked, some may be the same array) of a trie whose `layers`
    (`TrieLayer`s or `ir.Layer`s, implicit targets) end in
    `num_final_states` states, for unique sequences `item_live` bool (N',);
    walks: `layer_walks(layers)`, if already computed."""
    layout = BitLayout(layer_walks(layers) if walks is None else walks, {})
    live, ends, _ = _walk_up(layers, num_final_states, end_token, items, item_live, layout)
    as_bools = lambda bits: None if bits is None else layer_walk.bools(bits)
    return [as_bools(x) for x in live[1:]], [as_bools(x) for x in ends]


def _walk_up(layers: Sequence, num_final_states: int, end_token: Optional[int],
             items: ItemIndex, item_live: np.ndarray, layout: BitLayout, crossed=None
             ) -> tuple[list, list, dict]:
    """(live per depth 0..depth (None at depth 0 and where slot bits were
    walked to straight), ends, slot words {t: uint32 (rows * W,)} for the
    layout's slot steps): liveness from the deepest layer up. A slot step's
    states are live where a word of their row is nonzero (no walk across
    that layer).

    crossed(d, bits): if given, called with depth d's bits once the walk
    has crossed the layer above them (deepest first), which are then
    dropped (live[d] None): the caller packs them, so a 1e9 walk holds the
    bool arrays of two depths at a time, not of every depth."""
    walks, depth = layout.walks, len(layers)

    def cross(d: int) -> None:
        if crossed is not None and live[d] is not None:
            crossed(d, live[d])
            live[d] = None

    states = [layer.num_states for layer in layers] + [num_final_states]
    room = layout.state_counts or [None] * (depth + 1)  # each depth's words, padded
    own: list = [None] * (depth + 1)  # own[d]: the state's own item is in the subset
    if items.item_depth is None:
        own[depth] = item_live if item_order(items) is None else \
            final_item_live(item_order(items), item_live, room[depth])
    else:
        for d in np.unique(items.item_depth):
            d = int(d)
            at = (items.item_depth == d) & item_live
            bits = np.zeros(states[d], dtype=bool)
            bits[items.item_state[at]] = True
            own[d] = bits
        if own[depth] is None:
            own[depth] = np.zeros(num_final_states, dtype=bool)
    live: list = [None] * (depth + 1)
    live[depth] = own[depth]
    slot_bits: dict = {}
    for t in range(depth - 1, -1, -1):
        step = layout.slots.get(t)
        if step is not None and live[t + 1] is not None:
            scattered = np.zeros(step.present.shape, dtype=bool)
            # the layer's children, in order (states past them pad a capacity)
            scattered[step.present] = live[t + 1][:layers[t].num_edges]  # (bools either way)
            slot_bits[t] = layer_walk.pack(scattered.reshape(-1))
        if t == 0:
            cross(1)
            break
        above = layout.slots.get(t - 1)
        if step is not None:
            rows = slot_bits[t].reshape(step.present.shape[0], -1)
            live[t] = (rows[:states[t]] != 0).any(axis=1)
        elif above is not None and above.children is not None:
            # Depth t has slot bits: walk from depth t + 1 to the slots
            # straight (live[t] per state is never needed).
            bits = layer_walk.child_live(above.children, above.walk, live[t + 1])
            if own[t] is not None:
                bits = layer_walk.bools(bits).copy()
                bits[above.present.reshape(-1)] |= own[t][:layers[t - 1].num_edges]
            slot_bits[t - 1] = layer_walk.words(bits)
            cross(t + 1)
            continue
        else:
            live[t] = layer_walk.child_live(layers[t], walks[t], live[t + 1], room[t])
        if own[t] is not None:
            live[t] = live[t] | own[t]
        cross(t + 1)
    ends = [own[d] if (d == depth or layers[d].accepting is not None) and
            end_token is not None else None for d in range(depth + 1)]
    return live, ends, slot_bits


def rows_item_live(selection: np.ndarray, items: ItemIndex, layout: "BitLayout", where: str):
    """The unique sequences some selected input row is (selection: bool
    (N,) over the input rows), as `subset_of_items` takes them: packed bits
    with the final depth's words where the items are the final states in
    order but for listed additions (`item_masks.rows_item_bits`: 1/8 of the
    fresh pages), else bool (N',)."""
    if items.item_depth is None and items.state_item is None:
        room = None if layout.state_counts is None else layout.state_counts[-1]
        return item_masks.rows_item_bits(selection, items, where, room)
    return item_masks.rows_item_mask(selection, items, where)


def subset_of_items(layers: Sequence, num_final_states: int, end_token: Optional[int],
                    items: ItemIndex, item_live: np.ndarray, fingerprint: str,
                    layout: BitLayout) -> Subset:
    """One `Subset` holding the unique sequences `item_live` (bool (N',),
    or `PackedBits` (N') for a fixed-length set, from `rows_item_live`),
    less those `items.removed` (taken out of `item_live` in place, a chunk
    at a time, so pass an array of your own), laid out as `layout` says."""
    if items.removed is not None:
        item_masks.drop_items(item_live, items.removed)
    size_of_subset = item_masks.count_items(item_live)  # (`_walk_up` puts it in final-state order)
    counts = layout.state_counts
    size = (lambda d: None) if counts is None else (lambda d: counts[d])  # noqa: ARG005
    depth = len(layers)
    words: list = [None] * (depth + 1)

    def crossed(d: int, bits) -> None:
        if d - 1 not in layout.slots and d not in layout.shared:
            words[d] = layer_walk.words(bits, size(d))[None, :]

    _, ends, slot_bits = _walk_up(layers, num_final_states, end_token, items, item_live, layout,
                                  crossed)
    for d in range(depth, 0, -1):
        if d - 1 in slot_bits:
            words[d] = slot_bits[d - 1][None, :]
        elif d in layout.shared:
            words[d] = words[d + 1]  # live[d] is live[d + 1]: one array
    return Subset(live=tuple(words[1:]),
                  ends=tuple(None if b is None else layer_walk.words(b, size(d))[None, :]
                             for d, b in enumerate(ends)),
                  sizes=np.array([size_of_subset], dtype=np.int64),
                  fingerprint=fingerprint)


def checked_subset_index(subset, fingerprint: str, subset_index, batch_size: int, where: str):
    """`subset_index` for decoding over `subset`, as int32 (batch_size,)
    (default: zeros when it holds one subset), after checking that `subset`
    is a `Subset` of the set with `fingerprint` and that a concrete index
    has that shape and its values in [0, R) (a traced one is returned as it
    is); raises DecodeInputError naming what is wrong."""
    if not isinstance(subset, Subset):
        raise DecodeInputError(f"{where}: subset is a {type(subset).__name__}: expected a Subset "
                               "of this set (its subset(mask), or stack_subsets([...]))")
    if subset.fingerprint != fingerprint:
        raise DecodeInputError(f"{where}: the subset was made from another compiled set "
                               f"(fingerprint {subset.fingerprint}, this set's {fingerprint})")
    if subset_index is None:
        if subset.num_subsets != 1:
            raise DecodeInputError(f"{where}: {subset.num_subsets} stacked subsets: pass "
                                   f"subset_index, ints ({batch_size},), one per batch row")
        return np.zeros(batch_size, np.int32)
    try:
        index = np.asarray(subset_index)
    except Exception:  # a traced value (jax raises on conversion): checked where it is used
        return subset_index
    return checked_rows(index, subset.num_subsets, batch_size, where).astype(np.int32)


def checked_rows(subset_index, num_subsets: int, batch_size: int, where: str) -> np.ndarray:
    """A concrete `subset_index` as int64 (batch_size,) after checking its
    shape, dtype and values in [0, num_subsets) (any stacked subset form's
    rows); raises DecodeInputError naming what is wrong."""
    index = np.asarray(subset_index)
    if index.shape != (batch_size,) or index.dtype.kind not in "iu":
        raise DecodeInputError(f"{where}: subset_index has shape {index.shape} and dtype "
                               f"{index.dtype}: expected ints ({batch_size},), one subset per "
                               "batch row")
    bad = np.flatnonzero((index < 0) | (index >= num_subsets))
    if bad.size:
        raise DecodeInputError(f"{where}: subset_index[{int(bad[0])}] = {int(index[bad[0]])}: "
                               f"expected a subset in [0, {num_subsets})")
    return index.astype(np.int64)


@overload
def stack_subsets(subsets: Sequence[Subset]) -> Subset: ...


@overload
def stack_subsets(subsets: Sequence[RankedSubset]) -> RankedSubset: ...


def stack_subsets(subsets):
    """R subsets of one set as one `Subset`, rows in order.

    Ranked subsets (the torch door's `ranked_subset`) stack as one
    `RankedSubset` (`RankedSubset.stack`).

    For per-row subsets in one batch (`subset_index` picks a row's subset).

    Depths whose bits every subset shares (unary layers) share the stacked
    array too.

    Parameters
    ----------
    subsets : sequence of Subset (or of RankedSubset)
        Non-empty; subsets of one compiled set (equal fingerprints), each
        holding R_i >= 1 subsets (itself possibly a stack).

    Returns
    -------
    Subset
        R = sum of R_i subsets, those of ``subsets[0]`` first: each array of
        ``live`` and ``ends`` is the inputs' uint32 (R_i, words) arrays
        concatenated along axis 0, uint32 (R, words) (None where theirs are
        None); ``sizes`` int64 (R,); the inputs' fingerprint. Decode over it
        with ``subset_index`` int32 (batch_size,), each row's subset in
        [0, R).

    Raises
    ------
    ConstraintSetError
        If `subsets` is empty, holds something other than a `Subset` (or
        mixes them with ranked subsets), or holds subsets of different
        compiled sets.
    """
    subsets = list(subsets)
    from static_compiler.item_bits.rank import RankedSubset  # (not loaded by a serving process)
    if subsets and all(isinstance(s, RankedSubset) for s in subsets):
        return RankedSubset.stack(subsets)
    if not subsets or not all(isinstance(s, Subset) for s in subsets):
        raise ConstraintSetError(f"stack_subsets: expected a non-empty list of Subset (or of "
                                 f"RankedSubset), got {[type(s).__name__ for s in subsets]}")
    prints = {s.fingerprint for s in subsets}
    if len(prints) > 1:
        raise ConstraintSetError("stack_subsets: the subsets come from different compiled sets "
                                 f"(fingerprints {sorted(prints)})")
    stacked: dict = {}

    def stack(arrays):
        if arrays[0] is None:
            return None
        key = tuple(id(a) for a in arrays)
        if key not in stacked:
            stacked[key] = np.concatenate(arrays, axis=0)
        return stacked[key]

    return Subset(live=tuple(stack([s.live[i] for s in subsets])
                             for i in range(len(subsets[0].live))),
                  ends=tuple(stack([s.ends[i] for s in subsets])
                             for i in range(len(subsets[0].ends))),
                  sizes=np.concatenate([s.sizes for s in subsets]),
                  fingerprint=subsets[0].fingerprint)
