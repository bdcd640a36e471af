"""Per-layer reports of a compiled constraint set (used by `static-compiler
show-ir --stats`, `--layer N` and the main job).

`layer_rows` gives one dict per layer; `summary` the totals and the paper's
memory bound; `stats_table` renders both as a fixed-width text table (or a
Markdown table for the README); `layer_text` prints one layer's rows in the
IR text form.

The reference point is the STATIC paper's bound (Su et al. 2026, sec. on
memory):

    U_max = (1/8 + K2) |V|^d + K1 * sum_{l = d+1 .. L} min(|V|^l, |C|)

with K1 = 12 bytes per CSR node, K2 = 4 bytes per dense state, d the number
of leading `dense_rows` layers, L the depth and |C| the number of sequences.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from static_compiler.errors import ReportInputError
from static_compiler.ir import Automaton, LayoutKind, layer_stats

if TYPE_CHECKING:  # the report layer sits beside the compiler; imported lazily at run time
    from static_compiler.compiled import CompiledConstraints

PAPER_K1 = 12
"""Bytes per CSR node in the paper's bound."""

PAPER_K2 = 4
"""Bytes per dense state in the paper's bound."""


def branch_histogram(branch: np.ndarray) -> list[tuple[int, int, int]]:
    """Counts of states by branch factor in buckets 0, 1, 2, 3-4, 5-8, 9-16, ...

    Args:
      branch: int array (num_states,), the number of children of each state.
    Returns:
      [(lo, hi, count), ...] for the non-empty buckets, lo <= branch <= hi,
      in increasing order of lo.
    """
    branch = np.asarray(branch, dtype=np.int64)
    return _bucketed(np.unique(branch, return_counts=True))


def counts_histogram(counts: np.ndarray) -> list[tuple[int, int, int]]:
    """`branch_histogram` of the states that counts int (B,) describes
    (counts[b]: states with b children, as `Layer.branch_counts` and
    `LayerSummary` hold them)."""
    counts = np.asarray(counts, dtype=np.int64)
    return _bucketed((np.arange(counts.size), counts))


def _bucketed(values_counts) -> list[tuple[int, int, int]]:
    """(branch values, states with each) summed into the buckets of
    `branch_histogram`: 0 holds branch 0, 1 branch 1, j >= 2 holds
    2^(j-2)+1 .. 2^(j-1)."""
    values, counts = (np.asarray(a, dtype=np.int64) for a in values_counts)
    bucket = np.zeros(values.shape, dtype=np.int64)
    positive = values > 0
    bucket[positive] = np.ceil(np.log2(values[positive])).astype(np.int64) + 1
    out = []
    for j, count in enumerate(np.bincount(bucket, weights=counts, minlength=1).astype(np.int64)):
        if count:
            lo, hi = (j, j) if j < 2 else ((1 << (j - 2)) + 1, 1 << (j - 1))
            out.append((lo, hi, int(count)))
    return out


def format_histogram(histogram: list) -> str:
    """`branch_histogram` output as text, e.g. ``0:3 1:10 2:4 3-4:1``."""
    return " ".join(f"{lo}:{n}" if lo == hi else f"{lo}-{hi}:{n}" for lo, hi, n in histogram)


def paper_memory_bound(vocab_size: int, depth: int, num_sequences: int, dense_layers: int,
                       k1: int = PAPER_K1, k2: int = PAPER_K2) -> int:
    """The paper's U_max in bytes (rounded up; see the module docstring).

    Exact integer arithmetic: |V|^l is never formed as a float, so V = 2^16,
    L = 8 does not overflow."""
    for name, value, low in (("vocab_size", vocab_size, 1), ("depth", depth, 1),
                             ("num_sequences", num_sequences, 1), ("dense_layers", dense_layers, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ReportInputError(f"paper_memory_bound: {name}={value!r}, expected an int >= {low}")
    if dense_layers > depth:
        raise ReportInputError(f"paper_memory_bound: dense_layers={dense_layers} exceeds "
                               f"depth={depth}")
    V, C = int(vocab_size), int(num_sequences)
    dense_states = V ** int(dense_layers)
    dense = -(-dense_states * (1 + 8 * k2) // 8)  # ceil((1/8 + K2) * V^d)
    sparse = k1 * sum(min(V ** l, C) for l in range(int(dense_layers) + 1, int(depth) + 1))
    return dense + sparse


def _compiled_stats(obj, devices: Optional[int] = None) -> Optional[list]:
    """`CompiledConstraints.layer_stats(devices)` of `obj`; an Automaton
    whose layers all have layouts is lowered first (to measure its tables);
    None when some layer has no layout."""
    from static_compiler.compiled import CompiledConstraints, Lowered
    from static_compiler.target.lowering import lower

    if isinstance(obj, CompiledConstraints):
        return obj.layer_stats(devices)
    if any(layer.layout is None for layer in obj.layers):
        return None
    plan, tables = lower(obj)
    return CompiledConstraints(Lowered(plan, tables), _held_ir=obj).layer_stats(devices)


def layer_rows(obj: Union[Automaton, "CompiledConstraints"],
               devices: Optional[int] = None) -> list[dict]:
    """One dict per layer.

    Keys: layer, states, edges, max_branch, mean_branch, accepting, targets,
    histogram ([(lo, hi, count)], see `branch_histogram`), layout (a
    `LayoutKind`, or "none"), k, mixed (`Layout.mixed_text`), token_dtype,
    state_dtype, estimated_bytes (cost model), bytes (measured tables) and
    bytes_per_device (split across `devices` devices, see
    `CompiledConstraints.layer_stats`). For a layer without a layout (an IR
    before choose-layout) layout is "none" and the seven after it are None."""
    ir = _automaton_of(obj)
    compiled_stats = _compiled_stats(obj, devices)
    rows = []
    for t, layer in enumerate(ir.layers):
        if compiled_stats is not None:
            row = dict(compiled_stats[t])
        else:
            row = layer_stats(layer)
            lay = layer.layout
            row.update(layout=lay.kind if lay else "none", k=lay.k if lay else None,
                       mixed=lay.mixed_text if lay else None,
                       token_dtype=lay.token_dtype if lay else None,
                       state_dtype=lay.state_dtype if lay else None,
                       estimated_bytes=lay.estimated_bytes if lay else None, bytes=None,
                       bytes_per_device=None)
        row["layer"] = t
        row["histogram"] = counts_histogram(layer.branch_counts())
        rows.append(row)
    return rows


def summary(obj, rows: Optional[list] = None) -> dict[str, object]:
    """Totals over the layers and the paper's bound.

    Keys: vocab_size, depth, sequences, states (all depths, final states
    included), edges, estimated_bytes and
    bytes (None when some layer has no layout), bytes_per_sequence,
    dense_layers (d: leading dense_rows layers), paper_bound_bytes (U_max)
    and bytes_over_bound (measured / U_max)."""
    ir = _automaton_of(obj)
    rows = layer_rows(obj) if rows is None else rows
    laid_out = all(r["bytes"] is not None for r in rows)
    d = 0
    while d < len(rows) and rows[d]["layout"] == LayoutKind.DENSE_ROWS:
        d += 1
    measured = sum(r["bytes"] for r in rows) if laid_out else None
    bound = paper_memory_bound(ir.vocab_size, ir.depth, ir.num_sequences, d)
    return {
        "vocab_size": ir.vocab_size, "depth": ir.depth, "sequences": ir.num_sequences,
        "states": ir.num_states, "edges": ir.num_edges,
        "estimated_bytes": sum(r["estimated_bytes"] for r in rows) if laid_out else None,
        "bytes": measured,
        "bytes_per_sequence": measured / ir.num_sequences if measured is not None else None,
        "dense_layers": d, "paper_bound_bytes": bound,
        "bytes_over_bound": measured / bound if measured is not None else None,
    }


def _automaton_of(obj) -> Automaton:
    from static_compiler.compiled import CompiledConstraints

    if isinstance(obj, CompiledConstraints):
        return obj.outline  # (a set lowered from pieces: its summary, the IR left unread)
    if isinstance(obj, Automaton):
        return obj
    raise ReportInputError(f"report of a {type(obj).__name__}: expected CompiledConstraints "
                           "or an ir.Automaton")


_COLUMNS = (("layer", "layer"), ("states", "states"), ("edges", "edges"),
            ("max_branch", "max_br"), ("mean_branch", "mean_br"), ("layout", "layout"),
            ("k", "k"), ("mixed", "mixed"), ("token_dtype", "tokens"), ("state_dtype", "states_dt"),
            ("estimated_bytes", "est_bytes"), ("bytes", "bytes"), ("histogram", "branch histogram"))


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "mean_branch":
        return f"{value:.3f}"
    if key == "histogram":
        return format_histogram(value)
    return str(value)


def stats_table(obj, markdown: bool = False, devices: Optional[int] = None) -> str:
    """The per-layer table, a totals row and the memory reference lines.

    Args:
      obj: CompiledConstraints, or an Automaton (with or without layouts).
      markdown: render a Markdown table (for README figures) instead of
        fixed-width columns.
      devices: also show each device's bytes with the tables split across
        this many devices (`CompiledConstraints.shard`); default: the set's
        own placement, if it has one.
    """
    ir = _automaton_of(obj)
    rows = layer_rows(obj, devices)
    tot = summary(obj, rows)
    columns: tuple[tuple[str, str], ...] = _COLUMNS
    lowered = getattr(obj, "lowered", None)  # (an Automaton has none)
    split = devices is not None and devices > 1 or \
        lowered is not None and lowered.placement is not None
    if split and tot["bytes"] is not None:
        at = [key for key, _ in columns].index("bytes") + 1
        columns = columns[:at] + (("bytes_per_device", "bytes/dev"),) + columns[at:]
    body = [[_cell(key, r[key]) for key, _ in columns] for r in rows]
    per_device = sum(r["bytes_per_device"] for r in rows) if tot["bytes"] is not None else None
    totals = {"layer": "total", "states": sum(r["states"] for r in rows), "edges": tot["edges"],
              "estimated_bytes": tot["estimated_bytes"], "bytes": tot["bytes"],
              "bytes_per_device": per_device}
    body.append([_cell(key, totals.get(key)) if key in totals else "" for key, _ in columns])
    header = [title for _, title in columns]
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i == len(header) - 1 else "--:"
                                for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
    else:
        widths = [max(len(header[i]), *(len(row[i]) for row in body)) for i in range(len(header))]
        def fmt(row):
            cells = [c.rjust(w) for c, w in zip(row[:-1], widths[:-1])] + [row[-1]]
            return "  ".join(cells).rstrip()
        lines = [fmt(header)] + [fmt(row) for row in body]
    lines.append("")
    lines.append(f"automaton: vocab={ir.vocab_size} depth={ir.depth} sequences={ir.num_sequences} "
                 f"final_states={ir.num_final_states}"
                 + (f" end_token={ir.end_token}" if ir.end_token is not None else ""))
    if tot["bytes"] is not None:
        lines.append(f"bytes: measured {tot['bytes']} (estimated {tot['estimated_bytes']}), "
                     f"{tot['bytes_per_sequence']:.2f} bytes per sequence")
        if split and per_device is not None:
            lines.append(f"bytes per device: {per_device} ({per_device / tot['bytes']:.3f}x of "
                         "one device's; split tables / D + replicated ones)")
    else:
        lines.append("bytes: - (some layer has no layout; run a pipeline with choose-layout)")
    subsets = _subset_line(obj)
    if subsets:
        lines.append(subsets)
    lines += attribute_lines(getattr(obj, "attributes", None))
    ratio = "" if tot["bytes_over_bound"] is None else \
        f"; measured / U_max = {tot['bytes_over_bound']:.3f}"
    lines.append(f"paper bound U_max = (1/8 + {PAPER_K2})|V|^d + {PAPER_K1} * "
                 f"sum_(l>d) min(|V|^l, |C|) with d={tot['dense_layers']}: "
                 f"{tot['paper_bound_bytes']} bytes{ratio}")
    return "\n".join(lines) + "\n"


def attribute_lines(attributes) -> list[str]:
    """One line per item attribute column (name, kind, dtype, categories,
    bytes) of an `ItemAttributes`; [] for None."""
    if attributes is None:
        return []
    return [f"attribute {row['name']}: {row['kind']} {row['dtype']}"
            + ("" if row["categories"] is None else f", {row['categories']} categories")
            + f", {row['nbytes']} bytes" for row in attributes.describe()]


def _subset_line(obj) -> str:
    """For a compiled set whose items can form subsets: the bits one subset
    takes and how they are laid out (`liveness`); else ""."""
    if getattr(obj, "items", None) is None or getattr(obj, "plan", None) is None or \
            not all(layer.implicit_targets for layer in obj.outline.layers):
        return ""
    from static_compiler.item_bits.layers import plan_bit_widths, shared_depths
    from static_compiler.lowered import plan as plan_lib

    slots = plan_lib.slot_steps(obj.plan)
    shared = sorted(shared_depths(obj.outline.layers, slots,
                                  plan_lib.state_counts(obj.plan)))
    live, ends = plan_bit_widths(obj.plan)
    words = sum(w for d, w in enumerate(live, 1) if d not in shared) + sum(w or 0 for w in ends)
    bits = 32 * words / obj.outline.num_states
    return (f"item subsets: {4 * words} bytes per subset ({bits:.3f} "
            f"bits per state); slot bits for the children of steps {list(slots)}; depths "
            f"{shared} hold the next depth's bits")


def layer_text(obj, layer: int, max_edges: Optional[int] = None) -> str:
    """Layer `layer`'s header and rows, exactly as in the IR text form
    (`ir.print_ir`); rows are elided when the layer has more than `max_edges`
    edges (default: the printer's limit). Targets name states at depth
    `layer` + 1. obj: an ir.Automaton, or CompiledConstraints (a set whose
    IR lives in its tables prints the rows from its tables, unread).

    Raises ReportInputError when `layer` is not in [0, depth)."""
    from static_compiler.ir import _ELIDE_EDGES, print_ir

    ir = _automaton_of(obj) if not isinstance(obj, Automaton) else obj
    rows_of = getattr(obj, "_rows_of", lambda: None)()
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
            or not 0 <= layer < ir.depth:
        raise ReportInputError(f"layer {layer!r}: expected an int in [0, {ir.depth}) "
                               f"(the automaton has depth {ir.depth})")
    # Print a one-layer automaton with the printer itself, then give the
    # header its real index: one formatter for both views.
    single = dataclasses.replace(ir, layers=(ir.layers[layer],))
    text = print_ir(single, max_edges=_ELIDE_EDGES if max_edges is None else max_edges,
                    rows_of=None if rows_of is None else lambda _, n: rows_of(layer, n))
    lines = text.splitlines()[1:]  # drop the one-layer automaton's own header
    lines[0] = f"layer {layer} " + lines[0][len("layer 0 "):]
    return "\n".join(lines) + "\n"
