"""The layout cost model: bytes of the tables a layout needs and candidates
read per beam, shared by the passes (choose-layout, split-heavy,
pad-branches, pack-dtypes) and by state merging (`merge_states`, which the
graph frontend also runs), so it sits just above the IR, below both.

The byte formulas mirror exactly what `static_compiler.target.lowering.lower` builds
(a test checks estimate == measured for every layout):

==========  ==============================================================
dense_rows  next-state table (S, V) of state_dtype (-1 marks no edge)
csr         indptr (S + 1,) state_dtype, tokens (E,) token_dtype,
            targets (E,) state_dtype when targets are explicit
unary       tokens (S,) token_dtype, targets (S,) when explicit
near_unary  tokens (E,), exception states (X,) and their row starts (X,)
            of state_dtype, their branches (X,) of `branch_dtype_for` the
            max branch, targets (E,) when explicit
==========  ==============================================================

A layer where some states accept (variable-length sets) adds a bool
(S,) table. Slices past the end of a table are clamped by the gather and
masked, so no table is padded, except to a layout's reserved capacity
(S and E are then the capacity's, see `Layout.padded_counts`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_compiler.ir import Automaton, Layer, Layout, LayoutKind
from static_compiler.support.dtypes import branch_dtype_for, state_dtype_for, token_dtype_for

# The functions below read a layer's counts, branch histogram
# (`branch_counts`), accepting table and targets only, so they take an
# `ir.Layer` or its `ir.LayerSummary` alike.


def layout_bytes(layer: Layer, layout: Layout, vocab_size: int) -> int:
    """Bytes of the tables `layout` needs for `layer` (S states, E edges)."""
    S, E = layout.padded_counts(layer.num_states, layer.num_edges)
    tb = np.dtype(layout.token_dtype).itemsize
    sb = np.dtype(layout.state_dtype).itemsize
    explicit = 0 if layer.implicit_targets else 1
    accepting = S if layer.has_accepting else 0
    if layout.kind == LayoutKind.DENSE_ROWS:
        return accepting + S * vocab_size * sb
    if layout.kind == LayoutKind.CSR:
        return accepting + (S + 1) * sb + E * tb + explicit * E * sb
    if layout.kind == LayoutKind.UNARY:
        return accepting + S * tb + explicit * S * sb
    if layout.kind == LayoutKind.NEAR_UNARY:
        bb = branch_dtype_for(layer.max_branch).itemsize
        return accepting + E * tb + layout.exceptions * (2 * sb + bb) + explicit * E * sb
    raise ValueError(f"unknown layout kind {layout.kind!r}")


DEFAULT_PAD_MULTIPLE = 8
"""pad-branches' default multiple (8 sublanes); split-heavy plans for it when
no pad-branches follows it."""


def padded_width(k: int, multiple: int, vocab_size: int) -> int:
    """What pad-branches makes of a slice width k: rounded up to a multiple
    of `multiple`, but never past the vocabulary size (beyond which a slice
    reads more than a dense row) and never below k."""
    return max(k, min(-(-k // multiple) * multiple, vocab_size))


def mixed_light_k(layer: Layer, k: int, vocab_size: int, beams: int, wide_slots: int,
                  max_read_ratio: float, multiple: int = DEFAULT_PAD_MULTIPLE) -> int:
    """The mixed layout's light_k for a sliced layer, or 0 when mixing does
    not pay.

    k: the layer's slice width before padding (its branch counts are only
    read when k > multiple). pad-branches will round k up to
    `padded_width(k, multiple, vocab_size)` = K and leave a light_k that is
    already a multiple of `multiple` as it is, so the reads are planned for
    the widths the backend will use.
    With light_k = l, a batch row of `beams` beams reads beams * l entries
    plus (K - l) for each of up to `wide_slots` heavy beams, against beams *
    K unmixed. Beams are assumed to sit on states uniformly at random, so a
    row expects beams * P(branch > l) heavy beams; l is the smallest multiple
    of `multiple` below k for which that is at most wide_slots / 2 (the
    exact fallback, K reads for every beam, then runs rarely), and it is used
    when the row reads at most `max_read_ratio` of the unmixed reads."""
    if k <= multiple:
        return 0
    counts = layer.branch_counts()
    states = int(counts.sum())
    if states == 0:
        return 0
    padded_k = padded_width(k, multiple, vocab_size)
    # heavier[l] = states with more than l children, for l in [0, k]: from the histogram.
    capped = np.zeros(k + 1, dtype=np.int64)
    capped[:min(k, counts.size)] = counts[:k]
    capped[k] += counts[k:].sum()
    heavier = states - np.cumsum(capped)
    for light in range(multiple, k, multiple):
        if beams * heavier[light] / states <= wide_slots / 2:
            reads = beams * light + wide_slots * (padded_k - light)
            return light if reads <= max_read_ratio * beams * padded_k else 0
    return 0


def with_estimate(layer: Layer, layout: Layout, vocab_size: int) -> Layout:
    return dataclasses.replace(layout, estimated_bytes=layout_bytes(layer, layout, vocab_size))


def packed(layer: Layer, layout: Layout, vocab_size: int, num_next_states: int) -> Layout:
    """`layout` with the narrowest dtypes for `layer` and its byte estimate:
    tokens in `dtypes.token_dtype_for(V)`; state ids / row pointers in
    `dtypes.state_dtype_for` of the largest of edges, states and next states."""
    largest = max(*layout.padded_counts(layer.num_states, layer.num_edges), num_next_states)
    lay = dataclasses.replace(layout, token_dtype=token_dtype_for(vocab_size).name,
                              state_dtype=state_dtype_for(largest).name)
    return with_estimate(layer, lay, vocab_size)


def applicable_layouts(layer: Layer, vocab_size: int, num_next_states: int
                       ) -> dict[LayoutKind, Layout]:
    """Every layout kind that can serve `layer` exactly, by kind, at packed dtypes."""
    counts = layer.branch_counts()
    max_branch = max(1, layer.max_branch)
    exceptions = layer.num_states - (int(counts[1]) if counts.size > 1 else 0)
    options = {LayoutKind.DENSE_ROWS: Layout(LayoutKind.DENSE_ROWS, vocab_size),
               LayoutKind.CSR: Layout(LayoutKind.CSR, max_branch)}
    if exceptions == 0:
        options[LayoutKind.UNARY] = Layout(LayoutKind.UNARY, 1)
    else:
        options[LayoutKind.NEAR_UNARY] = Layout(LayoutKind.NEAR_UNARY, max_branch,
                                                exceptions=exceptions)
    return {kind: packed(layer, lay, vocab_size, num_next_states) for kind, lay in options.items()}


DEFAULT_DENSE_THRESHOLD = 0.5
"""choose-layout's default fraction of V at which a layer's max branch makes
dense_rows worth considering."""

DEFAULT_DENSE_MAX_OVERHEAD = 8.0
"""choose-layout's default cap on dense_rows bytes relative to csr's."""


def candidate_layouts(layer: Layer, vocab_size: int, num_next_states: int,
                      dense_threshold: float = DEFAULT_DENSE_THRESHOLD,
                      dense_max_overhead: float = DEFAULT_DENSE_MAX_OVERHEAD) -> list[Layout]:
    """Layouts worth considering for `layer`, fastest first, each with its
    dtypes packed and its exact byte estimate.

    dense_rows reads V entries per beam against csr's k (plus the gather of
    k log-probabilities), so it is worth it once k >= dense_threshold * V;
    but it stores V entries for every state, so it is considered only while
    it costs at most `dense_max_overhead` times csr's bytes: a 1 MB set
    whose one wide state has k close to V never becomes a 700 MB table."""
    options = applicable_layouts(layer, vocab_size, num_next_states)
    if LayoutKind.UNARY in options:
        return [options[LayoutKind.UNARY]]
    csr, near, dense = (options[LayoutKind.CSR], options[LayoutKind.NEAR_UNARY],
                        options[LayoutKind.DENSE_ROWS])
    ordered = []
    if csr.k >= dense_threshold * vocab_size \
            and dense.estimated_bytes <= dense_max_overhead * csr.estimated_bytes:
        ordered.append(dense)
    ordered += [near, csr] if near.estimated_bytes < csr.estimated_bytes else [csr]
    return ordered



def tables_lower_bound(layers, vocab_size: int) -> int:
    """A lower bound of the bytes choose-layout's smallest layouts need for
    layers 1.. of a trie that holds `layers` (`ir.LayerSummary`s; layer 0,
    the root, left out) as part of its own: the bounds of the partitions
    of a partitioned build add up to one of the merged trie's
    (`partitioned.partitions_built` checks the memory budget with them,
    partition by partition, before the rest are built).

    Per layer: the smallest of `applicable_layouts` at the part's own
    counts (its dtypes, its exceptions, targets taken implicit), less one
    state id. Each layout's bytes add up over the parts at the merged
    layer's dtypes, which are at least as wide, except csr's one extra
    row pointer (hence the state id less); a part with one child per state
    gets unary, which costs no more than its share of the others; and the
    smallest of sums is at least the sum of the smallests."""
    total = 0
    for layer in layers[1:]:
        options = applicable_layouts(layer.replace(implicit_targets=True), vocab_size, 0)
        smallest = min(o.estimated_bytes for o in options.values())
        state_bytes = max(np.dtype(o.state_dtype).itemsize for o in options.values())
        total += max(0, smallest - state_bytes)
    return total


def estimated_bytes(ir: Automaton, dense_threshold: float = DEFAULT_DENSE_THRESHOLD) -> int:
    """Cost-model bytes of `ir`: every layer at its smallest candidate layout
    (packed dtypes). Merging states shrinks every layout's state tables, so
    minimizing pays when even the most compact layouts get smaller."""
    return sum(min(lay.estimated_bytes
                   for lay in candidate_layouts(layer, ir.vocab_size, ir.num_states_at(t + 1),
                                                dense_threshold))
               for t, layer in enumerate(ir.layers))
