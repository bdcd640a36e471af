"""Step kernels: one per layout, pure jax.numpy/lax with static shapes.

Each kernel maps the current states of any batch of beams, ``node`` int32
(...,), to the candidate transitions of this step:

* ``tokens`` int32 (..., K): candidate tokens, ascending along K within a beam
  for the valid slots;
* ``next``   int32 (..., K): the state each candidate enters at depth t + 1;
* ``valid``  bool  (..., K): False for slots that are not edges.

K is static per step: V for dense_rows, k for csr / near_unary (speculative
slicing: exactly k entries from the row start, slots past the row length
masked), 1 for unary. Gathers clamp out-of-range indices (``mode="clip"``),
so no table needs padding and no branch depends on data.

A run of consecutive steps decoded in one loop can also read a *packed run*
(`pack_run`): its steps' tables (csr, near_unary, unary, the extra end step)
rebuilt per call as one CSR table, so a traced step index picks rows with
one gather program (`packed_expand`) instead of a `lax.switch` over each
step's kernel. XLA compiles a kernel per op and per switch branch, which
made compiling a 33-step search take seconds; packing is used while the
run's tables are small (`PACK_MAX_ENTRIES`).

A longer run (or one with dense_rows layers) switches over its steps'
kernels, but steps with the same plan and table shapes share one kernel
(`group_run`): their tables stacked, one step's read through a
`TableSlice` at a traced position. A long set repeats a few step shapes,
so its program stays the same size whatever its length.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.row_search import exceptions_below
from static_compiler.ir import LayoutKind
from static_compiler.jax_support.placement import PACKED_TABLE_ENTRIES
from static_compiler.lowered.plan import StepPlan


class Candidates(NamedTuple):
    tokens: jnp.ndarray
    next: jnp.ndarray
    valid: jnp.ndarray


class TableSlice(NamedTuple):
    """One step's table inside a stack of its group's equal-shaped tables
    (`group_run`): rows [pos * n, (pos + 1) * n) of `data`, pos traced. The
    kernels read it as they read the table itself (`_gather` clamps an index
    into the step's own rows first, so out-of-range reads are the same)."""

    data: jax.Array  # (g * n, ...)
    pos: jax.Array  # int32 scalar
    n: int


def _gather(table, idx):
    """``jnp.take(table, idx, axis=0, mode="clip")`` of a table or a `TableSlice`."""
    if isinstance(table, TableSlice):
        idx = jnp.clip(jnp.asarray(idx, jnp.int32), 0, table.n - 1) + table.pos * table.n
        return jnp.take(table.data, idx, axis=0, mode="clip")
    return jnp.take(table, idx, axis=0, mode="clip")


def whole(table):
    """The array of a table or of a `TableSlice` (one dynamic slice)."""
    if isinstance(table, TableSlice):
        return lax.dynamic_slice_in_dim(table.data, table.pos * table.n, table.n, axis=0)
    return table


def _take(table, idx):
    return _gather(table, idx).astype(jnp.int32)


def slice_rows(step: StepPlan, tables: dict, start, end, k: int) -> Candidates:
    """Speculative slicing: k (static) entries from `start`, valid below `end`
    (start, end int32 (...,) -> Candidates (..., k))."""
    idx = start[..., None] + lax.iota(jnp.int32, k)
    return Candidates(*entries(step, tables, idx), idx < end[..., None])


def entries(step: StepPlan, tables: dict, idx) -> tuple[jax.Array, jax.Array]:
    """(tokens, next) int32, the token and target of edges `idx` int32 (...)
    of a sliced layer (indices past the table are clamped)."""
    nxt = _take(tables["targets"], idx) if step.explicit_targets else idx
    return _take(tables["tokens"], idx), nxt


def _csr_bounds(tables: dict, node):
    bounds = _take(tables["indptr"], node[..., None] + lax.iota(jnp.int32, 2))  # one gather
    return bounds[..., 0], bounds[..., 1]


def take_last(x, idx):
    """``jnp.take_along_axis(x, idx, axis=-1)`` for x (..., N) and idx int
    (..., K) with the same leading dims and entries in [0, N): one gather
    from the flattened x, its index computed elementwise (which XLA fuses
    into the gather; take_along_axis builds an index array of its own, a
    kernel more per call) and clamped, not checked."""
    idx = jnp.asarray(idx, jnp.int32)
    flat, stride = idx, x.shape[-1]
    for axis in reversed(range(x.ndim - 1)):
        flat = flat + _offsets(idx.shape, axis, stride)
        stride = stride * x.shape[axis]
    return jnp.take(x.reshape(-1), flat, mode="clip")


def take_rows(x, idx):
    """``x[b, idx[b, m], ...]``: x (B, N, ...) along axis 1 by idx int (B,
    M) in [0, N) -> (B, M, ...), one clamped gather of rows (see take_last)."""
    B, N = x.shape[:2]
    flat = _offsets(idx.shape, 0, N) + jnp.asarray(idx, jnp.int32)
    return jnp.take(x.reshape((B * N,) + x.shape[2:]), flat, axis=0, mode="clip")


def _offsets(shape, axis: int, stride):
    """int32 `shape`: the index along `axis` times `stride` (an iota: the
    exported modules' batch size is symbolic)."""
    return lax.broadcasted_iota(jnp.int32, shape, axis) * stride


def exception_rows(tables: dict):
    """(row starts, branches) int32 (X,) of a near_unary layer's exception
    states: its `ex_starts` / `ex_branch` tables (an older artifact's
    ex_bounds is read as these: `format.normalize.current_tables`)."""
    return (whole(tables["ex_starts"]).astype(jnp.int32),
            whole(tables["ex_branch"]).astype(jnp.int32))


def _near_unary_bounds(tables: dict, node):
    raw_states = whole(tables["ex_states"])
    num_ex = raw_states.shape[0]
    j, ex_states = exceptions_below(raw_states, node)
    # The exception at j (if node is one) and the one below it, read with one
    # gather per table (XLA compiles a kernel per gather).
    at = jnp.clip(j[..., None] - lax.iota(jnp.int32, 2), 0, num_ex - 1)  # [here, below]
    states = jnp.take(ex_states, at, mode="clip").astype(jnp.int32)
    starts = _take(tables["ex_starts"], at)
    ends = starts + _take(tables["ex_branch"], at)
    is_exception = (j < num_ex) & (states[..., 0] == node)
    # Between exceptions every state has one child, so rows advance in lockstep
    # with state ids: start = node + (end of the previous exception's row - its id - 1).
    shift = jnp.where(j > 0, ends[..., 1] - states[..., 1] - 1, 0)
    start = jnp.where(is_exception, starts[..., 0], node + shift)
    end = jnp.where(is_exception, ends[..., 0], start + 1)
    return start, end


_ROW_BOUNDS = {LayoutKind.CSR: _csr_bounds, LayoutKind.NEAR_UNARY: _near_unary_bounds}


def row_bounds(step: StepPlan, tables: dict, node):
    """[start, end) int32 (...,) of the rows of states `node` (csr and
    near_unary layouts, the ones that slice rows)."""
    return _ROW_BOUNDS[step.kind](tables, jnp.asarray(node, dtype=jnp.int32))


def _sliced(step: StepPlan, tables: dict, node) -> Candidates:
    start, end = row_bounds(step, tables, node)
    return slice_rows(step, tables, start, end, step.k)


def _dense_rows(step: StepPlan, tables: dict, node) -> Candidates:  # noqa: ARG001 (one signature per layout)
    nxt = _take(tables["next"], node)
    tokens = jnp.broadcast_to(lax.iota(jnp.int32, nxt.shape[-1]), nxt.shape)
    return Candidates(tokens, nxt, nxt >= 0)


def _unary(step: StepPlan, tables: dict, node) -> Candidates:
    tokens = _take(tables["tokens"], node)[..., None]
    nxt = _take(tables["targets"], node) if step.explicit_targets else node
    return Candidates(tokens, nxt[..., None], jnp.ones(tokens.shape, dtype=bool))


_KERNELS = {LayoutKind.DENSE_ROWS: _dense_rows, LayoutKind.CSR: _sliced, LayoutKind.UNARY: _unary, LayoutKind.NEAR_UNARY: _sliced}


def expand(step: StepPlan, tables: dict, node) -> Candidates:
    """Candidate transitions of the states `node` int32 (...,); see module doc."""
    node = jnp.asarray(node, dtype=jnp.int32)
    return _KERNELS[step.kind](step, tables, node)


def accepts(step: StepPlan, tables: dict, node):
    """bool (...,): whether each state `node` may end its sequence here."""
    if not step.has_accepting:
        return jnp.zeros(jnp.shape(node), dtype=bool)
    return _gather(tables["accepting"], node)


# ---------------------------------------------------------------------------
# Packed runs: the tables of several consecutive steps as one CSR table, so
# one gather program (no lax.switch over the steps' kernels) serves them all.

PACK_MAX_ENTRIES = PACKED_TABLE_ENTRIES
"""A run of steps is decoded from a packed table only while that table holds
at most this many entries (row pointers + edges): it is rebuilt on every
call, which costs O(entries), and on small tables that is far below the
compile time it saves (one gather program instead of one per step). Tables
split across devices are larger (`placement`), so never packed."""


class PackedRun(NamedTuple):
    """The layers of a run of steps as one CSR table.

    indptr int32 (P + 1,): row r's edges are [indptr[r], indptr[r + 1]); a
    step has a row per state and one empty row after them (the extra step of
    variable-length sets: its final states, with no edges). tokens (E,):
    every step's edges; targets int32 (E,): their targets, local to the
    next step, or None when every step numbers its targets implicitly (the
    target is then the edge's index within its step). accepting bool (P,):
    a state may end here (the extra step: every state). row_offsets,
    edge_offsets int32 (steps,): where each step's rows and edges start.
    k: static slots per beam, the widest step's."""

    indptr: jax.Array
    tokens: jax.Array
    targets: Optional[jax.Array]
    accepting: jax.Array
    row_offsets: jax.Array
    edge_offsets: jax.Array
    k: int


def step_entries(plan, tables, t: int) -> Optional[int]:
    """Entries step `t` adds to a packed run (its rows + 1 and its edges),
    or None for a dense_rows step (its V slots per beam are read another
    way, never packed)."""
    if t >= plan.depth:
        return plan.steps[-1].num_next_states + 1
    step = plan.steps[t]
    if step.kind == LayoutKind.DENSE_ROWS:
        return None
    return step.num_states + 1 + tables[t]["tokens"].shape[0]


def packed_entries(plan, tables, steps) -> Optional[int]:
    """Entries of `pack_run(plan, tables, steps)`, or None when a step has a
    dense_rows layout."""
    entries = [step_entries(plan, tables, t) for t in steps]
    return None if None in entries else sum(entries)


def _concat(parts: list) -> jax.Array:
    """One concatenate (one kernel) of traced arrays, as int32 unless all bool."""
    out = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
    return out if out.dtype == jnp.bool_ else out.astype(jnp.int32)


def pack_run(plan, tables, steps) -> PackedRun:
    """The tables of `steps` (consecutive, no dense_rows layer) packed into
    one `PackedRun`; jax ops, so it runs on traced tables.

    XLA compiles each op into a kernel of its own, so this is a fixed number
    of ops whatever the run's length: each kind of table is concatenated
    once, and what the plan and the table shapes fix (offsets, unary rows,
    where each piece lands) is a numpy constant. A row's start is its step's
    edge offset plus: for csr, its indptr entry; otherwise its state id plus
    the extra children of the near_unary exceptions below it, from one
    scatter-add and one cumulative sum over the run (each step's total is
    taken back at its end)."""
    row_offsets, edge_offsets = [], []
    base, csr_at, acc_at, tgt_at = [], [], [], []  # static, per row / per edge
    csr, ex_states, ex_branch, ex_shift, accepting, tokens, targets = ([] for _ in range(7))
    cancel = []  # rows where a near_unary step's extra children end (its total is taken back)
    rows = edges = k = csr_len = acc_len = tgt_len = 0
    explicit = any(t < plan.depth and plan.steps[t].explicit_targets for t in steps)
    for t in steps:
        row_offsets.append(rows)
        edge_offsets.append(edges)
        if t >= plan.depth:  # the extra step: final states, no edges, all may end
            n = plan.steps[-1].num_next_states
            base.append(np.full(n + 1, edges))
            csr_at.append(np.full(n + 1, -1))
            acc_at.append(np.full(n + 1, -1))  # -1: True
            rows += n + 1
            continue
        step, tabs = plan.steps[t], tables[t]
        n, e = step.num_states, tabs["tokens"].shape[0]
        if step.kind == LayoutKind.CSR:
            base.append(np.full(n + 1, edges))
            csr.append(tabs["indptr"])
            csr_at.append(csr_len + np.arange(n + 1))
            csr_len += tabs["indptr"].shape[0]  # n + 1, or more where padded to split evenly
        else:
            base.append(edges + np.arange(n + 1))
            csr_at.append(np.full(n + 1, -1))
        if step.kind == LayoutKind.NEAR_UNARY:
            ex_states.append(tabs["ex_states"])
            ex_branch.append(exception_rows(tabs)[1])
            ex_shift.append(np.full(tabs["ex_states"].shape[0], rows + 1))
            cancel.append(rows + n + 1)
        if step.has_accepting:
            accepting.append(tabs["accepting"])
            acc_at.append(np.append(acc_len + np.arange(n), -2))  # -2: False
            acc_len += n
        else:
            acc_at.append(np.full(n + 1, -2))
        tokens.append(tabs["tokens"])
        if explicit and step.explicit_targets:
            targets.append(tabs["targets"])
            tgt_at.append(tgt_len + np.arange(e))
            tgt_len += e
        elif explicit:
            tgt_at.append(-1 - np.arange(e))  # -1 - j: implicit, target j
        rows, edges = rows + n + 1, edges + e
        k = max(k, 1 if step.kind == LayoutKind.UNARY else step.k)
    base.append([edges])  # row `rows` ends the last one
    csr_at.append([-1])
    start = np.concatenate(base).astype(np.int32)
    csr_at = np.concatenate(csr_at)
    indptr = jnp.asarray(start)
    if csr:
        from_csr = jnp.take(_concat(csr), np.maximum(csr_at, 0).astype(np.int32))
        indptr = indptr + jnp.where(csr_at >= 0, from_csr, 0)
    if ex_states:
        # Each step's total of extra children (e - n unpadded; its padding
        # entries, ids past every state, add theirs at the end row) is
        # taken back where the step ends.
        totals = jnp.stack([jnp.sum(jnp.asarray(b, jnp.int32) - 1) for b in ex_branch])
        at = _concat(ex_states) + np.concatenate(ex_shift).astype(np.int32)
        extra = jnp.zeros(rows + 1, jnp.int32).at[at].add(_concat(ex_branch) - 1)
        extra = extra.at[np.asarray(cancel, np.int32)].add(-totals)
        indptr = indptr + jnp.cumsum(extra, dtype=jnp.int32)
    acc_at = np.concatenate(acc_at)
    acc_at = np.where(acc_at == -1, acc_len + 1, np.where(acc_at == -2, acc_len, acc_at))
    acc_all = _concat(accepting + [np.array([False, True])])
    if explicit:
        tgt_at = np.concatenate(tgt_at)
        found = jnp.take(_concat(targets), np.maximum(tgt_at, 0).astype(np.int32))
        tgt_all = jnp.where(tgt_at >= 0, found, (-1 - tgt_at).astype(np.int32))
    return PackedRun(indptr, _concat(tokens) if tokens else np.zeros(1, np.int32), tgt_all if explicit else None,
                     jnp.take(acc_all, acc_at.astype(np.int32)),
                     np.asarray(row_offsets, np.int32), np.asarray(edge_offsets, np.int32),
                     max(k, 1))


def packed_expand(packed: PackedRun, index, node) -> tuple[Candidates, jax.Array]:
    """Candidates (..., k) and accepting bool (...,) of the states `node`
    int32 (...,) at step `index` (int32 scalar, traced) of a packed run."""
    row = jnp.asarray(node, jnp.int32) + jnp.take(packed.row_offsets, index, mode="clip")
    start, end = _take(packed.indptr, row), _take(packed.indptr, row + 1)
    idx = start[..., None] + lax.iota(jnp.int32, packed.k)
    nxt = idx - jnp.take(packed.edge_offsets, index, mode="clip") if packed.targets is None \
        else _take(packed.targets, idx)
    cand = Candidates(_take(packed.tokens, idx), nxt, idx < end[..., None])
    return cand, jnp.take(packed.accepting, row, mode="clip")


# ---------------------------------------------------------------------------
# Grouped runs: the steps of a run that is not packed, grouped by kernel, so
# a traced step index switches over the groups, not over every step.

STACK_MAX_ENTRIES = 1 << 20
"""The groups of a run (`group_run`) stack at most this many table entries
in all; steps past it keep kernels of their own. The stacks are rebuilt on
every call (a decoding loop builds them once, before the loop), a copy that
long sets with small tables repay many times in compile time, and that large
tables would pay on every call: 4M entries (four unary layers of a 1e6-item
set) cost 11 % of a whole 8-step beam_search."""


class GroupedRun(NamedTuple):
    """The layers of a run of steps, grouped by kernel: steps with the same
    `StepPlan` and table shapes run one kernel, reading their tables from
    one stack (each kind of table concatenated along its first axis over
    the group's steps) at the step's position, a traced index.

    A `lax.switch` over every step of a long run compiled one branch per
    step, each taking every step's tables as operands (XLA passes a
    conditional's operands to every branch): compile time grew with the
    square of the run's length. Over the groups it grows with the number of
    distinct step shapes, which a long set repeats.

    tables: per group, its stacked tables (key -> (g * n, ...)), or, for a
    group of one step, that step's own tables. steps: per group, its steps
    (static; the first names the kernel). group, position: int32 (run
    length,): each step's group and its place in it."""

    tables: tuple
    steps: tuple
    group: np.ndarray
    position: np.ndarray

    def step_tables(self, g: int, pos) -> dict:
        """``{t: tables}`` for group `g`'s first step t: the tables of the
        step at position `pos` (int32 scalar, traced) of the group, as the
        kernels read them (`TableSlice` where stacked)."""
        steps, tabs = self.steps[g], self.tables[g]
        if len(steps) == 1:
            return {steps[0]: tabs}
        n = len(steps)
        return {steps[0]: {key: TableSlice(arr, pos, arr.shape[0] // n)
                           for key, arr in tabs.items()}}


def step_signature(plan, tables, t: int):
    """What fixes step `t`'s kernel: its `StepPlan` and its tables' shapes
    and dtypes (None for the extra end step: a group of its own)."""
    if t >= plan.depth:
        return None
    return plan.steps[t], tuple((key, tuple(arr.shape), str(arr.dtype))
                                for key, arr in sorted(tables[t].items()))


def run_groups(plan, tables, steps, limit: Optional[int] = None) -> tuple[tuple[int, ...], ...]:
    """The steps of a run grouped by `step_signature` (first-seen order),
    the groups stacking at most `limit` (default `STACK_MAX_ENTRIES`)
    entries in all; a step that would pass it keeps a group of its own."""
    limit = STACK_MAX_ENTRIES if limit is None else limit
    groups, open_group = [], {}  # signature -> index of its group
    sizes, stacked = [], 0  # entries per group; entries in groups of two or more
    for t in steps:
        sig = step_signature(plan, tables, t)
        size = 0 if t >= plan.depth else sum(int(np.prod(a.shape)) for a in tables[t].values())
        g = open_group.get(sig) if sig is not None else None
        added = None if g is None else size + (sizes[g] if len(groups[g]) == 1 else 0)
        if added is not None and stacked + added <= limit:
            groups[g].append(t)
            sizes[g] += size
            stacked += added
            continue
        if sig is not None and g is None:
            open_group[sig] = len(groups)
        groups.append([t])
        sizes.append(size)
    return tuple(tuple(g) for g in groups)


def group_run(plan, tables, steps, limit: Optional[int] = None) -> Optional[GroupedRun]:
    """The run `steps` as a `GroupedRun` (`run_groups`), or None when no two
    of its steps share a kernel (the per-step switch is then as small)."""
    groups = run_groups(plan, tables, steps, limit)
    if len(groups) == len(steps):
        return None
    where = {t: (g, i) for g, members in enumerate(groups) for i, t in enumerate(members)}
    stacked = []
    for members in groups:
        if len(members) == 1:
            stacked.append(tables[members[0]] if members[0] < plan.depth else {})
            continue
        stacked.append({key: jnp.concatenate([jnp.asarray(tables[t][key]) for t in members])
                        for key in tables[members[0]]})
    return GroupedRun(tuple(stacked), groups,
                      np.asarray([where[t][0] for t in steps], np.int32),
                      np.asarray([where[t][1] for t in steps], np.int32))
