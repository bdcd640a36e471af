"""The IR verifier: every invariant of an `Automaton` (sorted rows, targets
in range, no dead or unreachable state, layouts that fit their layers),
raising IRVerificationError that names the layer, state and value."""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.errors import IRVerificationError
from static_compiler.ir.row_checks import (
    check_accepting_has_end,
    check_implicit_targets,
    check_row_span,
    check_rows,
    row_of,
)
from static_compiler.ir.types import Automaton, Layer, Layout, LayoutKind
from static_compiler.support.dtypes import MAX_VOCAB_SIZE


def _same_arrays(x: Layer, y: Layer) -> bool:
    return all(getattr(x, n) is getattr(y, n) for n in ("indptr", "tokens", "targets", "accepting"))


def verify(a: Automaton, unchanged_from: Optional[Automaton] = None) -> None:
    """Checks every invariant of the IR; raises IRVerificationError naming the
    layer, state and value that break one. Cost: O(edges), vectorized.

    `unchanged_from` is an already verified automaton this one was derived
    from: layers whose arrays are the very same objects there (a pass that
    only chose layouts) get only their layout checked."""
    V = a.vocab_size
    if not isinstance(V, (int, np.integer)) or not 1 <= V <= MAX_VOCAB_SIZE:
        raise IRVerificationError(f"vocab_size={V!r}: expected an int in [1, {MAX_VOCAB_SIZE}] "
                                  "(token ids are int32 when decoding)")
    if a.depth < 1:
        raise IRVerificationError("automaton has no layers: expected depth >= 1")
    if a.end_token is not None and not 0 <= a.end_token < V:
        raise IRVerificationError(
            f"end_token={a.end_token} is outside the vocabulary [0, {V})")
    if a.layers[0].num_states != 1:
        raise IRVerificationError(
            f"layer 0 has {a.layers[0].num_states} states: expected exactly 1 (the root)")
    if a.num_final_states < 0 or a.num_sequences < 1:
        raise IRVerificationError(
            f"num_final_states={a.num_final_states}, num_sequences={a.num_sequences}: "
            "expected >= 0 and >= 1")
    same_shape = (unchanged_from is not None and unchanged_from.depth == a.depth
                  and unchanged_from.vocab_size == a.vocab_size
                  and unchanged_from.end_token == a.end_token
                  and unchanged_from.num_final_states == a.num_final_states)
    for t, layer in enumerate(a.layers):
        if same_shape and _same_arrays(layer, unchanged_from.layers[t]) \
                and a.num_states_at(t + 1) == unchanged_from.num_states_at(t + 1):
            _verify_layout(f"layer {t}", layer, a.vocab_size, layer.branch(),
                           a.num_states_at(t + 1))
        else:
            _verify_layer(a, t, layer)
    _verify_capacities(a)
    if not (same_shape and unchanged_from.num_sequences == a.num_sequences):
        counted = count_sequences(a.layers, a.num_final_states)
        if counted != a.num_sequences:
            raise IRVerificationError(f"num_sequences={a.num_sequences}, but the layers accept "
                                      f"{counted} sequences")


def count_sequences(layers, num_final_states: int) -> int:
    """The sequences that `layers` (ending in `num_final_states` final
    states) accept: for a trie (implicit targets throughout) its final and
    accepting states, O(states); else counted bottom-up over the edges
    (int64 sums, Python ints only where those could overflow)."""
    if all(layer.implicit_targets for layer in layers):
        return num_final_states + sum(int(layer.accepting.sum()) for layer in layers
                                      if layer.accepting is not None)
    below = np.ones(num_final_states, dtype=np.int64)
    for layer in reversed(layers):
        per_edge = below[layer.target_array()]
        if per_edge.dtype == np.int64 and per_edge.size and \
                int(per_edge.max()) > np.iinfo(np.int64).max // max(1, int(layer.branch().max())):
            per_edge = per_edge.astype(object)  # sums per row could overflow int64
        starts = layer.indptr[:-1].astype(np.int64)
        counts = np.zeros(layer.num_states, dtype=per_edge.dtype)
        has = layer.branch() > 0
        if per_edge.size:
            counts[has] = np.add.reduceat(per_edge, starts[has])
        below = counts + layer.accepting_array().astype(counts.dtype)
    return int(below[0])


def _verify_capacities(a: Automaton) -> None:
    """Reserved capacity is all or nothing, and a layer's reserved edges are
    the next layer's reserved states (implicit targets number them alike)."""
    lays = [layer.layout for layer in a.layers]
    if not any(lay is not None and lay.reserved for lay in lays):
        return
    if not all(lay is not None and lay.reserved for lay in lays):
        t = next(t for t, lay in enumerate(lays) if lay is None or not lay.reserved)
        raise IRVerificationError(f"layer {t} reserves no capacity while others do: reserve "
                                  "capacity in every layer or none")
    for t in range(a.depth - 1):
        if lays[t].edges_capacity != lays[t + 1].states_capacity:
            raise IRVerificationError(
                f"layer {t} reserves {lays[t].edges_capacity} edges, layer {t + 1} "
                f"{lays[t + 1].states_capacity} states: expected equal (edge e enters state e)")
    if lays[0].states_capacity != 1:
        raise IRVerificationError(f"layer 0 reserves {lays[0].states_capacity} states: the root "
                                  "is one state")


def _verify_layer(a: Automaton, t: int, layer: Layer) -> None:
    where = f"layer {t}"
    S, E = layer.num_states, layer.num_edges
    ip = layer.indptr
    if ip.ndim != 1 or ip.dtype.kind not in "iu":
        raise IRVerificationError(f"{where}: indptr must be a 1-D int array, got "
                                  f"shape {ip.shape} dtype {ip.dtype}")
    if layer.tokens.ndim != 1 or layer.tokens.dtype.kind not in "iu":
        raise IRVerificationError(f"{where}: tokens must be a 1-D int array, got "
                                  f"shape {layer.tokens.shape} dtype {layer.tokens.dtype}")
    if S < 1:
        raise IRVerificationError(f"{where}: has no states")
    check_row_span(where, int(ip[0]), int(ip[-1]), E)
    acc = layer.accepting
    if acc is not None and (acc.shape != (S,) or acc.dtype != np.bool_):
        raise IRVerificationError(f"{where}: accepting must be bool of shape ({S},), "
                                  f"got {acc.shape} {acc.dtype}")
    branch = layer.branch()
    check_rows(where, ip, layer.tokens, acc, vocab_size=a.vocab_size, end_token=a.end_token,
               branch=branch)
    n_next = a.num_states_at(t + 1)
    if layer.targets is None:
        check_implicit_targets(where, t + 1, E, n_next)
    else:
        tg = layer.targets
        if tg.shape != (E,) or tg.dtype.kind not in "iu":
            raise IRVerificationError(f"{where}: targets must be int of shape ({E},), "
                                      f"got {tg.shape} {tg.dtype}")
        tg = tg.astype(np.int64)
        if E and ((tg < 0) | (tg >= n_next)).any():
            e = int(np.flatnonzero((tg < 0) | (tg >= n_next))[0])
            raise IRVerificationError(
                f"{where}, state {row_of(ip, e)}: target {int(tg[e])} is outside "
                f"[0, {n_next}) (states at depth {t + 1})")
        reached = np.zeros(n_next, dtype=bool)
        reached[tg] = True
        if not reached.all():
            s = int(np.flatnonzero(~reached)[0])
            raise IRVerificationError(
                f"depth {t + 1}, state {s}: unreachable (no edge of {where} enters it)")
    check_accepting_has_end(where, layer.num_accepting, a.end_token)
    _verify_layout(where, layer, a.vocab_size, branch, a.num_states_at(t + 1))


def _verify_layout(where: str, layer: Layer, V: int, branch: np.ndarray,
                   num_next_states: int) -> None:
    if layer.layout is None:
        return
    odd = np.flatnonzero(branch != 1)
    check_layout(where, layer.layout, V, max_branch=int(branch.max(initial=0)),
                 non_unit=int(odd.shape[0]), num_states=layer.num_states,
                 num_edges=layer.num_edges, num_next_states=num_next_states,
                 largest_token=int(layer.tokens.max(initial=0)),
                 implicit_targets=layer.implicit_targets,
                 first_non_unit=(s := int(odd[0]) if odd.size else 0, int(branch[s])))


def check_layout(where: str, lay: Layout, V: int, *, max_branch: int, non_unit: int,
                 num_states: int, num_edges: int, num_next_states: int, largest_token: int,
                 implicit_targets: bool = True, first_non_unit: Optional[tuple] = None) -> None:
    """Checks that layout `lay` fits a layer from its counts alone: its
    widest row (max_branch), how many states have a branch other than 1
    (non_unit; first_non_unit, (state, branch) of the first such state,
    else of state 0, for the message), its states, edges, the next depth's states and its largest
    token; the IR verifier passes a layer's arrays' counts, the chunked
    table checker (`artifact.table_check`) those it read from the tables.
    Raises IRVerificationError naming `where`."""
    if lay.kind == LayoutKind.DENSE_ROWS and lay.k != V:
        raise IRVerificationError(f"{where}: dense_rows layout must have k=V={V}, got {lay.k}")
    if lay.kind.sliced and lay.k < max_branch:
        raise IRVerificationError(
            f"{where}: layout {lay.kind.value} k={lay.k} is smaller than the max branch "
            f"{max_branch}; speculative slicing would drop children")
    if lay.kind == LayoutKind.UNARY and (non_unit or lay.k != 1):
        s, b = first_non_unit if first_non_unit is not None else (0, 1)
        at = f"{where}, state {s}" if first_non_unit is not None else where
        raise IRVerificationError(
            f"{at}: unary layout needs exactly one child per state and k=1, "
            f"got branch {b}, k={lay.k}")
    if lay.kind == LayoutKind.NEAR_UNARY and (
            lay.exceptions < non_unit if lay.reserved else lay.exceptions != non_unit):
        raise IRVerificationError(
            f"{where}: near_unary records {lay.exceptions} exceptions"
            f"{' (capacity)' if lay.reserved else ''}, the layer has "
            f"{non_unit} states whose branch is not 1")
    for name, dt in (("token", lay.token_dtype), ("state", lay.state_dtype)):
        try:
            np.dtype(dt)
        except TypeError:
            raise IRVerificationError(f"{where}: {name} dtype {dt!r} is not a numpy dtype") from None
    if lay.reserved:
        if not implicit_targets:
            raise IRVerificationError(f"{where}: layout {lay.kind.value} with explicit targets "
                                      "cannot reserve capacity (a trie's layers can)")
        if lay.states_capacity < num_states or lay.edges_capacity < num_edges:
            raise IRVerificationError(
                f"{where}: capacity {lay.states_capacity}/{lay.edges_capacity} is below the "
                f"layer's {num_states} states / {num_edges} edges")
        if lay.kind == LayoutKind.UNARY and lay.states_capacity != lay.edges_capacity:
            raise IRVerificationError(f"{where}: a unary layer's capacity must reserve as many "
                                      f"edges as states, got {lay.states_capacity}/"
                                      f"{lay.edges_capacity}")
    # Row pointers reach E, state ids and targets S - 1 / next S - 1 (padded
    # to a reserved capacity): a narrower state dtype would wrap them.
    states, edges = lay.padded_counts(num_states, num_edges)
    largest = max(states, edges, lay.edges_capacity if lay.reserved else num_next_states)
    state_max = np.iinfo(np.dtype(lay.state_dtype)).max if np.dtype(lay.state_dtype).kind in "iu" \
        else None
    if state_max is None or largest > state_max:
        raise IRVerificationError(
            f"{where}: state dtype {lay.state_dtype} cannot hold the layer's row pointers and "
            f"state ids (up to {largest}: {states} states, {edges} edges, {num_next_states} next "
            "states): run pack-dtypes, or name a wider dtype")
    if np.dtype(lay.token_dtype).kind not in "iu" or \
            largest_token > np.iinfo(np.dtype(lay.token_dtype)).max:
        raise IRVerificationError(
            f"{where}: token {largest_token} does not fit token dtype {lay.token_dtype}")

