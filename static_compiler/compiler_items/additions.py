"""Adding items to a compiled trie without rebuilding it
(`CompiledConstraints.update(add=...)`).

A trie's states are numbered, at each depth, in the lexicographic order of
the prefixes that reach them (`frontend.automaton_from_sorted_codes`), and
child e of a layer is state e of the next depth. New items are merged into
that order one depth at a time: their new edges are inserted into each
layer's sorted (state, token) order (`np.insert` at positions found by a
binary search within the parents' rows), which shifts the ids of the states
after them, and nothing is sorted but the added items themselves. Cost:
O(edges) array copies per layer plus O(added * depth * log branch).

Item ids stay: items that were in the set keep theirs, new items take the
next ids (`ItemIndex`: row_item grows by the added rows, item_state follows
the renumbering). Whether the merged trie still fits the compiled plan is
`fit_problems`' answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import as_token_matrix, sort_unique_rows
from static_compiler.frontend.sequences import check_set_rows
from static_compiler.ir import Automaton, Layer, LayoutKind, frozen
from static_compiler.item_bits import item_masks
from static_compiler.item_bits.layers import find_in_rows
from static_compiler.item_bits.state_order import InsertedOrder, item_order
from static_compiler.items.index import ItemIndex
from static_compiler.support.arrays import PieceArray, joined, materialized
from static_compiler.support.dtypes import index_dtype_for
from static_compiler.support.mapped import release_pages


@contextlib.contextmanager
def small_pages():
    """numpy allocations in the block get no MADV_HUGEPAGE. An addition
    allocates ~0.6 GB of new arrays at 1e7 items; where the kernel compacts
    memory synchronously to back madvised regions with huge pages
    (transparent huge pages with defrag "madvise", as on this machine),
    the first additions of a process stalled on it: 1.3-2.9 s, against at
    most 1.3 s without (`tools.bench.live`). numpy's switch is private
    (numpy >= 1.20) and process-wide; where it is missing nothing changes."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    previous = setter(False) if setter is not None else None
    try:
        yield
    finally:
        if setter is not None:
            setter(previous)


@dataclasses.dataclass(frozen=True)
class Merged:
    """What `merge_items` returns: the merged automaton (each layer keeps
    its old layout), its item index, report {"added": new items,
    "already_present": added sequences that were items, "restored":
    removed items added again}, and per layer the most children of a state
    that gained some (0 where none did), and the states with other than one
    child (None where the layer's layout is not near_unary)."""

    ir: Automaton
    items: ItemIndex
    report: dict
    widest: tuple
    exceptions: tuple = ()


def _grown_layers(ir: Automaton, depth: int) -> list:
    """The layers of `ir`, and empty ones past its depth up to `depth` (the
    old final states, which all accept, then no states)."""
    layers = list(ir.layers)
    for t in range(ir.depth, depth):
        n = ir.num_final_states if t == ir.depth else 0
        layers.append(Layer(indptr=frozen(np.zeros(n + 1, np.int64)),
                            tokens=frozen(np.zeros(0, ir.layers[0].tokens.dtype)),
                            accepting=frozen(np.ones(n, bool)) if n else None))
    return layers


def checked_additions(ir: Automaton, sequences, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(matrix int64 (n, Lmax), lengths int64 (n,)) of valid added sequences:
    tokens in [0, V), not the end token, and of the set's length for a
    fixed-length set (the checks `compile_constraints` runs, from
    `frontend`)."""
    try:
        mat, lengths, ragged = as_token_matrix(sequences)
    except ConstraintSetError as e:
        raise ConstraintSetError(f"{where}: {e}") from None
    check_set_rows(mat, lengths, ragged, ir, f"{where}: added",
                   " (compile with end_token=... for variable lengths)")
    return mat.astype(np.int64, copy=False), lengths


@dataclasses.dataclass(frozen=True, eq=False)
class LayerInsertion:
    """What merging added sequences changes at one depth t of a trie; old
    ids are the trie's before the merge, new ids after (all int64):

    new_states (a,) ascending: the old ids at depth t before which the
      depth's new states go (new state i gets new id new_states[i] + i).
    ending: new ids of the states at depth t where added sequences end.
    edge_at (e,) ascending: the old positions in layer t's (state, token)
      order before which its new edges go; new edge j becomes edge
      edge_at[j] + j and so enters new state edge_at[j] + j at depth t + 1
      (implicit targets). Empty at the last depth.
    tokens (e,): the new edges' tokens. parent (e,) ascending: the new ids
      of their source states."""

    new_states: np.ndarray
    ending: np.ndarray
    edge_at: np.ndarray
    tokens: np.ndarray
    parent: np.ndarray

    @property
    def new_ids(self) -> np.ndarray:
        return self.new_states + np.arange(self.new_states.shape[0])

    @functools.cached_property
    def gains(self) -> tuple[np.ndarray, np.ndarray]:
        """(states, counts): the new ids of the states that gain edges, and
        how many each gains (few: no array over the layer)."""
        return np.unique(self.parent, return_counts=True)


@dataclasses.dataclass(frozen=True, eq=False)
class Insertions:
    """Added sequences placed in a trie (`place_additions`): the old layers
    grown to the merged depth, a `LayerInsertion` per depth 0..depth, and
    per unique added sequence (sorted order) its length, the tokens matched
    in the old trie, its old state at each depth it reached (int64 (n,
    depth + 1)), its new end state; `inverse` maps the added rows to them."""

    depth: int
    layers: tuple
    at: tuple
    lengths: np.ndarray
    matched: np.ndarray
    old_state: np.ndarray
    end_state: np.ndarray
    inverse: np.ndarray


def place_additions(ir, sequences, where: str = "update") -> Insertions:
    """Where the token `sequences` go in `ir` (a trie: implicit targets; an
    `ir.Automaton` or a set's `subsets.TableTrie`): the `Insertions` both
    the automaton merge (`merge_items`) and the table merge
    (`table_additions`) apply. Raises ConstraintSetError for invalid
    sequences."""
    mat, lengths = checked_additions(ir, sequences, where)
    codes, lengths, inverse = sort_unique_rows(mat, lengths, ir.vocab_size, return_inverse=True)
    n, depth = codes.shape[0], max(ir.depth, int(lengths.max()))
    tokens = np.full((n, depth), -1, dtype=np.int64)  # -1 past a row's end
    tokens[:, :codes.shape[1]] = codes.astype(np.int64) - 1
    old = _grown_layers(ir, depth)
    V = ir.vocab_size

    # Walk the old trie: old_state[:, t] is the old state at depth t while
    # the prefix exists; `matched` tokens were found; a sequence that leaves
    # the trie leaves at the edge position `leave_at` (old ids).
    old_state = np.zeros((n, depth + 1), dtype=np.int64)
    leave_at = np.zeros(n, dtype=np.int64)
    matched = np.zeros(n, dtype=np.int64)
    walking = np.ones(n, dtype=bool)
    for t in range(depth):
        walking &= lengths > t
        idx = np.flatnonzero(walking)
        edge, found = find_in_rows(old[t].indptr, old[t].tokens, old_state[idx, t],
                                   tokens[idx, t])
        old_state[idx[found], t + 1] = edge[found]
        matched[idx[found]] += 1
        leave_at[idx[~found]] = edge[~found]
        walking[idx[~found]] = False
        release_pages(old[t].tokens)  # (a memory-mapped layer's: every page may be touched)

    at = []
    none = np.zeros(0, dtype=np.int64)
    state = np.zeros(n, dtype=np.int64)  # each sequence's state at depth t (new ids)
    end_state = np.full(n, -1, dtype=np.int64)
    ins_states = none  # new states at depth t: old ids they precede
    for t in range(depth + 1):
        on_old = matched >= t
        state[on_old] = _renumbered(old_state[on_old, t], ins_states)
        ending = lengths == t
        end_state[ending] = state[ending]
        if t == depth:
            at.append(LayerInsertion(ins_states, state[ending], none, none, none))
            break
        layer = old[t]
        # New edges: from sequences that leave the old trie at or before this layer.
        leaving = np.flatnonzero((lengths > t) & (matched <= t))
        keys, first, inv = np.unique(state[leaving] * V + tokens[leaving, t],
                                     return_index=True, return_inverse=True)
        src = leaving[first]  # one sequence per new edge
        parent = keys // V
        # An old parent's new edge goes where the search left its row; a new
        # parent's rows come after those of the old states before it.
        new_ids = ins_states + np.arange(ins_states.shape[0])
        before = ins_states[np.minimum(np.searchsorted(new_ids, parent),
                                       max(0, ins_states.shape[0] - 1))] \
            if ins_states.size else np.zeros(keys.shape[0], np.int64)
        ins = np.where(matched[src] == t, leave_at[src],
                       layer.indptr[np.minimum(before, layer.num_states)].astype(np.int64))
        at.append(LayerInsertion(ins_states, state[ending], ins, keys % V, parent))
        state[leaving] = (ins + np.arange(ins.shape[0]))[inv]  # new edge j is merged edge ins_j + j
        ins_states = ins
    return Insertions(depth, tuple(old), tuple(at), lengths, matched, old_state, end_state,
                      inverse)


def merged_branch(old_branch: np.ndarray, change: LayerInsertion, dtype) -> np.ndarray:
    """`dtype` (S',): the children of each state of a layer after `change`,
    from its children before, `old_branch` (S,)."""
    branch = np.insert(old_branch.astype(dtype, copy=False), change.new_states, 0)
    gaining, gained = change.gains
    branch[gaining] += gained.astype(dtype)
    return branch


def merge_items(ir, items: ItemIndex, sequences, where: str = "update") -> Merged:
    """`ir` (a trie: implicit targets; an `ir.Automaton` or a set's
    `subsets.TableTrie`, read from its tables) with the token `sequences`
    added (see module doc), each layer keeping its layout: the merged
    automaton and item index. Raises ConstraintSetError for invalid
    sequences."""
    placed = place_additions(ir, sequences, where)
    new_items, report = items_after(ir, items, placed)
    merged = merge_placed(ir, placed, new_items.num_unique)
    return dataclasses.replace(merged, items=new_items, report=report)


def merge_placed(ir, placed: Insertions, num_sequences: int) -> Merged:
    """The automaton of `ir` with the sequences `placed` in it (items and
    report left empty: `items_after` makes them)."""
    layers, widest, exceptions = [], [], []
    for t, (layer, change) in enumerate(zip(placed.layers, placed.at)):
        num_edges = layer.num_edges + change.edge_at.shape[0]
        index_dtype = index_dtype_for(num_edges)
        branch = None
        if _stays_unary(layer, change):
            # every state, old or new, keeps one child: no branch array to build
            indptr = np.arange(layer.num_states + change.new_states.shape[0] + 1,
                               dtype=index_dtype)
            widest.append(1 if change.edge_at.size else 0)
            exceptions.append(None)
        else:
            branch = merged_branch(np.diff(layer.indptr.astype(index_dtype, copy=False)),
                                   change, index_dtype)
            indptr = np.zeros(branch.shape[0] + 1, dtype=index_dtype)
            np.cumsum(branch, out=indptr[1:])
            widest.append(int(branch[change.parent].max(initial=0)))
            near = layer.layout is not None and layer.layout.kind == LayoutKind.NEAR_UNARY
            exceptions.append(int(np.count_nonzero(branch != 1)) if near else None)
        accepting = None
        if t > 0 and (layer.accepting is not None or change.ending.size):
            accepting = np.insert(layer.accepting if layer.accepting is not None
                                  else np.zeros(layer.num_states, bool), change.new_states, False)
            accepting[change.ending] = True
        layers.append(Layer(indptr=frozen(indptr),
                            tokens=frozen(np.insert(layer.tokens, change.edge_at,
                                                    change.tokens.astype(layer.tokens.dtype))),
                            accepting=None if accepting is None else frozen(accepting),
                            layout=layer.layout))
        if branch is not None:  # lowering reads it: give the layer the one built here
            object.__setattr__(layers[-1], "_branch", frozen(branch.astype(np.int64)))
    num_final = _old_count(ir, placed.depth) + placed.at[-1].new_states.shape[0]
    merged = Automaton(vocab_size=ir.vocab_size, layers=tuple(layers),
                       num_final_states=num_final, num_sequences=num_sequences,
                       end_token=ir.end_token)
    return Merged(merged, None, {}, tuple(widest), tuple(exceptions))


def _stays_unary(layer, change: LayerInsertion) -> bool:
    """Whether a unary layer (its layout says so: every state has one child)
    stays unary: the states that gain children are exactly the new ones,
    one child each."""
    gaining, gained = change.gains
    return layer.layout is not None and layer.layout.kind == LayoutKind.UNARY and \
        layer.accepting is None and gaining.shape == change.new_states.shape and \
        bool((gaining == change.new_ids).all()) and bool((gained == 1).all())


def _old_count(ir: Automaton, depth: int) -> int:
    """States the old trie has at `depth` (>= its own depth)."""
    return ir.num_final_states if depth == ir.depth else 0


def _old_item_at(ir: Automaton, items: ItemIndex, depth: int, states: np.ndarray) -> np.ndarray:
    """int64: the item ending at each old state at `depth`, -1 for none."""
    if items.item_depth is None:  # one length: in final state order (`ItemIndex`)
        if depth != ir.depth:
            return np.full(states.shape, -1, np.int64)
        order = item_order(items)
        return states.copy() if order is None else np.asarray(order[states]).astype(np.int64)
    return item_masks.items_ending_at(items, depth, ir.num_states_at(depth))[states].astype(
        np.int64)


def _renumbered(states: np.ndarray, inserted: np.ndarray) -> np.ndarray:
    """The new ids of old `states` at a depth where new states were placed
    before the old ids `inserted` (sorted): s + #(inserted <= s)."""
    if inserted.shape[0] == 0 or states.shape[0] == 0:
        return states
    lo, hi = int(states.min()), int(states.max())
    if states.shape[0] * np.log2(inserted.shape[0] + 1) > 4 * (hi - lo):  # one pass beats searching
        return states + count_at_most(inserted, lo, hi, states.dtype)[states - lo]
    return states + np.searchsorted(inserted, states, side="right").astype(states.dtype)


def count_at_most(values: np.ndarray, lo: int, hi: int, dtype=np.int64) -> np.ndarray:
    """`dtype` (hi - lo + 1,): at s - lo, #(values <= s) for ascending
    `values` (repeats allowed): a step per value in [lo, hi], written by
    one `np.repeat` (1.6x faster than a cumulative sum of counts at 1e7)."""
    first = int(np.searchsorted(values, lo, side="left"))
    inside = values[first:int(np.searchsorted(values, hi, side="right"))]
    steps = np.diff(inside - lo, prepend=0, append=hi - lo + 1)
    return np.repeat(np.arange(first, first + inside.shape[0] + 1, dtype=dtype), steps)


def items_after(ir, items: ItemIndex, placed: Insertions,
                lazy: bool = False) -> tuple[ItemIndex, dict]:
    """The `ItemIndex` of `ir` with the sequences `placed` added (ids stay;
    new items take the next ids, in sorted order), and the report {"added",
    "already_present", "restored"}. lazy: its arrays as
    `arrays.PieceArray`s, computed a range at a time from the old ones
    (possibly memory-mapped: an artifact's update streams them to files)."""
    lengths = placed.lengths
    ids = np.full(lengths.shape[0], -1, dtype=np.int64)
    present = np.flatnonzero((placed.matched == lengths) & (lengths <= ir.depth))
    for d in np.unique(lengths[present]).tolist():
        at = present[lengths[present] == d]
        ids[at] = _old_item_at(ir, items, d, placed.old_state[at, d])
    fresh = ids < 0
    added = int(fresh.sum())  # new ids are num_unique + 0.. in sorted order, as `fresh` lists them
    ids[fresh] = items.num_unique + np.arange(added)
    was = ids[~fresh]
    restored = 0 if items.removed is None else int(np.count_nonzero(items.removed[was]))
    report = {"added": added, "already_present": int(was.shape[0]) - restored,
              "restored": restored}
    old, num_unique = items.num_unique, items.num_unique + added
    inserted_at = [change.new_states for change in placed.at]
    new_states = placed.end_state[fresh].astype(np.int32)
    one_length = ir.end_token is None or items.item_depth is None  # every item at ir.depth

    def fill_state(out, start, stop):
        count = max(0, min(stop, old) - start)
        if count:
            states = np.arange(start, start + count, dtype=np.int32) \
                if items.item_state is None else \
                np.asarray(items.item_state[start:start + count]).astype(np.int32, copy=False)
            if one_length:
                out[:count] = _renumbered(states, inserted_at[ir.depth])
            else:
                depths = np.asarray(items.item_depth[start:start + count])
                for d in np.flatnonzero(np.bincount(depths)).tolist():  # (a few)
                    at = depths == d
                    out[:count][at] = _renumbered(states[at], inserted_at[d])
            release_pages(items.item_state, start * 4, (start + count) * 4)
        out[count:] = new_states[max(0, start - old):max(0, stop - old)]

    depth_of = lambda count: PieceArray(count, np.int32, lambda out, start, stop:  # noqa: ARG005
                                        out.fill(ir.depth))
    positions = dict(item_depth=None, item_state=None, state_item=None, state_inserted_at=None,
                     state_inserted_item=None)
    if ir.end_token is None and items.item_depth is None:
        # one length: the final states' items, the new ones inserted where
        # their states go (fresh items and their end states ascend alike)
        order = item_order(items)
        order = InsertedOrder.empty(old) if order is None else \
            order if isinstance(order, InsertedOrder) else InsertedOrder.of_array(order)
        order = order.with_insertions(inserted_at[ir.depth], new_states, ids[fresh])
        positions["state_inserted_at"], positions["state_inserted_item"] = order.at, order.item
    else:
        positions["item_state"] = PieceArray(num_unique, np.int32, fill_state)
        positions["item_depth"] = depth_of(num_unique) if ir.end_token is None else \
            joined(depth_of(old) if items.item_depth is None else items.item_depth,
                   lengths[fresh].astype(np.int32))
    removed = None
    if items.removed is not None:
        grown = joined(items.removed, np.zeros(added, bool))

        def fill_removed(out, start, stop):
            grown.fill_rows(out, start, stop)
            out[was[(was >= start) & (was < stop)] - start] = False  # restored
        removed = PieceArray(num_unique, bool, fill_removed)
    arrays = dict(row_item=joined(items.row_item, ids[placed.inverse].astype(np.int32)),
                  removed=removed, stale_rows=_stale_rows(items, was, placed.inverse.shape[0]),
                  **positions)
    if not lazy:
        arrays = {key: None if arr is None else materialized(arr) for key, arr in arrays.items()}
    return ItemIndex(num_unique=num_unique, **arrays), report


def _stale_rows(items: ItemIndex, was: np.ndarray, num_added: int):
    """The new index's stale_rows (`ItemIndex.stale_rows`): the old ones,
    and every row of an item that was removed and is added again now (`was`:
    the ids of the added sequences that were items), then `num_added` live
    rows; None while no item was ever added again. A `PieceArray`, a range
    of rows at a time (one bool per item aside: 1 GB at 1e9)."""
    restored = was[np.asarray(items.removed[was])] if items.removed is not None and was.size \
        else was[:0]
    if not restored.size and items.stale_rows is None:
        return None
    back = np.zeros(items.num_unique, bool)
    back[restored] = True
    old = items.num_items

    def fill_rows(out, start, stop):
        head = max(0, min(stop, old) - start)
        if head:
            np.take(back, np.asarray(items.row_item[start:start + head]), out=out[:head])
            if items.stale_rows is not None:
                out[:head] |= np.asarray(items.stale_rows[start:start + head])
        out[head:] = False

    return PieceArray(old + num_added, bool, fill_rows)


def inserted(old, count: int, at: np.ndarray, values, size: int, fill) -> PieceArray:
    """The first `count` entries of `old` (an array, possibly memory-mapped)
    with `values` inserted before the positions `at` (ascending, as
    `np.insert` takes them), padded with `fill` to `size`, in `old`'s dtype.
    A range of it reads only the old entries it holds."""
    k = at.shape[0]
    dest = at + np.arange(k)
    values = np.broadcast_to(np.asarray(values, old.dtype), (k,))
    total = count + k

    def fill_rows(out, start, stop):
        real = max(0, min(stop, total) - start)
        lo, hi = np.searchsorted(dest, [start, start + real])
        first, last = start - lo, start + real - hi  # the old entries in the range
        if hi > lo:
            keep = np.ones(real, bool)
            keep[dest[lo:hi] - start] = False
            out[:real][keep] = old[first:last]
            out[dest[lo:hi] - start] = values[lo:hi]
        else:
            out[:real] = old[first:last]
        release_pages(old, first * old.itemsize, last * old.itemsize)
        out[real:] = fill

    return PieceArray(size, old.dtype, fill_rows)


def fit_problems(outline, widest: tuple, exceptions: tuple, plan_ir) -> list[str]:
    """Why a merged trie does not fit the plan `plan_ir` (the compiled
    automaton or its summary, whose layouts the merged layers keep) was
    lowered for: one line per problem, [] when it fits (same table shapes,
    same programs). `outline`: the merged automaton or its summary (counts
    and accepting per layer); widest and exceptions per layer as `Merged`
    has them. Only states that gained children are looked at: the others
    fit already."""
    if outline.depth != plan_ir.depth:
        return [f"depth {plan_ir.depth} -> {outline.depth}"]
    problems = []
    for t, (layer, was, widest, exceptions) in enumerate(zip(outline.layers, plan_ir.layers,
                                                              widest, exceptions)):
        lay, where = was.layout, f"layer {t}"
        counts = (layer.num_states, layer.num_edges)
        if not lay.reserved and counts != (was.num_states, was.num_edges):
            problems.append(f"{where}: no capacity reserved ({was.num_states} -> "
                            f"{layer.num_states} states, {was.num_edges} -> {layer.num_edges} "
                            "edges)")
        elif lay.reserved and (counts[0] > lay.states_capacity or counts[1] > lay.edges_capacity):
            problems.append(f"{where}: {counts[0]} states / {counts[1]} edges exceed the "
                            f"capacity {lay.states_capacity}/{lay.edges_capacity}")
        elif lay.kind.sliced and widest > lay.k:
            problems.append(f"{where}: a state has {widest} children, the slice reads k={lay.k}")
        elif lay.kind == LayoutKind.UNARY and (widest > 1 or counts[0] != counts[1]):
            problems.append(f"{where}: unary layer gains a state with other than one child")
        elif lay.kind == LayoutKind.NEAR_UNARY and lay.reserved and exceptions > lay.exceptions:
            problems.append(f"{where}: {exceptions} states with other than one child exceed the "
                            f"room for {lay.exceptions}")
        elif layer.has_accepting != was.has_accepting:
            problems.append(f"{where}: gains accepting states")
    return problems
