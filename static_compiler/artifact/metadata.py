"""The manifest fields that describe a compiled set (`set_metadata`: the
static plan, per-layer statistics, layout text and table names), and the
plan and automaton they and the tables describe, read back
(`plan_from_metadata`, `summary_from_metadata`, `automaton_from_metadata`;
numpy tables only, no module is executed).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from static_compiler.errors import ArtifactFormatError, DecodeInputError
from static_compiler.ir import Automaton, AutomatonSummary, LayerSummary, Layout
from static_compiler.item_bits.layers import table_branch_counts
from static_compiler.lowered.plan import Plan, StepPlan
from static_compiler.support.arguments import check_export_beam_sizes, check_tokens_per_beam
from static_compiler.target.raising import automaton_from_tables


def set_metadata(compiled) -> dict[str, object]:
    """The manifest fields that describe the compiled set: vocab_size,
    max_length, depth, end_token, num_sequences, num_final_states,
    plan_steps (the static plan) and layers (per-layer statistics, the
    branch histogram, layout text and table names). With the tables they
    determine the automaton (`automaton_from_tables`) and its summary
    (`summary_from_metadata`, which the library reads a set back as)."""
    plan: Plan = compiled.plan
    ir = compiled.outline  # (counts and layouts: a set lowered from pieces keeps its IR unread)
    layers = []
    for t, (stats, layer) in enumerate(zip(compiled.layer_stats(), ir.layers)):
        layers.append({**stats, "branch_counts": [int(c) for c in layer.branch_counts()],
                       "layout_text": layer.layout.to_text(),
                       "tables": sorted(compiled.lowered.tables[t])})
    return {"vocab_size": plan.vocab_size, "max_length": plan.max_length, "depth": plan.depth,
            "end_token": plan.end_token, "num_sequences": ir.num_sequences,
            "num_final_states": ir.num_final_states,
            "plan_steps": tuple(dataclasses.asdict(s) for s in plan.steps), "layers": tuple(layers)}


def plan_from_metadata(metadata: dict, where: str = "tables") -> tuple[Plan, list]:
    """(Plan, per-layer Layouts) that `metadata` (the fields of
    `set_metadata`, as the manifest holds them) records."""
    try:
        steps = tuple(StepPlan(**step) for step in metadata["plan_steps"])
        layouts = [Layout.from_text(info["layout_text"]) for info in metadata["layers"]]
    except (TypeError, KeyError, ValueError) as e:
        raise ArtifactFormatError(f"{where}: plan_steps or layers do not describe a plan "
                                  f"({type(e).__name__}: {e})") from None
    return Plan(vocab_size=metadata["vocab_size"], steps=steps,
                end_token=metadata["end_token"]), layouts


def summary_from_metadata(metadata: dict, tables, where: str = "tables") -> AutomatonSummary:
    """The laid-out `AutomatonSummary` (counts, branch histograms, accepting
    states, layouts) that `metadata` (the fields of `set_metadata`, as the
    manifest holds them) records for `tables`, checked against the tables
    without rebuilding the automaton: each layer's branch histogram is read
    from its tables a chunk at a time (`layers.table_branch_counts`: bounded
    memory; a few entries for unary and near_unary layers) and must equal
    the recorded one (a manifest before format version 7 has none: its
    reader fills it from the tables, `normalize.with_branch_counts`), its
    totals the recorded state and edge counts, its accepting states the
    recorded count. Raises ArtifactFormatError naming the layer where they
    disagree."""
    plan, layouts = plan_from_metadata(metadata, where)
    layers = []
    for t, (info, step, layout, tabs) in enumerate(zip(metadata["layers"], plan.steps, layouts,
                                                        tables)):
        states, edges, accepting = (info.get(k) for k in ("states", "edges", "accepting"))
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                   for n in (states, edges, accepting)) or states > step.num_states:
            raise ArtifactFormatError(f"{where}: layer {t} records states={states!r}, "
                                      f"edges={edges!r}, accepting={accepting!r}: expected ints "
                                      f">= 0, states at most the plan's {step.num_states}")
        try:
            counts = table_branch_counts(step.kind.value, tabs, states)
            held = int(np.count_nonzero(tabs["accepting"][:states])) if "accepting" in tabs else 0
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ArtifactFormatError(f"{where}: layer {t}: its {step.kind.value} tables cannot "
                                      f"be read ({type(e).__name__}: {e})") from None
        recorded = info.get("branch_counts")
        trim = lambda c: np.trim_zeros(np.asarray(c, np.int64), "b")
        problem = None
        held_edges = int((np.arange(counts.shape[0]) * counts).sum())
        if recorded is not None and (not isinstance(recorded, list) or
                                     not np.array_equal(trim(recorded), trim(counts))):
            problem = (f"its branch histogram {recorded!r:.80} is not its tables' "
                       f"{counts.tolist()!r:.80}")
        elif int(counts.sum()) != states or held_edges != edges:
            problem = (f"its tables hold {int(counts.sum())} states with {held_edges} edges, "
                       f"the manifest records {states} / {edges}")
        elif held != accepting:
            problem = f"{held} states accept in its tables, the manifest records {accepting}"
        if problem:
            raise ArtifactFormatError(f"{where}: layer {t}: the manifest's summary disagrees with "
                                      f"the tables: {problem}")
        layers.append(LayerSummary(states, edges, counts, accepting, step.has_accepting,
                                   not step.explicit_targets, layout))
    return AutomatonSummary(plan.vocab_size, tuple(layers), metadata["num_final_states"],
                            metadata["num_sequences"], plan.end_token)


def automaton_from_metadata(metadata: dict, tables, where: str = "tables") -> Automaton:
    """The automaton that `metadata` (the fields of `set_metadata`, as the
    manifest holds them) and `tables` (one dict of numpy arrays per layer)
    describe; see `target.raising.automaton_from_tables`."""
    plan, layouts = plan_from_metadata(metadata, where)
    counts = [(info.get("states"), info.get("edges")) for info in metadata["layers"]]
    return automaton_from_tables(plan, layouts, tables, where=where,
                                 num_final_states=metadata["num_final_states"],
                                 num_sequences=metadata["num_sequences"], counts=counts)


def export_caps(compiled) -> tuple[Optional[int], ...]:
    """The per-step caps the beam_step modules apply (`check_tokens_per_beam`
    of export_tokens_per_beam), after checking export_beam_sizes (ints and
    beam schedules of max_length steps); raises
    DecodeInputError naming the export option that is wrong."""
    export = compiled.export_options
    check_export_beam_sizes(export.beam_sizes, compiled.plan.max_length)
    if export.priors and not export.subsets:
        raise DecodeInputError("export_priors=True needs export_subsets=True (the items and "
                               "their attributes)")
    try:
        return check_tokens_per_beam(export.tokens_per_beam, compiled.plan.max_length)
    except DecodeInputError as e:
        raise DecodeInputError(f"export_tokens_per_beam: {e}") from None


DEFAULT_BEAM_SIZES = (70,)
"""The beam sizes a tables-only artifact that records no export plan
(format versions 11 to 14) is read back with, and re-exported for when
re-export is given none (`compile_constraints`' export_beam_sizes default)."""


def export_plan(compiled) -> dict:
    """The export plan a tables-only manifest records (format version 15,
    "export_plan"): what `compiled` asks `save` to export, beam sizes and
    schedules, per-step caps (`export_caps`, which checks them) and item
    priors, so a later `re-export` exports what a save with modules would
    have (`export_options` reads it back)."""
    caps = export_caps(compiled)
    sizes = check_export_beam_sizes(compiled.export_options.beam_sizes, compiled.plan.max_length)
    return {"beam_sizes": tuple(m for m in sizes if isinstance(m, int)),
            "beam_schedules": tuple(m for m in sizes if not isinstance(m, int)),
            "tokens_per_beam": tuple(caps),
            "priors": bool(compiled.export_options.priors)}


def export_options(manifest) -> dict:
    """The export options (`compiled.ExportOptions` fields beam_sizes,
    tokens_per_beam, priors) of the set a manifest was saved from: what its modules were exported for, or a tables-only artifact's
    export plan (`export_plan`; DEFAULT_BEAM_SIZES where it records none)."""
    plan = manifest.export_plan
    if manifest.tables_only and plan is not None:
        return {"beam_sizes": plan["beam_sizes"] + plan["beam_schedules"],
                "tokens_per_beam": tokens_per_beam_option(plan["tokens_per_beam"]),
                "priors": plan["priors"]}
    if manifest.tables_only:
        return {"beam_sizes": DEFAULT_BEAM_SIZES, "tokens_per_beam": None, "priors": False}
    caps = next((m.tokens_per_beam for m in manifest.modules.values()
                 if m.tokens_per_beam is not None), None)
    return {"beam_sizes": manifest.beam_sizes() + manifest.beam_schedules,
            "tokens_per_beam": tokens_per_beam_option(caps),
            "priors": manifest.exports_priors}


def tokens_per_beam_option(caps) -> Optional[object]:
    """The export_tokens_per_beam option that gave the per-step `caps` a
    module (or an export plan) records: None or an int when they are what
    those give (so a set that grows deeper keeps its rule), else the caps
    as they are."""
    if caps is None or all(c is None for c in caps):
        return None
    if caps[0] is None and len(set(caps[1:])) == 1:
        return caps[1]
    return tuple(caps)
