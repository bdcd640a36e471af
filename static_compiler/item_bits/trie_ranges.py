"""Every trie state's items as one range of trie positions, read from the
layers' row pointers alone (no array per state): the other half of issue
54's subsets proportional to their item bits (`rank` holds the bits).

Trie order: see `rank`. With A_d(x) the accepting states before state x at
depth d (every state at the last depth accepts),

    lo(s) = offset(s) + G_d(s),   hi(s) = offset(s) + G_d(s + 1),
    G_d(x) = sum over d' >= d of A_d'(x_d'),  x_d = x, x_{d'+1} = indptr_d'[x_d'],
    offset(s) = sum over d' < d of A_d'(ancestor_d'(s) + 1),

and a decoder carries offset down a beam: offset(child) = offset(s) +
A_d(s + 1) (`child_offsets`). A fixed-length set has offset 0 and G the
composed row pointers to the last depth. An accepting state's own item is
at lo(s). A near_unary layer's row pointers come from `ExceptionRows` (a
rank over a bit per state marking its exceptions: O(1), not a binary
search), a unary layer's are the identity, a dense_rows layer's are
computed once (S + 1 entries, 1/V of its table). `trie_order`: where a
set's items lie in trie order; `depth_live`: a depth's per-state bits made
from a subset's rank bits (the hybrid's shallow depths).

numpy only; importable by the serving loader (no compiler module).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.item_bits.layers import NearRows, UnitRows
from static_compiler.item_bits.rank import ItemRanks, RankedSubset
from static_compiler.item_bits.state_order import InsertedOrder, item_order


def trie_order(items, layers: Optional["RangeLayers"] = None) -> InsertedOrder:
    """Where the unique sequences of `items` (an `ItemIndex`) lie in trie
    order, as an `InsertedOrder` over positions 0..N'-1 (module doc). A
    fixed-length set's is its final states' (`state_order.item_order`). A
    variable-length set's needs its `layers`: each item's position is the
    lo of its end state (`state_ranges`, the offsets carried down every
    depth's states), computed once per index (O(states + N' depth)); ids in
    order but for the added ones list only those."""
    count = int(items.num_unique)
    if items.item_depth is None:
        order = item_order(items)
        if order is None:
            return InsertedOrder.empty(count)
        return order if isinstance(order, InsertedOrder) else InsertedOrder.of_array(order)
    if layers is None:
        raise ConstraintSetError("trie_order: a variable-length set's order needs its layers "
                                 "(`range_layers`)")
    depth = np.asarray(items.item_depth).astype(np.int64)
    state = np.asarray(items.item_state).astype(np.int64)
    position = np.zeros(count, np.int64)
    ending = set(np.unique(depth).tolist())
    offsets = np.zeros(1, np.int64)  # every state's at this depth, carried down (no searches)
    for d in range(layers.depth + 1):
        if d in ending:
            at = depth == d
            position[at] = state_ranges(layers, d, state[at], offsets[state[at]])[0]
        if d < layers.depth:
            branch = np.diff(np.asarray(layers.rows[d]).astype(np.int64))
            offsets = np.repeat(child_offsets(layers, d, offsets, np.arange(branch.shape[0])),
                                branch)
    held = np.empty(count, np.int64)
    held[position] = np.arange(count)  # position -> item
    return InsertedOrder.of_array(held)


class ExceptionRows:
    """The row pointers of a near_unary layer of S states in O(1) reads an
    entry: indptr[s] = s + extra(r), r = the exceptions below s (a fine
    rank over a bit per state marking the exceptions), extra(r) = the extra
    children of the exceptions before exception r, read from the tables as
    ex_starts[r] - ex_states[r] (r < X; indptr[S] - S at X). Where
    `layers.NearRows` binary-searches the X exceptions (log2 X dependent
    reads), this reads 5 entries, for S / 8 bytes (+ S / 16 of word counts)
    per layer: the near_unary layers of a names set are most of its depth.
    rows: the layer's `NearRows` (its tables and exception ids)."""

    def __init__(self, rows, num_states: int):
        self.states = rows.states  # (the X real exceptions' ids, ascending)
        self.starts = rows.tables["ex_starts"]
        self.exceptions = ItemRanks.of_positions(np.asarray(self.states), int(num_states),
                                                 fine=True)
        self.end = int(rows[int(num_states)]) - int(num_states)
        self.shape = (int(num_states) + 1,)

    def extras(self, dtype=np.int64) -> np.ndarray:
        """`dtype` (X + 1,): extra(r) for every r in [0, X] (one subtraction
        over the tables, no gather)."""
        count = int(self.states.shape[0])
        out = np.empty(count + 1, dtype)
        np.subtract(self.starts[:count], self.states, out=out[:count], dtype=dtype,
                    casting="unsafe")
        out[count] = self.end
        return out

    def extra(self, r: np.ndarray) -> np.ndarray:
        """int64: extra(r) for exception counts r (ints in [0, X])."""
        count = int(self.states.shape[0])
        if count == 0:
            return np.full(np.shape(r), self.end, np.int64)
        at = np.minimum(r, count - 1)
        own = np.asarray(self.starts[at]).astype(np.int64) - \
            np.asarray(self.states[at]).astype(np.int64)
        return np.where(r < count, own, self.end)

    def __getitem__(self, index) -> np.ndarray:
        index = np.asarray(index, np.int64)
        return index + self.extra(self.exceptions.rank(index))

    def __array__(self, dtype=None, copy=None):
        whole = self[np.arange(self.shape[0])]
        return whole if dtype is None else whole.astype(dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class RangeLayers:
    """What `state_ranges` reads of a trie: rows, per layer d its row
    pointers (an array, or the `layers.UnitRows` / `layers.NearRows` a
    `TableLayer` answers entries of; dense_rows layers' computed once);
    accepting, per depth 0..depth-1 an `ItemRanks` (fine: three reads a
    rank) of its accepting bits or None (no state accepts);
    num_final_states."""

    rows: tuple
    accepting: tuple
    num_final_states: int

    @property
    def depth(self) -> int:
        return len(self.rows)

    def accepting_before(self, d: int, x: np.ndarray) -> Optional[np.ndarray]:
        """A_d(x): accepting states before x at depth d (None: none accept;
        the last depth: x)."""
        if d == self.depth:
            return x
        ranks = self.accepting[d]
        return None if ranks is None else ranks.rank(x)


def range_layers(layers: Sequence, num_final_states: int) -> RangeLayers:
    """The `RangeLayers` of a trie's `layers` (`TrieLayer`s, `ir.Layer`s or
    `TableLayer`s: implicit targets) ending in `num_final_states` states: a
    near_unary layer's rows as `ExceptionRows`."""
    rows, accepting = [], []
    for layer in layers:
        indptr = layer.indptr
        rows.append(ExceptionRows(indptr, layer.num_states) if isinstance(indptr, NearRows)
                    else indptr if hasattr(indptr, "range") or isinstance(indptr, np.ndarray)
                    else np.asarray(indptr))
        acc = layer.accepting
        accepting.append(None if acc is None or not np.any(acc) else
                         ItemRanks.of_mask(np.asarray(acc[:layer.num_states], bool), fine=True))
    return RangeLayers(tuple(rows), tuple(accepting), int(num_final_states))


@dataclasses.dataclass(frozen=True, eq=False)
class RangeTables:
    """What a decoder's range reads take of one set, in numpy, for a
    backend to place (`torch_backend.rank_kernels.range_tensors`,
    `jax_support.ranked_arrays.range_arrays`): rows, per layer None (unary:
    the identity), its row pointers int64 (S_d + 1,), or (the `ItemRanks`
    of its exception marks, extra (X + 1,), the exceptions' states (X,),
    where their rows start (X,)) (`ExceptionRows`); accepting, per depth
    0..depth - 1 an `ItemRanks` or None; counts, the trie's states per
    depth 0..depth; ends, per depth whether `Subset.ends` holds bits there;
    at int64 (K,), the added items' trie positions; num_items: N';
    layers: the `RangeLayers` they come from (`depth_bounds` reads it)."""

    rows: tuple
    accepting: tuple
    counts: tuple
    ends: tuple
    at: np.ndarray
    num_items: int
    layers: Optional[RangeLayers] = None


def range_tables(trie, order: InsertedOrder, dtype=np.int64) -> RangeTables:
    """The `RangeTables` of a set's trie (`rules.set_view.TableTrie` or
    `ir.Automaton`: its layers, final states and end token) and trie order
    (`trie_order`), index arrays of `dtype` (int64; a JAX door's int32:
    a table already of that dtype is taken as it is, no copy)."""
    layers = range_layers(trie.layers, trie.num_final_states)
    rows: list = []
    as_index = lambda a: np.asarray(a).astype(dtype, copy=False)  # noqa: E731
    for r in layers.rows:
        if isinstance(r, UnitRows):
            rows.append(None)
        elif isinstance(r, ExceptionRows):  # (rows start at the exceptions' ex_starts)
            count = int(r.states.shape[0])
            rows.append((r.exceptions, r.extras(dtype), as_index(r.states),
                         as_index(r.starts[:count])))
        else:
            rows.append(as_index(r))
    end = trie.end_token is not None
    ends = tuple(end and (d == layers.depth or trie.layers[d].accepting is not None)
                 for d in range(layers.depth + 1))
    counts = tuple(int(layer.num_states) for layer in trie.layers) + (int(trie.num_final_states),)
    return RangeTables(tuple(rows), layers.accepting, counts, ends,
                       np.asarray(order.at, np.int64), int(order.count), layers)


def below(layers: RangeLayers, depth: int, states) -> np.ndarray:
    """G_depth(states), int64: the items ending at or below depth `depth`
    under the states before `states` (ints in [0, S_depth]), by composing
    row pointers down (one gather per layer and state; none for a unary
    layer's `UnitRows`)."""
    x = np.asarray(states, dtype=np.int64)
    total = np.zeros(x.shape, np.int64)
    for d in range(depth, layers.depth + 1):
        here = layers.accepting_before(d, x)
        if here is not None:
            total += here
        if d < layers.depth:
            x = np.asarray(layers.rows[d][x], dtype=np.int64)
    return total


def child_offsets(layers: RangeLayers, depth: int, offsets, states) -> np.ndarray:
    """The offsets of the children of `states` at `depth` whose own offsets
    are `offsets`: what a decoder carries down a beam (module doc)."""
    offsets = np.asarray(offsets, np.int64)
    here = layers.accepting_before(depth, np.asarray(states, np.int64) + 1)
    return offsets if here is None else offsets + here


def offsets_of(layers: RangeLayers, depth: int, states) -> np.ndarray:
    """offset(states) at `depth`, from their ancestors (a binary search per
    layer above: the host's way; a decoder carries it, `child_offsets`)."""
    x = np.asarray(states, dtype=np.int64)
    if all(a is None for a in layers.accepting[:depth]):
        return np.zeros(x.shape, np.int64)
    chain = [x]
    for d in range(depth - 1, -1, -1):
        chain.append(np.searchsorted(np.asarray(layers.rows[d]), chain[-1], side="right") - 1)
    out = np.zeros(x.shape, np.int64)
    for d, parent in zip(range(depth - 1, -1, -1), chain[1:]):
        out = child_offsets(layers, d, out, parent)
    return out


def state_ranges(layers: RangeLayers, depth: int, states, offsets=None) -> tuple:
    """(lo, hi) int64: the trie positions of the items at or below `states`
    (ints) at `depth` (0..depth of the trie), given their `offsets` (None:
    `offsets_of`). An accepting state's own item is at lo."""
    x = np.asarray(states, dtype=np.int64)
    base = offsets_of(layers, depth, x) if offsets is None else np.asarray(offsets, np.int64)
    bounds = below(layers, depth, np.stack([x, x + 1]))
    return base + bounds[0], base + bounds[1]


@dataclasses.dataclass(frozen=True, eq=False)
class DepthBounds:
    """The item ranges of every state at one depth, made once per set, for
    the shallow depths whose liveness bits a subset computes from its rank
    bits (`depth_live`: few states, many candidates per beam there). lo
    int64: S + 1 consecutive bounds where each state's range ends where the
    next one's starts (no item ends above this depth between them: every
    fixed-length set), hi None; else lo, hi int64 (S,)."""

    depth: int
    lo: np.ndarray
    hi: Optional[np.ndarray]

    @property
    def num_states(self) -> int:
        return int(self.lo.shape[0]) - (1 if self.hi is None else 0)


def depth_bounds(layers: RangeLayers, depth: int) -> DepthBounds:
    """The `DepthBounds` of every state at `depth` (1..layers.depth), the
    offsets carried down from the root (O(states above + S_depth x layers
    below))."""
    offsets = np.zeros(1, np.int64)
    for d in range(depth):
        rows = np.asarray(layers.rows[d]).astype(np.int64)
        offsets = np.repeat(child_offsets(layers, d, offsets, np.arange(rows.shape[0] - 1)),
                            np.diff(rows))
    count = int(offsets.shape[0])
    lo, hi = state_ranges(layers, depth, np.arange(count), offsets)
    if count == 0 or np.array_equal(lo[1:], hi[:-1]):
        edges = np.append(lo, hi[-1:]) if count else np.zeros(1, np.int64)
        return DepthBounds(depth, edges, None)
    return DepthBounds(depth, lo, hi)


def depth_live(ranked: RankedSubset, bounds: DepthBounds) -> np.ndarray:
    """bool (R, S): whether each state at `bounds.depth` has a selected item
    at or below it, in each of `ranked`'s rows: S + 1 (or 2 S) ranks a row,
    no walk up the trie (`liveness`'s bits of that depth)."""
    rows = np.arange(ranked.num_subsets)[:, None]
    if bounds.hi is None:
        ranks = ranked.prefix(bounds.lo[None, :], rows)
        return ranks[:, 1:] > ranks[:, :-1]
    return ranked.prefix(bounds.hi[None, :], rows) > ranked.prefix(bounds.lo[None, :], rows)
