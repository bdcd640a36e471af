"""How a trie's layers are read for its liveness bits: the numpy helpers
that the library and the serving loader share with
`static_compiler.item_bits.liveness` (which computes the bits).

A trie is given as its layers: anything with ``indptr`` (S + 1,) row
pointers (child e of a layer is state e of the next depth), ``accepting``
bool (S,) or None, ``num_states``, ``num_edges`` and ``branch()``, such as
`TrieLayer` or `ir.Layer`. Here: a lowered layer's row pointers read back
from its tables (`TableLayer`, over `lowered.tables`); how many words
each depth's bits take (`bit_widths`, `slot_words`,
`dense_slots`); and how liveness crosses each layer (`layer_walks`,
`is_unary`, `shared_depths`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np

from static_compiler.lowered.tables import EXCEPTION_TABLES, exception_rows, row_pointers
from static_compiler.support.arrays import search_sorted
from static_compiler.support.mapped import release_pages


class _Rows:
    """What a trie layer with row pointers `indptr` (S + 1,) answers."""

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])

    def branch(self) -> np.ndarray:
        return np.diff(self.indptr.astype(np.int64))


@dataclasses.dataclass(frozen=True, eq=False)
class TrieLayer(_Rows):
    """One layer of a trie with implicit targets, for `liveness`."""

    indptr: np.ndarray
    accepting: Optional[np.ndarray] = None

    @property
    def num_states(self) -> int:
        return int(self.indptr.shape[0]) - 1

    def branch_counts(self) -> np.ndarray:
        """int64 (max_branch + 1,): at b, how many states have b children."""
        return np.bincount(self.branch(), minlength=1)

    @property
    def has_accepting(self) -> bool:
        return self.accepting is not None




class _VirtualRows:
    """Row pointers (S + 1,) int64 answered without an array of S + 1
    entries (8 GB at 1e9 states): indexing with ints or int arrays computes
    the entries asked for (`_rows`); slices and numpy functions see the whole
    array (`_whole_array`)."""

    def __init__(self, num_states: int):
        self.shape, self.dtype = (int(num_states) + 1,), np.dtype(np.int64)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._whole_array()[index]
        index = np.asarray(index, dtype=np.int64)
        n = self.shape[0]
        if ((index < -n) | (index >= n)).any():
            raise IndexError(f"row pointer index out of range for {n} entries")
        out = self._rows(np.where(index < 0, index + n, index))
        return out if out.ndim else int(out)

    def __array__(self, dtype=None, copy=None):
        whole = self._whole_array()
        return whole if dtype is None else whole.astype(dtype)

    def astype(self, dtype, copy: bool = True) -> np.ndarray:  # noqa: ARG002 (numpy's signature)
        return np.asarray(self, dtype=dtype)

    def range(self, start: int, stop: int) -> np.ndarray:
        """int64 (stop - start + 1,): entries start..stop (0 <= start <=
        stop < len)."""
        return self._rows(np.arange(start, stop + 1, dtype=np.int64))


def state_ranges(num_states: int, chunk: int, indptr=None, num_children: int = 0) -> list:
    """[(start, stop)] ranges of a layer's states, at most `chunk` states
    each and, given row pointers `indptr` (an array: rows can be wide), cut
    again where they pass every `chunk` children of `num_children`: how a
    large layer is read a range at a time."""
    bounds = np.arange(0, num_states, chunk, dtype=np.int64)
    if indptr is not None:
        cuts = np.searchsorted(indptr, np.arange(chunk, num_children, chunk))
        bounds = np.union1d(bounds, np.minimum(cuts, num_states))
    bounds = np.append(bounds[bounds < num_states], num_states)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def row_range(indptr, start: int, stop: int) -> np.ndarray:
    """int64 (stop - start + 1,): entries start..stop of row pointers
    `indptr` (an array, or `_VirtualRows`, which compute the range alone)."""
    if isinstance(indptr, _VirtualRows):
        return indptr.range(start, stop)
    return np.asarray(indptr[start:stop + 1]).astype(np.int64)


class NearRows(_VirtualRows):
    """The row pointers of a near_unary layer's first `num_states` states,
    from its exception tables, read where asked (mapped tables stay mapped:
    no copy of them, 0.4 GB of fresh pages at 1e9). Rows lie in state order
    with one child per state between exceptions, so indptr[s] = s + the
    extra children (branch - 1) of the exceptions below s (a binary search
    over the X exceptions), and exception i's own extra is its row start less
    its id. The whole array is built on its first read as a whole and kept."""

    def __init__(self, tables: dict, num_states: int):
        super().__init__(num_states)
        self.tables = tables
        ex = tables["ex_states"]
        real = search_sorted(ex, num_states)
        self.states = ex[:real]  # (searched with keys of its dtype)
        self._starts = exception_rows(tables, real, starts_only=True)
        self._end = 0  # the extra children of all the exceptions
        if real:
            start, branch = exception_rows({k: v[real - 1:real] for k, v in tables.items()
                                            if k in EXCEPTION_TABLES})
            self._end = int(start[0] + branch[0]) - int(self.states[real - 1]) - 1
        self._whole = None

    def _extra(self, below: np.ndarray) -> np.ndarray:
        """int64: the extra children of the exceptions before exception
        `below` (ints in [0, X]: X is past them all)."""
        real = self.states.shape[0]
        if real == 0:
            return np.zeros(np.shape(below), np.int64)
        at = np.minimum(below, real - 1)
        extra = np.asarray(self._starts[at]).astype(np.int64) - self.states[at]
        return np.where(below < real, extra, self._end)

    def _extra_range(self, lo: int, hi: int) -> np.ndarray:
        """`_extra` of exceptions lo..hi, the mapped pages read dropped again."""
        out = self._extra(np.arange(lo, hi + 1))
        self.release(lo, hi)
        return out

    def exception_range(self, start: int, stop: int) -> tuple:
        """(first, last, ids, starts, ends) of states start..stop - 1: the
        row pointers at start and stop, and the exceptions among them (int64
        ids) with their rows [starts, ends), from the exceptions' running
        extra children alone (no search per exception)."""
        lo, hi = (int(i) for i in self._find([start, stop]))
        ids = np.asarray(self.states[lo:hi]).astype(np.int64)
        extra = self._extra_range(lo, hi)
        return (start + int(extra[0]), stop + int(extra[-1]), ids, ids + extra[:-1],
                ids + extra[1:] + 1)

    def exception_tables(self, start: int, stop: int) -> tuple:
        """(lo, hi, states, starts, end_extra) of states start..stop - 1, as
        `bit_kernels.near_table_rows_any` reads them: the exceptions lo..hi
        - 1 among them; their ids and row starts, then the next exception's
        if there is one (read-only views of the tables, mapped ones included:
        no copy; int32 or int64, a narrower or mixed pair as int64 copies of
        the range); the extra children of all the exceptions.
        `release(lo, hi)` drops the pages read again."""
        lo, hi = (int(i) for i in self._find([start, stop]))
        end = min(hi + 1, self.states.shape[0])
        pair = [np.asarray(table[lo:end]) for table in (self.states, self._starts)]
        if pair[0].dtype != pair[1].dtype or pair[0].dtype not in (np.int32, np.int64):
            pair = [part.astype(np.int64) for part in pair]
        views = []
        for part in pair:
            view = part.view()
            view.flags.writeable = False  # (one compiled signature, mapped or not)
            views.append(view)
        return lo, hi, views[0], views[1], self._end

    def release(self, lo: int, hi: int) -> None:
        """Drops exceptions lo..hi's mapped pages (read by a range)."""
        for table in (self._starts, self.states):
            release_pages(table, lo * table.itemsize, (hi + 1) * table.itemsize)

    def _find(self, index) -> np.ndarray:
        """How many exceptions lie below each of `index` (ints)."""
        return search_sorted(self.states, index)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        if self._whole is not None:
            return self._whole[index]
        return index + self._extra(self._find(index))

    def _whole_array(self) -> np.ndarray:
        if self._whole is None:
            self._whole = row_pointers("near_unary", self.tables, self.shape[0] - 1)
        return self._whole

    def range(self, start: int, stop: int) -> np.ndarray:
        # start's own entry, then one child per state plus each exception's
        # extra children past it: a cumulative sum over the range, no search
        # per entry (a walk over 1e9 states reads every range once)
        if self._whole is not None:
            return self._whole[start:stop + 1]
        lo, hi = (int(i) for i in self._find([start, stop]))
        extra = self._extra_range(lo, hi)
        steps = np.ones(stop - start + 1, dtype=np.int64)
        steps[0] = start + extra[0]
        steps[np.asarray(self.states[lo:hi]) - start + 1] += np.diff(extra)
        return np.cumsum(steps, out=steps)


class UnitRows(_VirtualRows):
    """The row pointers of a layer whose state s has the one child s (a
    unary layer): indptr[s] = s."""

    def _rows(self, index: np.ndarray) -> np.ndarray:
        return index

    def _whole_array(self) -> np.ndarray:
        return np.arange(self.shape[0], dtype=np.int64)

    def range(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop + 1, dtype=np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class TableLayer(_Rows):
    """One lowered layer of a trie (implicit targets) read as rows from its
    tables, never rebuilt as an `ir.Layer`: what subsets, removals and item
    lookups of a set held in its tables (a `Shards` build, an artifact) read.
    Its states are the first `num_states` of the tables' (the trie's
    count, or all of them: states padded to a reserved capacity have no
    children and accept nothing). Each array is read on first use and kept:
    indptr (S + 1,) (csr: the table's own row pointers, in their dtype;
    unary and near_unary: `UnitRows` / `NearRows`, computed per entry),
    accepting bool (S,) or None, tokens (E,) in (state, token) order;
    histogram, the branch histogram (`branch_counts`) where a summary
    records it, else read from the tables on first use."""

    kind: str
    tables: dict
    num_states: int
    implicit_targets: bool = True
    layout: object = None  # the `ir.Layout` it was lowered with, where known
    histogram: Optional[np.ndarray] = None

    @functools.cached_property
    def indptr(self) -> np.ndarray:
        if self.kind == "csr":
            return np.asarray(self.tables["indptr"][:self.num_states + 1])
        if self.kind == "unary":
            return UnitRows(self.num_states)
        if self.kind == "near_unary":
            return NearRows(self.tables, self.num_states)
        return row_pointers(self.kind, self.tables, self.num_states)

    def exception_states(self) -> np.ndarray:
        """int64: the states with other than one child, ascending (read
        from the exception table of a near_unary layer)."""
        if self.kind == "near_unary":
            return self.indptr.states
        if self.kind == "unary":
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.branch() != 1)

    @functools.cached_property
    def accepting(self) -> Optional[np.ndarray]:
        acc = self.tables.get("accepting")
        return None if acc is None else np.asarray(acc[:self.num_states])

    @functools.cached_property
    def tokens(self) -> np.ndarray:
        if self.kind == "dense_rows":  # each row's columns that have a child, in order
            table = np.asarray(self.tables["next"][:self.num_states])
            V = table.shape[1]
            columns = np.arange(V, dtype=np.uint16 if V <= 1 << 16 else np.uint32)
            return np.broadcast_to(columns, table.shape)[table >= 0]
        tokens = self.tables["tokens"]
        # (a memory-mapped table stays one: its readers drop pages they read)
        return tokens[:self.num_edges] if isinstance(tokens, np.ndarray) else \
            np.asarray(tokens[:self.num_edges])

    def branch_counts(self) -> np.ndarray:
        return self._branch_counts

    @functools.cached_property
    def _branch_counts(self) -> np.ndarray:
        if self.histogram is not None:
            return np.asarray(self.histogram, dtype=np.int64)
        return table_branch_counts(self.kind, self.tables, self.num_states)

    @property
    def has_accepting(self) -> bool:
        return "accepting" in self.tables


BRANCH_CHUNK = 1 << 22
"""States read at a time by `table_branch_counts` (bounded memory on large
or memory-mapped tables)."""


def table_branch_counts(kind: str, tables: dict, num_states: int) -> np.ndarray:
    """int64 (max_branch + 1,): at b, how many of the first `num_states`
    states of a lowered layer have b children, read from its tables a chunk
    at a time (never a whole row-pointer array): what an artifact without a
    recorded histogram (format version < 7) gives its summary."""
    counts = np.zeros(1, np.int64)

    def add(branch):
        nonlocal counts
        more = np.bincount(branch, minlength=counts.shape[0])
        more[:counts.shape[0]] += counts
        counts = more

    if kind in ("unary", "near_unary"):  # one child each, but a near_unary layer's exceptions
        real = search_sorted(tables["ex_states"], num_states) if kind == "near_unary" \
            else 0
        if real:
            add(exception_rows(tables, real)[1])
        if counts.shape[0] < 2:
            counts = np.append(counts, np.zeros(2 - counts.shape[0], np.int64))
        counts[1] += num_states - real
        return counts
    for start in range(0, num_states, BRANCH_CHUNK):
        stop = min(num_states, start + BRANCH_CHUNK)
        if kind == "csr":
            add(np.diff(np.asarray(tables["indptr"][start:stop + 1]).astype(np.int64)))
        else:  # dense_rows
            add((np.asarray(tables["next"][start:stop]) >= 0).sum(axis=1))
    return counts


def table_layers(steps: Sequence[tuple], tables: Sequence[dict]) -> list:
    """The `TableLayer`s of a lowered set: steps, (kind, num_states,
    explicit_targets, branch histogram or None) per layer as its plan and
    summary record them; tables, one dict of arrays per layer."""
    return [TableLayer(str(getattr(kind, "value", kind)), tabs, int(num_states), not explicit,
                       histogram=histogram)
            for (kind, num_states, explicit, histogram), tabs in zip(steps, tables)]


def find_in_rows(indptr: np.ndarray, tokens: np.ndarray, states: np.ndarray,
                 want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(edge int64, found bool) for each (states[i], want[i]): the edge with
    that token in the state's row (rows indptr[s]:indptr[s + 1] of `tokens`,
    sorted) if found, else where it would be inserted to keep the row
    sorted. A binary search within the rows, all pairs at once (no key array
    over the layer)."""
    lo = indptr[states].astype(np.int64)
    end = indptr[states + 1].astype(np.int64)
    hi = end.copy()
    last = max(0, tokens.shape[0] - 1)
    while True:
        open_ = lo < hi
        if not open_.any():
            break
        mid = (lo + hi) // 2
        below = open_ & (tokens[np.minimum(mid, last)] < want)
        lo = np.where(below, mid + 1, lo)
        hi = np.where(open_ & ~below, mid, hi)
    found = lo < end
    found[found] = tokens[lo[found]] == want[found]
    return lo, found






def slot_words(vocab_size: int) -> int:
    """W: uint32 words per state of slot bits (see `liveness`), ceil(V / 32)."""
    return -(-int(vocab_size) // 32)






def bit_widths(num_states: Sequence[int], accepting: Sequence[bool], end_token: Optional[int],
               vocab_size: int = 0, dense: Sequence[int] = ()) -> tuple[tuple, tuple]:
    """(live widths for depths 1..depth, ends widths for depths 0..depth or
    None): the words per subset row of a `Subset`'s arrays, for a trie with
    num_states[d] states at depth d = 0..depth (as its tables hold them),
    accepting[d] whether some state at depth d < depth accepts, and `dense`
    the steps whose children get slot bits (`lowered.plan.slot_step`:
    num_states[t] * slot_words(vocab_size) words)."""
    depth = len(num_states) - 1
    words = [-(-n // 32) for n in num_states]
    live = tuple(num_states[d - 1] * slot_words(vocab_size) if d - 1 in dense else words[d]
                 for d in range(1, depth + 1))
    ends = tuple(words[d] if end_token is not None and (d == depth or accepting[d]) else None
                 for d in range(depth + 1))
    return live, ends


def plan_bit_widths(plan) -> tuple[tuple, tuple]:
    """`bit_widths` of a lowered `lowered.plan.Plan`: the words per subset
    row of the live and ends bits (slot bits for the children of dense_rows
    steps). numpy only, so reports need no jax."""
    from static_compiler.lowered.plan import slot_steps

    states = [s.num_states for s in plan.steps] + [plan.steps[-1].num_next_states]
    accepting = [s.has_accepting for s in plan.steps] + [True]
    return bit_widths(states, accepting, plan.end_token, plan.vocab_size, slot_steps(plan))


def dense_slots(next_table: np.ndarray) -> np.ndarray:
    """bool (rows, 32 * W): the (state, token) slots of a dense_rows table
    `next` int (rows, V) that hold an edge (next >= 0), False past V. In
    row-major order these slots are the layer's edges in order (a trie lists
    each state's children by token), so a subset's slot bits are its
    children's bits scattered to them."""
    rows, V = next_table.shape
    present = np.zeros((rows, 32 * slot_words(V)), dtype=bool)
    present[:, :V] = np.asarray(next_table) >= 0
    return present


NEAR_UNARY_SHARE = 0.25
"""A layer whose states with other than one child are at most this share of
its states is walked as near-unary (bit copies between those states, which
it lists); others test every row."""


@dataclasses.dataclass(frozen=True)
class LayerWalk:
    """How liveness crosses one layer from its children (see `layer_walk.child_live`):
    kind "unary" (state s has child s), "near" (`exceptions`: the states
    with other than one child, sorted) or "general" (every row tested)."""

    kind: str
    exceptions: Optional[np.ndarray] = None


def is_unary(layer) -> bool:
    """Whether state s of `layer` has exactly one child, state s, and no
    state accepts: decided from the structure (every state's branch is 1),
    never from counts alone. Equal state and edge counts are not enough:
    rows padded to a reserved capacity, or the absent slots of a dense
    step, are states without children, and then some other state has
    several. `layer`: a `TrieLayer`, an `ir.Layer` or an `ir.LayerSummary`
    (anything with num_states, num_edges, has_accepting and
    branch_counts(); O(1) when the counts differ, else one pass)."""
    if layer.has_accepting or layer.num_edges != layer.num_states:
        return False
    counts = layer.branch_counts()
    return counts.shape[0] > 1 and int(counts[1]) == layer.num_states or layer.num_states == 0


def shared_depths(layers: Sequence, slot_steps: Sequence[int],
                  state_counts: Optional[Sequence] = None) -> frozenset:
    """The depths d whose bits are depth d + 1's, held once: layer d is
    unary, neither depth has slot bits (`slot_steps`: the steps whose
    children do), and the tables hold as many states at both
    (`state_counts` per depth 0..depth; None: the trie's)."""
    return frozenset(d for d in range(1, len(layers)) if is_unary(layers[d]) and
                     not {d - 1, d} & set(slot_steps) and
                     (state_counts is None or state_counts[d] == state_counts[d + 1]))


def layer_walks(layers: Sequence) -> tuple:
    """One `LayerWalk` per layer (`TrieLayer`s or `ir.Layer`s): computed once
    per compiled set (O(edges))."""
    walks = []
    for layer in layers:
        if is_unary(layer):
            walks.append(LayerWalk("unary"))
            continue
        counts = layer.branch_counts()
        exceptions = layer.num_states - (int(counts[1]) if counts.shape[0] > 1 else 0)
        if exceptions <= NEAR_UNARY_SHARE * layer.num_states:
            ex = layer.exception_states() if hasattr(layer, "exception_states") \
                else np.flatnonzero(layer.branch() != 1)
            walks.append(LayerWalk("near", ex))
            continue
        walks.append(LayerWalk("general"))
    return tuple(walks)
