"""One numpy view of a compiled set's items, behind every front door.

The compiled set (`CompiledConstraints`), the served artifact
(`serving.Artifact`) and the torch backend (`TorchConstraints`) each hold
one `SetView` and add only their device placement (a subset's device copies
are kept in its `Subset.placements`). The view holds what item subsets read
on the host: the plan facts (`SetFacts`: step kinds, state counts, slot
steps, end token, V, final states), the host tables, the item index, the
fingerprint (a content hash of the set, then the items' removal tag), the
base subset (the items no update removed, computed once), and the trie and
`BitLayout` (built on first use; O(edges)). Versions of one set that keep
its tables (removals) share the trie, the layout and the fingerprint
(`SetView.version`).

Numpy only: the serving loader and the torch backend import it without jax
and without the compiler. A saved artifact's manifest is read into facts
here (`facts_of_manifest`), the one reader of its ``plan_steps``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from static_compiler.errors import ArtifactFormatError, ConstraintSetError, FilterExpressionError
from static_compiler.item_bits.item_masks import (
    RowSource,
    rows_are_items,
    rows_item_mask,
    stacked_rows_item_bits,
)
from static_compiler.item_bits.layers import TableLayer, table_layers
from static_compiler.item_bits.liveness import BitLayout, Subset, bit_layout, rows_item_live, subset_of_items
from static_compiler.item_bits.placements import Placements
from static_compiler.items.index import ItemIndex
from static_compiler.lowered.plan import Plan, PlanFacts, StepPlan, slot_steps, state_counts

if TYPE_CHECKING:  # (made on demand: a serving process never loads them)
    from static_compiler.item_bits import rank
from static_compiler.rules import priors


def _array_or_filter(selection):
    """A selection as the item masks take it: a `RowSource` (a filter) as it
    is, else an array (raises numpy's TypeError or ValueError for ragged
    lists)."""
    return selection if isinstance(selection, RowSource) else np.asarray(selection)


@dataclasses.dataclass(frozen=True)
class SetFacts(PlanFacts):
    """The plan facts item subsets read: the static `plan` (its steps'
    kinds and state counts, V, the end token), num_final_states, slot_steps
    (the steps whose children get slot bits: `lowered.plan.slot_steps`, or
    () for an artifact with per-state bits) and trie_layers, per layer
    (the trie's own states, its branch histogram or None) as a manifest
    records them, or None (the trie comes from the compiled set)."""

    plan: Plan
    num_final_states: int
    slot_steps: tuple
    trie_layers: Optional[tuple] = None

    @classmethod
    def of_plan(cls, plan: Plan, num_final_states: int, slots: bool = True,
                trie_layers: Optional[tuple] = None) -> "SetFacts":
        """slots: whether dense steps' subset bits are slot bits (a
        manifest's ``subset_bits == "dense_slots"``)."""
        return cls(plan, int(num_final_states), slot_steps(plan) if slots else (), trie_layers)

    @property
    def state_counts(self) -> tuple:
        """States per depth 0..depth as the tables hold them (`lowered.plan.state_counts`)."""
        return state_counts(self.plan)

    @property
    def explicit_targets(self) -> tuple:
        """bool per layer: whether its states are shared between items."""
        return tuple(bool(step.explicit_targets) for step in self.plan.steps)


def facts_of_manifest(manifest) -> SetFacts:
    """The `SetFacts` a saved artifact's `Manifest` records (its plan_steps,
    layers, vocab_size, end_token, num_final_states, subset_bits): the one
    reader of a manifest's plan. Raises ArtifactFormatError when the steps
    do not describe a plan."""
    try:
        steps = tuple(StepPlan(**step) for step in manifest.plan_steps)
        trie = tuple((layer["states"], layer.get("branch_counts")) for layer in manifest.layers)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactFormatError(f"plan_steps do not describe a plan ({type(e).__name__}: "
                                  f"{e})") from None
    plan = Plan(int(manifest.vocab_size), steps,
                None if manifest.end_token is None else int(manifest.end_token))
    return SetFacts.of_plan(plan, manifest.num_final_states,
                            manifest.subset_bits == "dense_slots", trie)


class TableTrie(NamedTuple):
    """A trie held in its tables: `layers.TableLayer`s of the trie's state
    counts, its final state count, V and end token (what `liveness`,
    `compiler_items.subsets.unique_ids` and `compiler_items.additions.merge_items`
    read of an automaton)."""

    layers: tuple
    num_final_states: int
    vocab_size: int
    end_token: Optional[int]

    @property
    def depth(self) -> int:
        return len(self.layers)

    def num_states_at(self, depth: int) -> int:
        return self.num_final_states if depth == self.depth else self.layers[depth].num_states

    @classmethod
    def of(cls, plan, summary, tables) -> "TableTrie":
        """The trie that a lowered set's `plan`, laid-out `summary`
        (`ir.AutomatonSummary`: counts and layouts) and `tables` hold."""
        layers = tuple(TableLayer(step.kind.value, tabs, layer.num_states,
                                  not step.explicit_targets, layer.layout, layer.branch_counts())
                       for step, layer, tabs in zip(plan.steps, summary.layers, tables))
        return cls(layers, summary.num_final_states, plan.vocab_size, plan.end_token)

    @classmethod
    def of_facts(cls, facts: SetFacts, tables) -> "TableTrie":
        """The trie of a saved artifact: its facts' trie_layers over `tables`
        (the trie's own state counts: tables padded to a capacity hold more)."""
        layers = table_layers([(step.kind, states, step.explicit_targets, histogram)
                               for step, (states, histogram) in zip(facts.plan.steps,
                                                                   facts.trie_layers)], tables)
        return cls(tuple(layers), facts.num_final_states, facts.vocab_size, facts.end_token)


def check_subsettable(items: Optional[ItemIndex], explicit_targets: Sequence[bool], where: str,
                      source: str = "this set", missing=ConstraintSetError) -> ItemIndex:
    """The item index, or an error naming `where` saying why `source` has
    none: `missing` (its type) without an index, ConstraintSetError when
    layers share states between items (explicit targets)."""
    if items is None:
        raise missing(f"{where}: {source} has no item index: item subsets need a set compiled "
                      "from sequences and saved with export_subsets=True (a graph or an IR "
                      "has no items; an artifact of format version < 3 none)")
    shared = [t for t, explicit in enumerate(explicit_targets) if explicit]
    if shared:
        raise ConstraintSetError(f"{where}: layers {shared} share states between items (explicit "
                                 "targets, from the 'minimize' pass): an item subset cannot be "
                                 "expressed as live states; compile without 'minimize' to use "
                                 "subsets")
    return items


def _selection(selection, items: ItemIndex, where: str):
    """`_array_or_filter` of a selection, ConstraintSetError naming it
    (and `where`) where it is no array (ragged nested lists)."""
    try:
        return _array_or_filter(selection)
    except (TypeError, ValueError) as err:
        raise ConstraintSetError(
            f"{where}: selection {str(selection)[:60]!r} is not an array ({err}): "
            f"expected bool ({items.num_items},) over the input rows") from None


def _trie_order(items: ItemIndex, trie):
    """`trie_ranges.trie_order` of a set's items and trie (`SetView.trie_order`)."""
    from static_compiler.item_bits import trie_ranges
    layers = None if items.item_depth is None else \
        trie_ranges.range_layers(trie.layers, trie.num_final_states)
    return trie_ranges.trie_order(items, layers)


class _Once:
    """A value made by `make()` on first use, once across threads."""

    def __init__(self, make: Callable[[], object]):
        self._make, self._done, self._value = make, False, None
        self._lock = threading.Lock()

    def get(self):
        if not self._done:
            with self._lock:
                if not self._done:
                    self._value, self._done, self._make = self._make(), True, None
        return self._value


class SetView:
    """A compiled set's items seen on the host (see the module doc).

    Attributes
    ----------
    facts : SetFacts
    tables : tuple of dict of str to numpy.ndarray
        The host tables, one dict per layer; () for a set without items
        (nothing reads them: a torch backend's host copies are dropped).
    items : ItemIndex or None
        The item index (None: no item subsets).
    fingerprint : str
        Property: the set's content hash and its items' removal tag;
        subsets carry it.
    """

    def __init__(self, facts: SetFacts, tables, items: Optional[ItemIndex],
                 fingerprint: Union[str, Callable[[], str]], *, trie=None, lookup=None,
                 source: str = "this set", missing=ConstraintSetError,
                 rows_in_item_order: Optional[bool] = None):
        """fingerprint: the set's hash, or a function computing it on first
        use; trie: a function returning the trie (`ir.Automaton` or
        `TableTrie`; default: `TableTrie.of_facts`); lookup: for a set whose
        subsets may also be token sequences, `compiler_items.subsets.item_mask`; source,
        missing: how a set without items is named, and the error type;
        rows_in_item_order: whether row i is item i for every row of `items`
        where known (an artifact's manifest records it, format version 17,
        checked at load), else None: read from `items` when first asked."""
        self.facts, self.items = facts, items
        self.tables = () if items is None else tuple(tables)
        self._lookup, self.source, self._missing = lookup, source, missing
        # (the builders hold what they read, not the view: versions share them)
        held = self.tables
        self._hash = _Once(fingerprint if callable(fingerprint) else lambda: fingerprint)
        self._trie = _Once(trie if trie is not None else lambda: TableTrie.of_facts(facts, held))
        built = self._trie
        self._layout = _Once(lambda: bit_layout(
            built.get().layers, {t: held[t]["next"] for t in facts.slot_steps},
            facts.state_counts))
        self._first_rows = _Once(lambda: items.first_live_rows())
        self._base = _Once(self._build_base)
        # (removals keep the order and the rows' items: versions share these two)
        self._order = _Once(lambda: _trie_order(items, built.get()))
        self._rows_are_items = _Once(lambda: rows_are_items(items)) \
            if rows_in_item_order is None or items is None else _Once(lambda: rows_in_item_order)
        self._removed_ranks = _Once(self._build_removed_ranks)
        # a door's device copies of what the trie and order give (a JAX door's ranked
        # subsets' ranges: `backend.decode.ranked.set_ranges`); removals share them
        self.placements = Placements()

    @classmethod
    def of_artifact(cls, manifest, tables, items: Optional[ItemIndex], ir_sha256: str, *,
                    source: str, missing, built=None) -> "SetView":
        """The view of a saved artifact read with numpy (`Manifest`, host
        tables, item index, and the sha256 of its IR text, the fingerprint's
        first part, from the manifest's file list; whether its rows are its
        items as the manifest records it, where it does); built:
        a view of the same host tables whose trie, layout and (once made) trie
        order to share."""
        view = cls(facts_of_manifest(manifest), tables, items, ir_sha256,
                   source=source, missing=missing,
                   rows_in_item_order=manifest.rows_in_item_order)
        if built is not None:
            view._trie, view._layout = built._trie, built._layout
            if built._order._done:  # (the same trie, so its order; once made: a builder not
                view._order = built._order  # yet run would hold the older items)
        return view

    def version(self, items: Optional[ItemIndex]) -> "SetView":
        """This view for a version of the set with the same tables and other
        `items` (a removal): the trie, layout, first rows and hash are shared,
        the base subset is the version's own."""
        if items is self.items:
            return self
        out = SetView.__new__(SetView)
        out.__dict__.update(self.__dict__, items=items)
        out._base = _Once(out._build_base)
        out._removed_ranks = _Once(out._build_removed_ranks)
        return out

    @property
    def fingerprint(self) -> str:
        return self._hash.get() + ("" if self.items is None else self.items.removal_tag)

    def trie(self):
        """The trie subsets and item lookups read (built once)."""
        return self._trie.get()

    def checked_items(self, where: str) -> ItemIndex:
        """The item index, or the error saying why there is none (`where`
        names the door)."""
        return check_subsettable(self.items, self.facts.explicit_targets, where, self.source,
                                 self._missing)

    def bit_layout(self, where: str) -> BitLayout:
        """The `BitLayout` of this set's subsets (built once); raises as
        `checked_items` for a set without item subsets."""
        self.checked_items(where)
        return self._layout.get()

    def first_rows(self) -> np.ndarray:
        """int64 (N',): the first live input row of each unique sequence
        (`ItemIndex.first_live_rows`)."""
        return self._first_rows.get()

    def pick(self, selection, expression, masks, where: str) -> Subset:
        """What every door's ``subset(selection=None, *, where=None,
        masks=None)`` does: `subset` of `selection`, or of the rows the
        filter `expression` (text or `rules.where.Expr`) picks over the
        items' attributes and the named bool (N,) `masks` (per-request item
        masks such as ``seen``), evaluated by `rules.where.evaluate`. Raises
        ConstraintSetError for both or neither of selection and expression
        (FilterExpressionError for masks without an expression, and for the
        expression's own errors) and as `subset`."""
        return self.subset(self.selected_rows(selection, expression, masks, where), where)

    def selected_rows(self, selection, expression, masks, where: str):
        """`pick`'s selection: `selection` as given, or the filter
        `expression` (with `masks`) checked as a `rules.where.RowFilter` over
        the N input rows, evaluated where it is used (a chunk at a time into
        item bits, `item_masks.rows_item_bits`); raises as `pick`."""
        from static_compiler.rules.where import checked_masks, row_filter  # (serving: when used)

        items = self.checked_items(where)
        if masks is not None:  # (first: a list of masks gets this error, not numpy's)
            try:
                masks = checked_masks(masks, items.num_items)
            except FilterExpressionError as err:
                raise FilterExpressionError(f"{where}: {err}") from None
        if expression is None:
            if masks:
                raise FilterExpressionError(f"{where}: masks={sorted(masks)} without where=...: "
                                            "masks are the names a filter expression reads")
            if selection is None:
                raise ConstraintSetError(f"{where}: nothing selected: pass a selection (bool "
                                         "(N,) over the input rows, or sequences) or where=...")
            return selection
        if selection is not None:
            raise ConstraintSetError(f"{where}: a selection and where=... at once: pass one (a "
                                     "mask can join the expression: where='... and picked', "
                                     "masks={'picked': mask})")
        columns = {} if items.attributes is None else items.attributes
        try:
            return row_filter(expression, columns, masks, items.num_items)
        except FilterExpressionError as err:
            raise FilterExpressionError(f"{where}: {err}") from None

    def prior(self, column: str, weight, selection, expression, masks,
              where: str) -> priors.Prior:
        """What every door's ``prior(column, weight=1.0, selection=None, *,
        where=None, masks=None)`` does: the `rules.priors.Prior` of the float
        or int attribute `column` with `weight`, over the items the
        selection (bool (N,) over the input rows) or filter picks (default:
        every item), less those updates removed. Raises as `checked_items`,
        AttributeColumnError for a missing or bad column, DecodeInputError for a bad weight, and
        as `pick` for the selection."""
        items = self.checked_items(where)
        weight = priors.check_weight(weight)
        values = priors.weighted(priors.item_values(items, column), weight, column)
        if selection is None and expression is None and \
                (masks is None or (isinstance(masks, dict) and not masks)):
            live = np.ones(items.num_unique, bool)
        else:
            live = rows_item_mask(_array_or_filter(
                self.selected_rows(selection, expression, masks, where)), items, where)
        if items.removed is not None:
            live &= ~np.asarray(items.removed)
        best = priors.best_below(self.trie(), items, values, live, self.facts.state_counts)
        return priors.Prior(best, weight, column, self.fingerprint)

    def subset(self, selection, where: str) -> Subset:
        """The items `selection` picks, bool (N,) over the input rows
        (duplicate rows are one item; with a lookup, also token sequences of
        the set), as a `Subset`. Raises (naming `where`) as `checked_items`,
        and ConstraintSetError for a selection of another shape or dtype."""
        items = self.checked_items(where)
        layout = self.bit_layout(where)
        trie = self.trie()
        if self._lookup is not None:
            if isinstance(selection, RowSource):  # (a text catalogue's lookup takes a mask)
                rows, selection = selection, np.empty(selection.num_rows, bool)
                rows.fill(0, rows.num_rows, selection)
            item_live = self._lookup(selection, items, where, trie, layout)
        else:
            item_live = rows_item_live(_selection(selection, items, where), items, layout, where)
        return subset_of_items(trie.layers, trie.num_final_states, trie.end_token, items,
                               item_live, self.fingerprint, layout)

    def ranked(self, selection, expression, masks, where: str) -> rank.RankedSubset:
        """What every door's ``ranked_subset(selection=None, *,
        where=None, masks=None)`` does: the items `selection` picks (bool
        (N,) over the input rows, or (R, N): R subsets stacked; with a
        lookup also token sequences) or the filter `expression` (with
        `masks`) picks, less those updates removed, as a
        `rank.RankedSubset` (fine counts) in this set's trie order: its
        cost is the selection's item bits, no pass over the trie's states.
        Raises as `pick` (and ConstraintSetError for a selection of more
        than two dimensions)."""
        from static_compiler.item_bits import rank
        items = self.checked_items(where)
        picked = self.selected_rows(selection, expression, masks, where)
        order, removed = self._order.get(), self._removed_ranks.get()
        in_order = self.rows_in_item_order()  # (then a row's bit is its item's, packed as it is)
        if not isinstance(picked, RowSource):
            picked = _selection(picked, items, where)
            if picked.dtype != bool and self._lookup is not None:  # token sequences
                live = self._lookup(picked, items, where, self.trie(), self.bit_layout(where))
                return rank.ranked_subset(live, order, removed, fine=True,
                                          fingerprint=self.fingerprint)
            if picked.ndim not in (1, 2) or (picked.ndim == 2 and not picked.shape[0]):
                raise ConstraintSetError(f"{where}: selection has shape {picked.shape}: "
                                         f"expected bool ({items.num_items},) or (R, "
                                         f"{items.num_items}), R >= 1, over the input rows")
            if picked.dtype == bool and picked.shape[-1] == items.num_items and in_order:
                return rank.ranked_subset(picked, order, removed, fine=True,  # (packed as they are)
                                          fingerprint=self.fingerprint)
        rows = [picked] if isinstance(picked, RowSource) or picked.ndim == 1 else list(picked)
        # each row's items as packed bits (a filter's rows in place, or the scatter
        # through row -> item)
        room = rank.words_for(items.num_unique)  # (the words then held as they are: no copy)
        words = [bits.data.view(np.uint32)
                 for bits in stacked_rows_item_bits(rows, items, where, room, in_order)]
        words = words[0][None] if len(words) == 1 else np.stack(words)
        return rank.ranked_subset_of_words(words, order, removed, fine=True,
                                           fingerprint=self.fingerprint, adopt=True)

    def rows_in_item_order(self) -> bool:
        """Whether input row i is item i for every row (`item_masks.
        rows_are_items`: a sorted input without duplicates), read once:
        then a mask or a filter's rows are packed as they are, no scatter."""
        return bool(self._rows_are_items.get())

    def trie_order(self):
        """The set's trie order (`trie_ranges.trie_order`, an `InsertedOrder`;
        built once): where its items lie among the trie's positions."""
        return self._order.get()

    def _build_removed_ranks(self):
        from static_compiler.item_bits import rank
        removed = None if self.items is None else self.items.removed
        return None if removed is None else rank.ItemRanks.of_mask(np.asarray(removed, bool))

    def base_subset(self) -> Optional[Subset]:
        """What every decode runs over when no subset is given: all items
        but those updates removed (computed once); None if none was."""
        if self.items is None or not self.items.removal_tag:
            return None
        return self._base.get()

    def _build_base(self) -> Subset:
        return self.subset(np.ones(self.items.num_items, bool), "base_subset")
