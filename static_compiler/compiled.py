"""`CompiledConstraints`: a compiled constraint set (its automaton, plan and
tables) and what it does: logits-processor steps, item subsets, updates,
mesh placement, save. `compiler.compile_constraints` builds one.

Besides its verbs a set keeps three frozen records, so that its own public
names stay few: `Lowered` (the plan, the tables and where they live),
`ExportOptions` (what `save` exports) and `BuildInfo` (how this version was
built), in `records`. The names they replace keep working until
`support.deprecation.REMOVED_IN`, with a DeprecationWarning (`MOVED`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import numpy as np

from static_compiler.backend import decode
from static_compiler.backend.decode.engine import JaxEngine
from static_compiler.compiler_items import subsets
from static_compiler.decode_calls import beam_search_over
from static_compiler.decoding.decoder import Decoder
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.ir import Automaton, AutomatonSummary, layer_stats, print_ir
from static_compiler.items.index import ItemIndex
from static_compiler.items.names import NameTable
from static_compiler.jax_support import placement as placement_lib
from static_compiler.lifecycle import next_version
from static_compiler.lowered.plan import Plan, PlanFacts
from static_compiler.records import NOT_YET, BuildInfo, Computed, ExportOptions, Lowered
from static_compiler.rules.set_view import SetFacts, SetView
from static_compiler.support.decode_state import check_int, check_processor_state, is_traced
from static_compiler.support.deprecation import warn_deprecated
from static_compiler.target.raising import automaton_from_tables, table_head
from static_compiler.warm import WarmUp

MOVED = {
    "tables": ("lowered", "tables"), "placement": ("lowered", "placement"),
    "device_tables": ("lowered", "device_tables"), "nbytes": ("lowered", "nbytes"),
    "table_bytes_per_device": ("lowered", "bytes_per_device"),
    "export_beam_sizes": ("export_options", "beam_sizes"),
    "export_tokens_per_beam": ("export_options", "tokens_per_beam"),
    "export_subsets": ("export_options", "subsets"),
    "export_priors": ("export_options", "priors"),
    "pipeline": ("build", "pipeline"), "timings": ("build", "timings"),
    "frontend_stats": ("build", "frontend_stats"), "last_update": ("build", "last_update"),
}
"""Old public name of `CompiledConstraints` -> (record, its name there):
each still reads, with a DeprecationWarning, until
`support.deprecation.REMOVED_IN`."""


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledConstraints(PlanFacts, WarmUp, Decoder):
    """A compiled constraint set: its automaton, decoding plan and tables.

    What `compile_constraints` returns (also `load`, `update`, `shard`);
    immutable. Decode over it with `beam_search`, `greedy_decode` or
    `sample`, step by step with the verbs every front door has
    (`decoding.decoder.Decoder`: `init_processor` / `mask` /
    `allowed_tokens` / `advance`, `allowed`, `init_beams` / `beam_step` /
    `finalize`, over `backend.decode.engine.JaxEngine`),
    restrict it to items with `subset`; `save` writes it as an artifact. Below, V is the vocabulary size and T = `max_length`.

    Its plan and tables, how it was built and what `save` exports are three
    frozen records (`lowered`, `build`, `export_options`). The names they
    replace (`MOVED`: tables, placement, device_tables, nbytes,
    table_bytes_per_device, export_beam_sizes, export_tokens_per_beam,
    export_subsets, export_priors, pipeline, timings, frontend_stats,
    last_update) still read until 0.2.0, with a DeprecationWarning naming
    the record's name to use.

    Attributes
    ----------
    lowered : Lowered
        The plan and tables the decoders read and where they live:
        `lowered.tables` (host), `lowered.device_tables`,
        `lowered.placement` (`shard`), `lowered.nbytes` and
        `lowered.bytes_per_device()`.
    build : BuildInfo
        How this version was built: `build.pipeline`, `build.timings`,
        `build.frontend_stats`, `build.last_update`.
    export_options : ExportOptions
        What `save` exports: `export_options.beam_sizes`,
        `tokens_per_beam`, `subsets`, `priors` (the export_... options of
        `compile_constraints`).
    names : NameTable or None
        For a text catalogue, the `items.names.NameTable` mapping token
        sequences back to names (saved as names.jsonl); else None.
    items : ItemIndex or None
        For sequence input, where each input row (an item) ends in the trie
        (`items.index.ItemIndex`), for item subsets; else None.
    plan : Plan
        Property: `lowered.plan`, the static decoding plan (hashable).
    ir : Automaton
        Property: the automaton after the pipeline (print it for the text
        dump). A set compiled in memory holds it (private `_held_ir`); a
        set held in its tables (compiled from `Shards` straight into them
        by `target.lowering.lower_pieces`, read by `load`, or updated
        within capacity) holds only its laid-out `ir.AutomatonSummary`
        (private `_summary`) and reads the automaton back from the tables
        (`target.raising.automaton_from_tables`, some 36 bytes per item
        against the tables' 12) on first use, and keeps it; the IR text,
        `layer_stats`, `save` and decoding read `outline` and the tables,
        never this.
    outline : Automaton or AutomatonSummary
        Property: the IR without its arrays: the summary for a set held in
        its tables, else the automaton it holds.
    vocab_size : int
        Property: V; tokens lie in [0, V).
    max_length : int
        Property: T, the length of decoded token arrays (depth, plus one
        for the end token).
    fingerprint : str
        Property: content hash of the automaton and of the items an update
        removed; subsets carry it.
    attributes : ItemAttributes or None
        Property: the items' attribute columns (`items.attributes`), or None.
    """

    lowered: Lowered
    build: BuildInfo = BuildInfo()
    export_options: ExportOptions = ExportOptions()
    names: Optional[NameTable] = None
    items: Optional[ItemIndex] = None
    _held_ir: Optional[Automaton] = dataclasses.field(default=None, repr=False)
    _summary: Optional[AutomatonSummary] = None
    # what this set works out on first use (processors, set view, an IR read
    # back from the tables ...); not a field of the set: a new version starts empty
    _computed: "Computed" = dataclasses.field(default_factory=lambda: Computed(), init=False,
                                             repr=False, compare=False)

    def __post_init__(self):
        if self._held_ir is None and self._summary is None:
            raise ConstraintSetError("CompiledConstraints: a set without _held_ir is held in "
                                     "its tables and needs the summary of the IR they hold")

    if not TYPE_CHECKING:  # (the type checker still refuses the old names)
        def __getattr__(self, name: str):
            """The names `MOVED` into a record: the record's, with a
            DeprecationWarning naming it (until REMOVED_IN)."""
            if name not in MOVED:
                # (Python calls this after a property raised AttributeError too: that
                # property runs again so its own error, not this one, is raised)
                for klass in type(self).__mro__:
                    found = klass.__dict__.get(name)
                    if isinstance(found, property):
                        return found.__get__(self, type(self))
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            record, new = MOVED[name]
            call = "()" if name == "table_bytes_per_device" else ""
            warn_deprecated(f"CompiledConstraints.{name}{call}",
                            f"CompiledConstraints.{record}.{new}{call}")
            return getattr(getattr(self, record), new)

    @property
    def plan(self) -> Plan:  # type: ignore[override]  # (PlanFacts: an attribute elsewhere)
        """The static decoding plan (`lowered.plan`)."""
        return self.lowered.plan

    @property
    def ir(self) -> Automaton:
        """The automaton after the pipeline: `_held_ir`, or for a set held in
        its tables the automaton read back from them on first use (kept in
        `_computed.ir`; O(table size) memory)."""
        if self._held_ir is not None:
            return self._held_ir
        if self._computed.ir is None:
            summary = self._summary
            assert summary is not None  # (held_ir or summary: __post_init__)
            self._computed.ir = automaton_from_tables(
                self.plan, [layer.layout for layer in summary.layers], self.lowered.tables,
                num_final_states=summary.num_final_states, num_sequences=summary.num_sequences,
                where="compiled tables",
                counts=[(layer.num_states, layer.num_edges) for layer in summary.layers])
        return self._computed.ir

    @property
    def outline(self):
        """What the IR is without its arrays: `_summary` for a set held in its
        tables (the IR never read back by this), else `_held_ir`; both have
        vocab_size, depth, num_sequences, num_final_states, end_token,
        num_states, num_edges and layers with counts and layouts."""
        return self._held_ir if self._held_ir is not None else self._summary

    def ir_text(self, max_edges: Optional[int] = None) -> str:
        """The IR's text dump (`ir.print_ir`, rows elided past `max_edges`
        edges, default the printer's limit); for a set held in its tables,
        printed from its summary and the first rows of each table
        (`target.raising.table_head`), equal to the automaton's."""
        from static_compiler.ir import _ELIDE_EDGES

        limit = _ELIDE_EDGES if max_edges is None else check_int("max_edges", max_edges, low=0)
        return print_ir(self.outline, max_edges=limit, rows_of=self._rows_of())

    def _rows_of(self):
        """None for a set that holds its IR; else `ir.print_ir`'s rows_of:
        (t, n) -> a `Layer` of layer t's first n states, read from the tables."""
        if self._held_ir is not None:
            return None
        return lambda t, n: table_head(self.plan.steps[t], self.lowered.tables[t], n)

    def _new_version(self, **changes) -> "CompiledConstraints":
        """A new version of this set: its fields with `changes` (field name
        -> value, as `dataclasses.replace`), so a set held in its tables
        stays held in them (its IR unread) unless `changes` give _held_ir
        and _summary. Its `_computed` starts empty: the caller hands it what
        stays valid (`shard`, `update`)."""
        return dataclasses.replace(self, **changes)

    def layer_stats(self, devices: Optional[int] = None) -> list[dict]:
        """One dict per layer: states, edges, max_branch, mean_branch,
        accepting, targets, layout, k, mixed ("light=l,wide=H" for a mixed
        layout, else None), token/state dtypes, estimated_bytes (cost model),
        bytes (measured tables) and bytes_per_device: what each device
        holds when the tables are split across `devices` devices by the
        `placement` rule (default: this set's own `lowered.placement`, else
        one device: all bytes)."""
        where = self.lowered.placement
        if devices is None:
            devices = 1 if where is None else where.devices
        if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
            raise DecodeInputError(f"layer_stats: devices={devices!r}: expected an int >= 1")
        min_bytes = placement_lib.DEFAULT_MIN_BYTES if where is None else where.min_bytes
        out = []
        for layer, step, tabs in zip(self.outline.layers, self.plan.steps, self.lowered.tables):
            st = layer_stats(layer)
            st.update(layout=step.kind, k=step.k, mixed=layer.layout.mixed_text,
                      token_dtype=step.token_dtype,
                      state_dtype=step.state_dtype,
                      estimated_bytes=layer.layout.estimated_bytes,
                      bytes=sum(a.nbytes for a in tabs.values()),
                      bytes_per_device=placement_lib.bytes_per_device(tabs, int(devices),
                                                                      min_bytes))
            out.append(st)
        return out

    def shard(self, mesh, axis: str, min_bytes: int = placement_lib.DEFAULT_MIN_BYTES
              ) -> "CompiledConstraints":
        """This set with its tables placed across `mesh`'s `axis` (D
        devices) for every decoder (`beam_search`, `sample`, `mask` ...)
        and for `save`, which then exports modules for this mesh: a table
        of at least `min_bytes` whose first dimension D divides is split
        into D contiguous ranges of rows (states or edges), one per device;
        the others are replicated (`lowered.placement`). Inside jit, XLA partitions
        each gather from a split table into a local gather and one
        all-reduce, so results are bit-identical to one device. A split
        table is padded to a multiple of D rows that no decode reads
        (`placement.padded`), so any set splits, with or without reserved
        capacity. `lowered.bytes_per_device()` reports what each device
        holds."""
        tables = self.lowered.tables
        out = self._new_version(lowered=Lowered(
            self.plan, tables, placement_lib.MeshPlacement.of(mesh, axis, tables, min_bytes)))
        out._computed.set_view = self._set_view  # the same set and items
        return out

    # The verbs of every front door: `Decoder`, over this set's engine.

    @property
    def _engine(self) -> JaxEngine:
        return JaxEngine(self.plan, lambda: self.lowered.device_tables, self._warmth,
                         None if self.items is None else lambda: self._set_view)

    def beam_step(self, state: decode.BeamState, logits, step, *,
                  subset: Optional[subsets.Subset] = None, subset_index=None,
                  tokens_per_beam: Optional[int] = None, beam_size: Optional[int] = None,
                  prior=None) -> decode.BeamState:
        """One beam-search step (`Decoder.beam_step`, the program a served
        artifact's modules run: `beam_step_switch`); tokens_per_beam: the
        most children a beam may contribute at this step (None: no cap)."""
        return self._beam_step(state, logits, step, subset, subset_index, beam_size, prior,
                               tokens_per_beam=tokens_per_beam)

    def _no_names(self) -> str:
        return ("texts: this set was compiled from token ids, not names "
                "(compile_constraints(names, tokenizer=...) keeps names)")

    def beam_search(self, logits_fn, batch_size: int, beam_size: int, *,
                    subset: Optional[subsets.Subset] = None, subset_index=None, **options):
        """Constrained beam search over this set: `static_compiler.beam_search(
        self, logits_fn, batch_size=..., beam_size=..., ...)` (its options)."""
        return beam_search_over(self, logits_fn, batch_size, beam_size, subset, subset_index,
                                options)

    def processor(self, batch_size: int, *, subset: Optional[subsets.Subset] = None,
                  subset_index=None) -> decode.StepProcessor:
        """The processor pair for `batch_size` rows with one jitted program
        per step (`backend.decode.StepProcessor`): `mask(logits, state,
        step)`, `advance(state, tokens, step)` and the fused
        `advance_and_mask(state, tokens, step, logits)`, bit-identical to
        `mask` / `advance`, each call one dispatch that passes only the
        logits, state, tokens and step t's tables (and subset bits). For
        custom loops at a few rows, where `mask` / `advance` (op by op, or
        jitted with every step's tables as arguments) cost more in dispatch
        than in work. subset / subset_index as in `mask`, fixed for the
        processor. Without a subset one processor per batch size is kept.
        Processors of sets with equal plans share their programs, and one of
        a set compiled with capacity also compiles each program ahead for
        the removal-aware bits (`_removal_program`): a warmed-up loop then
        compiles nothing after a removal or an addition that fits."""
        batch_size = decode.StepProcessor.checked_batch(batch_size)
        key = None if subset is not None or subset_index is not None else batch_size
        cache = self._computed.processors
        if key is not None and key in cache:
            return cache[key]
        live = self._live(subset, subset_index, batch_size, "processor")
        out = decode.StepProcessor(self.plan, self.lowered.device_tables, batch_size, live,
                                   removal=self._removal_program(live, batch_size),
                                   counter=self._compile_counter())
        if key is not None:
            cache[key] = out
        return out

    def accept_drafts(self, state: decode.ProcessorState, drafts, step, *,
                      subset: Optional[subsets.Subset] = None, subset_index=None):
        """Speculative decoding: (accepted int32 (B,), state after them) for
        draft tokens int (B, n) at `step` (see backend.decode.speculative);
        subset / subset_index as in `mask` (default: the items this version
        has not removed)."""
        where = f"accept_drafts(step={'<traced>' if is_traced(step) else step})"
        state = check_processor_state(state, where)  # named as the decoder names it
        live = self._live(subset, subset_index, state.node.shape[0], where)
        with self._counting():
            return decode.accept_drafts(self.plan, self.lowered.device_tables, state, drafts, step,
                                        live)

    @property
    def _set_view(self) -> SetView:
        """The numpy view of this set's items every front door shares
        (`rules.set_view.SetView`: fingerprint, base subset, trie, bit
        layout), made once; `shard` shares it, `update` by removal shares
        what it built."""
        view = self._computed.set_view
        if view is None:
            plan, tables = self.plan, self.lowered.tables
            digests = self._computed.table_digests  # (a set read back: no table hashed)
            trie = (lambda ir=self._held_ir: ir) if self._held_ir is not None else \
                (lambda summary=self._summary: subsets.TableTrie.of(plan, summary, tables))
            view = SetView(SetFacts.of_plan(plan, self.outline.num_final_states), tables,
                           self.items, lambda: subsets.set_fingerprint(plan, tables, digests),
                           trie=trie, lookup=subsets.item_mask,
                           rows_in_item_order=self._computed.rows_in_item_order)
            self._computed.set_view = view
        return view

    def update(self, *, add=None, remove=None, attributes=None) -> "CompiledConstraints":
        """A new version of this set with the items `add` lists (token
        sequences) and without those `remove` picks (a bool mask over this
        set's N rows, or token sequences; with `add`, a mask of N + n
        entries, the n added rows last, is taken too); an item in both is
        removed. Item ids stay: item i is still input row i, added rows are
        rows N, N + 1, ... (`item_index` finds them).

        Removal is pure liveness: the tables and compiled programs are
        shared, nothing recompiles. Additions are placed in the trie
        (`additions.place_additions`: linear, no full sort); when the merged
        trie fits the capacity reserved at compile time (`capacity=`) they
        are written straight into new tables of the same plan
        (`table_additions`: the version is held in its tables), and so
        every compiled program stays the same; otherwise the merged trie is
        compiled anew once, and `build.last_update["grew"]` says why (one line
        per layer that did not fit). Subsets made before an
        update are refused by the new version.

        `build.last_update`: {"removed", "already_removed", "absent"} for
        removals (sequences not in the set are counted, not an error; a
        token outside the vocabulary or, in a fixed-length set, a row of
        another length is one), and
        {"added", "already_present", "restored", "grew"} for additions.

        attributes: for a set with attributes, the added rows' values
        {name: array (n,)} of every attribute (new categories are appended
        after the old ones: old codes stay); removals keep the columns.
        Raises ConstraintSetError for invalid sequences or masks, for a
        set without items (graph, IR, minimize) and for a text catalogue
        (add names by compiling anew); AttributeColumnError for attributes
        missing, unknown or malformed, or given without additions."""
        version = next_version.updated(self, add=add, remove=remove, attributes=attributes)
        if add is None:  # the same tables (`lowered`, kept) and set: share what was computed
            version._computed.set_view = self._set_view.version(version.items)
        version._computed.warmth = self._warmth()  # (one count: `compilations`)
        version._set_view.base_subset()  # computed now, so the next decode only reads it
        return version

    def item_index(self, sequences) -> np.ndarray:
        """int64 (n,): the item (input row; the first of duplicate rows,
        and for an item removed and added again the first row it was added
        again with: `ItemIndex.first_live_rows`) each of `sequences` is, -1
        for a sequence not in the set (or removed)."""
        items = self._set_view.checked_items("item_index")
        first = self._set_view.first_rows()
        ids = subsets.unique_ids(self._set_view.trie(), items, sequences)
        if items.removed is not None:
            ids = np.where(ids >= 0, np.where(items.removed[np.maximum(ids, 0)], -1, ids), -1)
        return np.where(ids >= 0, first[np.maximum(ids, 0)], -1)

    def _removal_program(self, live, batch_size: int):
        """What a decoder also compiles (`decode.beam_search`'s
        also_compile) when it decodes this set over every item (`live` is
        None: no subset, nothing removed): for a set compiled with capacity
        (one that expects updates) and an item index, the shapes of its
        decode over the items a removal leaves, so that warming up a decode
        loop compiles that program too and the first removal compiles
        nothing; else None."""
        if live is not None or self.items is None:
            return None
        specs = self._computed.removal_specs
        if specs is NOT_YET:  # (per call: this runs before every decode)
            specs = {} if all(layer.implicit_targets for layer in self.outline.layers) and \
                any(layer.layout.reserved for layer in self.outline.layers) else None
            self._computed.removal_specs = specs
        if specs is None:
            return None
        if batch_size not in specs:
            specs[batch_size] = decode.live.live_mask_spec(self.plan, batch_size)
        return specs[batch_size]

    def save(self, path, *, overwrite: bool = False, modules: Optional[bool] = None):
        """Writes the artifact directory atomically (see static_compiler.artifact.writer).

        modules: export the StableHLO modules a jax serving process runs
        (True; needs jax), or write the tables alone (False: what the torch
        backend and `sc.load` read; `static-compiler re-export PATH` adds the
        modules later). None (default): modules when jax is installed."""
        from static_compiler.artifact import writer
        from static_compiler.format.spec import artifact_path
        return writer.save(self, artifact_path(path, "save"), overwrite=overwrite,
                           modules=modules)
