"""The processor pair as compiled host loops (numba) over one step's tables:
`mask` (the tokens each row may take) and `advance` (each row along its
token), with the semantics of `static_compiler.backend.decode.processor`
and of the torch ops (`torch_backend.ops.mask_at` / `advance_at`), bit for
bit, on every layout (csr, near_unary, unary, dense_rows; implicit or
explicit targets), with or without an item subset (liveness bits per
state, or slot bits of dense rows; end bits; or a ranked subset's rank
bits in trie order, read as `torch_backend.rank_kernels` reads them:
`HostRanges`, RANK_BITS), fixed and variable length.

Why: an engine that masks a few dozen rows per step (vLLM's processor on a
CPU) pays 60-120 tensor ops of 2-4 us each for what is one short loop per
row here (a few microseconds per call in all: docs/benchmarks.md, "vLLM").

Conventions (those of the torch kernels, so the results match on any
input the door accepts): a row is live when valid and its state is in [0,
S) of its depth; only live rows read the tables; indices read by a row
that is live are in range for a verified set, and every read is clamped
into its table anyway (no input reads outside an array). Subset bits: bit
i of subset row r of words int32 (R, W) is bit i % 32 of word r * W + i //
32 (a `Subset`'s uint32 words, reinterpreted), its flat index clamped
into [0, R * W) as the torch kernels' gathers clamp it. A ranked
subset's row is clamped into [0, R), its positions into [0, size], as
`rank_kernels` clamps them.

numba is optional: without it `AVAILABLE` is False and nothing here runs
(the engines keep their tensor ops).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from static_compiler.host_kernels.jit import AVAILABLE, njit  # noqa: F401 (AVAILABLE: the engines read it here)
from static_compiler.host_kernels.jit import clamp as _clamp
from static_compiler.host_kernels.ranked import (
    NO_COUNTS,
    NO_META,
    NO_SUMS,
    NO_WITHIN,
    NO_WORDS,
    PTR,
    PTR_N,
    HostRanges,
    host_ranges,
    int_at,
    offsets_of,
    ranked_end,
    ranked_run,
)

CSR, NEAR_UNARY, UNARY, DENSE_ROWS, NO_CHILDREN = 0, 1, 2, 3, 4
"""A step's kind as the kernels read it (NO_CHILDREN: the extra step of a
variable-length set, where rows only end)."""
ACCEPT_NONE, ACCEPT_TABLE, ACCEPT_ALL = 0, 1, 2
"""Which states may end here: none, those the accepting table marks, all
(the extra step)."""
NO_SUBSET, CHILD_BITS, SLOT_BITS, RANK_BITS = 0, 1, 2, 3
"""How a subset's bits are read at a step: none, one bit per next state,
one bit per (state, token) of a dense row, a range count over a ranked
subset's item bits per next state (`HostRanges`)."""

_KINDS = {"csr": CSR, "near_unary": NEAR_UNARY, "unary": UNARY, "dense_rows": DENSE_ROWS}
_NO_INTS = np.zeros(0, np.int32)
_NO_ROWS = np.zeros((0, 0), np.int32)
_NO_FLAGS = np.zeros(0, np.bool_)
_NO_INDEX = np.zeros(0, np.int64)


class HostLayer(NamedTuple):
    """One step's tables as the kernels read them, in the kernels' argument
    order: int32 (bool accepting)
    C-contiguous numpy arrays, empty where the layout keeps none.

    kind, explicit (targets listed), k (entries a row reads: the plan's
    slice width), count (states at this depth: rows at others read
    nothing), accept (ACCEPT_*); indptr (S + 1,) for csr; ex_states,
    ex_starts, ex_branch (X,) for near_unary; tokens, targets (entries,);
    next (S, V) for dense_rows; accepting (S,)."""

    kind: int
    explicit: bool
    k: int
    count: int
    accept: int
    indptr: np.ndarray = _NO_INTS
    ex_states: np.ndarray = _NO_INTS
    ex_starts: np.ndarray = _NO_INTS
    ex_branch: np.ndarray = _NO_INTS
    tokens: np.ndarray = _NO_INTS
    targets: np.ndarray = _NO_INTS
    next: np.ndarray = _NO_ROWS
    accepting: np.ndarray = _NO_FLAGS

    @classmethod
    def of(cls, plan, tables: tuple, step: int, count: int) -> "HostLayer":
        """Step `step` of a set with `plan` (a `Plan`) and `tables` (one
        dict of numpy arrays per layer, int32 / bool); count: its states
        (the plan's count at that depth)."""
        if step >= plan.depth:
            return cls(NO_CHILDREN, False, 0, count,
                       ACCEPT_NONE if plan.end_token is None else ACCEPT_ALL)
        sp, tabs = plan.steps[step], tables[step]
        accept = ACCEPT_TABLE if sp.has_accepting and plan.end_token is not None \
            else ACCEPT_NONE
        arrays = {name: np.ascontiguousarray(tabs[name], np.bool_ if name == "accepting"
                                             else np.int32)
                  for name in ("indptr", "ex_states", "ex_starts", "ex_branch", "tokens",
                               "targets", "next", "accepting") if name in tabs}
        if accept == ACCEPT_NONE:
            arrays.pop("accepting", None)
        return cls(_KINDS[str(sp.kind)], bool(sp.explicit_targets), int(sp.k), count, accept,
                   **arrays)




class HostSubset(NamedTuple):
    """A subset's bits at one step, per row (`host_subset`,
    `ranked_subset`): mode (NO_SUBSET, CHILD_BITS, SLOT_BITS, RANK_BITS);
    live: the step's words int32 (R * W,) flat, W live_width, slot_states
    (dense rows' states, for slot bits); ends: the end bits' words (R *
    W_e,), W_e ends_width, has_ends (False: the ends are not limited
    here); rows int64 (B,), each row's subset. A ranked subset's (the
    rest, placeholders otherwise): step; its set's `HostRanges`; its item
    bits' words int32 (R, W), within int16 (R, W), counts int32 / int64
    (R, C), the added items' three ((R, 0) without additions), first bool
    (R, S_1) (`rank_kernels.RankedLive`'s), numpy views."""

    mode: int
    live: np.ndarray
    live_width: int
    slot_states: int
    ends: np.ndarray
    ends_width: int
    has_ends: bool
    rows: np.ndarray
    step: int = 0
    range_meta: np.ndarray = NO_META
    range_ints: np.ndarray = _NO_INTS
    range_words: np.ndarray = NO_WORDS
    range_within: np.ndarray = NO_WITHIN
    range_counts: np.ndarray = NO_SUMS
    words: np.ndarray = NO_WORDS
    within: np.ndarray = NO_WITHIN
    counts: np.ndarray = NO_COUNTS
    added_words: np.ndarray = NO_WORDS
    added_within: np.ndarray = NO_WITHIN
    added_counts: np.ndarray = NO_COUNTS
    first: np.ndarray = np.zeros((1, 0), np.bool_)


NO_BITS = HostSubset(NO_SUBSET, _NO_INTS, 1, 1, _NO_INTS, 1, False, _NO_INDEX)
"""No subset: every live state is in."""


def host_subset(live: Optional[np.ndarray], slot: bool, vocab_size: int,
                ends: Optional[np.ndarray], rows: np.ndarray) -> HostSubset:
    """The `HostSubset` of one step: live, the step's words int32 (R, W)
    (None past the last layer), slot: they are slot bits (R, S * ceil(V /
    32)); ends int32 (R, W_e) or None; rows ints (B,)."""
    rows = np.ascontiguousarray(rows, np.int64)
    mode, width, states = NO_SUBSET, 1, 1
    if live is not None:
        width = live.shape[1]
        mode = CHILD_BITS
        if slot:
            mode, width = SLOT_BITS, -(-vocab_size // 32)
            states = live.shape[1] // width
        live = np.ascontiguousarray(live, np.int32).reshape(-1)
    has_ends = ends is not None
    return HostSubset(mode, _NO_INTS if live is None else live, width, states,
                      np.ascontiguousarray(ends, np.int32).reshape(-1) if has_ends else _NO_INTS,
                      ends.shape[1] if has_ends else 1, has_ends, rows)


def ranked_subset(ranges: HostRanges, step: int, has_ends: bool, rows: np.ndarray,
                  items: tuple, added: Optional[tuple], first: np.ndarray) -> HostSubset:
    """The `HostSubset` of a ranked subset at `step` over the set of
    `ranges`: items (words int32 (R, W), within int16 (R, W), counts int32
    / int64 (R, C)), added (the same over the added items, or None), first
    bool (R, S_1), C-contiguous (read in place); has_ends: its end bits
    limit the rows ending at this step (`RangeTensors.ends`); rows ints
    (B,)."""
    if added is None:
        added = (NO_WORDS, NO_WITHIN, np.zeros((1, 0), items[2].dtype))
    return HostSubset(RANK_BITS, _NO_INTS, 1, 1, _NO_INTS, 1, has_ends,
                      np.ascontiguousarray(rows, np.int64), step, *ranges, *items, *added, first)


# ---------------------------------------------------------------------------
# The kernels




@njit(nogil=True, cache=True, inline="always")
def _bit(words, width, row, i):
    """Bit i of subset row `row` (words int32 (R * width,) flat), its word
    index clamped as a gather clamps it (no words: 0)."""
    n = words.shape[0]
    if n == 0:
        return False
    w = words[_clamp(row * width + (i >> 5), n)]
    return ((w >> (i & 31)) & 1) != 0


@njit(nogil=True, cache=True, inline="always")
def _slot_bit_of_row(words, width, states, row, s, v):
    """Slot bit v of state s in subset row `row`, as a mask reads it: the
    state's words (row clamped into [0, R * states)) then bit v."""
    n = words.shape[0]
    if n == 0:
        return False
    at = _clamp(row * states + _clamp(s, states), n // width)
    return ((words[at * width + (v >> 5)] >> (v & 31)) & 1) != 0


@njit(nogil=True, cache=True, inline="always")
def _slot_bit_flat(words, width, states, row, s, v):
    """Slot bit v of state s in subset row `row`, as an advance reads it:
    bit clamp(s) * 32 width + v of the row's words (the flat word clamped)."""
    return _bit(words, states * width, row, _clamp(s, states) * (32 * width) + v)


@njit(nogil=True, cache=True, inline="always")
def _entry(tokens, targets, explicit, i):
    """(token, next state) of table entry i (a unary layer's: its state),
    read as a gather reads it: clamped, zeros from an empty table."""
    n_tok, n_tgt = tokens.shape[0], targets.shape[0]
    tok = tokens[_clamp(i, n_tok)] if n_tok > 0 else 0
    if not explicit:
        return tok, i
    return tok, targets[_clamp(i, n_tgt)] if n_tgt > 0 else 0


@njit(nogil=True, cache=True, inline="always")
def _bounds(kind, indptr, ex_states, ex_starts, ex_branch, s):
    """[start, end) of state s's row in a csr or near_unary layer."""
    if kind == CSR:
        n = indptr.shape[0]
        if n == 0:
            return 0, 0
        return indptr[_clamp(s, n)], indptr[_clamp(s + 1, n)]
    num = ex_states.shape[0]
    j = np.searchsorted(ex_states, s) if num else 0
    if j < num and ex_states[j] == s:
        return ex_starts[j], ex_starts[j] + ex_branch[j]
    start = s
    if j > 0:  # between exceptions every state has one child, in order
        p = _clamp(j - 1, num)
        start = s + ex_starts[p] + ex_branch[p] - ex_states[p] - 1
    return start, start + 1




@njit(nogil=True, cache=True, inline="always")
def _child_in(mode, live, width, row, nxt):
    """Whether next state `nxt` is in the row's subset (CHILD_BITS), or no
    subset limits it (not RANK_BITS: `ranked_run`)."""
    return mode != CHILD_BITS or _bit(live, width, row, nxt)


@njit(nogil=True, cache=True, inline="always")
def _ends_here(accept, accepting, has_ends, ends, ends_width, row, s):
    """Whether a live, unfinished row at state s may take the end token
    (a ranked subset's end bits: `has_ends` False here, `ranked_end`)."""
    if accept == ACCEPT_NONE:
        return False
    if accept == ACCEPT_TABLE:
        n = accepting.shape[0]
        if n == 0 or not accepting[_clamp(s, n)]:
            return False
    return not has_ends or _bit(ends, ends_width, row, s)


@njit(nogil=True, cache=True)
def mask_rows(kind, explicit, k, count, accept, indptr, ex_states, ex_starts, ex_branch,
              tokens, targets, nxt_rows, accepting, vocab, end,
              mode, live, width, slot_states, ends, ends_width, has_ends, subset_rows,
              step, range_meta, range_ints, range_words, range_within, range_counts,
              words, within, counts, added_words, added_within, added_counts, first,
              node, valid, finished, allowed):
    """Writes True into allowed bool (B, V) (zeros on entry) at the tokens
    each row (node int64, valid, finished bool (B,)) may take at this step
    (end: the end token, -1 for none)."""
    rk = (range_meta, range_ints, range_words, range_within, range_counts,
          words, within, counts, added_words, added_within, added_counts, first)
    ranked = mode == RANK_BITS
    run = np.zeros(max(k, vocab) + 1 if ranked else 1, np.bool_)  # (a row's children's bits)
    one = run[run.shape[0] - 1:]
    n_next = nxt_rows.shape[0]
    for b in range(node.shape[0]):
        s = node[b]
        if not valid[b] or s < 0 or s >= count:
            continue
        if finished[b]:
            if end >= 0:
                allowed[b, end] = True
            continue
        row = subset_rows[b] if subset_rows.shape[0] > 0 else 0
        own, off = offsets_of(rk, step, s) if ranked else (np.int64(0), np.int64(0))
        if kind == DENSE_ROWS:
            if n_next > 0:
                at = _clamp(s, n_next)
                t0, n = np.int64(0), np.int64(0)
                if ranked:  # the row's children: states [t0, t0 + n), their own row's
                    t0 = int_at(range_ints, range_meta[step, PTR], range_meta[step, PTR_N], s)
                    n = min(max(int_at(range_ints, range_meta[step, PTR],
                                        range_meta[step, PTR_N], s + 1) - t0, 0), vocab)
                    ranked_run(rk, row, step, t0, n, off, run)
                for v in range(vocab):
                    t = nxt_rows[at, v]
                    if t < 0:
                        continue
                    if mode == SLOT_BITS:
                        if not _slot_bit_of_row(live, width, slot_states, row, s, v):
                            continue
                    elif ranked:  # (a column past the row's states: clamped, as torch reads)
                        j = _clamp(t - t0, vocab)
                        if j >= n or not run[j]:
                            continue
                    elif not _child_in(mode, live, width, row, t):
                        continue
                    allowed[b, v] = True
        elif kind != NO_CHILDREN:
            lo, hi = s, s + 1  # (a unary layer's one entry: its state's)
            if kind != UNARY:
                lo, hi = _bounds(kind, indptr, ex_states, ex_starts, ex_branch, s)
                if hi > lo + k:
                    hi = lo + k
            if ranked and not explicit and hi > lo:  # (entry i enters state i)
                ranked_run(rk, row, step, lo, hi - lo, off, run)
            for i in range(lo, hi):
                tok, t = _entry(tokens, targets, explicit, i)
                if 0 <= tok < vocab:
                    if ranked and explicit:
                        ranked_run(rk, row, step, t, 1, off, one)
                        is_in = one[0]
                    elif ranked:
                        is_in = run[i - lo]
                    else:
                        is_in = _child_in(mode, live, width, row, t)
                    if is_in:
                        allowed[b, tok] = True
        if end >= 0 and _ends_here(accept, accepting, has_ends and not ranked, ends, ends_width,
                                   row, s) and not (ranked and has_ends and
                                                    not ranked_end(rk, row, step, s, own)):
            allowed[b, end] = True


@njit(nogil=True, cache=True)
def advance_rows(kind, explicit, k, count, accept, indptr, ex_states, ex_starts, ex_branch,
                 tokens, targets, nxt_rows, accepting, vocab, end,
                 mode, live, width, slot_states, ends, ends_width, has_ends, subset_rows,
                 step, range_meta, range_ints, range_words, range_within, range_counts,
                 words, within, counts, added_words, added_within, added_counts, first,
                 node, valid, finished, taken, out_node, out_valid, out_finished):
    """Moves each row (node int64, valid, finished bool (B,)) along its
    token taken int64 (B,), writing its new state into out_*: a token the
    row may not take (see `mask_rows`) makes it invalid; the end token
    finishes it (node 0)."""
    rk = (range_meta, range_ints, range_words, range_within, range_counts,
          words, within, counts, added_words, added_within, added_counts, first)
    ranked = mode == RANK_BITS
    one = np.zeros(1, np.bool_)  # (a child's bit)
    n_next = nxt_rows.shape[0]
    for b in range(node.shape[0]):
        s = node[b]
        tok = taken[b]
        at_depth = valid[b] and 0 <= s < count
        expanding = at_depth and not finished[b]
        row = subset_rows[b] if subset_rows.shape[0] > 0 else 0
        own, off = offsets_of(rk, step, s) if ranked and expanding else (np.int64(0), np.int64(0))
        ok = False
        nxt = 0
        if kind == DENSE_ROWS:
            column = _clamp(tok, vocab)
            if n_next > 0:
                nxt = nxt_rows[_clamp(s, n_next), column]
            ok = expanding and 0 <= tok < vocab and nxt >= 0
            if ok and mode == SLOT_BITS:
                ok = _slot_bit_flat(live, width, slot_states, row, s, column)
            elif ok and ranked:
                ranked_run(rk, row, step, nxt, 1, off, one)
                ok = one[0]
            elif ok:
                ok = _child_in(mode, live, width, row, nxt)
        elif kind != NO_CHILDREN and expanding:
            lo, hi = s, s + 1  # (a unary layer's one entry: its state's)
            if kind != UNARY:
                lo, hi = _bounds(kind, indptr, ex_states, ex_starts, ex_branch, s)
                if hi > lo + k:
                    hi = lo + k
            for i in range(lo, hi):  # (a sum over the hits, as the tensor ops take it)
                mine, t = _entry(tokens, targets, explicit, i)
                if mine == tok:
                    if ranked:
                        ranked_run(rk, row, step, t, 1, off, one)
                        is_in = one[0]
                    else:
                        is_in = _child_in(mode, live, width, row, t)
                    if is_in:
                        ok = True
                        nxt += t
        done = False
        if end >= 0 and tok == end:
            done = (at_depth and finished[b]) or (expanding and _ends_here(
                accept, accepting, has_ends and not ranked, ends, ends_width, row, s) and not (
                ranked and has_ends and not ranked_end(rk, row, step, s, own)))
        ok = ok or done
        out_valid[b] = ok
        out_finished[b] = done
        out_node[b] = nxt if ok and not done else 0


# ---------------------------------------------------------------------------
# Calls on numpy rows


def _args(layer: HostLayer, sub: HostSubset, vocab_size: int, end_token: Optional[int]) -> tuple:
    return (*layer, vocab_size, -1 if end_token is None else end_token, *sub)


def mask(layer: HostLayer, sub: HostSubset, vocab_size: int, end_token: Optional[int],
         node: np.ndarray, valid: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """bool (B, V): the tokens each row may take at the step of `layer`
    (node int64, valid, finished bool (B,), C-contiguous)."""
    allowed = np.zeros((node.shape[0], vocab_size), np.bool_)
    mask_rows(*_args(layer, sub, vocab_size, end_token), node, valid, finished, allowed)
    return allowed


def advance(layer: HostLayer, sub: HostSubset, vocab_size: int, end_token: Optional[int],
            node: np.ndarray, valid: np.ndarray, finished: np.ndarray,
            taken: np.ndarray) -> tuple:
    """(node int64, valid, finished bool) (B,): each row moved along its
    token int64 (B,) at the step of `layer`."""
    B = node.shape[0]
    out = (np.empty(B, np.int64), np.empty(B, np.bool_), np.empty(B, np.bool_))
    advance_rows(*_args(layer, sub, vocab_size, end_token), node, valid, finished, taken, *out)
    return out


def warm() -> None:
    """Loads (or compiles, the first time on a machine: seconds; cached on
    disk after) both kernels for the argument types the engines pass (no
    subset, liveness bits, a ranked subset of int32 positions and counts),
    on one row: what a first step would otherwise pay. Nothing without
    numba."""
    if not AVAILABLE:
        return
    layer = HostLayer(CSR, False, 1, 1, ACCEPT_TABLE, indptr=np.zeros(2, np.int32),
                      accepting=np.zeros(1, np.bool_))
    one = np.zeros(1, np.int64)
    flags = np.zeros(1, np.bool_)
    ints = np.zeros((1, 1), np.int32)
    ranked = ranked_subset(host_ranges([None], [None], [1, 1], np.zeros(0, np.int32), 1, 2), 0,
                           True, one, (ints, np.zeros((1, 1), np.int16), ints), None,
                           np.zeros((1, 1), np.bool_))
    for sub in (NO_BITS, host_subset(ints, False, 2, ints, one), ranked):
        mask(layer, sub, 2, 1, one, flags, flags)
        advance(layer, sub, 2, 1, one, flags, flags, one)
