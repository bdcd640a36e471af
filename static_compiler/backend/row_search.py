"""How a near_unary step finds a state's row: the number of exception
states (int32 ids, ascending) below each state id, by the search that
compiles and runs best for the table's length and the caller's rows.

Used by `backend.kernels` (its near_unary kernel) and set per program by
the processor's per-step programs (`decode.processor.StepProcessor`).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax.numpy as jnp
import numpy as np
from jax import lax

BINARY_ROW_SEARCH = contextvars.ContextVar("BINARY_ROW_SEARCH", default=False)
"""Read while tracing: True makes near_unary layers of more than
`BINARY_SEARCH_MIN` exception states find a state's row by an unrolled
binary search (log2(X) gathers per row, fused) instead of comparing against all X: the processor's
per-step programs (`decode.processor.StepProcessor`) set it, since at a few
rows the X compares cost more than the search (XLA on CPU splits a loop of
1024+ elements across threads)."""

BINARY_SEARCH_MIN = 64

COMPARE_ALL_MAX = 4096
"""near_unary layers with at most this many exception states find a state's
row by comparing against all of them (X compares per beam, no loop)."""


@contextlib.contextmanager
def few_rows():
    """Traces the code inside for a few rows (`BINARY_ROW_SEARCH` set)."""
    token = BINARY_ROW_SEARCH.set(True)
    try:
        yield
    finally:
        BINARY_ROW_SEARCH.reset(token)


def exceptions_below(raw_states, node):
    """(j int32 node.shape, states): j = how many of the exception states
    `raw_states` (ascending, any int dtype, X >= 1) are below each `node`,
    and the states as the caller should read them (widened to int32 unless
    the unrolled search read only its probes). A binary search (a loop of
    log2(X) steps) on long lists; on short ones one comparison against all,
    which XLA compiles several times faster than the loop; with
    `BINARY_ROW_SEARCH` set, an unrolled search for few rows."""
    num_ex = raw_states.shape[0]
    if BINARY_ROW_SEARCH.get() and num_ex > BINARY_SEARCH_MIN:
        # (no op over the whole table: the probes are read and widened one by one)
        j = lower_bound(raw_states, node, unrolled=True)
        ex_states = raw_states
    else:
        ex_states = raw_states.astype(jnp.int32)
        if num_ex <= COMPARE_ALL_MAX:
            j = jnp.searchsorted(ex_states, node, side="left",
                                 method="compare_all").astype(jnp.int32)
        else:
            j = lower_bound(ex_states, node)
    return j, ex_states


def lower_bound(sorted_values, query, unrolled: bool = False):
    """int32 query.shape: how many of `sorted_values` (int32 (N,), N >= 1,
    ascending) are below each query, i.e. ``jnp.searchsorted(sorted_values,
    query, side="left")``, by a branchless binary search: the count is built
    bit by bit, highest first, adding 2^k wherever the entry 2^k past it is
    still below the query. The loop carries that one array (jnp's binary
    search carries two and compiles into seven kernels; this one into four,
    with no final correction step). `unrolled`: the log2(N) steps as
    straight-line code (XLA fuses them into one kernel: for few queries)."""
    n = sorted_values.shape[0]
    bits = np.asarray([1 << k for k in reversed(range(n.bit_length()))], np.int32)
    query = jnp.asarray(query, jnp.int32)

    def step(i, count):
        bit = jnp.asarray(bits)[i]
        probe = jnp.take(sorted_values, count + bit - 1, mode="clip")
        return jnp.where((count + bit <= n) & (probe < query), count + bit, count)

    count = jnp.zeros(query.shape, jnp.int32)
    if unrolled:
        for bit in bits.tolist():
            probe = jnp.take(sorted_values, count + (bit - 1), mode="clip").astype(jnp.int32)
            count = jnp.where((count + bit <= n) & (probe < query), count + bit, count)
        return count
    return lax.fori_loop(0, len(bits), step, count)
