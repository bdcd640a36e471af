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
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from static_compiler.backend.lowering import StepPlan
from static_compiler.ir import LayoutKind


class Candidates(NamedTuple):
    tokens: jnp.ndarray
    next: jnp.ndarray
    valid: jnp.ndarray


def _take(table, idx):
    return jnp.take(table, idx, axis=0, mode="clip").astype(jnp.int32)


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
    indptr = tables["indptr"]
    return _take(indptr, node), _take(indptr, node + 1)


COMPARE_ALL_MAX = 4096
"""near_unary layers with at most this many exception states find a state's
row by comparing against all of them (X compares per beam, no loop)."""


def _near_unary_bounds(tables: dict, node):
    ex_states = tables["ex_states"].astype(jnp.int32)
    ex_bounds = tables["ex_bounds"].astype(jnp.int32)
    num_ex = ex_states.shape[0]
    # j = number of exception states below `node`: a binary search (a loop of
    # log2(X) steps) on long lists; on short ones one comparison against all,
    # which XLA compiles several times faster than the loop.
    method = "compare_all" if num_ex <= COMPARE_ALL_MAX else "scan"
    j = jnp.searchsorted(ex_states, node, side="left", method=method).astype(jnp.int32)
    here = jnp.minimum(j, num_ex - 1)
    is_exception = (j < num_ex) & (jnp.take(ex_states, here, mode="clip") == node)
    below = jnp.maximum(j - 1, 0)
    # Between exceptions every state has one child, so rows advance in lockstep
    # with state ids: start = node + (end of the previous exception's row - its id - 1).
    shift = jnp.where(j > 0, jnp.take(ex_bounds[:, 1], below, mode="clip")
                      - jnp.take(ex_states, below, mode="clip") - 1, 0)
    start = jnp.where(is_exception, jnp.take(ex_bounds[:, 0], here, mode="clip"), node + shift)
    end = jnp.where(is_exception, jnp.take(ex_bounds[:, 1], here, mode="clip"), start + 1)
    return start, end


_ROW_BOUNDS = {LayoutKind.CSR: _csr_bounds, LayoutKind.NEAR_UNARY: _near_unary_bounds}


def row_bounds(step: StepPlan, tables: dict, node):
    """[start, end) int32 (...,) of the rows of states `node` (csr and
    near_unary layouts, the ones that slice rows)."""
    return _ROW_BOUNDS[step.kind](tables, jnp.asarray(node, dtype=jnp.int32))


def _sliced(step: StepPlan, tables: dict, node) -> Candidates:
    start, end = row_bounds(step, tables, node)
    return slice_rows(step, tables, start, end, step.k)


def _dense_rows(step: StepPlan, tables: dict, node) -> Candidates:
    nxt = _take(tables["next"], node)
    tokens = jnp.broadcast_to(lax.iota(jnp.int32, nxt.shape[-1]), nxt.shape)
    return Candidates(tokens, nxt, nxt >= 0)


def _unary(step: StepPlan, tables: dict, node) -> Candidates:
    tokens = _take(tables["tokens"], node)[..., None]
    nxt = _take(tables["targets"], node) if step.explicit_targets else node
    return Candidates(tokens, nxt[..., None], jnp.ones(tokens.shape, dtype=bool))


_KERNELS = {LayoutKind.DENSE_ROWS: _dense_rows, LayoutKind.CSR: _sliced, LayoutKind.UNARY: _unary, LayoutKind.NEAR_UNARY: _sliced}


def num_candidates(step: StepPlan, vocab_size: int) -> int:
    """K, the static candidate count of `step`."""
    return {LayoutKind.DENSE_ROWS: vocab_size, LayoutKind.UNARY: 1}.get(step.kind, step.k)


def expand(step: StepPlan, tables: dict, node) -> Candidates:
    """Candidate transitions of the states `node` int32 (...,); see module doc."""
    node = jnp.asarray(node, dtype=jnp.int32)
    return _KERNELS[step.kind](step, tables, node)


def accepts(step: StepPlan, tables: dict, node):
    """bool (...,): whether each state `node` may end its sequence here."""
    if not step.has_accepting:
        return jnp.zeros(jnp.shape(node), dtype=bool)
    return jnp.take(tables["accepting"], node, mode="clip")
