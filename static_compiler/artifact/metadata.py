"""The manifest fields that describe a compiled set (`set_metadata`: the
static plan, per-layer statistics, layout text and table names), and the
plan and automaton they and the tables describe, read back
(`plan_from_metadata`, `automaton_from_metadata`; numpy tables only, no
module is executed).
"""

from __future__ import annotations

import dataclasses

from static_compiler.backend.lowering import Plan, StepPlan, automaton_from_tables
from static_compiler.errors import ArtifactFormatError
from static_compiler.ir import Automaton, Layout


def set_metadata(compiled) -> dict[str, object]:
    """The manifest fields that describe the compiled set: vocab_size,
    max_length, depth, end_token, num_sequences, num_final_states,
    plan_steps (the static plan) and layers (per-layer statistics, layout
    text and table names). With the tables they determine the automaton
    (`automaton_from_tables`)."""
    plan: Plan = compiled.plan
    ir = compiled.outline  # (counts and layouts: a set lowered from pieces keeps its IR unread)
    layers = []
    for t, (stats, layer) in enumerate(zip(compiled.layer_stats(), ir.layers)):
        layers.append({**stats, "layout_text": layer.layout.to_text(),
                       "tables": sorted(compiled.tables[t])})
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


def automaton_from_metadata(metadata: dict, tables, where: str = "tables") -> Automaton:
    """The automaton that `metadata` (the fields of `set_metadata`, as the
    manifest holds them) and `tables` (one dict of numpy arrays per layer)
    describe; see `lowering.automaton_from_tables`."""
    plan, layouts = plan_from_metadata(metadata, where)
    counts = [(info.get("states"), info.get("edges")) for info in metadata["layers"]]
    return automaton_from_tables(plan, layouts, tables, where=where,
                                 num_final_states=metadata["num_final_states"],
                                 num_sequences=metadata["num_sequences"], counts=counts)
