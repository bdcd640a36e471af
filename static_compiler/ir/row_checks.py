"""The invariants of a layer's rows, checked on arrays: the one code behind
every verify path. `ir.verify` runs it on an IR layer's whole arrays,
`artifact.table_check` on a saved layer's tables a chunk of states at a
time (so `static-compiler verify`, the serving loader's `load_checked` and
`load(check_automaton=True)` refuse what the IR verifier refuses, with the
same message), `target.raising` on the tables it reads back.

Each check raises IRVerificationError naming `where` (the layer), the
state and the value that break an invariant; numpy only.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.errors import IRVerificationError


def check_row_span(where: str, first: int, last: int, num_edges: int) -> None:
    """A layer's row pointers start at 0 and end at its `num_edges`
    (`first`, `last`: its indptr[0] and indptr[num_states])."""
    if first != 0 or last != num_edges:
        raise IRVerificationError(f"{where}: indptr must start at 0 and end at "
                                  f"num_edges={num_edges}, got {first} .. {last}")


def check_rows(where: str, rows: np.ndarray, tokens: np.ndarray,
               accepting: Optional[np.ndarray], *, vocab_size: int,
               end_token: Optional[int], first_state: int = 0,
               branch: Optional[np.ndarray] = None) -> None:
    """The rows of states first_state .. first_state + n - 1 of a layer:
    row pointers that never decrease, tokens in [0, vocab_size) that are
    not the end token and rise strictly within each row, no dead state (no
    child and not accepting).

    rows: int (n + 1,), their row pointers (edge offsets in the layer);
    tokens: int (rows[-1] - rows[0],), their edges' tokens; accepting: bool
    (n,), or None where none accepts; branch: int (n,), np.diff(rows) where
    the caller has it. A state is named by its id in the layer."""
    if branch is None:
        branch = np.subtract(rows[1:], rows[:-1], dtype=np.int64)
    if (branch < 0).any():
        s = int(np.flatnonzero(branch < 0)[0])
        raise IRVerificationError(f"{where}, state {first_state + s}: indptr decreases "
                                  f"({int(rows[s])} -> {int(rows[s + 1])})")
    first = int(rows[0]) if rows.shape[0] else 0

    def state_of(e: int) -> int:  # the state whose row holds tokens[e]
        return first_state + row_of(rows, first + e)

    if tokens.shape[0]:
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            wide = tokens.astype(np.int64)
            e = int(np.flatnonzero((wide < 0) | (wide >= vocab_size))[0])
            raise IRVerificationError(f"{where}, state {state_of(e)}: token {int(wide[e])} is "
                                      f"outside [0, {vocab_size})")
        if end_token is not None and (tokens == end_token).any():
            e = int(np.flatnonzero(tokens == end_token)[0])
            raise IRVerificationError(f"{where}, state {state_of(e)}: the end token {end_token} "
                                      "labels an edge")
        # strictly increasing inside each row: compare neighbours that share a row
        same_row = np.ones(tokens.shape[0], dtype=bool)
        same_row[rows[:-1][branch > 0] - first] = False
        not_increasing = same_row[1:] & (tokens[1:] <= tokens[:-1])  # (a comparison: no overflow)
        if not_increasing.any():
            e = int(np.flatnonzero(not_increasing)[0]) + 1
            raise IRVerificationError(f"{where}, state {state_of(e)}: tokens not strictly "
                                      f"increasing ({int(tokens[e - 1])} then {int(tokens[e])})")
    dead = branch == 0 if accepting is None else (branch == 0) & ~accepting
    if dead.any():
        s = first_state + int(np.flatnonzero(dead)[0])
        raise IRVerificationError(f"{where}, state {s}: dead state (no outgoing edge and not "
                                  "accepting)")


def check_accepting_has_end(where: str, num_accepting: int, end_token: Optional[int]) -> None:
    """States of a layer accept (`num_accepting` of them) only where the
    automaton has an end token to end them with."""
    if num_accepting and end_token is None:
        raise IRVerificationError(f"{where}: states accept before the last layer but the "
                                  "automaton has no end_token")


def check_implicit_targets(where: str, depth: int, num_edges: int, next_states: int) -> None:
    """Implicit targets (edge e enters state e) number the next depth's
    `next_states` states: one per edge of the layer."""
    if num_edges != next_states:
        raise IRVerificationError(f"{where}: implicit targets need num_edges={num_edges} states "
                                  f"at depth {depth}, found {next_states}")


def check_numbered_in_order(where: str, targets: np.ndarray, first_edge: int) -> None:
    """Targets int (n,) of edges first_edge .. first_edge + n - 1 of a
    layer with implicit targets (a dense table's entries) are their own
    edge ids: edge e enters state e."""
    elsewhere = np.flatnonzero(targets != np.arange(first_edge, first_edge + targets.shape[0]))
    if elsewhere.size:
        e = int(elsewhere[0])
        raise IRVerificationError(f"{where}: the dense table does not number children in order "
                                  f"(implicit targets): edge {first_edge + e} enters state "
                                  f"{int(targets[e])}")


def check_exceptions(where: str, ids: np.ndarray, starts: np.ndarray, branch: np.ndarray, *,
                     num_states: int, real: int, padding_id: int, previous_id: int = -1,
                     extra: int = 0) -> int:
    """A near_unary layer's exception entries (all, or a chunk of them):
    ids int64 (n,), the states they describe; starts and branch int64
    (n,), those states' row starts and children. The first `real` are the
    layer's: ids rising strictly within [0, num_states), above
    `previous_id` (the last id of the chunk before), row starts those their
    ids imply (rows lie in state order, one child per state between
    exceptions, so an exception's row starts at its id plus the extra
    children, branch - 1, of the exceptions before it: `extra` those of the
    chunks before). The rest are padding (id `padding_id`, no children).
    Returns `extra` plus this chunk's."""
    mine = ids[:real]
    if mine.shape[0] and (int(mine[0]) <= previous_id or int(mine.min()) < 0
                          or int(mine.max()) >= num_states or (np.diff(mine) <= 0).any()):
        raise IRVerificationError(f"{where}: exception ids (ex_states) must rise strictly "
                                  f"within [0, {num_states})")
    if (ids[real:] != padding_id).any() or branch[real:].any():
        raise IRVerificationError(f"{where}: exception entries past its {num_states} states are "
                                  f"not padding (id {padding_id}, no children)")
    more = np.cumsum(branch[:real] - 1)
    implied = mine + extra + np.concatenate([[0], more[:-1]])
    if not np.array_equal(implied, starts[:real]):
        raise IRVerificationError(f"{where}: its exceptions' row starts disagree with the starts "
                                  "implied by ex_states and ex_branch")
    return extra + (int(more[-1]) if real else 0)


def check_padding(where: str, num_states: int, num_edges: int,
                  row_ends: Optional[np.ndarray], accepting: Optional[np.ndarray]) -> None:
    """States past a layer's `num_states` (padding to a reserved capacity)
    hold no edge and accept nothing: row_ends int (m,), their rows' ends
    (all num_edges; None where the layout has no rows to pad); accepting
    bool (m,) or None."""
    if row_ends is not None and (row_ends != num_edges).any():
        raise IRVerificationError(f"{where}: states past its {num_states} (padding to the "
                                  "reserved capacity) have edges")
    if accepting is not None and accepting.any():
        raise IRVerificationError(f"{where}: states past its {num_states} (padding to the "
                                  "reserved capacity) accept")


def row_of(indptr: np.ndarray, edge: int) -> int:
    """The state whose row (of row pointers `indptr`) holds `edge`."""
    return int(np.searchsorted(indptr, edge, side="right")) - 1
