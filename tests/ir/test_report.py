"""The per-layer report: branch histogram and the paper's bound against
brute force, estimated vs measured bytes, and `layer_text` equal to the
layer's slice of the full IR dump."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import fixed_length_sets, ragged_sets, random_dags

from static_compiler import compile_constraints, report
from static_compiler.errors import ReportInputError
from static_compiler.frontend import build_automaton
from static_compiler.ir import LayoutKind

THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])


def compiled_sets():
    return st.one_of(
        fixed_length_sets(max_items=20).map(lambda c: compile_constraints(c[0], c[1])),
        ragged_sets(max_items=20).map(lambda c: compile_constraints(c[0], c[1], end_token=c[2])),
        random_dags().map(lambda a: compile_constraints(a, a.vocab_size)))


def brute_bucket(b: int) -> tuple:
    if b < 2:
        return (b, b)
    hi = 1
    while hi < b:
        hi *= 2
    return (hi // 2 + 1, hi)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 70), st.integers(0, 1 << 31)), max_size=60))
def test_branch_histogram_matches_brute_force(branch):
    counts = {}
    for b in branch:
        counts[brute_bucket(b)] = counts.get(brute_bucket(b), 0) + 1
    want = [(lo, hi, n) for (lo, hi), n in sorted(counts.items())]
    assert report.branch_histogram(np.array(branch, dtype=np.int64)) == want


def test_histogram_text():
    hist = report.branch_histogram(np.array([0, 1, 1, 2, 3, 4, 5, 9]))
    assert report.format_histogram(hist) == "0:1 1:2 2:1 3-4:2 5-8:1 9-16:1"


def test_paper_bound_at_the_papers_configuration():
    # PAPER_FACTS: 20M items, V = 2048, L = 8, d = 2: ~17.3 MB dense + ~1.44 GB CSR
    dense = (2048 ** 2) // 8 + 4 * 2048 ** 2
    assert dense == 17_301_504
    assert report.paper_memory_bound(2048, 8, 20_000_000, 2) == dense + 12 * 6 * 20_000_000


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 70000), st.integers(1, 9), st.integers(1, 10 ** 10), st.data())
def test_paper_bound_matches_the_formula(V, L, C, data):
    d = data.draw(st.integers(0, L))
    exact = (Fraction(1, 8) + 4) * V ** d + 12 * sum(min(V ** l, C) for l in range(d + 1, L + 1))
    assert report.paper_memory_bound(V, L, C, d) == -(-exact.numerator // exact.denominator)


@pytest.mark.parametrize("args,pattern", [
    ((0, 3, 5, 0), r"vocab_size=0, expected an int >= 1"),
    ((4, 0, 5, 0), r"depth=0, expected an int >= 1"),
    ((4, 3, 0, 0), r"num_sequences=0, expected an int >= 1"),
    ((4, 3, 5, -1), r"dense_layers=-1, expected an int >= 0"),
    ((4, 3, 5, 4), r"dense_layers=4 exceeds depth=3"),
    ((4.0, 3, 5, 0), r"vocab_size=4.0, expected an int"),
])
def test_paper_bound_rejects_bad_arguments(args, pattern):
    with pytest.raises(ReportInputError, match=pattern):
        report.paper_memory_bound(*args)


@settings(max_examples=40, deadline=None)
@given(compiled_sets())
def test_rows_and_summary_agree_with_the_compiled_tables(compiled):
    rows = report.layer_rows(compiled)
    ir = compiled.ir
    assert len(rows) == ir.depth
    for t, (row, layer) in enumerate(zip(rows, ir.layers)):
        assert row["layer"] == t and row["layout"] == layer.layout.kind and row["k"] == layer.layout.k
        assert row["estimated_bytes"] == row["bytes"] == compiled.layer_stats()[t]["bytes"]
        assert sum(n for _, _, n in row["histogram"]) == layer.num_states
        lo, hi, _ = row["histogram"][-1]
        assert lo <= layer.max_branch <= hi
    assert report.layer_rows(ir) == rows  # an Automaton with layouts is lowered and measured
    tot = report.summary(compiled)
    assert tot["bytes"] == tot["estimated_bytes"] == compiled.lowered.nbytes
    assert tot["bytes_per_sequence"] == compiled.lowered.nbytes / ir.num_sequences
    d = next((t for t, l in enumerate(ir.layers) if l.layout.kind != LayoutKind.DENSE_ROWS), ir.depth)
    assert tot["dense_layers"] == d
    assert tot["paper_bound_bytes"] == report.paper_memory_bound(ir.vocab_size, ir.depth,
                                                                 ir.num_sequences, d)


def test_stats_table_of_the_example():
    text = report.stats_table(compile_constraints(THREE, 4))
    lines = text.splitlines()
    assert lines[0].split() == ["layer", "states", "edges", "max_br", "mean_br", "layout", "k",
                                "mixed", "tokens", "states_dt", "est_bytes", "bytes", "branch", "histogram"]
    assert lines[1].split() == ["0", "1", "2", "2", "2.000", "dense_rows", "4", "-", "uint16",
                                "int16", "8", "8", "2:1"]
    assert lines[2].split() == ["1", "2", "2", "1", "1.000", "unary", "1", "-", "uint16", "int16",
                                "4", "4", "1:2"]
    assert lines[3].split() == ["2", "2", "3", "2", "1.500", "dense_rows", "4", "-", "uint16",
                                "int16", "16", "16", "1:1", "2:1"]
    assert lines[4].split() == ["total", "5", "7", "28", "28"]
    assert "bytes: measured 28 (estimated 28), 9.33 bytes per sequence" in text
    # U_max with d = 1: (1/8 + 4) * 4 + 12 * (min(16, 3) + min(64, 3)) = 16.5 + 72 -> 89
    assert "with d=1: 89 bytes; measured / U_max = 0.315" in text


def test_markdown_table_has_one_row_per_layer_and_a_total():
    compiled = compile_constraints([[1, 2], [1], [3, 1, 2]], 5, end_token=4)
    md = report.stats_table(compiled, markdown=True).split("\n\n")[0].splitlines()
    assert len(md) == 2 + compiled.ir.depth + 1
    assert all(line.startswith("| ") and line.count("|") == 14 for line in md if line[1] != "-")
    assert md[-1].startswith("| total | ")


def test_a_mixed_layer_shows_its_light_k_and_wide_slots():
    rows = [(0, t) for t in range(40)] + [(s, s % 3) for s in range(1, 60)]
    compiled = compile_constraints(rows, 64)
    assert report.layer_rows(compiled)[1]["mixed"] == "light=8,wide=4"
    assert [r["mixed"] for r in report.layer_rows(compiled.ir)] == [None, "light=8,wide=4"]
    assert "light=8,wide=4" in report.stats_table(compiled).splitlines()[2]


def test_an_ir_without_layouts_reports_no_bytes():
    ir = build_automaton(THREE, 4)
    rows = report.layer_rows(ir)
    assert [r["layout"] for r in rows] == ["none"] * 3
    assert all(r["bytes"] is None and r["k"] is None for r in rows)
    text = report.stats_table(ir)
    assert "some layer has no layout" in text and "with d=0: " in text
    assert report.summary(ir)["bytes"] is None


@settings(max_examples=40, deadline=None)
@given(compiled_sets(), st.sampled_from([0, 3, 10 ** 9]))
def test_layer_text_is_the_layers_slice_of_the_dump(compiled, max_edges):
    ir = compiled.ir
    full = ir.to_text(max_edges=max_edges).splitlines()
    starts = [i for i, ln in enumerate(full) if ln.startswith("layer ")] + [len(full)]
    for t in range(ir.depth):
        want = full[starts[t]:starts[t + 1]]
        if max_edges == 3 and ir.num_edges > 3 and ir.layers[t].num_edges <= 3:
            continue  # the layer alone fits the limit, the whole automaton does not
        assert report.layer_text(ir, t, max_edges=max_edges).splitlines() == want


@pytest.mark.parametrize("layer,pattern", [
    (3, r"layer 3: expected an int in \[0, 3\) \(the automaton has depth 3\)"),
    (-1, r"layer -1: expected an int in \[0, 3\)"),
    (True, r"layer True: expected an int"),
    ("1", r"layer '1': expected an int"),
])
def test_layer_text_rejects_bad_layers(layer, pattern):
    with pytest.raises(ReportInputError, match=pattern):
        report.layer_text(build_automaton(THREE, 4), layer)


@pytest.mark.parametrize("fn", [report.layer_rows, report.summary, report.stats_table,
                                lambda x: report.layer_text(x, 0)])
def test_reports_reject_other_objects(fn):
    with pytest.raises(ReportInputError, match=r"of a list: expected"):
        fn([[1, 2]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=60))
def test_histogram_of_branch_counts_equals_the_branches(branch):
    """A summary's histogram (from its branch counts) is the layer's."""
    counts = np.bincount(np.array(branch, dtype=np.int64), minlength=1)
    assert report.counts_histogram(counts) == report.branch_histogram(np.array(branch, np.int64))
