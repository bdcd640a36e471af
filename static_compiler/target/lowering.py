"""Lowering: turn a laid-out IR into a static plan (`lowered.plan`) and a
pytree of numpy tables (their names and shapes per layout kind:
`lowered.tables`); `target.raising` is the inverse.

A layout with reserved capacity (`ir.Layout.states_capacity`) pads S and E
to it (see `lowered.tables`); the plan records the padded counts.
"""

from __future__ import annotations

from typing import Callable, Iterable, Union

import numpy as np

from static_compiler.errors import PipelineError
from static_compiler.ir import Automaton, AutomatonSummary, Layer, LayerPiece, Layout, LayoutKind
from static_compiler.lowered.plan import Plan, StepPlan
from static_compiler.support.arrays import table_array
from static_compiler.support.dtypes import branch_dtype_for


def padded(arr: np.ndarray, size: int, dtype, fill) -> np.ndarray:
    """`arr` as `dtype`, padded with `fill` to `size` entries (no copy when
    neither changes anything)."""
    if arr.shape[0] >= size:
        return arr.astype(dtype, copy=False)
    out = table_array(size, dtype)
    out[:arr.shape[0]] = arr
    out[arr.shape[0]:] = fill
    return out


def exception_entries(layout: Layout, exceptions: int) -> int:
    """X, the exception entries a near_unary layer's tables hold: its
    `exceptions`, or the room its layout reserves (the entries past them
    are padding: ids past every state, no children)."""
    return max(exceptions, layout.exceptions if layout.reserved else 0)


def _layer_tables(layer: Layer, vocab_size: int) -> dict[str, np.ndarray]:
    lay = layer.layout
    tok_dt, st_dt = np.dtype(lay.token_dtype), np.dtype(lay.state_dtype)
    num_states, num_edges = lay.padded_counts(layer.num_states, layer.num_edges)
    tables = {}
    if lay.kind == LayoutKind.DENSE_ROWS:
        nxt = np.full((num_states, vocab_size), -1, dtype=st_dt)
        rows = np.repeat(np.arange(layer.num_states), layer.branch())
        nxt[rows, layer.tokens.astype(np.int64)] = layer.target_array()
        tables["next"] = nxt
    elif lay.kind == LayoutKind.CSR:
        tables["indptr"] = padded(layer.indptr, num_states + 1, st_dt, layer.num_edges)
        tables["tokens"] = padded(layer.tokens, num_edges, tok_dt, 0)
    elif lay.kind == LayoutKind.UNARY:
        tables["tokens"] = padded(layer.tokens, num_states, tok_dt, 0)
    elif lay.kind == LayoutKind.NEAR_UNARY:
        branch = layer.branch()
        ex = np.flatnonzero(branch != 1)
        room = exception_entries(lay, ex.shape[0])
        tables["tokens"] = padded(layer.tokens, num_edges, tok_dt, 0)
        # padding entries: ids past every state (never found), no children
        tables["ex_states"] = padded(ex, room, st_dt, num_states)
        tables["ex_starts"] = padded(layer.indptr[ex], room, st_dt, layer.num_edges)
        tables["ex_branch"] = padded(branch[ex], room,
                                      branch_dtype_for(lay.widest_branch(layer.max_branch)), 0)
    else:
        raise PipelineError(f"cannot lower layout kind {lay.kind!r}")
    if lay.kind != LayoutKind.DENSE_ROWS and not layer.implicit_targets:
        tables["targets"] = layer.targets.astype(st_dt, copy=False)
    if layer.accepting is not None:
        tables["accepting"] = padded(layer.accepting, num_states, bool, False)
    for name, arr in tables.items():  # read-only views; no copy where dtypes already match
        tables[name] = arr = arr.view()
        arr.flags.writeable = False
    return tables


def plan_of(ir: Union[Automaton, AutomatonSummary]) -> Plan:
    """The static plan of a laid-out automaton (or its summary: the plan
    reads only counts and layouts). Raises PipelineError when a layer has
    no layout (run choose-layout first)."""
    steps = []
    for t, layer in enumerate(ir.layers):
        if layer.layout is None:
            raise PipelineError(f"layer {t} has no layout: run a pipeline with choose-layout "
                                "before lowering")
        lay = layer.layout
        num_states, num_edges = lay.padded_counts(layer.num_states, layer.num_edges)
        steps.append(StepPlan(kind=lay.kind, k=lay.k, num_states=num_states,
                              num_next_states=num_edges if lay.reserved
                              else ir.num_states_at(t + 1),
                              explicit_targets=not layer.implicit_targets,
                              has_accepting=layer.has_accepting,
                              token_dtype=lay.token_dtype, state_dtype=lay.state_dtype,
                              light_k=lay.light_k, wide_slots=lay.wide_slots))
    return Plan(vocab_size=ir.vocab_size, steps=tuple(steps), end_token=ir.end_token)


def lower(ir: Automaton) -> tuple[Plan, tuple[dict, ...]]:
    """Lowers a laid-out automaton to (Plan, tables);
    `raising.automaton_from_tables` is the inverse.

    `tables` is a tuple (one dict of numpy arrays per layer). Raises
    PipelineError when a layer has no layout (run choose-layout first)."""
    plan = plan_of(ir)
    return plan, tuple(_layer_tables(layer, ir.vocab_size) for layer in ir.layers)



# ---------------------------------------------------------------------------
# Lowering piece by piece: a partitioned build's layers, never merged.


def lower_pieces(summary: AutomatonSummary, pieces_of: Callable[[int], Iterable[LayerPiece]],
                 create: Callable) -> tuple[Plan, tuple[dict, ...]]:
    """`lower` of a tree whose layers come as pieces: `summary` is the
    laid-out summary of the automaton (`pipeline.run_pipeline` over the
    partitions' summed summaries) and pieces_of(t) yields layer t's
    `LayerPiece`s in order. Each table is written front to back by a
    writer from create(name, dtype, shape) (names "<layer>.<table>"): its
    append(rows) adds rows along the first axis, its close(fill) pads the
    rest with `fill` and returns the array (`frontend.array_files.ArrayFiles.writer`:
    into a file), so a partitioned build lowers straight into files and the
    merged layers are never held: equal to `lower` of the merged automaton,
    array for array (tests/frontend/test_partitioned.py)."""
    plan = plan_of(summary)
    tables = []
    for t, (layer, step) in enumerate(zip(summary.layers, plan.steps)):
        if not layer.implicit_targets:
            raise PipelineError(f"layer {t} has explicit targets: pieces lower trees only")
        tables.append(_layer_tables_from_pieces(t, layer, step, pieces_of(t),
                                                summary.vocab_size, create))
    return plan, tuple(tables)


def _layer_tables_from_pieces(t: int, layer, step: StepPlan, pieces: Iterable[LayerPiece],
                              vocab_size: int, create) -> dict[str, np.ndarray]:
    tok_dt, st_dt = np.dtype(step.token_dtype), np.dtype(step.state_dtype)
    S, E, kind = step.num_states, layer.num_edges, step.kind
    fills = {}
    if kind == LayoutKind.DENSE_ROWS:
        writers = {"next": create(f"{t}.next", st_dt, (S, vocab_size))}
        fills["next"] = -1
    elif kind == LayoutKind.CSR:
        padded_edges = layer.layout.padded_counts(layer.num_states, E)[1]
        writers = {"indptr": create(f"{t}.indptr", st_dt, (S + 1,)),
                   "tokens": create(f"{t}.tokens", tok_dt, (padded_edges,))}
        writers["indptr"].append(np.zeros(1, st_dt))
        fills["indptr"] = E
    elif kind == LayoutKind.UNARY:
        writers = {"tokens": create(f"{t}.tokens", tok_dt, (S,))}
    elif kind == LayoutKind.NEAR_UNARY:
        counts = layer.branch_counts()
        lay = layer.layout
        room = exception_entries(lay, layer.num_states - (int(counts[1]) if counts.size > 1
                                                          else 0))
        padded_edges = lay.padded_counts(layer.num_states, E)[1]
        writers = {"tokens": create(f"{t}.tokens", tok_dt, (padded_edges,)),
                   "ex_states": create(f"{t}.ex_states", st_dt, (room,)),
                   "ex_starts": create(f"{t}.ex_starts", st_dt, (room,)),
                   "ex_branch": create(f"{t}.ex_branch",
                                       branch_dtype_for(lay.widest_branch(layer.max_branch)),
                                       (room,))}
        fills.update(ex_states=S, ex_starts=E)  # padding entries (see `_layer_tables`)
    else:
        raise PipelineError(f"cannot lower layout kind {kind!r}")
    if layer.has_accepting:
        writers["accepting"] = create(f"{t}.accepting", np.dtype(bool), (S,))
    for piece in pieces:
        tokens = np.asarray(piece.tokens)
        if kind == LayoutKind.DENSE_ROWS:
            block = np.full((piece.num_states, vocab_size), -1, dtype=st_dt)
            rows = np.repeat(np.arange(piece.num_states), np.diff(piece.indptr()))
            block[rows, tokens.astype(np.int64)] = np.arange(
                piece.edge_offset, piece.edge_offset + piece.num_edges)
            writers["next"].append(block)
        elif kind == LayoutKind.CSR:
            writers["indptr"].append(piece.indptr()[1:])
            writers["tokens"].append(tokens)
        elif kind == LayoutKind.UNARY:
            writers["tokens"].append(tokens)
        else:
            writers["tokens"].append(tokens)
            ip = piece.indptr()
            branch = np.diff(ip)
            ex = np.flatnonzero(branch != 1)
            writers["ex_states"].append(ex + piece.state_offset)
            writers["ex_starts"].append(ip[ex])
            writers["ex_branch"].append(branch[ex])
        if "accepting" in writers:
            acc = piece.accepting_array()
            writers["accepting"].append(np.zeros(piece.num_states, bool) if acc is None else acc)
    return {name: w.close(fills.get(name, 0)) for name, w in writers.items()}
