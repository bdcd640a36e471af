"""Lowering: turn a laid-out IR into a static plan and a pytree of numpy tables.

The plan is hashable (it is a static argument of every jitted entry point);
the tables are plain arrays passed as arguments, so one compiled program
serves every constraint set whose tables have the same shapes.

Tables per layer (names are the keys of the layer's dict):

==========  ===================================================================
dense_rows  ``next``    (S, V) state_dtype: next state, -1 where no edge
csr         ``indptr``  (S + 1,) state_dtype; ``tokens`` (E,) token_dtype;
            ``targets`` (E,) state_dtype when targets are explicit
unary       ``tokens``  (S,) token_dtype; ``targets`` (S,) when explicit
near_unary  ``tokens``  (E,); ``ex_states`` (X,) state_dtype, sorted ids of
            the states whose branch is not 1; ``ex_starts`` (X,) state_dtype
            their row starts; ``ex_branch`` (X,) their branches, in
            `dtypes.branch_dtype_for` the layer's max branch (artifacts
            before format version 6 hold ``ex_bounds`` (X, 2), [start, end)
            rows, instead of the two: 8 bytes an exception, not 4 + 1);
            ``targets`` (E,) when explicit
any         ``accepting`` (S,) bool when some state at this depth accepts
==========  ===================================================================

A layout with reserved capacity (`ir.Layout.states_capacity`) pads S and E
to it: the extra states have no edges (csr rows that end where they start,
-1 rows, token 0 for unary) and accept nothing, the extra edges belong to
no row, so no state reaches them; the plan records the padded counts.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence, Union

import numpy as np

from static_compiler.errors import IRVerificationError, PipelineError
from static_compiler.ir import (Automaton, AutomatonSummary, Layer, LayerPiece, Layout,
                                LayoutKind, verify)
from static_compiler.support.arrays import search_sorted, table_array
from static_compiler.support.dtypes import branch_dtype_for
from static_compiler.live.layers import EXCEPTION_TABLES, exception_rows, row_pointers, slot_step


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Static facts about one decoding step (one IR layer); light_k and
    wide_slots are the mixed layout's (0 when off, see `ir.Layout`)."""

    kind: LayoutKind
    k: int
    num_states: int
    num_next_states: int
    explicit_targets: bool
    has_accepting: bool
    token_dtype: str
    state_dtype: str
    light_k: int = 0
    wide_slots: int = 0

    def __post_init__(self):
        # Plans read back from a manifest name their kind as a plain string.
        object.__setattr__(self, "kind", LayoutKind(self.kind))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static decoding plan: one `StepPlan` per layer.

    Attributes:
      vocab_size: V.
      steps: StepPlan per layer; len(steps) is the automaton depth.
      end_token: None for fixed-length sets. With an end token, decoding runs
        one more step than the depth, in which finished states can only end.
    """

    vocab_size: int
    steps: tuple
    end_token: Optional[int] = None

    @property
    def depth(self) -> int:
        return len(self.steps)

    @property
    def max_length(self) -> int:
        """Tokens in a decoded sequence, including the end token if any."""
        return self.depth + (0 if self.end_token is None else 1)


class PlanFacts:
    """The facts of a set every decoder states, read from its `plan`: a
    mixin of `CompiledConstraints` and the torch backend's
    `TorchConstraints`."""

    plan: Plan

    @property
    def vocab_size(self) -> int:
        """V: tokens lie in [0, V)."""
        return self.plan.vocab_size

    @property
    def max_length(self) -> int:
        """Length of decoded token arrays (depth, plus one for the end token)."""
        return self.plan.max_length

    @property
    def end_token(self) -> Optional[int]:
        """The token ending variable-length sequences (None: fixed length)."""
        return self.plan.end_token


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
    """Lowers a laid-out automaton to (Plan, tables); `automaton_from_tables`
    is the inverse.

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
    array for array (tests/test_partitioned.py)."""
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


def table_head(step: StepPlan, tabs: dict, rows: int) -> Layer:
    """A `Layer` holding a lowered layer's first `rows` states and their
    edges, read from its tables alone (a few entries of each): what the IR
    text prints of a large layer (`ir.print_ir` rows_of), so a set lowered
    from pieces prints without rebuilding its automaton."""
    indptr = row_pointers(step.kind, tabs, rows)
    if step.kind == LayoutKind.DENSE_ROWS:
        nxt = np.asarray(tabs["next"][:rows])
        tokens = np.nonzero(nxt >= 0)[1]
        targets = nxt[nxt >= 0].astype(np.int64)
    else:
        tokens = np.asarray(tabs["tokens"][:indptr[-1]])
        targets = np.asarray(tabs["targets"][:indptr[-1]]).astype(np.int64) \
            if step.explicit_targets else None
    accepting = np.asarray(tabs["accepting"][:rows]) if "accepting" in tabs else None
    return Layer(indptr=indptr, tokens=tokens, targets=targets, accepting=accepting)


def num_candidates(step: StepPlan, vocab_size: int) -> int:
    """K, the static candidate count of `step`."""
    return {LayoutKind.DENSE_ROWS: vocab_size, LayoutKind.UNARY: 1}.get(step.kind, step.k)


def candidate_columns(plan: Plan, step: int) -> int:
    """K at `step`: candidates per beam, end-token and carried-over columns included."""
    end = plan.end_token is not None
    if step >= plan.depth:
        return 2
    sp = plan.steps[step]
    return num_candidates(sp, plan.vocab_size) + int(end and sp.has_accepting) + int(end)


def live_beam_bounds(plan: Plan, beam_size: int, caps: Sequence[Optional[int]]
                     ) -> tuple[int, ...]:
    """Static bound per step on the beams that can be valid in a search
    whose beam 0 alone starts valid: 1 at step 0, then at most the previous
    bound times the candidates each beam keeps (caps: the per-step cap on a
    beam's children, None for none, as `arguments.check_tokens_per_beam`
    gives them). Valid beams come first, so beams past the bound need no
    work; both backends' beam searches pass it to their steps."""
    bounds, live = [], 1
    for step in range(plan.max_length):
        bounds.append(live)
        kept = candidate_columns(plan, step)
        live = min(beam_size, live * (kept if caps[step] is None else min(kept, caps[step])))
    return tuple(bounds)


def state_counts(plan: Plan) -> tuple[int, ...]:
    """States per depth 0..depth as the tables hold them (padded to a
    reserved capacity): the sizes of item subsets' bit rows."""
    return tuple(s.num_states for s in plan.steps) + (plan.steps[-1].num_next_states,)


def slot_steps(plan: Plan) -> tuple[int, ...]:
    """The steps whose children an item subset holds as slot bits: dense
    rows at least half full (`layers.slot_step`)."""
    return tuple(t for t, s in enumerate(plan.steps)
                 if slot_step(s.kind.value, s.num_states, s.num_next_states, plan.vocab_size))


def tables_nbytes(tables) -> int:
    """Total bytes of all tables."""
    return sum(arr.nbytes for layer in tables for arr in layer.values())


# ---------------------------------------------------------------------------
# The inverse: tables -> layers (numpy only; for reading artifacts back).


def _layer_from_tables(t: int, step: StepPlan, layout: Layout, tabs: dict, where: str,
                       counts: Optional[tuple] = None) -> Layer:
    kind = step.kind
    if kind == LayoutKind.DENSE_ROWS:
        nxt = np.asarray(tabs["next"])
        rows, tokens = np.nonzero(nxt >= 0)
        indptr = row_pointers(kind, tabs, step.num_states)
        targets = nxt[rows, tokens].astype(np.int64)
    elif kind == LayoutKind.CSR:
        indptr = row_pointers(kind, tabs, step.num_states)
        tokens = np.asarray(tabs["tokens"])
        targets = None
    elif kind == LayoutKind.UNARY:
        tokens = np.asarray(tabs["tokens"])
        indptr = row_pointers(kind, tabs, tokens.shape[0])
        targets = None
    elif kind == LayoutKind.NEAR_UNARY:
        tokens = np.asarray(tabs["tokens"])
        ex = np.asarray(tabs["ex_states"]).astype(np.int64)
        shapes = [np.shape(tabs[name]) for name in EXCEPTION_TABLES if name in tabs]
        if ex.ndim != 1 or shapes not in ([(ex.shape[0],)] * 2, [(ex.shape[0], 2)]) or \
                (ex.size and (ex.min() < 0 or ex.max() > step.num_states)):
            raise IRVerificationError(f"{where}: layer {t} ex_states and its row tables have "
                                      f"shapes {ex.shape} / {shapes} or ids outside "
                                      f"[0, {step.num_states}]")
        # Reserved room: the trie's states come first (the rest have no
        # children), and exception entries past its own are padding.
        n = counts[0] if layout.reserved and counts is not None and \
            isinstance(counts[0], (int, np.integer)) and 0 <= counts[0] <= step.num_states \
            else step.num_states
        real = search_sorted(ex, n)
        if (ex[:real] >= n).any() or (np.diff(ex[:real]) <= 0).any():
            raise IRVerificationError(f"{where}: layer {t}: exception ids (ex_states) must rise "
                                      f"strictly within [0, {n})")
        if (ex[real:] != step.num_states).any() or exception_rows(tabs)[1][real:].any():
            raise IRVerificationError(f"{where}: layer {t}: exception entries past its {n} "
                                      "states are not padding (id "
                                      f"{step.num_states}, no children)")
        indptr = row_pointers(kind, tabs, n)
        if not np.array_equal(indptr[ex[:real]], exception_rows(tabs, real)[0]):
            raise IRVerificationError(f"{where}: layer {t}: its exceptions' row starts disagree "
                                      "with the starts implied by ex_states")
        indptr = np.concatenate([indptr, np.full(step.num_states - n, indptr[-1])])
        targets = None
    else:
        raise IRVerificationError(f"{where}: layer {t} has layout kind {kind!r}, expected one of "
                                  f"{', '.join(LayoutKind)}")
    if kind != LayoutKind.DENSE_ROWS and step.explicit_targets:
        targets = np.asarray(tabs["targets"]).astype(np.int64)
    if targets is not None and not step.explicit_targets:
        if not np.array_equal(targets, np.arange(targets.shape[0])):
            raise IRVerificationError(f"{where}: layer {t} has implicit targets in the plan but "
                                      "its dense table does not number children in order")
        targets = None
    accepting = np.asarray(tabs["accepting"]) if "accepting" in tabs else None
    tokens = np.asarray(tokens)
    if layout.reserved:
        indptr, tokens, accepting = _unpadded(t, kind, indptr, tokens, accepting, counts, where)
    return Layer(indptr=indptr, tokens=tokens.astype(layout.token_dtype),
                 targets=targets, accepting=accepting, layout=layout)


def _unpadded(t: int, kind: str, indptr, tokens, accepting, counts, where: str):
    """A padded layer's arrays cut to its `counts` (states, edges), after
    checking that the padding holds nothing: padded states have no edges
    and accept nothing."""
    if counts is None:
        raise IRVerificationError(f"{where}: layer {t} is padded to a reserved capacity, and "
                                  "its state and edge counts are not given")
    states, edges = counts
    if not all(isinstance(n, (int, np.integer)) for n in counts):
        raise IRVerificationError(f"{where}: layer {t} counts {counts!r}: expected ints")
    padded_states = indptr.shape[0] - 1
    if not 0 <= states <= padded_states or not 0 <= edges <= tokens.shape[0]:
        raise IRVerificationError(f"{where}: layer {t} has {states} states / {edges} edges, its "
                                  f"tables {padded_states} / {tokens.shape[0]}")
    if kind != LayoutKind.UNARY and (indptr[states:] != edges).any():
        raise IRVerificationError(f"{where}: layer {t}: states past its {states} (padding to "
                                  "the reserved capacity) have edges")
    if accepting is not None and accepting[states:].any():
        raise IRVerificationError(f"{where}: layer {t}: states past its {states} (padding to "
                                  "the reserved capacity) accept")
    return (indptr[:states + 1], tokens[:edges if kind != LayoutKind.UNARY else states],
            None if accepting is None else accepting[:states])


def automaton_from_tables(plan: Plan, layouts: Sequence[Layout], tables, *,
                          num_final_states: int, num_sequences: int,
                          where: str = "tables", counts: Optional[Sequence] = None
                          ) -> Automaton:
    """The automaton that `plan`, the per-layer `layouts` and `tables` (one
    dict of numpy arrays per layer, as `lower` makes them) describe, checked
    with `ir.verify`: the inverse of `lower`, equal to the lowered IR.
    counts: (states, edges) per layer, needed for tables padded to a
    reserved capacity (the padding is checked empty and cut off).

    Raises IRVerificationError (naming `where` and the layer) when the tables
    do not form a valid automaton."""
    if not len(plan.steps) == len(layouts) == len(tables):
        raise IRVerificationError(f"{where}: {len(plan.steps)} plan steps, {len(layouts)} layouts "
                                  f"and {len(tables)} table layers; expected one of each per layer")
    counts = [None] * len(tables) if counts is None else list(counts)
    layers = tuple(_layer_from_tables(t, step, layout, tabs, where, n)
                   for t, (step, layout, tabs, n) in enumerate(zip(plan.steps, layouts, tables,
                                                                   counts)))
    ir = Automaton(vocab_size=plan.vocab_size, layers=layers, num_final_states=num_final_states,
                   num_sequences=num_sequences, end_token=plan.end_token)
    verify(ir)
    return ir
