"""New versions of a compiled set (`CompiledConstraints.update`): removals
as liveness over the same tables; additions merged into the trie
(`compiler_items.additions`) and lowered to tables of the same plan when they fit the
capacity reserved at compile time, else compiled anew with the set's
pipeline. A set held in its tables (a `Shards` build, `sc.load`) is
merged from rows read from its tables and stays held in them while it fits.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from static_compiler.compiler_items import additions, subsets, table_additions
from static_compiler.errors import AttributeColumnError, ConstraintSetError
from static_compiler.items.attributes import appended
from static_compiler.jax_support import placement as placement_lib
from static_compiler.passes import pipeline as pipeline_lib
from static_compiler.target.lowering import lower, plan_of


def updated(compiled, *, add=None, remove=None, attributes=None, streamed: bool = False):
    """`compiled` (a `CompiledConstraints`) with the items `add` lists and
    without those `remove` picks, and its `last_update` report (see
    `CompiledConstraints.update`); attributes: the added rows' values of
    every attribute column of the set (`attributes.appended`; removals keep
    the columns). streamed (additions alone): a version
    only to save, whose new tables and item arrays that fit the plan are
    `arrays.PieceArray`s computed from the old ones as they are written
    (`update.update_artifact` of a billion-item artifact: never whole in
    memory)."""
    items = subsets.check_subsettable(compiled.outline, compiled.items, "update")
    if add is None and remove is None:
        raise ConstraintSetError("update: nothing to do: pass add=... (token sequences) "
                                 "and/or remove=... (a bool mask over the input rows, or "
                                 "token sequences)")
    _check_attribute_args(items, add, attributes)
    new, report = compiled, {}
    if add is not None:
        with additions.small_pages():
            new, report = _with_additions(compiled, items, add, streamed and remove is None)
        old, items = items, new.items
        if old.attributes is not None:  # the added rows' values after the old ones
            join = additions.joined if streamed and remove is None else None
            items = dataclasses.replace(items, attributes=appended(
                old.attributes, attributes, items.num_items - old.num_items,
                "update(attributes=...)", join))
    if remove is not None:
        remove = _removal_over(remove, compiled.items.num_items, items.num_items)
        removed, removal = subsets.removal(items, remove, new._set_view.trie)
        report.update(removal)
        items = dataclasses.replace(items, removed=removed)
    return new._new_version(items=items,
                            build=dataclasses.replace(new.build, last_update=report))


def _removal_over(remove, before: int, after: int):
    """`remove` as `subsets.removal` takes it after `after - before` rows
    were added: a bool mask (or any array that is not a 2-D token matrix)
    of `before` entries, one per row of the set the update starts from
    (the contract of `update(remove=...)`: a mask over the set's rows),
    padded with False for the added rows; or one of `after` entries, the
    added rows included. ConstraintSetError for another length, naming
    both; sequences as they are."""
    if not isinstance(remove, np.ndarray) or (remove.dtype != bool and remove.ndim == 2):
        return remove
    if remove.shape == (after,):
        return remove
    if remove.shape == (before,) and remove.dtype == bool:
        return np.concatenate([remove, np.zeros(after - before, bool)])
    added = (f", or ({after},) counting the {after - before} rows add= appends"
             if after != before else "")
    raise ConstraintSetError(f"update: remove mask has shape {remove.shape} and dtype "
                             f"{remove.dtype}: expected ({before},) bool, one entry per row of "
                             f"the set this update starts from (its input rows, or names given "
                             f"for a text catalogue, then the rows earlier additions "
                             f"appended){added}")


def _check_attribute_args(items, add, attributes) -> None:
    """AttributeColumnError for attributes given without additions, or to a
    set without attributes (before any work is done)."""
    if attributes is None:
        return
    if add is None:
        raise AttributeColumnError("update(attributes=...): attribute values are for added "
                                   "rows: pass add=... with them (removals keep the columns)")
    if items.attributes is None:
        raise AttributeColumnError(f"update(attributes=...): the set has no attributes, so the "
                                   f"added rows take none (given: {sorted(attributes)}); "
                                   "compile it with attributes=... to have them")


def _with_additions(compiled, items, add, streamed: bool = False):
    """(`compiled` with the sequences `add` merged in, the report); streamed:
    see `updated`."""
    if compiled.names is not None:
        raise ConstraintSetError("update(add=...): this set is a text catalogue: compile "
                                 "it anew with the new names (added token sequences would "
                                 "have no name)")
    t0 = time.perf_counter()
    trie = compiled._set_view.trie()
    placed = additions.place_additions(trie, add)
    new_items, report = additions.items_after(trie, items, placed, lazy=streamed)
    if placed.depth == trie.depth:
        merged = table_additions.merged_summary(compiled.outline, placed, new_items.num_unique)
        problems = additions.fit_problems(merged.summary, merged.widest, merged.exceptions,
                                          compiled.outline)
    else:
        problems = [f"depth {trie.depth} -> {placed.depth}"]
    if problems:  # the merged trie is compiled anew
        new_items = new_items.materialized()
        ir = additions.merge_placed(trie, placed, new_items.num_unique).ir
        bare = ir.with_layers(layer.replace(layout=None) for layer in ir.layers)
        ir = pipeline_lib.run_pipeline(bare, pipeline_lib.parse_pipeline(compiled.build.pipeline))
        plan, tables = lower(ir)
        held_as = dict(_held_ir=ir, _summary=None)
    else:  # written into tables of the same plan: every compiled program stays
        plan = plan_of(merged.summary)
        if plan != compiled.plan:  # fit_problems checks what lowering records
            raise ConstraintSetError(f"update: internal error: the merged set fits but "
                                     f"lowers to another plan ({plan} != {compiled.plan})")
        tables = table_additions.merged_tables(compiled.lowered.tables, compiled.outline, merged,
                                               placed, lazy=streamed)
        held_as = dict(_held_ir=None, _summary=merged.summary)
    report = dict(report, grew=problems)
    where = compiled.lowered.placement
    if where is not None:  # grown tables may split differently
        where = placement_lib.MeshPlacement.of(where.mesh, where.axis, tables, where.min_bytes)
    timings = compiled.build.timings + (("update", time.perf_counter() - t0),)
    lowered = dataclasses.replace(compiled.lowered, plan=plan, tables=tables, placement=where)
    new = compiled._new_version(lowered=lowered, items=new_items, **held_as,
                               build=dataclasses.replace(compiled.build, timings=timings))
    return new, report
