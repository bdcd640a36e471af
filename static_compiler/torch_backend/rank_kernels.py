"""Rank reads of item subsets in torch: whether a candidate state has a
selected item at or below it, as a range count over the subset's item bits
in trie order (`static_compiler.item_bits.rank`, issue 54), instead of a
liveness bit per state computed up the trie for every subset.

* `RankTensors`: an `ItemRanks` with its word counts (fine: three reads a
  rank) as tensors, R rows;
* `RankedRows`: a `RankedSubset` placed (R stacked subsets, its set's
  fingerprint), read per batch row through a subset index int64 (B,);
* `RangeTensors`: what `trie_ranges.state_ranges` reads of one set (row pointers,
  accepting ranks, the added items' trie positions), placed once per
  device (`range_tensors`);
* `child_live` / `end_live`: the bool answers of `kernels.child_live` /
  `kernels.end_live` for candidate next states int64 (B, K) / states (B,),
  given the offsets a variable-length set's decoder carries down each row
  (`child_offsets`; zeros at the root, None for a set where no item ends
  above the last depth).

The same conventions as `kernels`: a static step, no host synchronisation,
no branch on tensor values (one ``torch.compile(fullgraph=True)`` graph);
positions and rows clamped into their tables; a state outside the trie's
[0, S_d) (a capacity's padding, -1 of a dense row) reads False, as its
liveness bit does. torch has no popcount: words are counted by shifts and
masks over int64.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits import rank, trie_ranges
from static_compiler.torch_backend.checks import is_int_dtype
from static_compiler.torch_backend.gather import take


class RankTensors(NamedTuple):
    """R bitmaps of `size` bits with fine rank counts (`rank.ItemRanks`
    with ``within``): words int32 (R, W) (uint32 reinterpreted; W * 32 >
    size, so a position's word is always whole and its bit below 32),
    counts int32 / int64 (R, W / 16 + 1), within int16 (R, W)."""

    words: torch.Tensor
    counts: torch.Tensor
    within: torch.Tensor
    size: int


def rank_tensors(ranks: rank.ItemRanks, device=None) -> RankTensors:
    """`ranks` as `RankTensors` on `device` (its word counts computed when
    it was made without them). On the CPU the tensors share the arrays'
    memory (no copy: a subset is placed in microseconds)."""
    if ranks.within is None:
        ranks = rank.ItemRanks.of_words(ranks.words, ranks.size, fine=True)
    words, within, counts = ranks.words, ranks.within, ranks.counts
    if words.shape[1] * 32 <= ranks.size:  # (made without the spare bit: a block of zeros)
        words, within = (np.pad(a, ((0, 0), (0, 16))) for a in (words, within))
    counts = counts.view(np.int32) if counts.dtype == np.uint32 and ranks.size < 1 << 31 else \
        counts.astype(np.int64)
    put = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return RankTensors(put(words.view(np.int32)), put(counts), put(within.view(np.int16)),
                       int(ranks.size))


def _popcount(x: torch.Tensor) -> torch.Tensor:
    """Set bits of each int32 (or int64 holding 32 bits) of `x`, a tensor
    of this module's own (updated in place: 8 of its 12 ops write no new
    buffer): shifts and masks, wrapping arithmetic (the sum's top byte is
    at most 32, positive)."""
    y = x >> 1
    y &= 0x55555555
    x -= y
    y = x >> 2
    y &= 0x33333333
    x &= 0x33333333
    x += y
    x += x >> 4
    x &= 0x0F0F0F0F
    x *= 0x01010101
    if x.dtype == torch.int64:
        x &= 0xFFFFFFFF
    return x >> 24


def rank_at(t: RankTensors, rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """at.dtype, at.shape: set bits before positions `at` (B, ...) (int32
    or int64, clamped to [0, size]) of rows `rows` (B,) (ints, clamped to
    [0, R)). int32 positions count in int32 (half the bytes an op moves)."""
    R, W = t.words.shape
    C = t.counts.shape[1]
    at = at.clamp(0, t.size)
    word = at >> 5  # (< W: the spare bit keeps it whole)
    keep = (torch.ones_like(at) << (at & 31)) - 1  # (int32: bit 31 wraps, as uint32 would)
    row = rows.clamp(0, R - 1).to(at.dtype if R * W < 1 << 31 else torch.int64)
    row = row.reshape(rows.shape + (1,) * (at.ndim - rows.ndim))
    flat = row * W + word
    value = take(t.words.reshape(-1), flat).to(at.dtype)  # (a new tensor: counted in place)
    if at.dtype == torch.int64:
        value &= 0xFFFFFFFF
    value &= keep
    total = _popcount(value)
    total += take(t.within.reshape(-1), flat)
    total += take(t.counts.reshape(-1), row * C + (word >> 4))
    return total


class RankedRows(NamedTuple):
    """A `rank.RankedSubset` of R subsets placed: items, `RankTensors` over
    the item ids; added, over the added items in trie order (None without
    additions); fingerprint, its set's."""

    items: RankTensors
    added: Optional[RankTensors]
    fingerprint: str

    @property
    def num_subsets(self) -> int:
        return int(self.items.words.shape[0])


class RangeTensors(NamedTuple):
    """What `trie_ranges.state_ranges` reads of one set, as tensors (`range_tensors`).

    rows: per layer d, its row pointers: None (unary: the identity), an
    index tensor (S_d + 1,), or (RankTensors of its exception marks, extra
    (X + 1,), the exceptions' states (X,) and where their rows start (X,))
    (`trie_ranges.ExceptionRows`); accepting: per depth 0..depth - 1,
    `RankTensors` of its accepting bits or None (none accepts); counts: the
    trie's states per depth 0..depth; ends: per depth, whether
    `Subset.ends` holds bits there (what `kernels.end_live` answers); at:
    (K,), the added items' trie positions; num_items: N' (all of them,
    added too); fingerprint: the set's. Index tensors are int32 where every
    position and state fits (ops move half the bytes), else int64: `dtype`."""

    rows: tuple
    accepting: tuple
    counts: tuple
    ends: tuple
    at: torch.Tensor
    num_items: int
    fingerprint: str

    @property
    def depth(self) -> int:
        return len(self.rows)

    @property
    def dtype(self) -> torch.dtype:
        return self.at.dtype

    def carries_offsets(self, depth: int) -> bool:
        """Whether states at `depth` need their offsets (an item ends at a
        depth above)."""
        return any(a is not None for a in self.accepting[:depth])


def range_tensors(trie, order, fingerprint: str, device=None) -> RangeTensors:
    """The `RangeTensors` of a set's trie (`rules.set_view.TableTrie`: its
    layers, final states and end token) and trie order (`trie_ranges.trie_order`,
    an `InsertedOrder`), placed on `device`: once per set and device."""
    tables = trie_ranges.range_tables(trie, order)
    small = max(tables.counts + (tables.num_items,)) < (1 << 31) - 1
    dtype = np.int32 if small else np.int64
    put = lambda a: torch.from_numpy(np.array(a, dtype)).to(device)  # noqa: E731  (a copy: tables may be read-only maps)
    rows = tuple(r if r is None else put(r) if isinstance(r, np.ndarray) else
                 (rank_tensors(r[0], device),) + tuple(put(a) for a in r[1:])
                 for r in tables.rows)
    accepting = tuple(None if a is None else rank_tensors(a, device) for a in tables.accepting)
    return RangeTensors(rows, accepting, tables.counts, tables.ends, put(tables.at),
                        tables.num_items, fingerprint)


def ranked_rows(ranked: rank.RankedSubset, ranges: RangeTensors, where: str,
                device=None) -> RankedRows:
    """`ranked` placed on `device` for decoding over the set of `ranges`;
    DecodeInputError naming the value when it is not a `RankedSubset` of
    that set (fingerprint, item count, added positions)."""
    if not isinstance(ranked, rank.RankedSubset):
        raise DecodeInputError(f"{where}: subset is a {type(ranked).__name__}: expected a "
                               "RankedSubset of this set (`rank.ranked_subset`)")
    if ranked.fingerprint != ranges.fingerprint:
        raise DecodeInputError(f"{where}: the ranked subset was made from another set "
                               f"(fingerprint {ranked.fingerprint!r}, this set's "
                               f"{ranges.fingerprint!r})")
    K = int(ranges.at.shape[0])
    if ranked.items.size != ranges.num_items or ranked.at.shape[0] != K \
            or not np.array_equal(ranked.at, ranges.at.cpu().numpy()):
        raise DecodeInputError(f"{where}: the ranked subset has {ranked.items.size} items, "
                               f"{ranked.at.shape[0]} of them added: this set has "
                               f"{ranges.num_items}, {K} added")
    return RankedRows(rank_tensors(ranked.items, device),
                      rank_tensors(ranked.added, device) if K else None, ranked.fingerprint)


class RankedLive(NamedTuple):
    """A ranked subset as the decoders read it (the `kernels.LiveBits` of
    the rank form, `ranked_live`): the set's `RangeTensors`, the placed
    `RankedRows`, one device; first, bool (R, S_1): which states at depth 1
    have a selected item below them, made once when placed (S_1 <= V
    ranks a subset) and read at step 0 as one entry a candidate: the
    root's V children of every row cost a rank each otherwise."""

    ranges: RangeTensors
    ranked: RankedRows
    first: torch.Tensor

    @property
    def num_subsets(self) -> int:
        return self.ranked.num_subsets


def ranked_live(ranges: RangeTensors, ranked: RankedRows) -> RankedLive:
    """The `RankedLive` of `ranked` (placed) over the set of `ranges`: its
    depth-1 states' bits read from its rank bits (`RankedLive.first`)."""
    R, S = ranked.num_subsets, ranges.counts[1]
    device = ranked.items.words.device
    rows = torch.arange(R, device=device)
    states = torch.arange(S + 1, dtype=ranges.dtype, device=device).expand(R, S + 1)
    offsets = _child_offsets(ranges, 0, None, torch.zeros(R, dtype=ranges.dtype, device=device))
    return RankedLive(ranges, ranked,
                      _between(ranges, ranked, rows, below(ranges, 1, states), offsets))


def check_rows(ranked: RankedRows, rows, batch_size: int, where: str) -> torch.Tensor:
    """A subset index: ints (batch_size,) as int64 (values unchecked: one
    outside [0, R) reads a clamped row); else DecodeInputError naming its
    shape and dtype."""
    if not isinstance(rows, torch.Tensor) or tuple(rows.shape) != (batch_size,) or \
            not is_int_dtype(rows.dtype):
        shape = tuple(rows.shape) if hasattr(rows, "shape") else type(rows).__name__
        raise DecodeInputError(f"{where}: subset_index has shape {shape} and dtype "
                               f"{getattr(rows, 'dtype', None)}: expected an int tensor "
                               f"({batch_size},), one of the {ranked.num_subsets} subsets per "
                               "batch row")
    return rows.long()


# ---------------------------------------------------------------------------
# Ranges and counts


def _next_rows(rows, x: torch.Tensor) -> torch.Tensor:
    """Row pointers of one layer at states x (in [0, S])."""
    if rows is None:
        return x
    if isinstance(rows, tuple):
        marks, extra = rows[:2]
        none = torch.zeros(x.shape[:1], dtype=x.dtype, device=x.device)
        return x + take(extra, rank_at(marks, none, x))
    return take(rows, x)


def below(ranges: RangeTensors, depth: int, x: torch.Tensor) -> torch.Tensor:
    """`trie_ranges.below`: x.shape in `ranges.dtype`, the items ending at or below
    `depth` under the states before x (B, ...) (clamped to [0, S_depth])."""
    x = x.to(ranges.dtype).clamp(0, ranges.counts[depth])
    none = torch.zeros(x.shape[:1], dtype=x.dtype, device=x.device)
    total = None
    for d in range(depth, ranges.depth + 1):
        if d == ranges.depth:
            return x if total is None else total + x
        if ranges.accepting[d] is not None:
            here = rank_at(ranges.accepting[d], none, x)
            total = here if total is None else total + here
        x = _next_rows(ranges.rows[d], x)
    raise AssertionError("unreachable")


def selected_before(ranges: RangeTensors, ranked: RankedRows, rows: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
    """positions.shape: the selected items at trie positions before
    `positions` (B, ...) in each row's subset (`RankedSubset.prefix`)."""
    if ranked.added is None:
        return rank_at(ranked.items, rows, positions)
    j = torch.searchsorted(ranges.at, positions.contiguous()).to(positions.dtype)
    return rank_at(ranked.items, rows, positions - j) + rank_at(ranked.added, rows, j)


def _offsets(ranges: RangeTensors, depth: int, offsets, where: str):
    if offsets is None:
        if ranges.carries_offsets(depth):
            raise DecodeInputError(f"{where}: offsets=None at depth {depth}: items end above "
                                   "it (a variable-length set): pass the offsets carried "
                                   "down each row (`child_offsets`, zeros at the root)")
        return None
    return offsets.to(ranges.dtype)


def _between(ranges, ranked, rows, edges, offsets) -> torch.Tensor:
    """bool (B, K): a selected item between consecutive bounds `edges` (B,
    K + 1) (states at one depth, composed down by `below`)."""
    if offsets is not None:
        edges = edges + offsets[:, None]
    counts = selected_before(ranges, ranked, rows, edges)
    return counts[:, 1:] > counts[:, :-1]


def child_live(ranges: RangeTensors, ranked: RankedRows, rows: torch.Tensor, step: int,
               nxt: torch.Tensor, offsets: Optional[torch.Tensor] = None,
               consecutive: bool = False) -> torch.Tensor:
    """bool (B, K): the next states `nxt` int (B, K) (depth step + 1) have
    a selected item at or below them in each row's subset (`kernels.
    child_live`'s answer). offsets (B,): the offset of the rows' children
    (`child_offsets` of the rows' states), None where no item ends above
    depth step + 1. consecutive: nxt[:, i + 1] == nxt[:, i] + 1 (a csr /
    near_unary slice, a unary step): K + 1 bounds a row, not 2 K."""
    depth = step + 1
    offsets = _offsets(ranges, depth, offsets, "rank_kernels.child_live")
    if consecutive:
        return _between(ranges, ranked, rows, below(ranges, depth, torch.cat(
            [nxt, nxt[:, -1:] + 1], dim=1)), offsets)
    bounds = below(ranges, depth, torch.stack([nxt, nxt + 1], dim=1))
    if offsets is not None:
        bounds = bounds + offsets[:, None, None]
    counts = selected_before(ranges, ranked, rows, bounds)
    return counts[:, 1] > counts[:, 0]


def dense_child_live(ranges: RangeTensors, ranked: RankedRows, rows: torch.Tensor,
                     step: int, node: torch.Tensor, nxt: torch.Tensor,
                     offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bool (B, V): `child_live` at a dense_rows step, whose next states
    `nxt` (B, V) (-1: no child) of states `node` (B,) are the consecutive
    states of the node's row in token order: V + 1 bounds a row (the row's
    states, cut at its end) instead of 2 V, read back by nxt - first."""
    depth = step + 1
    offsets = _offsets(ranges, depth, offsets, "rank_kernels.dense_child_live")
    pointers = ranges.rows[step]
    if not isinstance(pointers, torch.Tensor):
        raise DecodeInputError(f"rank_kernels.dense_child_live: layer {step} keeps no row "
                               "pointer array (not a dense_rows or csr layer)")
    V = nxt.shape[1]
    x = node.to(ranges.dtype).clamp(0, ranges.counts[step] - 1 if ranges.counts[step] else 0)
    first, last = take(pointers, x), take(pointers, x + 1)
    states = torch.minimum(first[:, None] + torch.arange(V + 1, dtype=x.dtype,
                                                         device=x.device), last[:, None])
    live = _between(ranges, ranked, rows, below(ranges, depth, states), offsets)
    column = nxt - first[:, None].to(nxt.dtype)  # (in nxt's dtype: no pass converting it)
    return (nxt >= 0) & live.gather(1, column.clamp_(0, V - 1).long())


def end_live(ranges: RangeTensors, ranked: RankedRows, rows: torch.Tensor, step: int,
             node: torch.Tensor, offsets: Optional[torch.Tensor] = None
             ) -> Optional[torch.Tensor]:
    """bool (B,): the item ending at states `node` int (B,) (depth `step`)
    is in each row's subset (`kernels.end_live`'s answer: False where the
    state does not accept); None where the set's subsets hold no end bits
    at that depth. offsets: the states' own (as `child_live`)."""
    if not ranges.ends[step]:
        return None
    offsets = _offsets(ranges, step, offsets, "rank_kernels.end_live")
    count = ranges.counts[step]
    inside = (node >= 0) & (node < count)
    x = node.to(ranges.dtype).clamp(0, count)
    if step == ranges.depth:
        accepts = inside
    elif ranges.accepting[step] is None:
        accepts = torch.zeros_like(inside)
    else:
        own = rank_at(ranges.accepting[step], torch.zeros_like(x), torch.stack([x, x + 1], 1))
        accepts = inside & (own[:, 1] > own[:, 0])
    lo = below(ranges, step, x[:, None])  # an accepting state's own item: at lo
    return accepts & _between(ranges, ranked, rows, torch.cat([lo, lo + 1], dim=1),
                              offsets)[:, 0]


def child_offsets(ranges: RangeTensors, step: int, offsets: torch.Tensor,
                  node: torch.Tensor) -> torch.Tensor:
    """(B,) in offsets' dtype: the offset every child of states `node`
    (depth `step`) has, from the states' own `offsets` (`rank.
    child_offsets`): what a decoder carries down a row with its state,
    zeros at the root."""
    if ranges.accepting[step] is None:
        return offsets
    x = (node.to(ranges.dtype) + 1).clamp(0, ranges.counts[step])
    return offsets + rank_at(ranges.accepting[step], torch.zeros_like(x), x).to(offsets.dtype)


# ---------------------------------------------------------------------------
# What the decoders read (`kernels.step_columns`, `kernels.dense_child`)


def _parents(rows, x: torch.Tensor) -> torch.Tensor:
    """The states one layer up whose rows hold states x (B,) (the layer's
    row pointers `rows`, as `RangeTensors.rows`): a binary search over
    the row pointers (the last row starting at or before x: an empty row
    never holds x), over a near_unary layer's exception starts, none for
    a unary layer."""
    if rows is None:
        return x
    if isinstance(rows, tuple):  # row s starts at s + extra(exceptions below s)
        _, extra, states, starts = rows
        j = torch.searchsorted(starts, x.contiguous(), right=True).to(x.dtype)
        shift = take(extra, j)
        last = take(states, j - 1)  # the last exception starting at or before x
        return torch.where((j > 0) & (x < last + 1 + shift), last, x - shift)
    return torch.searchsorted(rows, x.contiguous(), right=True).to(x.dtype) - 1


def node_offsets(ranges: RangeTensors, step: int, node: torch.Tensor) -> Optional[torch.Tensor]:
    """(B,) in `ranges.dtype`: the offsets of states `node` int (B,) at
    depth `step` (`trie_ranges.offsets_of`: their ancestors' accepting
    states before them, a search up a layer per depth), None where no
    item ends above that depth (every fixed-length set). The decoders'
    states carry no offsets (the JAX door's state tuples are the same):
    a variable-length set's rows pay these searches at each step."""
    if not ranges.carries_offsets(step):
        return None
    top = min(d for d in range(step) if ranges.accepting[d] is not None)
    x = node.to(ranges.dtype).clamp(0, max(ranges.counts[step] - 1, 0))
    none = torch.zeros_like(x)
    out = none
    for d in range(step - 1, top - 1, -1):
        x = _parents(ranges.rows[d], x).clamp(0, max(ranges.counts[d] - 1, 0))
        if ranges.accepting[d] is not None:
            out = out + rank_at(ranges.accepting[d], none, x + 1)
    return out


def _child_offsets(ranges: RangeTensors, step: int, offsets: Optional[torch.Tensor],
                   node: torch.Tensor) -> Optional[torch.Tensor]:
    """The offsets of the children of states `node` whose own are
    `offsets` (None: zeros), None where the children need none."""
    if not ranges.carries_offsets(step + 1):
        return None
    if offsets is None:
        offsets = torch.zeros(node.shape, dtype=ranges.dtype, device=node.device)
    return child_offsets(ranges, step, offsets, node)


def _first_live(live: RankedLive, rows: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
    """bool nxt.shape: `RankedLive.first` of states nxt int (B, K) at depth
    1 in each row's subset (a state outside [0, S_1): False)."""
    S = live.first.shape[1]
    inside = (nxt >= 0) & (nxt < S)
    at = rows.clamp(0, live.first.shape[0] - 1)[:, None] * S + nxt.clamp(0, max(S - 1, 0))
    return inside & take(live.first.reshape(-1), at)


def children_live(live: RankedLive, rows: torch.Tensor, step: int, dense: bool,
                  node: torch.Tensor, nxt: torch.Tensor,
                  offsets: Optional[torch.Tensor]) -> torch.Tensor:
    """bool (B, K): `child_live` of a step's candidates `nxt` (B, K) from
    states `node` (B,) with their own `offsets` (`node_offsets`): a
    dense_rows step's (`dense`) read by token (`dense_child_live`), the
    others' as consecutive states (a csr / near_unary slice, a unary
    step's one child)."""
    if step == 0:
        return _first_live(live, rows, nxt)
    ranges = live.ranges
    below = _child_offsets(ranges, step, offsets, node)
    if dense:
        return dense_child_live(ranges, live.ranked, rows, step, node, nxt, below)
    return child_live(ranges, live.ranked, rows, step, nxt, below, consecutive=True)


def one_child_live(live: RankedLive, rows: torch.Tensor, step: int, node: torch.Tensor,
                   nxt: torch.Tensor, offsets: Optional[torch.Tensor]) -> torch.Tensor:
    """bool (B,): `child_live` of one next state per row, nxt int (B,)
    (-1: none, False), from states `node` with their `offsets`."""
    if step == 0:
        return _first_live(live, rows, nxt[:, None])[:, 0]
    ranges = live.ranges
    below = _child_offsets(ranges, step, offsets, node)
    return child_live(ranges, live.ranked, rows, step, nxt[:, None], below)[:, 0]
