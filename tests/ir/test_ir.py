"""IR: immutability, the text form (print -> parse gives an equal IR), and a
verifier that catches every broken invariant with a message naming the
layer, state and value (broken automata are built by hand)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from ir_strategies import fixed_length_sets, ragged_sets

from static_compiler.errors import IRParseError, IRVerificationError
from static_compiler.frontend import build_automaton
from static_compiler.ir import Automaton, Layer, Layout, LayoutKind, parse_ir, print_ir, verify


def layer(indptr, tokens, targets=None, accepting=None, layout=None):
    return Layer(indptr=np.asarray(indptr, dtype=np.int64), tokens=np.asarray(tokens, dtype=np.int64),
                 targets=None if targets is None else np.asarray(targets),
                 accepting=None if accepting is None else np.asarray(accepting), layout=layout)


def three_items(**changes) -> Automaton:
    """The README's example {121, 312, 313} over V = 4, built by hand;
    `changes` replace automaton fields, `layerN=` replaces layer N."""
    layers = [layer([0, 2], [1, 3]), layer([0, 1, 2], [2, 1]), layer([0, 1, 3], [1, 2, 3])]
    for t in range(3):
        if f"layer{t}" in changes:
            layers[t] = changes.pop(f"layer{t}")
    fields = dict(vocab_size=4, layers=tuple(layers), num_final_states=3, num_sequences=3)
    fields.update(changes)
    return Automaton(**fields)


def shared_suffix_dag() -> Automaton:
    """{00, 01, 10, 11} over V = 2 with both depth-1 prefixes merged: explicit targets."""
    return Automaton(vocab_size=2, num_final_states=1, num_sequences=4, layers=(
        layer([0, 2], [0, 1], targets=[0, 0]), layer([0, 2], [0, 1], targets=[0, 0])))


def test_hand_built_example_equals_frontend_output():
    a = three_items()
    verify(a)
    assert a == build_automaton([[3, 1, 3], [1, 2, 1], [3, 1, 2]], 4)
    assert list(a.sequences()) == [(1, 2, 1), (3, 1, 2), (3, 1, 3)]


def test_text_form_matches_the_design_sketch():
    text = str(three_items())
    assert text.splitlines()[0] == "automaton vocab=4 depth=3 sequences=3 final_states=3"
    assert "  s1: 2->1 3->2" in text.splitlines()
    assert text == print_ir(three_items()) == three_items().to_text()


def test_ir_is_immutable():
    a = three_items()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.vocab_size = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers[0].tokens = np.array([0])
    with pytest.raises(ValueError, match="read-only"):
        a.layers[1].tokens[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        a.layers[1].indptr[0] = 1


def test_explicit_targets_round_trip_and_enumerate():
    a = shared_suffix_dag()
    verify(a)
    assert list(a.sequences()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    text = str(a)
    assert "targets=explicit" in text and "  s0: 0->0 1->0" in text
    assert parse_ir(text) == a


def test_equality_sees_every_field():
    a = three_items()
    assert a == three_items()
    assert a != three_items(num_sequences=4)
    assert a != three_items(end_token=0)
    assert a != three_items(layer2=layer([0, 1, 3], [1, 2, 3], targets=[0, 1, 2]))  # explicit
    assert a != three_items(layer2=layer([0, 1, 3], [1, 2, 3], layout=Layout(LayoutKind.CSR, 2)))
    assert a != three_items(layer1=layer([0, 1, 2], [2, 0]))


@settings(max_examples=60, deadline=None)
@given(fixed_length_sets())
def test_fixed_sets_round_trip_through_text(case):
    rows, V = case
    a = build_automaton(rows, V)
    assert parse_ir(str(a)) == a
    assert str(parse_ir(str(a))) == str(a)


@settings(max_examples=60, deadline=None)
@given(ragged_sets())
def test_ragged_sets_round_trip_through_text(case):
    rows, V, end = case
    a = build_automaton(rows, V, end_token=end)
    assert parse_ir(str(a)) == a


def test_large_automata_print_statistics_and_elide_rows():
    rng = np.random.default_rng(0)
    a = build_automaton(rng.integers(0, 50, size=(300, 3)), 50)
    full, short = a.to_text(max_edges=10 ** 9), a.to_text(max_edges=10)
    assert parse_ir(full) == a
    for t, lay in enumerate(a.layers):
        if lay.num_states > 16:
            assert f"  ... {lay.num_states - 16} more rows elided" in short.splitlines()
    short_rows = [ln for ln in short.splitlines() if not ln.startswith("  ...")]
    assert set(short_rows) <= set(full.splitlines())
    with pytest.raises(IRParseError, match="rows were elided"):
        parse_ir(short)


# --------------------------------------------------------------------------
# The verifier: each broken invariant, and a message naming where.

BROKEN = [
    ("vocab_size < 1", lambda: three_items(vocab_size=0), r"vocab_size=0: expected an int in \[1, "),
    ("no layers", lambda: three_items(layers=()), r"no layers"),
    ("end token outside V", lambda: three_items(end_token=7),
     r"end_token=7 is outside the vocabulary \[0, 4\)"),
    ("two roots", lambda: three_items(layer0=layer([0, 1, 2], [1, 3])),
     r"layer 0 has 2 states: expected exactly 1"),
    ("no sequences", lambda: three_items(num_sequences=0), r"num_sequences=0"),
    ("indptr float", lambda: three_items(layer1=Layer(indptr=np.array([0., 1., 2.]),
                                                      tokens=np.array([2, 1]))),
     r"layer 1: indptr must be a 1-D int array"),
    ("tokens 2-D", lambda: three_items(layer1=Layer(indptr=np.array([0, 1, 2]),
                                                    tokens=np.array([[2, 1]]))),
     r"layer 1: tokens must be a 1-D int array"),
    ("indptr end != edges", lambda: three_items(layer1=layer([0, 1, 3], [2, 1])),
     r"layer 1: indptr must start at 0 and end at num_edges=2, got 0 \.\. 3"),
    ("indptr decreases", lambda: three_items(layer2=layer([0, 4, 3], [1, 2, 3])),
     r"layer 2, state 1: indptr decreases \(4 -> 3\)"),
    ("token >= V", lambda: three_items(layer2=layer([0, 1, 3], [1, 2, 9])),
     r"layer 2, state 1: token 9 is outside \[0, 4\)"),
    ("token < 0", lambda: three_items(layer1=layer([0, 1, 2], [-2, 1])),
     r"layer 1, state 0: token -2 is outside \[0, 4\)"),
    ("end token labels an edge", lambda: three_items(end_token=3),
     r"layer 0, state 0: the end token 3 labels an edge"),
    ("row not increasing", lambda: three_items(layer2=layer([0, 1, 3], [1, 3, 2])),
     r"layer 2, state 1: tokens not strictly increasing \(3 then 2\)"),
    ("duplicate token in a row", lambda: three_items(layer2=layer([0, 1, 3], [1, 3, 3])),
     r"layer 2, state 1: tokens not strictly increasing \(3 then 3\)"),
    ("implicit targets miscounted", lambda: three_items(num_final_states=4),
     r"layer 2: implicit targets need num_edges=3 states at depth 3, found 4"),
    ("target out of range", lambda: three_items(layer2=layer([0, 1, 3], [1, 2, 3], targets=[0, 1, 5])),
     r"layer 2, state 1: target 5 is outside \[0, 3\)"),
    ("negative target", lambda: three_items(layer1=layer([0, 1, 2], [2, 1], targets=[-1, 1])),
     r"layer 1, state 0: target -1 is outside \[0, 2\)"),
    ("unreachable state", lambda: three_items(layer2=layer([0, 1, 3], [1, 2, 3], targets=[0, 1, 1])),
     r"depth 3, state 2: unreachable"),
    ("targets wrong shape", lambda: three_items(layer2=layer([0, 1, 3], [1, 2, 3], targets=[0, 1])),
     r"layer 2: targets must be int of shape \(3,\)"),
    ("accepting not bool", lambda: three_items(end_token=0,
                                               layer1=layer([0, 1, 2], [2, 1], accepting=[1, 0])),
     r"layer 1: accepting must be bool of shape \(2,\)"),
    ("dead state", lambda: three_items(layer2=layer([0, 0, 3], [1, 2, 3])),
     r"layer 2, state 0: dead state"),
    ("accepting without end token", lambda: three_items(
        layer1=layer([0, 1, 2], [2, 1], accepting=[True, False])),
     r"layer 1: states accept before the last layer but the automaton has no end_token"),
    ("dense_rows k != V", lambda: three_items(layer0=layer([0, 2], [1, 3], layout=Layout(LayoutKind.DENSE_ROWS, 3))),
     r"layer 0: dense_rows layout must have k=V=4, got 3"),
    ("csr k < max branch", lambda: three_items(layer2=layer([0, 1, 3], [1, 2, 3], layout=Layout(LayoutKind.CSR, 1))),
     r"layer 2: layout csr k=1 is smaller than the max branch 2"),
    ("near_unary k < max branch", lambda: three_items(
        layer2=layer([0, 1, 3], [1, 2, 3], layout=Layout(LayoutKind.NEAR_UNARY, 1, exceptions=1))),
     r"layer 2: layout near_unary k=1 is smaller than the max branch 2"),
    ("unary with a branching state", lambda: three_items(
        layer2=layer([0, 1, 3], [1, 2, 3], layout=Layout(LayoutKind.UNARY, 1))),
     r"layer 2, state 1: unary layout needs exactly one child per state and k=1, got branch 2"),
    ("unary with k > 1", lambda: three_items(layer1=layer([0, 1, 2], [2, 1], layout=Layout(LayoutKind.UNARY, 2))),
     r"layer 1, state 0: unary layout needs .* k=1, got branch 1, k=2"),
    ("near_unary exceptions wrong", lambda: three_items(
        layer2=layer([0, 1, 3], [1, 2, 3], layout=Layout(LayoutKind.NEAR_UNARY, 2, exceptions=0))),
     r"layer 2: near_unary records 0 exceptions, the layer has 1"),
    ("token dtype too narrow", lambda: Automaton(
        vocab_size=300, num_final_states=1, num_sequences=1,
        layers=(layer([0, 1], [299], layout=Layout(LayoutKind.UNARY, 1, token_dtype="int8")),)),
     r"layer 0: token 299 does not fit token dtype int8"),
    ("dtype not numpy", lambda: three_items(
        layer1=layer([0, 1, 2], [2, 1], layout=Layout(LayoutKind.UNARY, 1, state_dtype="int33"))),
     r"layer 1: state dtype 'int33' is not a numpy dtype"),
]


@pytest.mark.parametrize("make,pattern", [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_verifier_catches_broken_invariant(make, pattern):
    with pytest.raises(IRVerificationError, match=pattern):
        verify(make())


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(kind="sparse", k=2), r"layout kind 'sparse' is not one of"),
    (dict(kind=LayoutKind.CSR, k=0), r"layout k=0 must be >= 1"),
])
def test_layout_rejects_bad_fields(kwargs, pattern):
    with pytest.raises(IRVerificationError, match=pattern):
        Layout(**kwargs)


def test_layout_text_round_trips():
    for lay in (Layout(LayoutKind.DENSE_ROWS, 4),
                Layout(LayoutKind.CSR, 8, "uint16", "int16", estimated_bytes=40),
                Layout(LayoutKind.UNARY, 1, state_dtype="int64"),
                Layout(LayoutKind.NEAR_UNARY, 16, exceptions=3)):
        assert Layout.from_text(lay.to_text()) == lay


def test_layout_kind_is_interchangeable_with_its_string():
    lay = Layout("near_unary", 4, exceptions=1)
    assert lay.kind is LayoutKind.NEAR_UNARY and lay == Layout(LayoutKind.NEAR_UNARY, 4, exceptions=1)
    assert lay.kind == "near_unary" and {"near_unary": 1}[lay.kind] == 1
    assert f"{lay.kind}" == str(lay.kind) == "near_unary"
    assert lay.to_text() == "near_unary(k=4,tokens=int32,states=int32,exceptions=1,est=0B)"
    assert [kind.sliced for kind in LayoutKind] == [False, True, False, True]


# --------------------------------------------------------------------------
# The parser: malformed text gives IRParseError with the line.

GOOD = str(three_items())


def _edit(old, new, count=1):
    assert old in GOOD
    return GOOD.replace(old, new, count)


PARSE_ERRORS = [
    ("empty", "", r"empty IR text"),
    ("bad header", "automaton vocab=four\n", r"line 1: expected 'automaton vocab="),
    ("text ends before a layer", GOOD.splitlines()[0] + "\n", r"expected layer 0 header after line 1"),
    ("wrong layer index", _edit("layer 1  ", "layer 2  "), r"line 4: expected header of layer 1"),
    ("malformed row", _edit("  s0: 2->0", "  s0: 2=>0"), r"line 5: expected row s0 of layer 1"),
    ("row out of order", _edit("  s1: 1->1", "  s2: 1->1"), r"line 6: expected row s1 of layer 1"),
    ("text ends inside a layer", GOOD.rsplit("  s1: 2->1 3->2", 1)[0],
     r"line 7: layer 2 header says states=2, but only 1 line follows"),
    ("edge count mismatch", _edit("layer 2  states=2 edges=3", "layer 2  states=2 edges=4"),
     r"layer 2: header says edges=4, rows hold 3"),
    ("implicit with other targets", _edit("  s1: 2->1 3->2", "  s1: 2->2 3->1"),
     r"layer 2: targets=implicit but rows name other targets"),
    ("trailing text", GOOD + "layer 3  what\n", r"line 10: unexpected text after the last layer"),
    ("bad layout", _edit("layout=none", "layout=csr[k=2]"), r"cannot parse layout 'csr\[k=2\]'"),
    ("layout missing k", _edit("layout=none", "layout=csr(tokens=int32)"), r"cannot parse layout"),
]


@pytest.mark.parametrize("text,pattern", [c[1:] for c in PARSE_ERRORS], ids=[c[0] for c in PARSE_ERRORS])
def test_parser_rejects_malformed_text(text, pattern):
    with pytest.raises(IRParseError, match=pattern):
        parse_ir(text)


def test_parser_verifies_what_it_reads():
    with pytest.raises(IRVerificationError, match=r"layer 2, state 1: tokens not strictly increasing"):
        parse_ir(_edit("  s1: 2->1 3->2", "  s1: 3->1 2->2"))


def test_a_state_dtype_too_narrow_for_the_layer_is_refused_not_wrapped():
    """An IR dump whose layout names int8 state ids for a layer reaching 200
    used to compile with pipeline="verify" and decode wrapped ids, beams
    outside the set."""
    import static_compiler as sc
    from static_compiler.errors import PipelineError

    items = [(a, b) for a in range(20) for b in range(10)]
    ir = sc.compile_constraints(items, 20).ir
    text = ir.to_text(max_edges=10 ** 9)
    with pytest.raises(IRVerificationError, match="state dtype int8 cannot hold .*up to 200"):
        parse_ir(text.replace("states=int16", "states=int8"))
    with pytest.raises(IRVerificationError, match="state dtype float32"):
        parse_ir(text.replace("states=int16", "states=float32"))
    narrow = ir.with_layers(layer.replace(layout=dataclasses.replace(layer.layout,
                                                                     state_dtype="int8"))
                            for layer in ir.layers)
    with pytest.raises(PipelineError, match="int8"):
        sc.compile_constraints(narrow, 20, pipeline="verify")


@pytest.mark.parametrize("vocab", [2 ** 31, 2 ** 33])
def test_a_vocabulary_past_int32_is_refused_not_wrapped(vocab):
    """[[2**32 + 1, 1]] with vocab_size 2**33 used to compile to {(1, 1)}."""
    import static_compiler as sc
    from static_compiler.errors import ConstraintSetError

    with pytest.raises(ConstraintSetError, match=f"vocab_size={vocab}: expected an int in"):
        sc.compile_constraints([[2 ** 32 + 1, 1]], vocab)


def test_branch_counts_are_computed_once_read_only_and_follow_the_rows():
    # passes plan from the branch histogram; a layer computes it once, and a
    # copy that changes only the layout keeps it, one with new rows does not
    layer = Layer(indptr=np.array([0, 2, 2, 5]), tokens=np.array([1, 4, 0, 2, 3]))
    assert layer.branch().tolist() == [2, 0, 3] and layer.branch_counts().tolist() == [1, 0, 1, 1]
    assert layer.branch() is layer.branch() and layer.max_branch == 3
    with pytest.raises(ValueError):
        layer.branch()[0] = 7
    with pytest.raises(ValueError):
        layer.branch_counts()[0] = 7
    relaid = layer.replace(layout=Layout(kind="csr", k=3))
    assert relaid.branch() is layer.branch() and relaid.branch_counts() is layer.branch_counts()
    rerowed = layer.replace(indptr=np.array([0, 1, 1, 5]))
    assert rerowed.branch().tolist() == [1, 0, 4] and rerowed.max_branch == 4
