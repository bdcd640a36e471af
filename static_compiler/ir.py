"""The automaton IR: a layered, acyclic, deterministic automaton in CSR arrays.

Layer t holds the transitions consumed at decoding step t: they leave the
`num_states` states at depth t and enter states at depth t + 1. Layer 0 leaves
the single root state. The states at depth `depth` (after the last layer) are
the *final* states and all accept.

Per layer (all numpy arrays, never node objects):

* ``indptr``  int32/int64 (num_states + 1,): row pointers into the edge arrays.
* ``tokens``  unsigned/signed int (num_edges,): edge labels, strictly increasing
  within each row.
* ``targets`` int (num_edges,) or ``None``: the state at depth t + 1 each edge
  enters. ``None`` means *implicit*: edge i enters state i (a tree, where the
  edge order of layer t is the state order of depth t + 1).
* ``accepting`` bool (num_states,) or ``None``: states at depth t that may end
  a sequence (variable-length sets). ``None`` means none do.
* ``layout``: a `Layout` chosen by the `choose-layout` pass, ``None`` before.

Everything is immutable: dataclasses are frozen and arrays are marked
read-only, so passes return new automata instead of editing one in place.
The text form (`Automaton.to_text`, `parse_ir`) is deterministic and parses
back to an equal automaton when no rows were elided.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Callable, Iterator, Optional, Union

import numpy as np

from static_compiler.dtypes import MAX_VOCAB_SIZE
from static_compiler.errors import IRParseError, IRVerificationError

class LayoutKind(enum.StrEnum):
    """Layout kinds the backend can lower:

    * ``dense_rows``: a (num_states, V) table of next-state ids (-1 = absent);
      each beam reads one row of V entries. Right for high fan-out near the root.
    * ``csr``: speculative slicing; each beam reads exactly ``k`` entries from
      its row start and masks slots past its row length. ``k`` >= the max branch.
    * ``unary``: every state has exactly one child; one token per state, no row
      pointers at all.
    * ``near_unary``: almost every state has one child; row pointers are kept
      only for the ``exceptions`` states whose branch differs from one (a sorted
      list, found by binary search), each beam reads ``k`` entries.

    csr and near_unary are the *sliced* kinds (`sliced`): they read k entries
    per beam, pad-branches rounds that k, and they can be *mixed*
    (``light_k`` / ``wide_slots``): beam search reads ``light_k`` entries per
    beam and the rest of a heavy state's row only for the few beams that sit
    on one, so a skewed level does not pay for its widest state at every beam
    (see `Layout`).

    A str enum: members equal, hash and print as their value ("csr"), so code
    and files that use the plain strings keep working.
    """

    DENSE_ROWS = "dense_rows"
    CSR = "csr"
    UNARY = "unary"
    NEAR_UNARY = "near_unary"

    @property
    def sliced(self) -> bool:
        """Whether beams read k entries from a row start (csr, near_unary)."""
        return self in (LayoutKind.CSR, LayoutKind.NEAR_UNARY)


LAYOUT_KINDS = tuple(kind.value for kind in LayoutKind)
"""The kinds' values as plain strings, in `LayoutKind` order (for messages)."""

_ELIDE_EDGES = 4096
"""Automata with more edges than this print statistics and elide rows."""

_ELIDED_ROWS_PER_LAYER = 16


def frozen(a: np.ndarray) -> np.ndarray:
    """Marks a freshly built array read-only in place and returns it.

    For builders that own `a` and hand it to a `Layer` without a copy;
    Layer copies any array that is still writeable, so a caller keeping a
    reference to its own array can never change the IR behind its back."""
    a.flags.writeable = False
    return a


def _frozen_array(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.flags.writeable:
        a = frozen(np.array(a, copy=True))
    return a


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the backend stores and reads one layer.

    Attributes:
      kind: a `LayoutKind` (a plain string such as "csr" is converted).
      k: candidates read per beam per step (V for dense_rows, 1 for unary).
      token_dtype: numpy dtype name of the token table ("uint16", "int32").
      state_dtype: numpy dtype name of row pointers / state ids.
      exceptions: near_unary only: number of states whose branch is not one.
      estimated_bytes: the cost model's estimate of the layer's table bytes.
      light_k, wide_slots: the mixed layout (csr and near_unary only; 0 =
        off, see `split-heavy`). Beam search reads `light_k` entries for every
        beam and `k - light_k` more for up to `wide_slots` beams per batch row
        whose state has more than `light_k` children ("heavy" states); a step
        with more heavy beams falls back to reading k for every beam. Same
        tables as without it: only the reads change.
      states_capacity, edges_capacity: room reserved for items added later
        (`reserve-capacity`; 0 = none): the backend pads the layer's tables
        to this many states and edges (unreachable states with no edges,
        edges in no row), so an update that fits keeps every table shape
        and no program recompiles. Only dense_rows, csr and unary layers
        of a trie (implicit targets) reserve.
    """

    kind: LayoutKind
    k: int
    token_dtype: str = "int32"
    state_dtype: str = "int32"
    exceptions: int = 0
    estimated_bytes: int = 0
    light_k: int = 0
    wide_slots: int = 0
    states_capacity: int = 0
    edges_capacity: int = 0

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", LayoutKind(self.kind))
        except ValueError:
            raise IRVerificationError(
                f"layout kind {self.kind!r} is not one of {LAYOUT_KINDS}") from None
        if self.k < 1:
            raise IRVerificationError(f"layout k={self.k} must be >= 1")
        if (self.light_k > 0) != (self.wide_slots > 0) or self.light_k < 0 or self.wide_slots < 0:
            raise IRVerificationError(
                f"layout light_k={self.light_k}, wide_slots={self.wide_slots}: expected both 0 "
                "(no mixed reads) or both >= 1")
        if self.light_k and (not self.kind.sliced or self.light_k >= self.k):
            raise IRVerificationError(
                f"layout {self.kind.value}(k={self.k}) with light_k={self.light_k}: the mixed layout "
                "needs kind csr or near_unary and 1 <= light_k < k")
        if self.states_capacity < 0 or self.edges_capacity < 0 or \
                (self.states_capacity > 0) != (self.edges_capacity > 0):
            raise IRVerificationError(
                f"layout capacity={self.states_capacity}/{self.edges_capacity}: expected both 0 "
                "(nothing reserved) or both >= 1")
        if self.reserved and self.kind == LayoutKind.NEAR_UNARY:
            raise IRVerificationError("layout near_unary cannot reserve capacity (its rows are "
                                      "implied by state ids): use csr")

    @property
    def reserved(self) -> bool:
        """True when the tables are padded to `states_capacity` / `edges_capacity`."""
        return self.states_capacity > 0

    def padded_counts(self, num_states: int, num_edges: int) -> tuple[int, int]:
        """(states, edges) of the lowered tables of a layer with these counts."""
        return max(num_states, self.states_capacity), max(num_edges, self.edges_capacity)

    @property
    def mixed(self) -> bool:
        """True when beams read light_k entries, plus wide slots for heavy states."""
        return self.light_k > 0

    @property
    def mixed_text(self) -> Optional[str]:
        """"light=l,wide=H" for a mixed layout (as in `to_text`), else None."""
        return f"light={self.light_k},wide={self.wide_slots}" if self.mixed else None

    def to_text(self) -> str:
        fields = [f"k={self.k}", f"tokens={self.token_dtype}",
                  f"states={self.state_dtype}"]
        if self.kind == LayoutKind.NEAR_UNARY:
            fields.append(f"exceptions={self.exceptions}")
        if self.mixed:
            fields.append(self.mixed_text)
        if self.reserved:
            fields.append(f"capacity={self.states_capacity}/{self.edges_capacity}")
        fields.append(f"est={self.estimated_bytes}B")
        return f"{self.kind.value}({','.join(fields)})"

    @classmethod
    def from_text(cls, text: str) -> "Layout":
        m = re.fullmatch(r"([a-z_]+)\(([^)]*)\)", text)
        if not m:
            raise IRParseError(f"cannot parse layout {text!r}: expected kind(k=..,...)")
        items = [item for item in m.group(2).split(",") if item]
        bare = [item for item in items if "=" not in item]
        if bare:
            raise IRParseError(f"cannot parse layout {text!r}: {bare[0]!r} has no value "
                               "(expected name=value)")
        kv = dict(item.split("=", 1) for item in items)
        try:
            capacity = kv.get("capacity", "0/0").split("/")
            if len(capacity) != 2:
                raise ValueError(f"capacity={kv['capacity']!r}: expected states/edges")
            return cls(kind=m.group(1), k=int(kv["k"]),
                       token_dtype=kv.get("tokens", "int32"),
                       state_dtype=kv.get("states", "int32"),
                       exceptions=int(kv.get("exceptions", 0)),
                       estimated_bytes=int(kv.get("est", "0B").rstrip("B")),
                       light_k=int(kv.get("light", 0)), wide_slots=int(kv.get("wide", 0)),
                       states_capacity=int(capacity[0]), edges_capacity=int(capacity[1]))
        except (KeyError, ValueError) as e:
            raise IRParseError(f"cannot parse layout {text!r}: {e}") from None


@dataclasses.dataclass(frozen=True, eq=False)
class Layer:
    """Transitions from the states at one depth to the next (see module doc)."""

    indptr: np.ndarray
    tokens: np.ndarray
    targets: Optional[np.ndarray] = None
    accepting: Optional[np.ndarray] = None
    layout: Optional[Layout] = None

    def __post_init__(self):
        for name in ("indptr", "tokens", "targets", "accepting"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _frozen_array(value))

    @property
    def num_states(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def implicit_targets(self) -> bool:
        return self.targets is None

    def branch(self) -> np.ndarray:
        """int64 (num_states,): number of children of each state."""
        return np.diff(self.indptr.astype(np.int64))

    @property
    def max_branch(self) -> int:
        return int(self.branch().max(initial=0))

    def branch_counts(self) -> np.ndarray:
        """int64 (max_branch + 1,): at b, how many states have b children
        (what the cost model reads; `LayerSummary` holds only this)."""
        return np.bincount(self.branch(), minlength=1)

    @property
    def has_accepting(self) -> bool:
        """Whether the layer has an accepting table (a variable-length set)."""
        return self.accepting is not None

    @property
    def num_accepting(self) -> int:
        return 0 if self.accepting is None else int(np.count_nonzero(self.accepting))

    def target_array(self) -> np.ndarray:
        """int64 (num_edges,): explicit targets (arange for implicit ones)."""
        if self.targets is None:
            return np.arange(self.num_edges, dtype=np.int64)
        return self.targets.astype(np.int64)

    def accepting_array(self) -> np.ndarray:
        """bool (num_states,), all False when no state accepts."""
        if self.accepting is None:
            return np.zeros(self.num_states, dtype=bool)
        return self.accepting

    def replace(self, **changes) -> "Layer":
        return dataclasses.replace(self, **changes)

    def __eq__(self, other):
        if not isinstance(other, Layer):
            return NotImplemented
        return (np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.tokens, other.tokens)
                and np.array_equal(self.target_array(), other.target_array())
                and self.implicit_targets == other.implicit_targets
                and np.array_equal(self.accepting_array(), other.accepting_array())
                and self.layout == other.layout)

    __hash__ = None


class _Layered:
    """Depth and per-depth state counts of a dataclass with `layers` (one
    per depth) and `num_final_states`: shared by `Automaton` and
    `AutomatonSummary`, which the layout passes take alike."""

    @property
    def depth(self) -> int:
        return len(self.layers)

    def num_states_at(self, depth: int) -> int:
        if depth == self.depth:
            return self.num_final_states
        return self.layers[depth].num_states

    def with_layers(self, layers):
        return dataclasses.replace(self, layers=tuple(layers))

    @property
    def num_states(self) -> int:
        return sum(l.num_states for l in self.layers) + self.num_final_states

    @property
    def num_edges(self) -> int:
        return sum(l.num_edges for l in self.layers)


@dataclasses.dataclass(frozen=True, eq=False)
class Automaton(_Layered):
    """A layered acyclic automaton over tokens 0..vocab_size-1.

    Attributes:
      vocab_size: V, the size of the model's vocabulary.
      layers: `Layer` per decoding step; ``len(layers)`` is the max length.
      num_final_states: states at depth ``len(layers)``; all of them accept.
      num_sequences: size of the accepted set.
      end_token: the token that ends a variable-length sequence, or None for
        a fixed-length set. It never labels an edge.
    """

    vocab_size: int
    layers: tuple[Layer, ...]
    num_final_states: int
    num_sequences: int
    end_token: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))

    def replace(self, **changes) -> "Automaton":
        return dataclasses.replace(self, **changes)

    def __eq__(self, other):
        if not isinstance(other, Automaton):
            return NotImplemented
        return (self.vocab_size == other.vocab_size
                and self.num_final_states == other.num_final_states
                and self.num_sequences == other.num_sequences
                and self.end_token == other.end_token
                and self.layers == other.layers)

    __hash__ = None

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self, max_edges: int = _ELIDE_EDGES) -> str:
        """Deterministic text dump; rows are elided past `max_edges` edges."""
        return print_ir(self, max_edges=max_edges)

    def sequences(self) -> Iterator[tuple[int, ...]]:
        """The accepted sequences as tuples, in lexicographic order (a
        sequence before its extensions); built by `enumerate_sequences`."""
        tokens, lengths = enumerate_sequences(self)
        # -1 past a row's end becomes 0, below every token + 1: prefixes first.
        order = np.lexsort((tokens + 1).T[::-1])
        for i in order:
            yield tuple(int(x) for x in tokens[i, :lengths[i]])


def enumerate_sequences(ir: Automaton) -> tuple[np.ndarray, np.ndarray]:
    """Every accepted sequence, level by level with numpy (no Python loop
    over items).

    Returns (tokens int64 (N, depth), lengths int64 (N,)): row i holds
    sequence i in its first lengths[i] columns and -1 after (the end token is
    not included). Rows come grouped by length, shorter first."""
    depth = ir.depth
    prefixes = np.zeros((1, 0), dtype=np.int64)
    states = np.zeros(1, dtype=np.int64)
    done_rows, done_lengths = [], []
    for t, layer in enumerate(ir.layers):
        if layer.accepting is not None:
            ends = np.asarray(layer.accepting)[states]
            done_rows.append(_pad(prefixes[ends], depth))
            done_lengths.append(np.full(int(ends.sum()), t, dtype=np.int64))
        indptr = layer.indptr.astype(np.int64)
        starts, counts = indptr[states], indptr[states + 1] - indptr[states]
        edges = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        prefixes = np.concatenate([np.repeat(prefixes, counts, axis=0),
                                   layer.tokens[edges].astype(np.int64)[:, None]], axis=1)
        states = layer.target_array()[edges]
    done_rows.append(prefixes)
    done_lengths.append(np.full(prefixes.shape[0], depth, dtype=np.int64))
    return np.concatenate(done_rows), np.concatenate(done_lengths)


def _pad(rows: np.ndarray, width: int) -> np.ndarray:
    out = np.full((rows.shape[0], width), -1, dtype=np.int64)
    out[:, :rows.shape[1]] = rows
    return out


# --------------------------------------------------------------------------
# Verifier


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
    if int(ip[0]) != 0 or int(ip[-1]) != E:
        raise IRVerificationError(
            f"{where}: indptr must start at 0 and end at num_edges={E}, "
            f"got {int(ip[0])} .. {int(ip[-1])}")
    branch = layer.branch()
    if (branch < 0).any():
        s = int(np.flatnonzero(branch < 0)[0])
        raise IRVerificationError(f"{where}, state {s}: indptr decreases "
                                  f"({int(ip[s])} -> {int(ip[s + 1])})")
    tok = layer.tokens
    if E:
        if int(tok.min()) < 0 or int(tok.max()) >= a.vocab_size:
            tok = tok.astype(np.int64)
            e = int(np.flatnonzero((tok < 0) | (tok >= a.vocab_size))[0])
            raise IRVerificationError(
                f"{where}, state {_row_of(ip, e)}: token {int(tok[e])} is outside "
                f"[0, {a.vocab_size})")
        if a.end_token is not None and (tok == a.end_token).any():
            e = int(np.flatnonzero(tok == a.end_token)[0])
            raise IRVerificationError(
                f"{where}, state {_row_of(ip, e)}: the end token {a.end_token} labels an edge")
        # Strictly increasing inside each row: compare neighbours that share a row.
        same_row = np.ones(E, dtype=bool)
        same_row[ip[:-1][branch > 0]] = False
        not_increasing = same_row[1:] & (tok[1:] <= tok[:-1])  # no overflow: a comparison
        if not_increasing.any():
            e = int(np.flatnonzero(not_increasing)[0]) + 1
            raise IRVerificationError(
                f"{where}, state {_row_of(ip, e)}: tokens not strictly increasing "
                f"({int(tok[e - 1])} then {int(tok[e])})")
    n_next = a.num_states_at(t + 1)
    if layer.targets is None:
        if n_next != E:
            raise IRVerificationError(
                f"{where}: implicit targets need num_edges={E} states at depth {t + 1}, "
                f"found {n_next}")
    else:
        tg = layer.targets
        if tg.shape != (E,) or tg.dtype.kind not in "iu":
            raise IRVerificationError(f"{where}: targets must be int of shape ({E},), "
                                      f"got {tg.shape} {tg.dtype}")
        tg = tg.astype(np.int64)
        if E and ((tg < 0) | (tg >= n_next)).any():
            e = int(np.flatnonzero((tg < 0) | (tg >= n_next))[0])
            raise IRVerificationError(
                f"{where}, state {_row_of(ip, e)}: target {int(tg[e])} is outside "
                f"[0, {n_next}) (states at depth {t + 1})")
        reached = np.zeros(n_next, dtype=bool)
        reached[tg] = True
        if not reached.all():
            s = int(np.flatnonzero(~reached)[0])
            raise IRVerificationError(
                f"depth {t + 1}, state {s}: unreachable (no edge of {where} enters it)")
    acc = layer.accepting
    if acc is not None and (acc.shape != (S,) or acc.dtype != np.bool_):
        raise IRVerificationError(f"{where}: accepting must be bool of shape ({S},), "
                                  f"got {acc.shape} {acc.dtype}")
    dead = (branch == 0) & ~layer.accepting_array()
    if dead.any():
        s = int(np.flatnonzero(dead)[0])
        raise IRVerificationError(
            f"{where}, state {s}: dead state (no outgoing edge and not accepting)")
    if layer.accepting is not None and a.end_token is None and layer.accepting.any():
        raise IRVerificationError(
            f"{where}: states accept before the last layer but the automaton has no end_token")
    _verify_layout(where, layer, a.vocab_size, branch, a.num_states_at(t + 1))


def _verify_layout(where: str, layer: Layer, V: int, branch: np.ndarray,
                   num_next_states: int) -> None:
    lay = layer.layout
    if lay is None:
        return
    max_branch = int(branch.max(initial=0))
    if lay.kind == LayoutKind.DENSE_ROWS and lay.k != V:
        raise IRVerificationError(f"{where}: dense_rows layout must have k=V={V}, got {lay.k}")
    if lay.kind.sliced and lay.k < max_branch:
        raise IRVerificationError(
            f"{where}: layout {lay.kind.value} k={lay.k} is smaller than the max branch "
            f"{max_branch}; speculative slicing would drop children")
    if lay.kind == LayoutKind.UNARY and ((branch != 1).any() or lay.k != 1):
        s = int(np.flatnonzero(branch != 1)[0]) if (branch != 1).any() else 0
        raise IRVerificationError(
            f"{where}, state {s}: unary layout needs exactly one child per state and k=1, "
            f"got branch {int(branch[s])}, k={lay.k}")
    if lay.kind == LayoutKind.NEAR_UNARY and lay.exceptions != int((branch != 1).sum()):
        raise IRVerificationError(
            f"{where}: near_unary records {lay.exceptions} exceptions, the layer has "
            f"{int((branch != 1).sum())} states whose branch is not 1")
    for name, dt in (("token", lay.token_dtype), ("state", lay.state_dtype)):
        try:
            np.dtype(dt)
        except TypeError:
            raise IRVerificationError(f"{where}: {name} dtype {dt!r} is not a numpy dtype") from None
    if lay.reserved:
        if not layer.implicit_targets or lay.kind == LayoutKind.NEAR_UNARY:
            raise IRVerificationError(f"{where}: layout {lay.kind.value} with explicit targets "
                                      "cannot reserve capacity (a trie's layers can)")
        if lay.states_capacity < layer.num_states or lay.edges_capacity < layer.num_edges:
            raise IRVerificationError(
                f"{where}: capacity {lay.states_capacity}/{lay.edges_capacity} is below the "
                f"layer's {layer.num_states} states / {layer.num_edges} edges")
        if lay.kind == LayoutKind.UNARY and lay.states_capacity != lay.edges_capacity:
            raise IRVerificationError(f"{where}: a unary layer's capacity must reserve as many "
                                      f"edges as states, got {lay.states_capacity}/"
                                      f"{lay.edges_capacity}")
    # Row pointers reach E, state ids and targets S - 1 / next S - 1 (padded
    # to a reserved capacity): a narrower state dtype would wrap them.
    states, edges = lay.padded_counts(layer.num_states, layer.num_edges)
    largest = max(states, edges, lay.edges_capacity if lay.reserved else num_next_states)
    state_max = np.iinfo(np.dtype(lay.state_dtype)).max if np.dtype(lay.state_dtype).kind in "iu" \
        else None
    if state_max is None or largest > state_max:
        raise IRVerificationError(
            f"{where}: state dtype {lay.state_dtype} cannot hold the layer's row pointers and "
            f"state ids (up to {largest}: {states} states, {edges} edges, {num_next_states} next "
            "states): run pack-dtypes, or name a wider dtype")
    tok_max = int(layer.tokens.max(initial=0))
    if np.dtype(lay.token_dtype).kind not in "iu" or \
            tok_max > np.iinfo(np.dtype(lay.token_dtype)).max:
        raise IRVerificationError(
            f"{where}: token {tok_max} does not fit token dtype {lay.token_dtype}")


def _row_of(indptr: np.ndarray, edge: int) -> int:
    return int(np.searchsorted(indptr, edge, side="right")) - 1


# --------------------------------------------------------------------------
# Printer and parser


@dataclasses.dataclass(frozen=True, eq=False)
class LayerSummary:
    """What the layout passes and the cost model read of a layer, without
    its arrays: counts, the branch histogram, accepting states, targets, and
    the layout. A partitioned build sums its partitions' summaries, so the
    passes plan the merged layers' layouts without reading them
    (`pipeline.plan_layouts`).

    counts: int64 (max_branch + 1,), at b the states with b children."""

    num_states: int
    num_edges: int
    counts: np.ndarray
    num_accepting: int = 0
    has_accepting: bool = False
    implicit_targets: bool = True
    layout: Optional[Layout] = None

    @classmethod
    def of(cls, layer: Layer) -> "LayerSummary":
        return cls(layer.num_states, layer.num_edges, layer.branch_counts(),
                   layer.num_accepting, layer.has_accepting, layer.implicit_targets,
                   layer.layout)

    def branch_counts(self) -> np.ndarray:
        return self.counts

    @property
    def max_branch(self) -> int:
        nonzero = np.flatnonzero(self.counts)
        return int(nonzero[-1]) if nonzero.size else 0

    def replace(self, **changes) -> "LayerSummary":
        return dataclasses.replace(self, **changes)

    def __eq__(self, other):
        if not isinstance(other, LayerSummary):
            return NotImplemented
        trim = lambda c: np.trim_zeros(np.asarray(c, np.int64), "b")
        return (self.num_states, self.num_edges, self.num_accepting, self.has_accepting,
                self.implicit_targets, self.layout) == \
            (other.num_states, other.num_edges, other.num_accepting, other.has_accepting,
             other.implicit_targets, other.layout) and \
            np.array_equal(trim(self.counts), trim(other.counts))

    __hash__ = None


@dataclasses.dataclass(frozen=True, eq=False)
class AutomatonSummary(_Layered):
    """An `Automaton` with `LayerSummary` layers: what `pipeline.plan_layouts`
    runs the layout passes over (vocab_size, depth, num_states_at,
    with_layers, as the passes use an Automaton)."""

    vocab_size: int
    layers: tuple
    num_final_states: int
    num_sequences: int
    end_token: Optional[int] = None

    @classmethod
    def of(cls, ir: "Automaton") -> "AutomatonSummary":
        return cls(ir.vocab_size, tuple(LayerSummary.of(layer) for layer in ir.layers),
                   ir.num_final_states, ir.num_sequences, ir.end_token)

    def __eq__(self, other):
        if not isinstance(other, AutomatonSummary):
            return NotImplemented
        return (self.vocab_size, self.num_final_states, self.num_sequences, self.end_token) == \
            (other.vocab_size, other.num_final_states, other.num_sequences, other.end_token) \
            and len(self.layers) == len(other.layers) and \
            all(a == b for a, b in zip(self.layers, other.layers))

    __hash__ = None


@dataclasses.dataclass(frozen=True, eq=False)
class LayerPiece:
    """A contiguous run of one tree layer's states and their edges: what a
    partitioned build hands the lowering one partition at a time
    (`backend.lowering.lower_pieces`), so a merged layer is never built.

    The run holds the layer's states [state_offset, state_offset +
    num_states) and edges [edge_offset, edge_offset + num_edges); the
    pieces of a layer come in order and tile it. Targets are implicit (edge
    i enters state i at the next depth).

    branch: children per state, uint (num_states,), or an int for all of
      them (1: a unary run, 0: states where every sequence ends).
    tokens: (num_edges,) int, the edge labels in layer order.
    accepting: bool (num_states,), a bool for all of them, or None (none).
    """

    state_offset: int
    edge_offset: int
    num_states: int
    num_edges: int
    branch: Union[np.ndarray, int]
    tokens: np.ndarray
    accepting: Union[np.ndarray, bool, None] = None

    def indptr(self) -> np.ndarray:
        """int64 (num_states + 1,): the run's row pointers, offset to the
        layer's edge ids (from edge_offset)."""
        if isinstance(self.branch, (int, np.integer)):
            return self.edge_offset + int(self.branch) * np.arange(self.num_states + 1,
                                                                    dtype=np.int64)
        out = np.empty(self.num_states + 1, dtype=np.int64)
        out[0] = self.edge_offset
        np.cumsum(self.branch, dtype=np.int64, out=out[1:])
        out[1:] += self.edge_offset
        return out

    def accepting_array(self) -> Optional[np.ndarray]:
        """bool (num_states,), or None when no state of the run accepts."""
        if self.accepting is None or self.accepting is False:
            return None
        if self.accepting is True:
            return np.ones(self.num_states, dtype=bool)
        return self.accepting


def layer_stats(layer: Union[Layer, "LayerSummary"]) -> dict[str, object]:
    """Statistics of one layer (or its summary): states, edges, max/mean
    branch, layout."""
    return {
        "states": layer.num_states,
        "edges": layer.num_edges,
        "max_branch": layer.max_branch,
        "mean_branch": layer.num_edges / layer.num_states if layer.num_states else 0.0,
        "accepting": layer.num_accepting,
        "targets": "implicit" if layer.implicit_targets else "explicit",
        "layout": layer.layout.to_text() if layer.layout else "none",
    }


def print_ir(a: Union[Automaton, "AutomatonSummary"], max_edges: int = _ELIDE_EDGES,
             rows_of: Optional[Callable[[int, int], Layer]] = None) -> str:
    """Text form of `a`; see the module docstring. Rows are printed in full
    when the automaton has at most `max_edges` edges, else the first
    `_ELIDED_ROWS_PER_LAYER` rows per layer and a count of the rest.

    rows_of(t, n): a `Layer` holding layer t's first n states and their
    edges (what is printed of it); default `a`'s own layers. With it, `a`
    may be an `AutomatonSummary` (a set whose IR lives in its tables,
    `backend.lowering.table_head`): the text equals the automaton's."""
    full = a.num_edges <= max_edges
    head = f"automaton vocab={a.vocab_size} depth={a.depth} sequences={a.num_sequences} " \
           f"final_states={a.num_final_states}"
    if a.end_token is not None:
        head += f" end_token={a.end_token}"
    lines = [head]
    for t, layer in enumerate(a.layers):
        st = layer_stats(layer)
        lines.append(
            f"layer {t}  states={st['states']} edges={st['edges']} "
            f"max_branch={st['max_branch']} mean_branch={st['mean_branch']:.3f} "
            f"targets={st['targets']} layout={st['layout']}")
        rows = layer.num_states if full else min(layer.num_states, _ELIDED_ROWS_PER_LAYER)
        shown = layer if rows_of is None else rows_of(t, rows)
        ip, tok = shown.indptr, shown.tokens
        tg = shown.target_array() if rows else None
        acc = shown.accepting_array()
        for s in range(rows):
            lo, hi = int(ip[s]), int(ip[s + 1])
            edges = " ".join(f"{int(tok[e])}->{int(tg[e])}" for e in range(lo, hi))
            mark = " accept" if acc[s] else ""
            lines.append(f"  s{s}{mark}:" + (f" {edges}" if edges else ""))
        if rows < layer.num_states:
            lines.append(f"  ... {layer.num_states - rows} more rows elided")
    return "\n".join(lines) + "\n"


_HEAD_RE = re.compile(r"automaton vocab=(\d+) depth=(\d+) sequences=(\d+) "
                      r"final_states=(\d+)(?: end_token=(\d+))?")
_LAYER_RE = re.compile(r"layer (\d+)  states=(\d+) edges=(\d+) max_branch=\d+ "
                       r"mean_branch=[0-9.]+ targets=(implicit|explicit) layout=(\S+)")
_ROW_RE = re.compile(r"  s(\d+)( accept)?:((?: \d+->\d+)*)")


def _elided(line: int) -> IRParseError:
    return IRParseError(f"line {line}: rows were elided in this dump; print it with max_edges "
                        "large enough to parse it back")


def parse_ir(text: str) -> Automaton:
    """Parses the full text form back into an equal `Automaton`.

    Raises IRParseError (with the line number) on malformed text or on a dump
    whose rows were elided; the result is verified."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise IRParseError("empty IR text")
    m = _HEAD_RE.fullmatch(lines[0])
    if not m:
        raise IRParseError(f"line 1: expected 'automaton vocab=.. depth=.. sequences=.. "
                           f"final_states=..', got {lines[0]!r}")
    vocab, depth, nseq, nfinal = (int(m.group(i)) for i in range(1, 5))
    end_token = int(m.group(5)) if m.group(5) is not None else None
    layers = []
    i = 1
    for t in range(depth):
        if i >= len(lines):
            raise IRParseError(f"expected layer {t} header after line {i}, text ended")
        lm = _LAYER_RE.fullmatch(lines[i])
        if not lm or int(lm.group(1)) != t:
            raise IRParseError(f"line {i + 1}: expected header of layer {t}, got {lines[i]!r}")
        S, E = int(lm.group(2)), int(lm.group(3))
        implicit = lm.group(4) == "implicit"
        layout = None if lm.group(5) == "none" else Layout.from_text(lm.group(5))
        i += 1
        if S > len(lines) - i:  # one row per state follows: refuse before allocating
            if any(ln.startswith("  ...") for ln in lines[i:]):
                raise _elided(i)
            left = len(lines) - i
            raise IRParseError(f"line {i}: layer {t} header says states={S}, but only {left} "
                               f"line{'s' * (left != 1)} follow{'s' * (left == 1)}")
        indptr = np.zeros(S + 1, dtype=np.int64)
        tokens, targets = [], []
        accepting = np.zeros(S, dtype=bool)
        for s in range(S):
            if i >= len(lines):
                raise IRParseError(f"layer {t}: expected row s{s}, text ended")
            if lines[i].startswith("  ..."):
                raise _elided(i + 1)
            rm = _ROW_RE.fullmatch(lines[i])
            if not rm or int(rm.group(1)) != s:
                raise IRParseError(f"line {i + 1}: expected row s{s} of layer {t}, got {lines[i]!r}")
            accepting[s] = rm.group(2) is not None
            for pair in rm.group(3).split():
                a_, b_ = pair.split("->")
                tokens.append(int(a_))
                targets.append(int(b_))
            indptr[s + 1] = len(tokens)
            i += 1
        if len(tokens) != E:
            raise IRParseError(f"layer {t}: header says edges={E}, rows hold {len(tokens)}")
        try:
            tg, tok = np.asarray(targets, dtype=np.int64), np.asarray(tokens, dtype=np.int64)
        except OverflowError:
            big = max(tokens + targets, key=abs)
            raise IRParseError(f"layer {t}: token or target {big} does not fit int64") from None
        if implicit and not np.array_equal(tg, np.arange(E)):
            raise IRParseError(f"layer {t}: targets=implicit but rows name other targets")
        layers.append(Layer(indptr=indptr, tokens=tok,
                            targets=None if implicit else tg,
                            accepting=accepting if accepting.any() else None,
                            layout=layout))
    if i != len(lines):
        raise IRParseError(f"line {i + 1}: unexpected text after the last layer: {lines[i]!r}")
    a = Automaton(vocab_size=vocab, layers=tuple(layers), num_final_states=nfinal,
                  num_sequences=nseq, end_token=end_token)
    verify(a)
    return a
