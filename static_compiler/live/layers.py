"""How a trie's layers are read for its liveness bits: the numpy helpers
that the library and the serving loader share with
`static_compiler.live.liveness` (which computes the bits).

A trie is given as its layers: anything with ``indptr`` (S + 1,) row
pointers (child e of a layer is state e of the next depth), ``accepting``
bool (S,) or None, ``num_states``, ``num_edges`` and ``branch()``, such as
`TrieLayer` or `ir.Layer`. Here: a lowered layer's row pointers read back
from its tables (`row_pointers`, `exception_rows`); which steps get slot
bits and how many words each depth's bits take (`slot_step`, `bit_widths`,
`dense_slots`); and how liveness crosses each layer (`layer_walks`,
`is_unary`, `shared_depths`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Sequence

import numpy as np


class TrieLayer(NamedTuple):
    """One layer of a trie with implicit targets, for `liveness`."""

    indptr: np.ndarray
    accepting: Optional[np.ndarray] = None

    @property
    def num_states(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])

    def branch(self) -> np.ndarray:
        return np.diff(self.indptr.astype(np.int64))

    def branch_counts(self) -> np.ndarray:
        """int64 (max_branch + 1,): at b, how many states have b children."""
        return np.bincount(self.branch(), minlength=1)

    @property
    def has_accepting(self) -> bool:
        return self.accepting is not None


def row_pointers(kind: str, tables: dict, num_states: int) -> np.ndarray:
    """int64 (num_states + 1,): the row pointers of the first num_states
    states (all of them, or a prefix: what the IR text prints of a large
    layer) of a lowered layer of `kind` (a `LayoutKind` value), from its
    tables (see backend.lowering), reading only those rows' entries: the
    inverse of lowering for the rows, numpy only (the serving loader has no
    IR)."""
    if kind == "dense_rows":
        present = np.asarray(tables["next"][:num_states]) >= 0
        return np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int64)
    if kind == "csr":
        return np.asarray(tables["indptr"][:num_states + 1]).astype(np.int64)
    if kind == "unary":
        return np.arange(num_states + 1, dtype=np.int64)
    if kind == "near_unary":
        count = int(np.searchsorted(tables["ex_states"], num_states))  # those below num_states
        branch = np.ones(num_states, dtype=np.int64)
        branch[np.asarray(tables["ex_states"][:count]).astype(np.int64)] = \
            exception_rows(tables, count)[1]
        return np.concatenate([[0], np.cumsum(branch)])
    raise ValueError(f"layout kind {kind!r}")


EXCEPTION_TABLES = ("ex_starts", "ex_branch", "ex_bounds")
"""A near_unary layer's tables of its exceptions' rows besides ex_states:
ex_starts and ex_branch, or ex_bounds (X, 2) in artifacts before format
version 6."""


def exception_rows(tables: dict, count: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """(row starts, branches) int64 of a near_unary layer's first `count`
    (default all) exception states, from its ex_starts / ex_branch tables or
    the ex_bounds of older artifacts (numpy; `kernels.exception_rows` is the
    decoder's)."""
    end = None if count is None else int(count)
    if "ex_bounds" in tables:
        bounds = np.asarray(tables["ex_bounds"][:end]).astype(np.int64)
        return bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    return (np.asarray(tables["ex_starts"][:end]).astype(np.int64),
            np.asarray(tables["ex_branch"][:end]).astype(np.int64))


def slot_words(vocab_size: int) -> int:
    """W: uint32 words per state of slot bits (see `liveness`), ceil(V / 32)."""
    return -(-int(vocab_size) // 32)


SLOT_MIN_FILL = 0.5
"""A dense_rows step's children get slot bits when at least this share of
its (state, token) slots hold an edge, so slot bits cost at most 1 /
SLOT_MIN_FILL bits per child; sparser dense steps keep per-state bits."""


def slot_step(kind: str, num_states: int, num_next_states: int, vocab_size: int) -> bool:
    """Whether the children of a step of layout `kind` (num_states states,
    num_next_states children, as its tables hold them) get slot bits."""
    return kind == "dense_rows" and num_next_states >= SLOT_MIN_FILL * num_states * vocab_size


def bit_widths(num_states: Sequence[int], accepting: Sequence[bool], end_token: Optional[int],
               vocab_size: int = 0, dense: Sequence[int] = ()) -> tuple[tuple, tuple]:
    """(live widths for depths 1..depth, ends widths for depths 0..depth or
    None): the words per subset row of a `Subset`'s arrays, for a trie with
    num_states[d] states at depth d = 0..depth (as its tables hold them),
    accepting[d] whether some state at depth d < depth accepts, and `dense`
    the steps whose children get slot bits (`slot_step`:
    num_states[t] * slot_words(vocab_size) words)."""
    depth = len(num_states) - 1
    words = [-(-n // 32) for n in num_states]
    live = tuple(num_states[d - 1] * slot_words(vocab_size) if d - 1 in dense else words[d]
                 for d in range(1, depth + 1))
    ends = tuple(words[d] if end_token is not None and (d == depth or accepting[d]) else None
                 for d in range(depth + 1))
    return live, ends


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
its states gets its liveness by one gather (each state's first child) and a
fix-up of those states; others by a cumulative sum over the edges."""


@dataclasses.dataclass(frozen=True)
class LayerWalk:
    """How liveness crosses one layer from its children (see `liveness._child_live`):
    kind "unary" (state s has child s), "near" (`exceptions`: the states
    with other than one child, sorted) or "general" (`count_dtype`: the
    narrowest unsigned dtype, from uint16 up (numpy sums into uint8
    slowly), whose wrapping running count of live children still tells a
    row with live children from one without: the layer's widest row has
    fewer children than the dtype's largest value)."""

    kind: str
    exceptions: Optional[np.ndarray] = None
    count_dtype: type = np.uint32


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
        branch = layer.branch()
        ex = np.flatnonzero(branch != 1)
        if ex.size <= NEAR_UNARY_SHARE * layer.num_states:
            walks.append(LayerWalk("near", ex))
            continue
        widest = int(branch.max(initial=0))
        walks.append(LayerWalk("general", count_dtype=next(
            t for t in (np.uint16, np.uint32, np.uint64) if widest < np.iinfo(t).max)))
    return tuple(walks)
