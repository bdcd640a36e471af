"""Item priors (soft constraints): a float attribute read as a log-prior
with a weight, so that a beam search ranks an item by the model's
log-probability plus weight x its prior (`CompiledConstraints.prior`,
`TorchConstraints.prior`; docs/business-rules.md, "Item priors").

While decoding, a prefix is ranked with the best prior among the live items
below it (an optimistic look-ahead): the `Prior` holds, for every state at
depths 1..depth, the largest prior of the live items its subtree holds
(-inf where none), in one float32 row laid out depth after depth, so that
a step reads each candidate's term with one gather at ``offset + next
state``. With an end token, the row also holds each state's own term (the
item ending there, -inf where none), which the end token's candidate
reads; a finished beam keeps its rank. The layout is the plan's
(`lowered.plan.prior_offsets`: the tables' state counts).
At the state where an item ends the term is the item's own prior, so the
final ranking is exact. Live items are those a selection or filter picks
(as `subset` takes them), less those updates removed; an item outside them
takes one constant term (`outside_term`, OUTSIDE_GAP below every live one),
so it ranks after the live items and by the model's log-probability among
the others; priors change with no recompile (new values, same shapes).

Sets held as a trie (an item index, no `minimize`). numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from static_compiler.errors import AttributeColumnError, DecodeInputError
from static_compiler.item_bits import state_order
from static_compiler.item_bits.layers import row_range
from static_compiler.item_bits.placements import Placements

CHUNK = 1 << 22
"""States crossed at a time when a layer's maxima are taken."""

OUTSIDE_GAP = 1e4
"""How far below the lowest live term (and below 0) the term of an item
outside a prior's selection lies (`outside_term`): such an item ranks by
its log-probability plus that one constant, so the items outside keep the
model's order among themselves, after every live item whose
log-probability is within OUTSIDE_GAP of theirs (float32 keeps ~1e-3 of a
log-probability there)."""


def outside_term(values: np.ndarray, item_live: np.ndarray) -> np.float32:
    """The float32 term of every item outside the selection (`item_live`
    False): OUTSIDE_GAP below the lowest live one of `values` (the weighted
    priors, float32 (N',)) and below 0. A constant added to the model's
    score, not a floor: the items outside still rank by the model."""
    lowest = min(0.0, float(np.min(values, where=item_live, initial=0.0)))
    return np.float32(np.float32(lowest) - np.float32(OUTSIDE_GAP))


@dataclasses.dataclass(frozen=True, eq=False)
class Prior:
    """The best prior below each state of one compiled set, and its weight.

    Attributes
    ----------
    best : numpy.ndarray
        float32 (S,), laid out as `lowered.plan.prior_offsets` says (the
        states at depths 1..depth as the tables hold them, padded to a
        reserved capacity): the entry of state s at depth d is the largest
        weighted prior (float32 weight x prior) among the live
        items below state s at depth d (with a negative weight: the
        smallest prior, weighted; either way the best term any item below
        can add); where only items outside the selection lie below, their
        one term (`outside_term`: a constant OUTSIDE_GAP below every live
        term, so they rank after the live ones and by the model among
        themselves); -inf where no item does.
    weight : float
        The prior's weight: an item's final score is its log-probability
        plus weight x prior.
    column : str
        The attribute it was read from.
    fingerprint : str
        The compiled set's (a prior of another set is refused).
    placements : Placements
        Its device copies, made once per device.
    """

    best: np.ndarray
    weight: float
    column: str
    fingerprint: str
    placements: Placements = dataclasses.field(default_factory=Placements, init=False,
                                               repr=False, compare=False)

    def __repr__(self):
        return (f"Prior(column={self.column!r}, weight={self.weight}, "
                f"entries={self.best.shape[0]})")


def check_prior(prior, fingerprint: str, where: str, made_by: str) -> "Prior":
    """`prior`, after checking it is a `Prior` of the set whose fingerprint
    is `fingerprint` (DecodeInputError naming `where` otherwise; made_by:
    the call that makes one, for the message)."""
    if not isinstance(prior, Prior):
        raise DecodeInputError(f"{where}: prior={repr(prior)[:60]} is a {type(prior).__name__}, "
                               f"expected a Prior (made by {made_by}(column, weight))")
    if prior.fingerprint != fingerprint:
        raise DecodeInputError(f"{where}: the prior is of another set (or of a version before "
                               f"an update): make it again with this set's {made_by}(...)")
    return prior


def check_no_length_penalty(prior, length_penalty: float) -> None:
    """DecodeInputError for a prior with a length penalty: the final scores
    with a prior are log-probability plus weight x prior, which GNMT's
    rescaling would mix up."""
    if prior is not None and length_penalty:
        raise DecodeInputError(f"prior with length_penalty={length_penalty}: the final scores "
                               "with a prior are log-probability plus weight x prior, which a "
                               "length penalty would rescale; pass one or the other")


def check_weight(weight) -> float:
    """The weight as a float: finite (not a bool)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)) \
            or not math.isfinite(weight):
        raise DecodeInputError(f"prior: weight={weight!r}: expected a finite float")
    return float(weight)


def item_values(items, column: str) -> np.ndarray:
    """float32 (N',): the prior of each unique item, the value of `column`
    (a float or int attribute) at its first live input row
    (`ItemIndex.first_live_rows`). Raises
    AttributeColumnError naming the column when it is missing, of another
    kind, or holds a value that is not finite (NaN, +-inf)."""
    columns = items.attributes or {}
    if column not in columns:
        raise AttributeColumnError(f"prior: no attribute {column!r}: the items carry "
                                   f"{sorted(columns) or 'none'} (give it with attributes=... "
                                   "when compiling)")
    col = columns[column]
    if col.kind not in ("float", "int"):
        raise AttributeColumnError(f"prior: attribute {column!r} is a {col.kind} column: expected "
                                   "a float or int column (the log-prior of each item)")
    first = items.first_live_rows()  # (a row an update made stale no longer counts)
    values = np.asarray(col.values)[first].astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise AttributeColumnError(f"prior: attribute {column!r} holds {values[bad[0]]} at input "
                                   f"row {int(first[bad[0]])}: expected finite values")
    return values


def weighted(values: np.ndarray, weight: float, column: str) -> np.ndarray:
    """float32 (N',): float32(weight) x values, each finite (AttributeColumnError
    naming the column where the product overflows float32)."""
    with np.errstate(over="ignore"):
        out = np.float32(weight) * values.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        raise AttributeColumnError(f"prior: weight {weight} x attribute {column!r} overflows "
                                   f"float32 at item {int(bad[0])} ({values[bad[0]]}): expected "
                                   "a smaller weight or prior")
    return out


def best_below(trie, items, values: np.ndarray, item_live: np.ndarray,
               state_counts: Optional[tuple] = None) -> np.ndarray:
    """float32 (S,), laid out as `lowered.plan.prior_offsets` says: for each
    state at depths 1..depth of `trie` (a trie held in its tables,
    `set_view.TableTrie`),
    the largest of `values` (float32 (N',), per unique item: the weighted
    priors) over the items ending at or below it, an item that `item_live`
    (bool (N',)) leaves out counting as `outside_term`, -inf where no item
    does; with an end token, then each state's own term at depths
    0..depth (its item's, -inf where none ends there).
    Depth d padded to state_counts[d] states (the tables'; None: the
    trie's)."""
    depth = trie.depth
    counts = state_counts or tuple(trie.num_states_at(d) for d in range(depth + 1))
    kept = np.where(item_live, values, outside_term(values, item_live)).astype(np.float32)
    own = _own_terms(trie, items, kept, counts)
    below = [own[depth]]
    for d in range(depth - 1, 0, -1):
        below.append(np.maximum(own[d], _layer_max(trie.layers[d], below[-1], counts[d])))
    below.reverse()  # depths 1..depth
    return np.concatenate(below + ([] if trie.end_token is None else own))


def _own_terms(trie, items, kept: np.ndarray, counts: tuple) -> list:
    """float32 (counts[d],) per depth 0..depth: the term of the item ending
    at each state, -inf where none does (a fixed-length set: the last
    depth's states are its items, the others end none; with an end token,
    the item index's item_depth / item_state say where each ends)."""
    depth = trie.depth
    own = [np.full(counts[d], -np.inf, np.float32) for d in range(depth + 1)]
    if items.item_depth is None:
        order = state_order.item_order(items)
        finals = trie.num_final_states
        item_of_state = np.arange(finals) if order is None else \
            np.asarray(order[np.arange(finals)], np.int64)
        own[depth][:finals] = kept[item_of_state]
        return own
    item_depth, item_state = np.asarray(items.item_depth), np.asarray(items.item_state)
    for d in range(depth + 1):
        at = item_depth == d
        own[d][item_state[at]] = kept[at]
    return own


def _layer_max(layer, child_best: np.ndarray, room: int) -> np.ndarray:
    """float32 (room,): for each state of `layer` (implicit targets: child
    e is state e at the next depth) the max of its children's entries of
    child_best, -inf for a state without children and past the layer's."""
    n = layer.num_states
    out = np.full(room, -np.inf, np.float32)
    if getattr(layer, "kind", None) == "unary":
        out[:n] = child_best[:n]
        return out
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        ptr = row_range(layer.indptr, a, b)
        lo, hi = int(ptr[0]), int(ptr[-1])
        if hi == lo:
            continue
        part = child_best[lo:hi]
        starts = ptr[:-1] - lo
        full = starts < ptr[1:] - lo  # rows with a child (reduceat would copy the next row)
        maxima = np.maximum.reduceat(part, np.minimum(starts, hi - lo - 1))
        out[a:b] = np.where(full, maxima, np.float32(-np.inf))
    return out
