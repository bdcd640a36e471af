"""Merging equivalent states layer by layer (suffix sharing, a DAFSA): the
algorithm behind the `minimize` pass and the graph frontend's last step.
It sits below both (it needs only the IR and the cost model), so the graph
frontend does not reach up into the passes.

Two states at the same depth are equivalent when both accept or both do not,
and their rows hold the same (token, class of target) pairs. Classes are
computed bottom-up: every final state (depth `depth`) is one class; a row's
signature at depth t uses the classes of depth t + 1. Grouping is vectorized:
each row gets a 64-bit hash (sum of a mixed hash of its (token, class) pairs,
so no Python loop over states), rows are grouped by (accepting, branch, hash),
and every row is then compared edge by edge with its group's first row; a row
that differs (a hash collision) splits off and the check repeats. The result
is exact whatever the hash; a good hash needs one round.

The minimized automaton is numbered top-down in first-appearance order
(breadth first, children in token order), so a layer whose targets are all
distinct keeps implicit targets and only shared states cost explicit
targets. Final states cost no table, so they are not merged: each edge of
the last layer keeps its own final state (implicit targets there); they
are all equivalent by definition.

Explicit targets cost bytes: a tree of random Semantic IDs shares almost
nothing and grows when minimized, while entity names share suffixes ("...
WITH ACUTE") and shrink. The pass therefore compares the cost model's
estimate (`estimated_bytes`: each layer at its smallest candidate layout,
packed dtypes) and keeps the input unless the minimized automaton is
smaller; `force=True` always minimizes. `minimize_automaton` returns the
before/after numbers (`MinimizeStats`) for reports.

It runs before choose-layout (it rejects an IR that already has layouts).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton, Layer
from static_compiler.ir.cost_model import estimated_bytes
from static_compiler.support.dtypes import index_dtype_for


@dataclasses.dataclass(frozen=True)
class MinimizeStats:
    """Sizes before and after minimization.

    states/edges count every state (final states included) and every edge;
    bytes are `estimated_bytes` (cost model, packed dtypes). `applied` says
    whether the minimized automaton was kept."""

    states_before: int
    states_after: int
    edges_before: int
    edges_after: int
    bytes_before: int
    bytes_after: int
    applied: bool

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: uint64 (n,) -> well-mixed uint64 (n,)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _group(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups equal values of `key` (integer (n,)).

    Returns (ids int64 (n,), first int64 (C,)): group ids numbered by first
    occurrence, and the first index of each group (ascending)."""
    n = key.size
    order = np.argsort(key)
    sorted_key = key[order]
    starts = np.empty(n, dtype=bool)
    starts[:1] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=starts[1:])
    group_start = np.flatnonzero(starts)
    first_of_group = np.minimum.reduceat(order, group_start) if n else order
    # Number groups by first occurrence without a second sort: firsts are distinct indices.
    is_first = np.zeros(n, dtype=bool)
    is_first[first_of_group] = True
    rank = np.cumsum(is_first) - 1
    ids = np.empty(n, dtype=np.int64)
    ids[order] = rank[first_of_group][np.cumsum(starts) - 1]
    return ids, np.flatnonzero(is_first)


def _row_hash(pairs: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """uint64 (S,): order-free hash of each row's pair ids (rows are sorted
    by token, so the set of pairs identifies the row)."""
    csum = np.zeros(pairs.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(_mix64(pairs), out=csum[1:])
        return csum[indptr[1:]] - csum[indptr[:-1]]


def equal_row_classes(pairs: np.ndarray, indptr: np.ndarray, accepting: np.ndarray,
                      row_hash: Callable = _row_hash) -> tuple[np.ndarray, np.ndarray]:
    """Classes of equal rows (same accepting flag, same pairs in order).

    Args:
      pairs: int64 (E,): one id per edge for its (token, target class).
      indptr: int64 (S + 1,) row pointers.
      accepting: bool (S,).
      row_hash: (pairs, indptr) -> uint64 (S,); equal rows must hash equal.
        Collisions only cost extra rounds (tests pass a constant hash).
    Returns:
      (classes int64 (S,) numbered by first occurrence, first int64 (C,):
      the first state of each class)."""
    S = indptr.size - 1
    branch = np.diff(indptr)
    with np.errstate(over="ignore"):
        key = _mix64(row_hash(pairs, indptr) ^ _mix64(branch * 2 + accepting))
    classes, first = _group(key)
    row_of_edge = np.repeat(np.arange(S), branch)
    offset = np.arange(pairs.size) - indptr[row_of_edge]
    while True:
        rep = first[classes]
        bad_row = (branch != branch[rep]) | (accepting != accepting[rep])
        # Compare edge by edge with the class's first row (same branch only).
        rep_edge = np.minimum(indptr[rep[row_of_edge]] + offset, max(pairs.size - 1, 0))
        differs = (pairs != pairs[rep_edge]) & ~bad_row[row_of_edge]
        bad_row[row_of_edge[differs]] = True
        if not bad_row.any():
            return classes, first
        # Equal rows agree on "differs from the class's first row", so this
        # split is sound; each first row stays, so every round adds a class.
        classes, first = _group(classes * 2 + bad_row)


def _rows_of(layer: Layer, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges of `states` (int64 (n,)) in that order: (indptr (n + 1,), edge ids)."""
    starts = layer.indptr[states].astype(np.int64)
    branch = layer.indptr[states + 1].astype(np.int64) - starts
    indptr = np.zeros(states.size + 1, dtype=np.int64)
    np.cumsum(branch, out=indptr[1:])
    edges = np.arange(int(indptr[-1])) + np.repeat(starts - indptr[:-1], branch)
    return indptr, edges


def _state_classes(ir: Automaton, row_hash: Callable
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Bottom-up classes: per depth 0..depth-1, (classes (S,), first (C,))."""
    out = [None] * ir.depth
    next_classes = np.zeros(ir.num_final_states, dtype=np.int64)  # all finals equivalent
    num_next = 1
    for t in reversed(range(ir.depth)):
        layer = ir.layers[t]
        pairs = layer.tokens.astype(np.int64) * num_next + next_classes[layer.target_array()]
        out[t] = equal_row_classes(pairs, layer.indptr.astype(np.int64),
                                   layer.accepting_array(), row_hash)
        next_classes, num_next = out[t][0], out[t][1].size
    return out


def _rebuild(ir: Automaton, classes: list[tuple[np.ndarray, np.ndarray]]) -> Automaton:
    """Top-down: one state per class, numbered in first-appearance order."""
    order = np.zeros(1, dtype=np.int64)  # new state i at depth t is class order[i]
    layers = []
    for t, layer in enumerate(ir.layers):
        representatives = classes[t][1][order]
        indptr, edges = _rows_of(layer, representatives)
        E = edges.size
        if t + 1 < ir.depth:
            target_class = classes[t + 1][0][layer.target_array()[edges]]
            uniq, first_seen = np.unique(target_class, return_index=True)
            order = uniq[np.argsort(first_seen, kind="stable")]
            new_id = np.empty(order.size, dtype=np.int64)
            new_id[order] = np.arange(order.size)
            targets = new_id[target_class]
            implicit = order.size == E and np.array_equal(targets, np.arange(E))
        else:
            implicit = True  # one final state per edge: free, and keeps targets implicit
        accepting = None if layer.accepting is None else layer.accepting[representatives]
        layers.append(Layer(indptr=indptr.astype(index_dtype_for(E)),
                            tokens=layer.tokens[edges],
                            targets=None if implicit else targets.astype(index_dtype_for(E)),
                            accepting=accepting))
    return ir.replace(layers=tuple(layers), num_final_states=layers[-1].num_edges)


def minimize_automaton(ir: Automaton, force: bool = False, *,
                       row_hash: Callable = _row_hash) -> tuple[Automaton, MinimizeStats]:
    """Minimizes `ir` (see module doc); returns (automaton, MinimizeStats).

    Keeps `ir` unless the minimized automaton is smaller by `estimated_bytes`
    or `force` is set. Raises PipelineError when a layer already has a layout."""
    for t, layer in enumerate(ir.layers):
        if layer.layout is not None:
            raise PipelineError(
                f"minimize: layer {t} already has layout {layer.layout.to_text()}; run "
                "minimize before choose-layout (merging states changes the tables)")
    small = _rebuild(ir, _state_classes(ir, row_hash))
    before, after = estimated_bytes(ir), estimated_bytes(small)
    applied = force or after < before
    stats = MinimizeStats(states_before=ir.num_states, states_after=small.num_states,
                          edges_before=ir.num_edges, edges_after=small.num_edges,
                          bytes_before=before, bytes_after=after, applied=applied)
    return (small if applied else ir), stats

