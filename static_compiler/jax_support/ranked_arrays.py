"""A ranked subset's arrays on a JAX device (issue 54), shared by the two
JAX doors: the in-process decoder reads them (`backend.decode.ranked`) and
the served artifact passes them to its exported ``_ranked`` modules
(`serving.engine`), whose arguments are these arrays' pytree leaves in
order (`ranked_leaves`).

* `RankArrays`: an `ItemRanks` with its word counts (three reads a rank);
* `RangeArrays`: what `trie_ranges.state_ranges` reads of one set (row
  pointers, accepting ranks, the added items' trie positions), placed once
  per set (`set_ranges`: cached in the set view's `placements`);
* `RankedMask`: what the decoders read in place of a `live.LiveMask`: the
  set's `RangeArrays`, the subset's rank bits (placed once per subset: its
  `placements`) and each batch row's subset; `ranked_mask` makes it,
  checking the subset against the set.

Every array is a pytree leaf, the structure (which layers accept, which
layout a layer's row pointers have) static: a new subset of the same set
and stack size runs the same program. Index arrays are int32 (positions
and states of a set under 2^31; jax's default ints).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from static_compiler.decoding.warm_up import in_background
from static_compiler.errors import DecodeInputError
from static_compiler.item_bits import rank, trie_ranges
from static_compiler.item_bits.liveness import checked_rows
from static_compiler.support.decode_state import is_traced

_INT32_MAX = (1 << 31) - 1


class RankArrays(NamedTuple):
    """R bitmaps with fine rank counts (`rank.ItemRanks` with ``within``):
    words uint32 (R, W) (W * 32 > size: a position's word is always whole),
    counts int32 (R, W / 16 + 1), within uint16 (R, W), size int32 ()."""

    words: Any
    counts: Any
    within: Any
    size: Any


def rank_arrays(ranks: rank.ItemRanks, put=jax.device_put) -> RankArrays:
    """`ranks` as `RankArrays` placed by `put` (its word counts computed
    when it was made without them)."""
    if ranks.within is None:
        ranks = rank.ItemRanks.of_words(ranks.words, ranks.size, fine=True)
    words, within, counts = ranks.words, ranks.within, ranks.counts
    if words.shape[1] * 32 <= ranks.size:  # (made without the spare bit: a block of zeros)
        words, within = (np.pad(a, ((0, 0), (0, 16))) for a in (words, within))
    if ranks.size > _INT32_MAX or words.size > _INT32_MAX:
        raise DecodeInputError(f"ranked subsets: {ranks.size} bits in {words.shape[0]} rows: the "
                               f"JAX doors read ranked subsets of under 2^31 items")
    return RankArrays(put(np.ascontiguousarray(words)), put(counts.astype(np.int32)),
                      put(np.ascontiguousarray(within)), put(np.int32(ranks.size)))


@dataclasses.dataclass(frozen=True)
class RangeArrays:
    """What `trie_ranges.state_ranges` reads of one set, as arrays
    (`range_arrays`; `rank_kernels.RangeTensors`' layout).

    rows: per layer d, its row pointers: None (unary: the identity), an
    int32 array (S_d + 1,), or (RankArrays of its exception marks, extra
    (X + 1,), the exceptions' states (X,), where their rows start (X,))
    (`trie_ranges.ExceptionRows`); accepting: per depth 0..depth - 1,
    `RankArrays` of its accepting bits or None (none accepts); counts:
    int32 (depth + 1,), the trie's states per depth; at: int32 (K,), the
    added items' trie positions; ends (static, with the pytree's
    structure): per depth, whether `Subset.ends` holds bits there (what
    `end_live` answers)."""

    rows: tuple
    accepting: tuple
    counts: Any
    at: Any
    ends: tuple = ()

    @property
    def depth(self) -> int:
        return len(self.rows)

    def carries_offsets(self, depth: int) -> bool:
        """Whether states at `depth` need their offsets (an item ends at a
        depth above)."""
        return any(a is not None for a in self.accepting[:depth])


jax.tree_util.register_dataclass(RangeArrays, data_fields=["rows", "accepting", "counts", "at"],
                                 meta_fields=["ends"])


class SetRanges(NamedTuple):
    """A set's `RangeArrays` with what a ranked subset of it has (checked
    by `ranked_mask`): at, its added items' trie positions (numpy); its
    item count; first: the item ranges of its depth-1 states
    (`trie_ranges.DepthBounds`), None for a set of depth 0."""

    arrays: RangeArrays
    at: np.ndarray
    num_items: int
    first: Optional[trie_ranges.DepthBounds]


def range_arrays(trie, order, put=jax.device_put) -> SetRanges:
    """The `SetRanges` of a set's trie (`rules.set_view.TableTrie` or
    `ir.Automaton`: its layers, final states and end token) and trie order
    (`trie_ranges.trie_order`), placed by `put`."""
    tables = trie_ranges.range_tables(trie, order, np.int32)
    largest = max(tables.counts + (tables.num_items,))
    if largest > _INT32_MAX - 1:  # (a larger set's int32 tables wrapped: refused here)
        raise DecodeInputError(f"ranked subsets: {largest} states or items: the JAX doors "
                               "read ranked subsets of under 2^31")
    put32 = lambda a: put(np.asarray(a).astype(np.int32, copy=False))  # noqa: E731
    rows = tuple(r if r is None else put32(r) if isinstance(r, np.ndarray) else
                 (rank_arrays(r[0], put),) + tuple(put32(a) for a in r[1:]) for r in tables.rows)
    accepting = tuple(None if a is None else rank_arrays(a, put) for a in tables.accepting)
    first = trie_ranges.depth_bounds(tables.layers, 1) if tables.layers.depth else None
    return SetRanges(RangeArrays(rows, accepting, put32(tables.counts), put32(tables.at),
                                 tables.ends), tables.at, tables.num_items, first)


def set_ranges(view, on=None) -> SetRanges:
    """The `SetRanges` of the set of `view` (a `rules.set_view.SetView`
    with items) on sharding `on` (None: jax's default device), made once
    per view and `on` (its `placements`, key ("jax-ranges", on); versions
    after removals share them: the same trie and order); waits for them
    where `start_set_ranges` began them."""
    return _ranges(view, on, background=False).result()


def start_set_ranges(view, on=None) -> None:
    """Begins `set_ranges(view, on)` on a daemon thread, if not made or
    begun yet, after the view's `rows_in_item_order` (what the first ranked
    subset asks): a served artifact with ranked modules starts them when
    loaded, so the first ranked subset and decode find them made (at 1e9
    items they take seconds: the near_unary layers' exception marks, the 4
    GB row -> item map read)."""
    _ranges(view, on, background=True)


def _ranges(view, on, background: bool) -> concurrent.futures.Future:
    def make():
        if background:
            view.rows_in_item_order()
        with jax.ensure_compile_time_eval():
            return range_arrays(view.trie(), view.trie_order(),
                                lambda a: jax.device_put(a, on))

    def start():
        if background:
            return in_background(make, "static-compiler-ranges")
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(make())  # (an error raises here: nothing kept)
        return done

    return view.placements.get(("jax-ranges", on), start)


class RankedMask(NamedTuple):
    """A ranked subset as the decoders read it (the `live.LiveMask` of the
    rank form): ranges, the set's `RangeArrays`; items, `RankArrays` (R
    rows) over the item ids; added, over the added items in trie order
    (None without additions); rows: int32 (B,), each batch row's subset;
    first: bool (R, S_1), which depth-1 states have a selected item below
    them, made on the host when placed (`trie_ranges.depth_live`: S_1 <= V
    ranks a row) and read at step 0 as one entry a candidate (the root's V
    children of every beam cost two range counts each otherwise:
    `rank_kernels.RankedLive.first`)."""

    ranges: RangeArrays
    items: RankArrays
    added: Optional[RankArrays]
    rows: Any
    first: Any = None

    @property
    def num_subsets(self) -> int:
        return int(self.items.words.shape[0])


def is_ranked(mask) -> bool:
    """Whether a decoder's subset bits are a `RankedMask`."""
    return isinstance(mask, RankedMask)


def ranked_mask(subset: rank.RankedSubset, ranges: SetRanges, fingerprint: str,
                subset_index, batch_size: int, where: str, on=None) -> RankedMask:
    """The `RankedMask` of `subset` over the set of `ranges` (`set_ranges`) whose
    fingerprint is `fingerprint`, with `subset_index` ints (batch_size,)
    picking each row's subset (default: all rows subset 0, for a single
    subset; concrete indices checked here, traced ones clamped when read).
    The rank bits are put on sharding `on` (None: the default device) once
    (the subset's `placements`, key ("jax-ranked", on)). DecodeInputError
    naming the value for a ranked subset of another set or version
    (fingerprint, item count, added positions) or a bad index.

    A Python-stepped search asks for the same mask at every step: the last
    mask made for concrete rows is kept with the subset (`_LastMask`) and
    given again for the same ranges, fingerprint, sharding and index
    values, checked already (a call's checks and placement were ~10 us of a
    step's host time)."""
    if not isinstance(subset, rank.RankedSubset):
        raise DecodeInputError(f"{where}: expected a RankedSubset, got {type(subset).__name__}")
    last = subset.placements.get(("jax-ranked-last", on), _LastMask)
    index = None if subset_index is None or is_traced(subset_index) else \
        np.asarray(subset_index)
    call = None if is_traced(subset_index) else (
        fingerprint, batch_size, None if index is None else (index.dtype.str, index.shape,
                                                             index.tobytes()))
    if call is not None:
        found = last.find(ranges, call)
        if found is not None:
            return found
    if subset.fingerprint != fingerprint:
        raise DecodeInputError(f"{where}: the ranked subset was made from another set or "
                               f"version (fingerprint {subset.fingerprint!r}, this set's "
                               f"{fingerprint!r})")
    K = int(ranges.at.shape[0])
    if subset.items.size != ranges.num_items or subset.at.shape[0] != K or \
            not np.array_equal(subset.at, ranges.at):
        raise DecodeInputError(f"{where}: the ranked subset has {subset.items.size} items, "
                               f"{subset.at.shape[0]} of them added: this set has "
                               f"{ranges.num_items}, {K} added")
    R = subset.num_subsets
    if subset_index is None:
        if R != 1:
            raise DecodeInputError(f"{where}: {R} stacked subsets: pass subset_index, ints "
                                   f"({batch_size},), one per batch row")
        rows = np.zeros(batch_size, np.int32)
    elif is_traced(subset_index):
        rows = subset_index  # (its shape checked by the decoder: `live.check_live_mask`)
    else:
        rows = checked_rows(subset_index, R, batch_size, where).astype(np.int32)

    def place():
        put = lambda a: jax.device_put(a, on)  # noqa: E731
        with jax.ensure_compile_time_eval():
            items = rank_arrays(subset.items, put)
            added = rank_arrays(subset.added, put) if K else None
            first = None if ranges.first is None else \
                put(trie_ranges.depth_live(subset, ranges.first))
            return items, added, first

    items, added, first = subset.placements.get(("jax-ranked", on), place)
    mask = RankedMask(ranges.arrays, items, added, rows, first)
    return mask if call is None else last.keep(ranges, call, mask)


class _LastMask:
    """The last `RankedMask` `ranked_mask` made of one subset for concrete
    rows, with what it was made for: the `SetRanges` (the same object) and
    (fingerprint, batch size, the index's dtype, shape and bytes). One
    entry, replaced whole (a thread reads the old pair or the new)."""

    def __init__(self):
        self._entry: Optional[tuple] = None

    def find(self, ranges: SetRanges, call: tuple) -> Optional[RankedMask]:
        entry = self._entry
        if entry is not None and entry[0] is ranges and entry[1] == call:
            return entry[2]
        return None

    def keep(self, ranges: SetRanges, call: tuple, mask: RankedMask) -> RankedMask:
        self._entry = (ranges, call, mask)
        return mask


def ranked_leaves(mask: RankedMask) -> tuple[list, list[str]]:
    """(leaves, names) of `mask` in pytree order: the arguments an
    exported ``_ranked`` module takes after its own, and their manifest
    names (``ranked.ranges.rows[1]``, ``ranked.items.words`` ...)."""
    paths, _ = jax.tree_util.tree_flatten_with_path(mask)
    return [leaf for _, leaf in paths], ["ranked" + _path_text(path) for path, _ in paths]


def _path_text(path) -> str:
    """A pytree path as ``.field[index]`` text."""
    out = []
    for key in path:
        if isinstance(key, jax.tree_util.SequenceKey):
            out.append(f"[{key.idx}]")
        elif isinstance(key, jax.tree_util.GetAttrKey):
            out.append(f".{key.name}")
        elif isinstance(key, jax.tree_util.DictKey):
            out.append(f".{key.key}")
        else:
            out.append(f".{key}")
    return "".join(out)
