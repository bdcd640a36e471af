"""The IR's data types: `Layout`, `Layer`, `Automaton`, and the summaries
(`LayerSummary`, `AutomatonSummary`, `LayerPiece`) that planning and the
partitioned build read without a layer's arrays. See `static_compiler.ir`
for what the arrays hold; numpy only."""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from typing import Iterator, Optional

import numpy as np

from static_compiler.errors import IRParseError, IRVerificationError
from static_compiler.ir.printer import _ELIDE_EDGES, print_ir


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
      exceptions: near_unary only: the exception entries its tables hold:
        the number of states whose branch is not one, or, with capacity
        reserved, room for that many (entries past them are padding).
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
        edges in no row; near_unary layers also to `exceptions` exception
        entries), so an update that fits keeps every table shape and no
        program recompiles. Only layers of a trie (implicit targets) reserve.
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

    @property
    def reserved(self) -> bool:
        """True when the tables are padded to `states_capacity` / `edges_capacity`."""
        return self.states_capacity > 0

    def widest_branch(self, max_branch: int) -> int:
        """The widest branch the tables must hold (a near_unary layer's
        ex_branch dtype): the layer's `max_branch`, or with capacity
        reserved at least k (an addition that fits stays within it)."""
        return max(max_branch, self.k) if self.reserved else max_branch

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


_BRANCH_CACHES = ("_branch", "_branch_counts")
"""A `Layer`'s values computed from its row pointers on first use."""


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
        """int64 (num_states,), read-only: number of children of each state.

        Computed once per layer (its arrays are frozen) and shared by every
        pass that plans from it."""
        return self._branch

    @functools.cached_property
    def _branch(self) -> np.ndarray:
        out = np.subtract(self.indptr[1:], self.indptr[:-1], dtype=np.int64)
        out.flags.writeable = False
        return out

    @property
    def max_branch(self) -> int:
        return int(self.branch().max(initial=0))

    def branch_counts(self) -> np.ndarray:
        """int64 (max_branch + 1,), read-only: at b, how many states have b
        children (what the cost model reads; `LayerSummary` holds only this)."""
        return self._branch_counts

    @functools.cached_property
    def _branch_counts(self) -> np.ndarray:
        out = np.bincount(self.branch(), minlength=1)
        out.flags.writeable = False
        return out

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
        """A copy with `changes`; it keeps the branch counts computed so far
        when the rows stay (a pass changing the layout only)."""
        new = dataclasses.replace(self, **changes)
        if "indptr" not in changes:
            for key in _BRANCH_CACHES:
                if key in self.__dict__:
                    new.__dict__[key] = self.__dict__[key]
        return new

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
