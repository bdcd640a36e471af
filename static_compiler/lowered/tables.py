"""The lowered tables' format, and the readers of a layer's rows from them.

Tables per layer (names are the keys of the layer's dict; `target.lowering`
writes them, `target.raising` reads them back as IR):

==========  ===================================================================
dense_rows  ``next``    (S, V) state_dtype: next state, -1 where no edge
csr         ``indptr``  (S + 1,) state_dtype; ``tokens`` (E,) token_dtype;
            ``targets`` (E,) state_dtype when targets are explicit
unary       ``tokens``  (S,) token_dtype; ``targets`` (S,) when explicit
near_unary  ``tokens``  (E,); ``ex_states`` (X,) state_dtype, sorted ids of
            the states whose branch is not 1; ``ex_starts`` (X,) state_dtype
            their row starts; ``ex_branch`` (X,) their branches, in
            `dtypes.branch_dtype_for` the layer's max branch (an artifact
            before format version 6 holds ``ex_bounds`` (X, 2), which its
            readers turn into these: `format.normalize.current_tables`);
            ``targets`` (E,) when explicit
any         ``accepting`` (S,) bool when some state at this depth accepts
==========  ===================================================================

A layout with reserved capacity (`ir.Layout.states_capacity`) pads S and E
to it: the extra states have no edges (csr rows that end where they start,
-1 rows, token 0 for unary) and accept nothing, the extra edges belong to
no row, so no state reaches them.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.support.arrays import search_sorted


def row_pointers(kind: str, tables: dict, num_states: int) -> np.ndarray:
    """int64 (num_states + 1,): the row pointers of the first num_states
    states (all of them, or a prefix: what the IR text prints of a large
    layer) of a lowered layer of `kind` (a `LayoutKind` value), from its
    tables (see the module doc), reading only those rows' entries: the
    inverse of lowering for the rows, numpy only (the serving loader has no
    IR)."""
    if kind == "dense_rows":
        present = np.asarray(tables["next"][:num_states]) >= 0
        return np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int64)
    if kind == "csr":
        return np.asarray(tables["indptr"][:num_states + 1]).astype(np.int64)
    if kind == "unary":
        return np.arange(num_states + 1, dtype=np.int64)
    if kind == "near_unary":
        count = search_sorted(tables["ex_states"], num_states)  # those below num_states
        branch = np.ones(num_states, dtype=np.int64)
        branch[np.asarray(tables["ex_states"][:count]).astype(np.int64)] = \
            exception_rows(tables, count)[1]
        return np.concatenate([[0], np.cumsum(branch)])
    raise ValueError(f"layout kind {kind!r}")


EXCEPTION_TABLES = ("ex_starts", "ex_branch")
"""A near_unary layer's tables of its exceptions' rows besides ex_states."""


def exception_rows(tables: dict, count: Optional[int] = None, starts_only: bool = False):
    """(row starts, branches) int64 of a near_unary layer's first `count`
    (default all) exception states, from its ex_starts / ex_branch tables
    (numpy; `kernels.exception_rows` is the decoder's); the row starts alone
    (in the table's int dtype, unread branches) with `starts_only`."""
    end = None if count is None else int(count)
    if starts_only:  # (a mapped table's slice stays mapped)
        return tables["ex_starts"][:end]
    return (np.asarray(tables["ex_starts"][:end]).astype(np.int64),
            np.asarray(tables["ex_branch"][:end]).astype(np.int64))
