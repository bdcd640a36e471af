"""Filter expressions (`rules.where`): the parser, the Python builder and the
evaluator.

The property tests build random trees over random int / float (NaN, inf,
-0.0) / bool / category columns and masks, with literals a column cannot
hold (ints past its dtype, floats between float32 values, categories it
lacks), and check `evaluate` (whole and in small chunks) against a row-by-row
evaluation in plain Python, and that ``parse(str(expr)) == expr``.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from static_compiler.errors import AttributeColumnError, ConstraintSetError, FilterExpressionError
from static_compiler.rules.where import (
    And,
    Column,
    Compare,
    IsIn,
    Name,
    Not,
    Or,
    attr,
    column_of,
    evaluate,
    item_mask,
    names,
    parse,
)

# The random tables: column name -> kind and dtype.
NUMERIC = {"i32": np.int32, "i64": np.int64, "u8": np.uint8, "f32": np.float32,
           "f64": np.float64}
BOOLS = ("flag", "seen", "liked")  # a bool column and two masks
MASKS = ("seen", "liked")
LABELS = ("a", "b", "c", "it's", 'q"\\', "", "news", "sport", "x y", "é", "k", "m")
ABSENT = "absent"
SPECIAL_INTS = (2**31, -2**31 - 1, 2**53 + 1, 2**63, -2**63 - 1, 2**64, 10**30, 255, 256, -1)
SPECIAL_FLOATS = (0.1, 1.5, -2.5, 2.0, -0.0, 1e300, -1e300, 16777217.0, 3.4e38, 5e-324,
                  float(np.float32(0.1)), 9007199254740993.0)
COLUMN_FLOATS = (0.0, -0.0, 1.0, 1.5, -2.5, 2.0, float(np.float32(0.1)), 0.1, np.nan, np.inf,
                 -np.inf, 16777216.0, 3.4028234663852886e38)
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge}


def _numbers(near=()):
    """Number literals: small, past some dtype's range, arbitrary floats, and
    `near` (a table's values and their neighbours)."""
    numbers = st.one_of(st.integers(-6, 6), st.sampled_from(SPECIAL_INTS),
                        st.sampled_from(SPECIAL_INTS).map(lambda v: -v),
                        st.floats(allow_nan=False, allow_infinity=False),
                        st.sampled_from(SPECIAL_FLOATS))
    return st.one_of(st.sampled_from(sorted(near, key=repr)), numbers) if near else numbers


def _leaves(near=None, labels=LABELS):
    labels = st.sampled_from(tuple(labels) + (ABSENT,))
    numeric = [leaf for name in sorted(NUMERIC) for leaf in (
        st.builds(Compare, st.just(name), st.sampled_from(sorted(COMPARE)),
                  _numbers((near or {}).get(name, ()))),
        st.builds(IsIn, st.just(name), st.lists(_numbers((near or {}).get(name, ())),
                                                max_size=10).map(tuple), st.booleans()))]
    return st.one_of(
        *numeric,
        st.builds(Compare, st.sampled_from(BOOLS), st.sampled_from(["==", "!="]), st.booleans()),
        st.builds(IsIn, st.sampled_from(BOOLS), st.lists(st.booleans(), max_size=3).map(tuple),
                  st.booleans()),
        st.builds(Name, st.sampled_from(BOOLS)),
        st.builds(Compare, st.just("cat"), st.sampled_from(["==", "!="]), labels),
        st.builds(IsIn, st.just("cat"), st.lists(labels, max_size=12).map(tuple), st.booleans()),
    )


def _operands(children):
    return st.lists(children, min_size=2, max_size=3).map(tuple)


def expressions(near=None, labels=LABELS):
    """Random trees over the columns of `tables` and the masks."""
    return st.recursive(
        _leaves(near, labels),
        lambda children: st.one_of(children.map(Not), _operands(children).map(And),
                                   _operands(children).map(Or)), max_leaves=8)


EXPRESSIONS = expressions()


def _column(draw, name: str, n: int) -> Column:
    """A random column `name` (a key of NUMERIC, or "cat") of n rows; values
    cluster on a small grid so that literals near one value meet others."""
    if name == "cat":
        size = draw(st.integers(1, len(LABELS)))
        categories = tuple(draw(st.permutations(LABELS))[:size])
        codes = draw(st.lists(st.integers(0, len(categories) - 1), min_size=n, max_size=n))
        return Column("category", np.array(codes, dtype=np.int32), categories)
    dtype = NUMERIC[name]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        value = st.one_of(st.integers(-3, 3), st.sampled_from([info.min, info.max, 2**31]),
                          st.integers(int(info.min), int(info.max)))
        value = value.filter(lambda v: info.min <= v <= info.max)
    else:
        value = st.one_of(st.sampled_from(COLUMN_FLOATS), st.floats(width=32),
                          st.integers(-4, 4).map(lambda v: v / 2))
    with np.errstate(over="ignore"):
        values = np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=dtype)
    return Column("int" if np.issubdtype(dtype, np.integer) else "float", values)


@st.composite
def tables(draw):
    """(columns, masks, num_rows) of random values."""
    n = draw(st.integers(0, 24))
    columns = {name: _column(draw, name, n) for name in (*NUMERIC, "cat")}
    columns["flag"] = Column("bool", np.array(draw(st.lists(st.booleans(), min_size=n,
                                                            max_size=n)), dtype=bool))
    masks = {m: np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
             for m in MASKS}
    return columns, masks, n


def _near(column) -> set:
    """Literals on and next to a numeric column's values: v, v +- 0.5 for an
    int; v and its float64 neighbours (between float32 values) for a float."""
    near = set()
    for v in column.values.tolist():
        if column.kind == "int":
            near |= {v, v + 1, v - 0.5, v + 0.5, float(v)}
        elif np.isfinite(v):
            near |= {v, float(np.nextafter(v, np.inf)), float(np.nextafter(v, -np.inf))}
    return {v for v in near if not isinstance(v, float) or np.isfinite(v)}


@st.composite
def leaf_cases(draw):
    """(columns, num_rows, one comparison or membership) over one numeric or
    category column, the literals mostly on or next to its values."""
    n = draw(st.integers(1, 12))
    name = draw(st.sampled_from([*NUMERIC, "cat"]))
    column = _column(draw, name, n)
    if name == "cat":
        literals, ops = st.sampled_from(column.categories + (ABSENT,)), ["==", "!="]
        listed = st.permutations(column.categories + (ABSENT,)).flatmap(  # distinct labels
            lambda labels: st.integers(0, len(labels)).map(lambda k: labels[:k]))
    else:
        literals, ops = _numbers(_near(column)), sorted(COMPARE)
        listed = st.lists(literals, max_size=12).map(tuple)
    leaf = draw(st.one_of(st.builds(Compare, st.just(name), st.sampled_from(ops), literals),
                          st.builds(IsIn, st.just(name), listed, st.booleans())))
    return {name: column}, n, leaf


@st.composite
def cases(draw):
    """(columns, masks, num_rows, expression) with literals near the values."""
    columns, masks, n = draw(tables())
    near = {name: _near(columns[name]) for name in NUMERIC}
    expr = draw(expressions(near, columns["cat"].categories))
    return columns, masks, n, expr


def _row_value(name, columns, masks, row):
    """Row `row` of column or mask `name` as a plain Python value."""
    if name in masks:
        return bool(masks[name][row])
    column = columns[name]
    value = column.values[row]
    if column.kind == "category":
        return column.categories[value]
    return {"int": int, "float": float, "bool": bool}[column.kind](value)


def _oracle(expr, columns, masks, row) -> bool:
    """`expr` at one row, in plain Python (exact int/float comparisons, NaN
    unequal to everything)."""
    if isinstance(expr, Not):
        return not _oracle(expr.operand, columns, masks, row)
    if isinstance(expr, And):
        return all(_oracle(o, columns, masks, row) for o in expr.operands)
    if isinstance(expr, Or):
        return any(_oracle(o, columns, masks, row) for o in expr.operands)
    value = _row_value(expr.name, columns, masks, row)
    if isinstance(expr, Name):
        return value
    if isinstance(expr, Compare):
        return COMPARE[expr.op](value, expr.value)
    return any(value == v for v in expr.values) != expr.negated


@settings(max_examples=examples(300))
@given(leaf_cases())
def test_each_comparison_matches_a_row_by_row_oracle(case):
    columns, n, leaf = case
    want = [_oracle(leaf, columns, {}, row) for row in range(n)]
    assert evaluate(leaf, columns, None, n).tolist() == want, str(leaf)


@pytest.mark.parametrize("length", range(14))
def test_in_lists_of_every_length_match_the_oracle(length):
    """An `in` list is an or of == up to FEW_VALUES, a lookup table (category)
    or np.isin past it."""
    rng = np.random.default_rng(length)
    n = 200
    columns = {"i16": Column("int", rng.integers(0, 16, n).astype(np.int16)),
               "f32": Column("float", (rng.integers(0, 16, n) / 2).astype(np.float32)),
               "cat": Column("category", rng.integers(0, 12, n, dtype=np.int32), LABELS)}
    for name, literals in [("i16", list(range(16))), ("f32", [v / 2 for v in range(16)]),
                           ("cat", [ABSENT, *LABELS])]:
        picked = tuple(rng.permutation(np.array(literals, dtype=object))[:length].tolist())
        for negated in (False, True):
            leaf = IsIn(name, picked, negated)
            want = [_oracle(leaf, columns, {}, row) for row in range(n)]
            assert evaluate(leaf, columns, None, n).tolist() == want, str(leaf)


@settings(max_examples=examples(100))
@given(cases(), st.integers(1, 7))
def test_evaluate_matches_a_row_by_row_oracle(case, chunk_rows):
    columns, masks, n, expr = case
    want = np.array([_oracle(expr, columns, masks, row) for row in range(n)], dtype=bool)
    got = evaluate(expr, columns, masks, n)
    assert got.dtype == bool and got.shape == (n,)
    np.testing.assert_array_equal(got, want, err_msg=str(expr))
    np.testing.assert_array_equal(evaluate(str(expr), columns, masks, n, chunk_rows=chunk_rows),
                                  want, err_msg=f"{expr} in chunks of {chunk_rows}")


@settings(max_examples=examples(300))
@given(EXPRESSIONS)
def test_the_canonical_text_parses_back_to_the_same_tree(expr):
    text = str(expr)
    again = parse(text)
    assert again == expr and hash(again) == hash(expr), text
    assert str(again) == text
    assert names(text) == names(expr)


@settings(max_examples=examples(300))
@given(st.text(alphabet="ab (),'\"\\=!<>.-+e1 andornotin", max_size=30))
def test_any_text_parses_or_raises_a_filter_error(text):
    try:
        tree = parse(text)
    except FilterExpressionError as err:
        assert "at position" in str(err) and "\n" not in str(err)
    else:
        assert parse(str(tree)) == tree


# The parser.

def test_precedence_is_not_then_and_then_or():
    a, b, c, d = (Name(x) for x in "abcd")
    assert parse("a or b and not c") == Or((a, And((b, Not(c)))))
    assert parse("not a and b or c and d") == Or((And((Not(a), b)), And((c, d))))
    assert parse("(a or b) and c") == And((Or((a, b)), c))
    assert parse("not (a or b)") == Not(Or((a, b)))
    assert parse("not not a") == Not(Not(a))
    assert parse("a and b and c") == And((a, b, c))
    assert parse("a and (b and c)") == And((a, And((b, c))))  # the parentheses are kept
    assert parse("((a))") == a


def test_comparisons_membership_and_flipped_comparisons():
    assert parse("age <= 7") == Compare("age", "<=", 7)
    assert parse("7 > age") == Compare("age", "<", 7)
    assert parse("'news' == category") == Compare("category", "==", "news")
    assert parse("x not in (1, 2)") == IsIn("x", (1, 2), negated=True)
    assert parse("not x in (1, 2)") == Not(IsIn("x", (1, 2)))
    assert parse("x in ('a')") == parse("x in ('a',)") == IsIn("x", ("a",))
    assert parse("x in ()") == IsIn("x", ())
    assert parse("x in (1, 2,)") == IsIn("x", (1, 2))
    assert str(parse("x not in ('a')")) == "x not in ('a',)"
    assert parse("age>=-3and b") == And((Compare("age", ">=", -3), Name("b")))


@pytest.mark.parametrize("text, value", [
    ("7", 7), ("-3", -3), ("+4", 4), ("1.5", 1.5), ("-2e3", -2000.0), (".5", 0.5), ("1.", 1.0),
    ("1e3", 1000.0), ("2E-2", 0.02), ("true", True), ("True", True), ("false", False),
    ("False", False), ("123456789012345678901234567890", 123456789012345678901234567890),
    (r"'it\'s'", "it's"), (r'"a\"b\\c"', 'a"b\\c'), ('"it\'s"', "it's"), ("''", ""),
    (r"'\\'", "\\"), ("'and or'", "and or")])
def test_literals(text, value):
    tree = parse(f"x == {text}")
    assert tree.value == value and type(tree.value) is type(value)


def test_literal_types_are_told_apart():
    one, one_float, true = Compare("x", "==", 1), Compare("x", "==", 1.0), Compare("x", "==", True)
    assert len({one, one_float, true}) == 3 and one != one_float and one != true
    assert str(one_float) == "x == 1.0" and str(true) == "x == true"


@pytest.mark.parametrize("text, position, fragment", [
    ("", 0, "empty expression"),
    ("   ", 3, "empty expression"),
    ("x == 'abc", 5, "unterminated string"),
    ("x == 'a\\nb'", 7, "unknown escape"),
    ("age < 3 )", 8, "unexpected ')'"),
    ("age < 3 age", 8, "unexpected 'age'"),
    ("age <", 5, "end of the expression"),
    ("age = 3", 4, "unexpected '='"),
    ("age not 3", 8, "'in'"),
    ("age in 3", 7, "'('"),
    ("age in (1 2)", 10, "',' or ')'"),
    ("(age < 3", 8, "')'"),
    ("and", 0, "unexpected 'and'"),
    ("x == 1e999", 5, "out of the float range"),
    ("x == y", 5, "unexpected 'y'"),
    ("3 < 4", 4, "attribute name"),
    ("a # b", 2, "unexpected character '#'"),
    ("(" * 300 + "a" + ")" * 300, 200, "nested"),
])
def test_syntax_errors_name_the_position(text, position, fragment):
    with pytest.raises(FilterExpressionError) as info:
        parse(text)
    message = str(info.value)
    assert f"at position {position}" in message and fragment in message, message
    assert "\n" not in message and isinstance(info.value, ConstraintSetError)


# The Python builder.

def test_the_builder_makes_the_parsed_tree():
    built = (attr("age") < 7) & attr("category").isin(["a", "b"]) & ~item_mask("seen")
    assert built == parse("age < 7 and category in ('a', 'b') and not seen")
    assert str(built) == "age < 7 and category in ('a', 'b') and not seen"
    assert (attr("in_stock") | (attr("age") >= 2.5)) == parse("in_stock or age >= 2.5")
    assert (attr("c") == "x") == Compare("c", "==", "x")
    assert (attr("c") != "x") == Compare("c", "!=", "x")
    assert (7 > attr("age")) == Compare("age", "<", 7)  # reflected
    assert (attr("age") <= np.int64(3)) == Compare("age", "<=", 3)
    assert type((attr("age") <= np.int64(3)).value) is int
    assert attr("age") == attr("age") and attr("age") != attr("b")
    assert attr("a") & (attr("b") & attr("c")) == parse("a and (b and c)")
    assert eval(repr(built), {"parse": parse}) == built


@pytest.mark.parametrize("build", [
    lambda: attr("and"), lambda: attr("1x"), lambda: attr("a.b"), lambda: attr("age") < float("nan"),
    lambda: attr("age") < float("inf"), lambda: attr("age") < [1], lambda: attr("c").isin("ab"),
    lambda: Compare("age", "=", 1), lambda: And((attr("a"),)), lambda: bool(attr("a")),
    lambda: attr("a") and attr("b")])
def test_bad_builds_raise(build):
    with pytest.raises(FilterExpressionError):
        build()


def test_names():
    assert names("a and b < 1 or not c in (1) or a") == frozenset({"a", "b", "c"})
    assert names(attr("x") > 1) == frozenset({"x"})


# The evaluator.

AGE = np.array([3, 9, 5, 7], dtype=np.int32)


def _columns():
    return {"age": Column("int", AGE),
            "category": column_of(np.array(["news", "sport", "news", "music"]), "category"),
            "in_stock": Column("bool", np.array([True, False, True, True])),
            "score": Column("float", np.array([0.5, np.nan, 2.0, -1.0], dtype=np.float32))}


SEEN = {"seen": np.array([False, True, False, True])}


@pytest.mark.parametrize("text, want", [
    ("age <= 7 and category in ('news', 'music') and not seen", [1, 0, 1, 0]),
    ("in_stock and score > 0", [1, 0, 1, 0]),
    ("score != 0.5", [0, 1, 1, 1]),  # NaN != anything
    ("not score == 0.5", [0, 1, 1, 1]),
    ("score not in (2, 0.5)", [0, 1, 0, 1]),
    ("category == 'film'", [0, 0, 0, 0]),  # not a category: no row, no error
    ("category != 'film'", [1, 1, 1, 1]),
    ("category not in ('film', 'news')", [0, 1, 0, 1]),
    ("age == 5.0 or age < 3.5", [1, 0, 1, 0]),
    ("age > 4.5 and age != 7.5", [0, 1, 1, 1]),
    ("age < 10000000000", [1, 1, 1, 1]),
    ("in_stock == false or seen", [0, 1, 0, 1]),
    ("seen in (true)", [0, 1, 0, 1]),
])
def test_evaluate_cases(text, want):
    got = evaluate(text, _columns(), SEEN, 4)
    np.testing.assert_array_equal(got, np.array(want, dtype=bool), err_msg=text)
    assert evaluate(parse(text), _columns(), SEEN, 4).tolist() == got.tolist()


@pytest.mark.parametrize("text, position, fragments", [
    ("categroy == 'a'", 0, ["unknown attribute 'categroy'",
                            "(attributes: age, category, in_stock, score; masks: seen)"]),
    ("age < 3 and category < 'news'", 12, ["'category' (category)", "'<'"]),
    ("category == 3", 0, ["'category' (category)", "expected a string"]),
    ("category in ('news', 3)", 0, ["'category' (category)", "compared with 3"]),
    ("age == 'x'", 0, ["'age' (int)", "expected a number"]),
    ("score >= true", 0, ["'score' (float)", "expected a number"]),
    ("in_stock < true", 0, ["'in_stock' (bool)", "'<'"]),
    ("in_stock == 1", 0, ["'in_stock' (bool)", "expected true or false"]),
    ("in_stock and age", 13, ["'age' (int)", "not bool"]),
    ("seen > false", 0, ["mask 'seen'", "'>'"]),
    ("not (in_stock or 3 < nope)", 21, ["unknown attribute 'nope'"]),
])
def test_name_and_kind_errors_name_the_position_and_the_attribute(text, position, fragments):
    with pytest.raises(FilterExpressionError) as info:
        evaluate(text, _columns(), SEEN, 4)
    message = str(info.value)
    assert f"at position {position}" in message, message
    assert all(f in message for f in fragments), message
    assert "\n" not in message


def test_errors_of_a_built_expression_point_into_its_canonical_text():
    with pytest.raises(FilterExpressionError) as info:
        evaluate((attr("age") < 3) & (attr("nope") == "a"), _columns(), SEEN, 4)
    message = str(info.value)
    assert "unknown attribute 'nope' at position 12" in message
    assert "in \"age < 3 and nope == 'a'\"" in message, message


class Untouchable(np.ndarray):
    """An array whose values must not be read (its dtype and shape may)."""

    def __getitem__(self, key):
        raise AssertionError("a value was read")


def test_names_and_kinds_are_checked_before_any_value_is_read():
    columns = {"age": Column("int", AGE.view(Untouchable)),
               "category": Column("category", np.zeros(4, np.int32).view(Untouchable), ("a",))}
    for text in ["age < 3 and nope", "age < 3 or category < 'a'", "age < 3 and age == 'x'"]:
        with pytest.raises(FilterExpressionError):
            evaluate(text, columns, {}, 4)
    with pytest.raises(FilterExpressionError, match="mask 'seen'"):
        evaluate("age < 3", columns, {"seen": np.zeros(3, bool)}, 4)


@pytest.mark.parametrize("columns, masks, fragments", [
    (_columns(), {"seen": np.zeros(4, np.int8)}, ["mask 'seen'", "dtype int8"]),
    (_columns(), {"seen": np.zeros(5, bool)}, ["mask 'seen'", "shape (5,)", "(4,)"]),
    (_columns(), {"seen": [True] * 4}, ["mask 'seen'", "list"]),
    ({**_columns(), "age": Column("int", AGE[:3])}, SEEN, ["attribute 'age'", "shape (3,)"]),
    ({**_columns(), "age": Column("int", AGE.astype(float))}, SEEN, ["'age'", "float64"]),
    ({**_columns(), "age": AGE}, SEEN, ["'age'", "expected a column"]),
    ({**_columns(), "seen": Column("bool", SEEN["seen"])}, SEEN, ["'seen'", "both"]),
])
def test_bad_masks_and_columns_are_named(columns, masks, fragments):
    with pytest.raises(FilterExpressionError) as info:
        evaluate("age < 7 or seen", columns, masks, 4)
    assert all(f in str(info.value) for f in fragments), str(info.value)


@pytest.mark.parametrize("chunk_rows", [1, 3, 64, 999, 1000, 4096])
def test_chunked_evaluation_equals_unchunked(chunk_rows):
    rng = np.random.default_rng(7)
    n = 1000
    columns = {"a": Column("int", rng.integers(-50, 50, n).astype(np.int16)),
               "f": Column("float", rng.normal(size=n)),
               "c": Column("category", rng.integers(0, 20, n, dtype=np.int32),
                           tuple("abcdefghijklmnopqrst")),
               "b": Column("bool", rng.random(n) < 0.5)}
    masks = {"m": rng.random(n) < 0.3}
    text = ("(a < 10 and f >= -0.5 or c in ('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'zz'))"
            " and not m and (b or a not in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10))")
    whole = evaluate(text, columns, masks, n, chunk_rows=n)
    assert 0 < whole.sum() < n
    np.testing.assert_array_equal(evaluate(text, columns, masks, n, chunk_rows=chunk_rows), whole)


def test_memory_mapped_columns_and_empty_tables(tmp_path):
    path = tmp_path / "age.bin"
    AGE.tofile(path)
    mapped = np.memmap(path, dtype=np.int32, mode="r", shape=(4,))
    assert evaluate("age > 4", {"age": Column("int", mapped)}, None, 4).tolist() == \
        [False, True, True, True]
    empty = {"age": Column("int", np.zeros(0, np.int64))}
    assert evaluate("age > 4 or seen", empty, {"seen": np.zeros(0, bool)}, 0).shape == (0,)


# Columns of plain arrays.

def test_column_of_plain_arrays():
    assert column_of(np.array([True, False]), "b").kind == "bool"
    assert column_of(np.array([1, 2], np.uint16), "i").kind == "int"
    assert column_of(np.array([1.5], np.float32), "f").kind == "float"
    for labels in (np.array(["b", "a", "b", "c"]), np.array(["b", "a", "b", "c"], dtype=object)):
        column = column_of(labels, "cat")
        assert column.kind == "category" and column.categories == ("b", "a", "c")
        assert column.values.dtype == np.uint8 and column.values.tolist() == [0, 1, 0, 2]
    assert column_of(np.array([], dtype=str), "cat").categories == ()


@pytest.mark.parametrize("array, fragment", [
    (np.array([1 + 2j]), "dtype complex128"),
    (np.array(["a", 3], dtype=object), "mixes types (int, str)"),
    (np.zeros((2, 2)), "shape (2, 2)"),
])
def test_column_of_rejects_other_arrays(array, fragment):
    with pytest.raises(AttributeColumnError, match="'tags'") as info:
        column_of(array, "tags")
    assert fragment in str(info.value)


# Numbers are ASCII; literals past a column's dtype compare exactly, silently.

@pytest.mark.parametrize("text, position, char", [
    ("x == \u0661\u0662", 5, "\u0661"),     # Arabic-Indic 12
    ("x < 1\u0662", 5, "\u0662"),           # an ASCII digit then another script's
    ("x in (1, \u0968)", 9, "\u0968"),      # Devanagari 2
    ("x > \uff13", 4, "\uff13"),            # fullwidth 3
    ("x >= 2\u00b2", 6, "\u00b2"),          # superscript 2
    ("x == 1.\u0665", 7, "\u0665"),
])
def test_only_ascii_digits_spell_a_number(text, position, char):
    with pytest.raises(FilterExpressionError) as info:
        parse(text)
    message = str(info.value)
    assert f"digit {char!r}" in message and f"at position {position}" in message, message
    assert "ASCII digits 0-9" in message


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", list(COMPARE))
def test_literals_past_a_float_dtype_compare_exactly_without_a_warning(dtype, op):
    big = float(np.finfo(dtype).max)
    values = np.array([0.0, -big, big, np.inf, -np.inf, np.nan], dtype)
    columns = {"x": Column("float", values)}
    past = [3.4028235e38, big * (1 + 2 ** -30), float(np.nextafter(big, np.inf)), big, 1e308] \
        if dtype == np.float32 else [2 ** 1024, 10 ** 400, big]  # (ints past float64: exact)
    for literal in past + [-v for v in past]:
        text = f"x {op} {literal!r}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (numpy's overflow warning would fail here)
            got = evaluate(text, columns, None, len(values))
            got_in = evaluate(f"x in ({literal!r}, 0.5)", columns, None, len(values))
        want = [COMPARE[op](float(v), literal) if not np.isnan(v) else op == "!="
                for v in values.tolist()]
        assert got.tolist() == want, text
        assert got_in.tolist() == [float(v) in (literal, 0.5) for v in values.tolist()], text


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.uint64])
@pytest.mark.parametrize("op", list(COMPARE))
def test_literals_past_an_int_dtype_compare_exactly_without_a_warning(dtype, op):
    info = np.iinfo(dtype)
    values = np.array([info.min, 0, info.max], dtype)
    for literal in (int(info.max) + 1, int(info.min) - 1, 2 ** 70, -2 ** 70, 1e30, -1e30,
                    float(info.max) + 0.5):
        text = f"x {op} {literal!r}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = evaluate(text, {"x": Column("int", values)}, None, 3)
        assert got.tolist() == [COMPARE[op](int(v), literal) for v in values.tolist()], text


def test_masks_must_be_a_mapping_of_names_to_bool_arrays():
    columns = _columns()
    for masks, fragment in (([SEEN["seen"]], "masks=[array([False"), ("seen", "is a str"),
                            ({("seen",): SEEN["seen"]}, "masks key ('seen',) is a tuple")):
        with pytest.raises(FilterExpressionError, match="mapping|name") as info:
            evaluate("age < 7 and not seen", columns, masks, 4)
        assert fragment in str(info.value) and "ambiguous" not in str(info.value)
