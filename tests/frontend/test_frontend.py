"""Frontend: the trie built from any order, with duplicates, equals the
brute-force set; every bad input is rejected with a typed, located error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import fixed_length_sets, ragged_sets, trie_shape, unique_sorted

from static_compiler import compile_constraints
from static_compiler.errors import ConstraintSetError, StaticCompilerError
from static_compiler.frontend import build_automaton, sort_unique_rows
from static_compiler.ir import parse_ir, verify


def check_against_oracle(automaton, rows):
    """The automaton accepts exactly the distinct rows and has one state per
    distinct prefix (a trie), accepting where a row ends."""
    verify(automaton)
    want = unique_sorted(rows)
    assert list(automaton.sequences()) == want
    assert automaton.num_sequences == len(want)
    shape = trie_shape(rows)
    assert automaton.depth == shape["depth"]
    for t in range(automaton.depth):
        layer = automaton.layers[t]
        assert layer.num_states == shape["states"][t]
        assert layer.num_edges == shape["states"][t + 1]
        assert layer.implicit_targets
        assert list(layer.accepting_array()) == shape["accepting"][t]
    assert automaton.num_final_states == shape["states"][-1]
    assert parse_ir(str(automaton)) == automaton


@settings(max_examples=120, deadline=None)
@given(fixed_length_sets())
def test_fixed_length_array_matches_oracle(case):
    rows, V = case
    a = build_automaton(np.array(rows, dtype=np.int64), V)
    check_against_oracle(a, rows)
    assert a.vocab_size == V and a.end_token is None


@settings(max_examples=40, deadline=None)
@given(fixed_length_sets())
def test_list_input_equals_array_input(case):
    rows, V = case
    from_list = build_automaton(rows, V)
    from_tuples = build_automaton((tuple(r) for r in rows), V)
    assert from_list == build_automaton(np.array(rows), V) == from_tuples


@settings(max_examples=100, deadline=None)
@given(ragged_sets())
def test_ragged_with_end_token_matches_oracle(case):
    rows, V, end = case
    a = build_automaton(rows, V, end_token=end)
    check_against_oracle(a, rows)
    assert a.end_token == end


@settings(max_examples=30, deadline=None)
@given(fixed_length_sets(max_vocab=1 << 21, max_length=12, max_items=20, min_vocab=2000))
def test_wide_vocab_long_rows_sort_over_several_words(case):
    # 11..21 bits per token and up to 12 tokens: the sort folds ranks across 64-bit words
    rows, V = case
    check_against_oracle(build_automaton(np.array(rows), V), rows)


@pytest.mark.parametrize("V", [1, 2, 255, 256, 65534, 65535, 65536, 65537, 1 << 20])
def test_vocab_boundaries(V):
    rows = [[V - 1, 0], [0, V - 1], [V - 1, V - 1], [0, 0], [V - 1, 0]]
    a = build_automaton(np.array(rows), V)
    check_against_oracle(a, rows)
    assert all(int(l.tokens.max()) <= V - 1 for l in a.layers)


def test_full_product_set_in_any_order():
    V, L = 5, 4
    grid = np.stack(np.meshgrid(*[np.arange(V)] * L, indexing="ij"), -1).reshape(-1, L)
    shuffled = grid[np.random.default_rng(0).permutation(len(grid))]
    a = build_automaton(np.concatenate([shuffled, shuffled[:50]]), V)
    check_against_oracle(a, grid.tolist())
    assert [l.max_branch for l in a.layers] == [V] * L


def test_all_duplicates_collapse_to_one_chain():
    a = build_automaton(np.tile([3, 1, 4, 1, 5], (100, 1)), 6)
    assert list(a.sequences()) == [(3, 1, 4, 1, 5)]
    assert [l.num_states for l in a.layers] == [1] * 5


def test_many_rows_sorted_like_python():
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 2048, size=(5000, 8))
    rows[::7, 3:] = 0  # shared prefixes
    rows = np.concatenate([rows, rows[:300]])
    codes, lengths = sort_unique_rows(rows, np.full(len(rows), 8), 2048)
    assert [tuple(r) for r in (codes.astype(np.int64) - 1).tolist()] == unique_sorted(rows)
    assert (lengths == 8).all()


def test_float_arrays_with_integral_values_are_accepted():
    rows = [[1.0, 2.0], [0.0, 3.0]]
    assert build_automaton(np.array(rows), 4) == build_automaton([[1, 2], [0, 3]], 4)
    assert build_automaton(rows, 4) == build_automaton([[1, 2], [0, 3]], 4)


def test_a_ragged_set_where_one_sequence_prefixes_another():
    a = build_automaton([[1, 2, 3], [1], [1, 2]], 5, end_token=0)
    assert list(a.sequences()) == [(1,), (1, 2), (1, 2, 3)]
    assert [list(l.accepting_array()) for l in a.layers] == [[False], [True], [True]]


def test_fixed_length_set_may_carry_an_end_token():
    a = build_automaton([[1, 2], [2, 1]], 4, end_token=3)
    assert a.end_token == 3 and list(a.sequences()) == [(1, 2), (2, 1)]
    assert all(l.accepting is None for l in a.layers)


# --------------------------------------------------------------------------
# Bad input: a typed error that names the value, what was expected and where.

BAD_INPUTS = [
    # (id, sequences, vocab_size, end_token, regex the message must match)
    ("empty array", np.zeros((0, 3), dtype=np.int64), 4, None, r"empty constraint set"),
    ("empty list", [], 4, None, r"empty constraint set"),
    ("empty generator", iter(()), 4, None, r"empty constraint set"),
    ("zero-length rows", np.zeros((2, 0), dtype=np.int64), 4, None, r"shape \(2, 0\).*not be empty"),
    ("empty sequence", [[1, 2], []], 4, 0, r"sequence 1 is empty"),
    ("negative token in array", np.array([[1, 2], [0, -2]]), 4, None,
     r"sequence 1, position 1: token -2 is outside the vocabulary \[0, 4\)"),
    ("-1 padding without an end token", np.array([[1, 2], [0, -1]]), 4, None,
     r"different lengths \(1\.\.2\): pass end_token"),
    ("token == V in array", np.array([[1, 4], [0, 1]]), 4, None,
     r"sequence 0, position 1: token 4 is outside the vocabulary \[0, 4\)"),
    ("token >= V in ragged list", [[1], [0, 2, 9]], 4, 3,
     r"sequence 1, position 2: token 9 is outside the vocabulary \[0, 4\)"),
    ("negative token in list", [[1, 2], [-5, 0]], 4, None, r"sequence 1, position 0: token -5"),
    ("non-integer float array", np.array([[1.0, 2.5]]), 4, None,
     r"\(0, 1\): value 2\.5 is not a finite integer"),
    ("nan in array", np.array([[1.0, 2.0], [np.nan, 1.0]]), 4, None,
     r"\(1, 0\): value nan is not a finite integer"),
    ("inf in array", np.array([[np.inf, 2.0]]), 4, None, r"\(0, 0\): value inf is not a finite"),
    ("non-integer in list", [[1, 2], [3, 0.5]], 4, None,
     r"sequence 1, position 1: value 0\.5 is not a finite integer"),
    ("nan in list", [[1, float("nan")]], 4, None, r"sequence 0, position 1: value nan"),
    ("bool array", np.array([[True, False]]), 4, None, r"expected integer token ids, got dtype bool"),
    ("string array", np.array([["a", "b"]]), 4, None, r"expected integer token ids, got dtype <U1"),
    ("3-D array", np.zeros((2, 3, 4), dtype=np.int64), 4, None, r"shape \(2, 3, 4\): expected 2-D"),
    ("1-D array", np.array([1, 2, 3]), 4, None, r"shape \(3,\): expected 2-D"),
    ("not iterable", 42, 4, None, r"constraint set of type int: expected"),
    ("a string", "123", 4, None, r"constraint set of type str"),
    ("scalar rows", [1, 2, 3], 4, None, r"sequence 0 is 1 \(int\): expected a sequence"),
    ("nested rows", [[[1], [2]]], 4, None, r"plain integers"),
    ("ragged without end token", [[1, 2], [1]], 4, None,
     r"different lengths \(1\.\.2\): pass end_token"),
    ("end token inside a sequence", [[1, 2], [3]], 4, 2,
     r"sequence 0, position 1: holds the end token 2"),
    ("vocab_size 0", [[0]], 0, None, r"vocab_size=0: expected an int in \[1, "),
    ("vocab_size negative", [[0]], -3, None, r"vocab_size=-3: expected an int in \[1, "),
    ("vocab_size float", [[0]], 4.0, None, r"vocab_size=4\.0: expected a positive int"),
    ("vocab_size bool", [[0]], True, None, r"vocab_size=True: expected a positive int"),
    ("vocab_size str", [[0]], "4", None, r"vocab_size='4': expected a positive int"),
    ("end token out of range", [[0]], 4, 4, r"end_token=4: expected an int in \[0, 4\)"),
    ("end token negative", [[0]], 4, -1, r"end_token=-1: expected an int in \[0, 4\)"),
    ("end token float", [[0]], 4, 1.0, r"end_token=1\.0: expected an int"),
]


@pytest.mark.parametrize("sequences,vocab_size,end_token,pattern",
                         [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_located_message(sequences, vocab_size, end_token, pattern):
    with pytest.raises(ConstraintSetError, match=pattern):
        build_automaton(sequences, vocab_size, end_token=end_token)


@pytest.mark.parametrize("sequences,vocab_size,end_token,pattern",
                         [c[1:] for c in BAD_INPUTS if not isinstance(c[1], type(iter(())))],
                         ids=[c[0] for c in BAD_INPUTS if not isinstance(c[1], type(iter(())))])
def test_compile_constraints_raises_the_same_typed_errors(sequences, vocab_size, end_token, pattern):
    with pytest.raises(StaticCompilerError, match=pattern):
        compile_constraints(sequences, vocab_size, end_token=end_token)


@settings(max_examples=60, deadline=None)
@given(ragged_sets(), st.integers(0, 2**32 - 1))
def test_sorted_rows_map_back_to_every_input_row(case, seed):
    # the radix passes' position bits keep the sort stable: the inverse names,
    # for every input row, the unique row equal to it
    rows, V, end = case
    rng = np.random.default_rng(seed)
    rows = [rows[i] for i in rng.integers(0, len(rows), 3 * len(rows))]
    lengths = np.array([len(r) for r in rows])
    matrix = np.zeros((len(rows), max(lengths)), dtype=np.int64)
    for i, r in enumerate(rows):
        matrix[i, :len(r)] = r
    codes, unique_lengths, inverse = sort_unique_rows(matrix, lengths, V, return_inverse=True)
    keys = [tuple(int(c) - 1 for c in row[:n]) for row, n in zip(codes, unique_lengths)]
    assert keys == sorted(set(map(tuple, rows)))
    assert inverse.dtype == np.int32
    assert [keys[i] for i in inverse] == [tuple(r) for r in rows]


@pytest.mark.parametrize("V,L,shared", [(2048, 8, 3), (1 << 20, 12, 2), (1 << 20, 12, 7), (3, 40, 30)])
def test_rows_that_tie_on_their_leading_columns_are_ordered_by_the_rest(V, L, shared):
    # the first radix digit holds the leading columns; rows that tie there
    # (here: most of them, in several groups) are ordered by the rest
    rng = np.random.default_rng(V + L)
    heads = rng.integers(0, V, size=(4, shared))
    rows = np.concatenate([heads[rng.integers(0, 4, 3000)], rng.integers(0, min(V, 3), (3000, L - shared))], 1)
    rows = np.concatenate([rows, rng.integers(0, V, (500, L)), rows[:700]])
    lengths = np.full(len(rows), L)
    codes, unique_lengths, inverse = sort_unique_rows(rows, lengths, V, return_inverse=True)
    keys = [tuple(r) for r in (codes.astype(np.int64) - 1).tolist()]
    assert keys == unique_sorted(rows)
    assert [keys[i] for i in inverse] == [tuple(r) for r in rows.tolist()]


def test_padded_rows_compile_like_the_lists_they_pad_and_reject_bad_lengths(tmp_path):
    from static_compiler.frontend import PaddedRows
    rows = [[3, 1], [3, 1, 4], [2], [3, 1]]
    matrix = np.array([[3, 1, 9], [3, 1, 4], [2, 9, 9], [3, 1, 9]], np.int32)  # 9: ignored padding
    padded = PaddedRows(matrix, np.array([2, 3, 1, 2]))
    assert build_automaton(padded, 10, end_token=0) == build_automaton(rows, 10, end_token=0)
    # Padding wider than the longest row: the same plan as the lists (it had a step holding
    # only the end token, whose export failed on an empty table), and it saves.
    wide = PaddedRows(np.pad(matrix, ((0, 0), (0, 2)), constant_values=9), padded.lengths)
    compiled = compile_constraints(wide, vocab_size=10, end_token=0, export_beam_sizes=(2,))
    assert compiled.plan == compile_constraints(rows, vocab_size=10, end_token=0).plan
    compiled.save(tmp_path / "wide.static")
    for lengths, pattern in (([2, 0, 1, 2], "sequence 1 has length 0"),
                             ([2, 4, 1, 2], "sequence 1 has length 4: expected 1..3"),
                             ([2, 3, 1], "expected an int matrix")):
        with pytest.raises(ConstraintSetError, match=pattern):
            build_automaton(PaddedRows(matrix, np.array(lengths)), 10, end_token=0)
    with pytest.raises(ConstraintSetError, match="expected an int matrix"):
        build_automaton(PaddedRows(matrix.astype(float), np.array([2, 3, 1, 2])), 10, end_token=0)
    with pytest.raises(ConstraintSetError, match="empty constraint set"):
        build_automaton(PaddedRows(matrix[:0], np.zeros(0, int)), 10, end_token=0)
