"""Step kernels in torch: the candidate transitions of a batch of rows at
one static step, read from a layer's tables (see `tables`), and the item
subsets' liveness bits read per candidate.

The same gathers as the JAX kernels (`static_compiler.backend.kernels`),
with the same clamping: an index outside a table reads its first or last
entry (an empty table reads zeros), so no branch depends on data and every
function here traces into one ``torch.compile(fullgraph=True)`` graph.
Shapes: B rows; K candidates per row (V for dense_rows, k for csr /
near_unary, 1 for unary); node int64 (B,).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from static_compiler.lowered.plan import StepPlan
from static_compiler.torch_backend import rank_kernels
from static_compiler.torch_backend.gather import take


class Children(NamedTuple):
    """tokens int64 (B, K), next int64 (B, K) the state each candidate
    enters at the next depth, valid bool (B, K)."""

    tokens: torch.Tensor
    next: torch.Tensor
    valid: torch.Tensor


class LiveBits(NamedTuple):
    """Item subsets as torch tensors: live, per depth d = 1..depth, int32
    (R, W_d) (the uint32 words of a `Subset`, reinterpreted); ends, per
    depth d = 0..depth, int32 (R, W_d) or None where no state accepts."""

    live: tuple
    ends: tuple


def _csr_bounds(tabs: dict, node: torch.Tensor):
    indptr = tabs["indptr"]
    n = indptr.shape[0]
    if n < 2:
        return take(indptr, node).long(), take(indptr, node + 1).long()
    # one gather of (indptr[s], indptr[s + 1]) pairs (a view of indptr); a state
    # outside [0, n - 1) reads a real row, as every row of a state that is not
    # live does: its candidates are invalid (`row_status`)
    bounds = take(indptr.as_strided((n - 1, 2), (1, 1)), node).long()
    return bounds[:, 0], bounds[:, 1]


def _near_unary_bounds(tabs: dict, node: torch.Tensor):
    ex_states = tabs["ex_states"]
    num_ex = ex_states.shape[0]
    # j: exception states below `node`; between exceptions every state has
    # one child, so its row starts where the previous exception's ends
    # plus the states in between.
    j = torch.searchsorted(ex_states, node.to(ex_states.dtype).contiguous(), side="left").long()
    at = (j[:, None] - torch.arange(2, device=node.device)).clamp(0, max(num_ex - 1, 0))
    states = take(ex_states, at).long()
    starts = take(tabs["ex_starts"], at).long()
    ends = starts + take(tabs["ex_branch"], at).long()
    is_exception = (j < num_ex) & (states[:, 0] == node)
    shift = torch.where(j > 0, ends[:, 1] - states[:, 1] - 1, torch.zeros_like(j))
    start = torch.where(is_exception, starts[:, 0], node + shift)
    end = torch.where(is_exception, ends[:, 0], start + 1)
    return start, end


def row_bounds(step: StepPlan, tabs: dict, node: torch.Tensor):
    """[start, end) int64 (B,) of the rows of states `node` (csr and
    near_unary layers)."""
    return (_csr_bounds if step.kind == "csr" else _near_unary_bounds)(tabs, node)


def slice_rows(step: StepPlan, tabs: dict, start, end, k: int) -> Children:
    """k entries from `start`, valid below `end` (start, end int64 (B,))."""
    idx = start[:, None] + torch.arange(k, device=start.device)
    nxt = take(tabs["targets"], idx).long() if step.explicit_targets else idx
    return Children(take(tabs["tokens"], idx).long(), nxt, idx < end[:, None])


def children(step: StepPlan, tabs: dict, node: torch.Tensor, vocab_size: int) -> Children:
    """The children the tables list for states `node` int64 (B,)."""
    if step.kind == "dense_rows":
        nxt = take(tabs["next"], node).long()
        tokens = torch.arange(vocab_size, device=node.device).expand(nxt.shape)
        return Children(tokens, nxt, nxt >= 0)
    if step.kind == "unary":
        tokens = take(tabs["tokens"], node).long()[:, None]
        nxt = take(tabs["targets"], node).long() if step.explicit_targets else node
        return Children(tokens, nxt[:, None], torch.ones_like(tokens, dtype=torch.bool))
    start, end = row_bounds(step, tabs, node)
    return slice_rows(step, tabs, start, end, step.k)


def accepts(step: StepPlan, tabs: dict, node: torch.Tensor) -> torch.Tensor:
    """bool (B,): whether each state may end its sequence here."""
    if not step.has_accepting:
        return torch.zeros(node.shape, dtype=torch.bool, device=node.device)
    return take(tabs["accepting"], node)


# ---------------------------------------------------------------------------
# Liveness bits (see static_compiler.item_bits.liveness for their layout)


def bits(words: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """bool idx.shape: bit idx of subset row rows[b] of `words` int32 (R, W);
    idx int64 (B, ...). Out-of-range indices read some bit (their candidates
    are invalid anyway)."""
    R, W = words.shape
    base = (rows * W).reshape(rows.shape + (1,) * (idx.ndim - 1))
    word = take(words.reshape(-1), base + (idx >> 5))
    return ((word.long() >> (idx & 31)) & 1).bool()


def is_ranked(sub) -> bool:
    """Whether `sub` holds a ranked subset (`rank_kernels.RankedLive`)
    rather than `LiveBits`."""
    return sub is not None and isinstance(sub[0], rank_kernels.RankedLive)


def child_live(sub, step: int, nxt: torch.Tensor) -> Optional[torch.Tensor]:
    """bool nxt.shape: the next states (depth step + 1) are live in each
    row's subset; None without a subset. sub: (LiveBits, rows int64 (B,))
    (a ranked subset's read: `rank_kernels.children_live`)."""
    if sub is None:
        return None
    live, rows = sub
    return bits(live.live[step], rows, nxt)


def dense_child_live(sub, step: int, node: torch.Tensor, vocab_size: int):
    """bool (B, V): which tokens of states `node` (a dense step with slot
    bits) lead to a live state; None without a subset. Each row reads its
    state's W = ceil(V / 32) slot words and unpacks them with shifts."""
    if sub is None:
        return None
    live, rows = sub
    words = live.live[step]
    W = -(-vocab_size // 32)
    R, states = words.shape[0], words.shape[1] // W
    row = take(words.reshape(R * states, W), rows * states + node.clamp(0, max(states - 1, 0)))
    shifts = torch.arange(32, device=node.device)
    unpacked = (row.long()[:, :, None] >> shifts) & 1
    return unpacked.reshape(node.shape[0], 32 * W)[:, :vocab_size].bool()


def end_live(sub, step: int, node: torch.Tensor) -> Optional[torch.Tensor]:
    """bool (B,): the items ending at states `node` (depth `step`) are in
    each row's subset; None without a subset or where no state accepts."""
    if sub is None or sub[0].ends[step] is None:
        return None
    live, rows = sub
    return bits(live.ends[step], rows, node)


def _ends(sub, step: int, node: torch.Tensor, offsets) -> Optional[torch.Tensor]:
    """`end_live` of either subset form (offsets: a ranked subset's
    `rank_kernels.node_offsets` of `node`)."""
    if is_ranked(sub):
        return rank_kernels.end_live(sub[0].ranges, sub[0].ranked, sub[1], step, node, offsets)
    return end_live(sub, step, node)


def _and(a: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return a if b is None else a & b


class StepColumns(NamedTuple):
    """The candidates of B rows at one step, as the processor pair reads
    them: children (None past the last layer), with valid already limited
    to expanding rows and live children; end bool (B,) or None: the row may
    take the end token and finish; stay bool (B,) or None: a finished row
    may take the end token again."""

    children: Optional[Children]
    end: Optional[torch.Tensor]
    stay: Optional[torch.Tensor]


def ranked_children_live(plan, step: int, node, nxt, sub, offsets=None) -> torch.Tensor:
    """bool (B, K): the children nxt int64 (B, K) of states node (B,) (the
    `children` of a step) live in each row's ranked subset, sub
    (`rank_kernels.RankedLive`, rows int64 (B,)); offsets: the states'
    `rank_kernels.node_offsets` where the caller has them (None: found
    here)."""
    live, rows = sub
    if offsets is None:
        offsets = rank_kernels.node_offsets(live.ranges, step, node)
    return rank_kernels.children_live(live, rows, step, plan.steps[step].kind == "dense_rows",
                                      node, nxt, offsets)


def ranked_child_live(step: int, node, nxt, sub) -> torch.Tensor:
    """bool (B,): one child per row, nxt int64 (B,) (-1: none, False) of
    states node (B,), live in each row's ranked subset (sub as
    `ranked_children_live`'s): the same answer as that read of the
    state's whole row gives at its column."""
    live, rows = sub
    return rank_kernels.one_child_live(live, rows, step, node, nxt,
                                       rank_kernels.node_offsets(live.ranges, step, node))


def step_columns(plan, tables, step: int, node, valid, finished, sub=None,
                 with_children: bool = True, child_subset: bool = True) -> StepColumns:
    """The candidates of rows at states `node` int64 (B,) (valid, finished
    bool (B,)) at static `step`: `static_compiler.backend.decode.candidates
    .step_candidates` without log-probs. sub: (LiveBits, rows int64 (B,))
    or (`rank_kernels.RankedLive`, rows): a ranked subset's range counts
    (the same answers), or None. With `with_children` False, children is None (the caller
    reads the one child it needs, `dense_child`); with `child_subset`
    False, the children's valid leaves the subset out (the caller reads
    the liveness of the children it needs: the beam step's lazy selection,
    `ranked_children_live`), the end column still reads it."""
    end = plan.end_token
    live, expanding = row_status(plan, step, node, valid, finished)
    kids, accepting = None, None
    ranked = is_ranked(sub)
    offsets = rank_kernels.node_offsets(sub[0].ranges, step, node) if ranked else None
    if step < plan.depth:
        sp = plan.steps[step]
        if with_children:
            c = children(sp, tables[step], node, plan.vocab_size)
            if not child_subset:
                in_subset = None
            elif ranked:
                in_subset = ranked_children_live(plan, step, node, c.next, sub, offsets)
            else:
                in_subset = dense_child_live(sub, step, node, plan.vocab_size) \
                    if step in plan.slot_steps else child_live(sub, step, c.next)
            # (a new tuple, not `_replace`, which torch 2.5's dynamo cannot trace)
            kids = Children(c.tokens, c.next, _and(c.valid, in_subset) & expanding[:, None])
        if end is not None and sp.has_accepting:
            accepting = _and(accepts(sp, tables[step], node), _ends(sub, step, node, offsets))
    elif end is not None:  # the extra step of variable-length sets: final states only end
        accepting = _and(torch.ones_like(live), _ends(sub, step, node, offsets))
    return StepColumns(kids, None if accepting is None else accepting & expanding,
                       None if end is None else live & finished)


def row_status(plan, step: int, node, valid, finished):
    """(live, expanding) bool (B,): rows at a state of this depth (ids from
    elsewhere read nothing), and those of them not finished."""
    live = valid & (node >= 0) & (node < plan.count_at(step))
    return live, live & ~finished


def dense_child(plan, tables, step: int, node, expanding, tokens, sub=None):
    """(ok bool (B,), next int64 (B,)) of each row's one token int64 (B,) at
    a dense_rows step: one gather of next[node, token] instead of the row's
    V columns; ok exactly where `children` marks that column valid."""
    V = plan.vocab_size
    in_vocab = (tokens >= 0) & (tokens < V)
    column = tokens.clamp(0, V - 1)
    nxt = take(tables[step]["next"], node).gather(1, column[:, None])[:, 0].long()
    ok = in_vocab & (nxt >= 0) & expanding
    if is_ranked(sub):
        ranges = sub[0].ranges
        ok = ok & rank_kernels.one_child_live(sub[0], sub[1], step, node, nxt,
                                              rank_kernels.node_offsets(ranges, step, node))
    elif sub is not None:
        if step in plan.slot_steps:  # slot bit v of state s: bit s * 32 W + v
            live, rows = sub
            words = live.live[step]
            W = -(-V // 32)
            states = max(words.shape[1] // W, 1)
            slot = node.clamp(0, states - 1) * (32 * W) + column
            ok = ok & bits(words, rows, slot)
        else:
            ok = ok & child_live(sub, step, nxt)
    return ok, nxt
