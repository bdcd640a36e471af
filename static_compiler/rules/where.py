"""Filter expressions over item attributes: `subset(where=...)`.

A filter is a boolean expression over named item columns (attributes) and
named per-request item masks, given as text (`filter_text.parse`) or built
in Python (`filter_tree`: `attr`, `item_mask`, ``&``, ``|``, ``~``); it
selects the input rows it is true for. This module evaluates it
(`evaluate`) and gathers the public names.

Semantics are exact comparisons of a row's value with the literal: an int
column against a float literal, or a float32 column against a literal no
float32 equals, compare as the numbers themselves (no rounding of the
literal); NaN compares false except by ``!=`` (and ``not in``). A bool
column (or a mask) is used bare or with ``==``/``!=``/``in`` and booleans; a
category column (integer codes into its categories) only with ``==``, ``!=``,
``in`` and ``not in`` and strings, and a string that is not one of its
categories matches no row. Anything else is a `FilterExpressionError`
naming the position, the attribute and its kind.

`row_filter` checks every name and kind before it reads a value; its
`RowFilter` evaluates the rows a chunk at a time with numpy ufuncs writing
into the output, on threads, so a memory-mapped column of 1e9 rows needs
the (N,) bool output (`evaluate`) and O(chunk) temporaries per thread, or
no (N,) output at all where a subset fills each chunk's item bits
(`item_masks.rows_item_bits`).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from static_compiler.errors import FilterExpressionError
from static_compiler.items.attributes import KINDS, Column, checked_attributes
from static_compiler.rules.filter_text import located, parse  # noqa: F401
from static_compiler.rules.filter_tree import (  # noqa: F401
    COMPARISONS,
    KEYWORDS,
    MAX_NESTING,
    And,
    Compare,
    Expr,
    IsIn,
    Junction,
    Name,
    Not,
    Or,
    attr,
    item_mask,
    literal_text,
    nesting,
)
from static_compiler.support.threads import on_threads

__all__ = ["And", "COMPARISONS", "Column", "Compare", "Expr", "FEW_VALUES", "IsIn", "KEYWORDS",
           "KINDS", "MAX_NESTING", "Name", "Not", "Or", "RowFilter", "attr", "checked_masks",
           "column_of", "evaluate", "item_mask", "names", "nesting", "parse", "row_filter"]

FEW_VALUES = 8
"""An `in` list of at most this many values is evaluated as an or of `==`."""


_UFUNCS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
           ">": np.greater, ">=": np.greater_equal}
_ORDERING = frozenset({"<", "<=", ">", ">="})


def column_of(array, name: str) -> Column:
    """A `Column` of a plain array (N,) by the rules of item attributes
    (`items.attributes.checked_attributes`: bool -> "bool", integer ->
    "int", floating -> "float", str -> "category", categories in the order
    first seen); raises AttributeColumnError naming `name` for anything
    else."""
    rows = np.shape(array)[0] if np.ndim(array) else 0
    return checked_attributes({name: array}, rows, "where")[name]


class _Plan:
    """One leaf as numpy work over a chunk of rows, set up once per
    `evaluate` (literals resolved against the column's dtype and categories):
    `op` is "const", "copy", "not", a ufunc name, "isin" or "lookup"."""

    __slots__ = ("op", "values", "operand")

    def __init__(self, op, values=None, operand=None):
        self.op, self.values, self.operand = op, values, operand


def _constant(result: bool) -> _Plan:
    return _Plan("const", operand=bool(result))


def _clamped_int(values, op: str, number: int) -> _Plan:
    """`values OP number` for an integer column and an integer literal,
    which may lie outside the column's dtype."""
    info = np.iinfo(values.dtype)
    if number > info.max:
        return _constant(op in ("<", "<=", "!="))
    if number < info.min:
        return _constant(op in (">", ">=", "!="))
    return _Plan(op, values, values.dtype.type(number))


def _int_compare(values, op: str, number) -> _Plan:
    """`values OP number` for an integer column, exact for a float literal
    (1.5 -> x < 2, x <= 1; 2.0 -> 2)."""
    if isinstance(number, float):
        if number.is_integer():
            number = int(number)
        elif op == "==":
            return _constant(False)
        elif op == "!=":
            return _constant(True)
        else:
            return _clamped_int(values, {"<": "<=", "<=": "<="}.get(op, ">="),
                                math.floor(number) if op in ("<", "<=") else math.ceil(number))
    return _clamped_int(values, op, number)


def _float_compare(values, op: str, number) -> _Plan:
    """`values OP number` for a floating column, exact: a literal its dtype
    cannot hold compares through its neighbours there (no rounding)."""
    kind = values.dtype.type
    try:
        wide = float(number)
    except OverflowError:  # an int beyond float64
        wide = math.inf if number > 0 else -math.inf
    with np.errstate(over="ignore"):  # past the dtype's max: +-inf, exact, no warning
        nearest = kind(wide)
        if float(nearest) == number:  # Python compares int and float exactly
            return _Plan(op, values, nearest)
        if op in ("==", "!="):
            return _constant(op == "!=")
        if float(nearest) < number:
            below, above = nearest, np.nextafter(nearest, kind(np.inf))
        else:
            below, above = np.nextafter(nearest, kind(-np.inf)), nearest
    return _Plan("<=", values, below) if op in ("<", "<=") else _Plan(">=", values, above)


def _isin_plan(values, codes: list, negated: bool, num_categories: Optional[int] = None
               ) -> _Plan:
    """Rows whose value is one of `codes` (already in the column's dtype):
    an or of equalities for a few (the fastest: 6 ms for 3 at 1e7), a
    lookup table over a category's codes or `np.isin` for more."""
    codes = sorted(set(codes))
    if not codes:
        plan = _constant(False)
    elif len(codes) == 1:
        plan = _Plan("==", values, codes[0])
    elif len(codes) <= FEW_VALUES:
        plan = _Plan("or", operand=[_Plan("==", values, code) for code in codes])
    elif num_categories is not None:
        table = np.zeros(num_categories, bool)
        table[codes] = True
        plan = _Plan("lookup", values, table)
    else:
        plan = _Plan("isin", values, np.array(codes, dtype=values.dtype))
    return _Plan("not", operand=plan) if negated else plan


def _exact_codes(values, kind: str, literals) -> list:
    """The literals an `in` list holds that a value of this numeric column
    can equal, in the column's dtype."""
    codes = []
    for number in literals:
        plan = (_int_compare if kind == "int" else _float_compare)(values, "==", number)
        if plan.op == "==":
            codes.append(plan.operand)
    return codes


class _Checker:
    """Resolves a parsed tree against the columns and masks: names, kinds
    and literals are checked, and each leaf becomes a `_Plan`."""

    def __init__(self, text: str, columns: Mapping, masks: Mapping, num_rows: int):
        self.text, self.columns, self.masks, self.num_rows = text, columns, masks, num_rows

    def fail(self, node, detail: str, what: str = "") -> FilterExpressionError:
        if not what:
            what = (f"attribute {node.name!r} ({self.columns[node.name].kind})"
                    if node.name in self.columns else f"mask {node.name!r} (bool)")
        return located(self.text, node.position or 0, what, detail)

    def column(self, node) -> Column:
        """The column (a mask as a bool column) `node` names."""
        name = node.name
        if name in self.columns and name in self.masks:
            raise self.fail(node, " is both an attribute and a mask", f"name {name!r}")
        if name in self.masks:  # (checked: `checked_masks`)
            return Column("bool", self.masks[name])
        if name not in self.columns:
            listed = ", ".join(sorted(self.columns)) or "none"
            raise self.fail(node, f" (attributes: {listed}; masks: "
                                  f"{', '.join(sorted(self.masks)) or 'none'})",
                            f"unknown attribute {name!r}")
        _check_column(name, self.columns[name], self.num_rows)  # dtype and shape, no values
        return self.columns[name]

    def plan(self, node) -> _Plan:
        if isinstance(node, Not):
            return _Plan("not", operand=self.plan(node.operand))
        if isinstance(node, Junction):
            return _Plan(node.word, operand=[self.plan(o) for o in node.operands])
        column = self.column(node)
        kind, values = column.kind, column.values
        if isinstance(node, Name):
            if kind != "bool":
                raise self.fail(node, f" is not bool: compare it (e.g. {node.name} == ...) to "
                                      "use it as a condition")
            return _Plan("copy", values)
        literals = (node.value,) if isinstance(node, Compare) else node.values
        op = node.op if isinstance(node, Compare) else "in"
        self.check_literals(node, kind, op, literals)
        if isinstance(node, Compare):
            if kind == "int":
                return _int_compare(values, op, node.value)
            if kind == "float":
                return _float_compare(values, op, node.value)
            if kind == "bool":
                return _Plan(op, values, np.bool_(node.value))
            code = _category_code(column, node.value)
            return _constant(op == "!=") if code is None else _Plan(op, values, code)
        if kind == "category":
            codes = [_category_code(column, v) for v in node.values]
            return _isin_plan(values, [c for c in codes if c is not None], node.negated,
                              len(column.categories))
        if kind == "bool":
            return _isin_plan(values, [np.bool_(v) for v in node.values], node.negated)
        return _isin_plan(values, _exact_codes(values, kind, node.values), node.negated)

    def check_literals(self, node, kind: str, op: str, literals) -> None:
        if kind == "category":
            if op in _ORDERING:
                raise self.fail(node, f": only ==, !=, in and not in apply to a category, "
                                      f"not {op!r}")
            expected, fits = "a string", (lambda v: isinstance(v, str))
        elif kind == "bool":
            if op in _ORDERING:
                raise self.fail(node, f": only ==, !=, in, not in and bare use apply to a bool, "
                                      f"not {op!r}")
            expected, fits = "true or false", (lambda v: isinstance(v, bool))
        else:
            expected = "a number"
            fits = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        for value in literals:
            if not fits(value):
                raise self.fail(node, f": compared with {literal_text(value)}, expected "
                                      f"{expected}")


def _category_code(column, label: str):
    """The code of category `label` in the codes' dtype (a wider scalar
    would widen every chunk of a uint8 column), or None when no row can
    hold it."""
    try:
        return column.values.dtype.type(column.categories.index(label))
    except ValueError:
        return None


def _check_column(name: str, column, num_rows: int) -> None:
    kind = getattr(column, "kind", None)
    values = getattr(column, "values", None)
    if kind not in KINDS or not isinstance(values, np.ndarray):
        raise FilterExpressionError(f"where: attribute {name!r} is {type(column).__name__}: "
                                    "expected a column (kind in int, float, bool, category and "
                                    "values, a numpy array)")
    wanted = {"int": "iu", "float": "f", "bool": "b", "category": "iu"}[kind]
    if values.dtype.kind not in wanted:
        raise FilterExpressionError(f"where: attribute {name!r} of kind {kind} has dtype "
                                    f"{values.dtype}")
    if values.shape != (num_rows,):
        raise FilterExpressionError(f"where: attribute {name!r} has shape {values.shape}: "
                                    f"expected one value per row, ({num_rows},)")
    if kind == "category" and not (isinstance(column.categories, tuple)
                                   and all(isinstance(c, str) for c in column.categories)):
        raise FilterExpressionError(f"where: category attribute {name!r} has categories "
                                    f"{column.categories!r}: expected a tuple of str")


def checked_masks(masks, num_rows: int, where: str = "where") -> dict:
    """`masks` (None, or a mapping of mask names to bool (num_rows,) numpy
    arrays over the input rows) as a dict; FilterExpressionError naming
    `where` and the value for anything else (a list of masks, a name that
    is not a str, a mask of another dtype or length). Every door's filter
    enters here (`row_filter`), before a name is looked up."""
    if masks is None:
        return {}
    if not isinstance(masks, Mapping):
        shown = repr(masks)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise FilterExpressionError(f"{where}: masks={shown} is a {type(masks).__name__}: "
                                    f"expected a mapping of names to bool arrays ({num_rows},) "
                                    "over the input rows, e.g. masks={'seen': seen}")
    for name, selection in masks.items():
        if not isinstance(name, str):
            raise FilterExpressionError(f"{where}: masks key {name!r} is a {type(name).__name__}: "
                                        "expected the mask's name (a str the filter reads)")
        _check_mask(name, selection, num_rows)
    return dict(masks)


def _check_mask(name: str, selection, num_rows: int) -> None:
    if not isinstance(selection, np.ndarray) or selection.dtype != bool \
            or selection.shape != (num_rows,):
        described = (f"dtype {selection.dtype} and shape {selection.shape}"
                     if isinstance(selection, np.ndarray) else type(selection).__name__)
        raise FilterExpressionError(f"where: mask {name!r} has {described}: expected a bool "
                                    f"mask of shape ({num_rows},) over the rows")


def _run(plan: _Plan, lo: int, hi: int, out: np.ndarray, scratch: list, depth: int) -> None:
    """Writes `plan`'s result for rows [lo, hi) into `out` (bool (hi-lo,));
    scratch[depth:] are bool buffers of at least the chunk's length."""
    op = plan.op
    if op == "const":
        out.fill(plan.operand)
    elif op == "copy":
        np.copyto(out, plan.values[lo:hi])
    elif op == "not":
        _run(plan.operand, lo, hi, out, scratch, depth)
        np.logical_not(out, out=out)
    elif op in ("and", "or"):
        combine = np.logical_and if op == "and" else np.logical_or
        first, *rest = plan.operand
        _run(first, lo, hi, out, scratch, depth)
        if depth == len(scratch):
            scratch.append(np.empty(len(out), bool))
        other = scratch[depth][:len(out)]
        for operand in rest:
            _run(operand, lo, hi, other, scratch, depth + 1)
            combine(out, other, out=out)
    elif op == "lookup":
        np.take(plan.operand, plan.values[lo:hi], out=out)
    elif op == "isin":
        out[...] = np.isin(plan.values[lo:hi], plan.operand)
    else:
        _UFUNCS[op](plan.values[lo:hi], plan.operand, out=out)


class RowFilter:
    """A checked filter expression over N rows, ready to evaluate any range
    of them (`fill`) or all (`evaluate`), made by `row_filter`.

    A subset of a filter (`SetView.pick`) fills one chunk of rows at a time
    straight into the chunk's item bits (`item_masks.rows_item_bits`, which
    takes it as an `item_masks.RowSource`), so no bool (N,) mask is made:
    1 GB of fresh pages at 1e9 rows.
    """

    def __init__(self, plan: _Plan, num_rows: int, chunk_rows: int):
        self.plan, self.num_rows, self.chunk_rows = plan, num_rows, chunk_rows

    def fill(self, lo: int, hi: int, out: np.ndarray, scratch: Optional[list] = None) -> None:
        """Writes the expression for rows [lo, hi) into `out` (bool
        (hi - lo,)), `chunk_rows` at a time; `scratch` (a list, kept by the
        caller across calls of one thread) holds the temporaries."""
        scratch = [] if scratch is None else scratch
        for a in range(lo, hi, self.chunk_rows):
            b = min(a + self.chunk_rows, hi)
            _run(self.plan, a, b, out[a - lo:b - lo], scratch, 0)

    def evaluate(self) -> np.ndarray:
        """bool (N,): the expression for every row, chunks on threads (the
        ufuncs release the GIL; each thread writes rows of its own)."""
        out = np.empty(self.num_rows, bool)
        step = self.chunk_rows
        ranges = [(a, min(a + step, self.num_rows)) for a in range(0, self.num_rows, step)]

        def one_share(share) -> None:
            scratch: list = []  # (this thread's temporaries)
            for lo, hi in share:
                self.fill(lo, hi, out[lo:hi], scratch)

        on_threads(ranges, one_share)
        return out


def row_filter(expr, columns: Mapping, masks: Optional[Mapping] = None, num_rows: int = 0, *,
               chunk_rows: int = 1 << 22) -> RowFilter:
    """`expr` checked against the columns and masks, as a `RowFilter`;
    takes and raises what `evaluate` does, reads no value."""
    if isinstance(expr, str):
        text = expr
    elif isinstance(expr, Expr):
        text = str(expr)  # parsed again below: positions in the canonical text
    else:
        raise FilterExpressionError(f"where: {type(expr).__name__} {expr!r}: expected the text "
                                    "of a filter expression or an Expr")
    num_rows = int(num_rows)
    if num_rows < 0 or int(chunk_rows) < 1:
        raise FilterExpressionError(f"where: num_rows {num_rows} and chunk_rows {chunk_rows}: "
                                    "expected num_rows >= 0 and chunk_rows >= 1")
    masks = checked_masks(masks, num_rows)
    plan = _Checker(text, columns, masks, num_rows).plan(parse(text))
    return RowFilter(plan, num_rows, int(chunk_rows))


def evaluate(expr, columns: Mapping, masks: Optional[Mapping] = None, num_rows: int = 0, *,
             chunk_rows: int = 1 << 22) -> np.ndarray:
    """The rows a filter expression selects (`row_filter(...).evaluate()`).

    Parameters
    ----------
    expr : Expr or str
        the expression, or its text (`parse`).
    columns : mapping of str to Column
        the attributes by name: objects with ``kind``, ``values`` (N,) and
        ``categories`` (see `Column`).
    masks : mapping of str to bool array (N,), optional
        per-request item masks by name (e.g. ``seen``).
    num_rows : int
        N, the rows every column and mask has.
    chunk_rows : int
        rows evaluated at a time (the temporaries' size), chunks on up to
        `support.threads.THREADS` threads.

    Returns
    -------
    bool array (N,)
        True where the expression holds.

    Raises
    ------
    FilterExpressionError
        the text does not parse; a name is neither an attribute nor a mask;
        a comparison does not fit its column's kind (the message names the
        position, the attribute and its kind); masks is not a mapping of
        names to bool (N,) arrays (`checked_masks`); a column's values are
        not (N,); the expression nests deeper than MAX_NESTING.

    Examples
    --------
    >>> age = column_of(np.array([3, 9, 5]), "age")
    >>> evaluate("age < 6 and not seen", {"age": age},
    ...          {"seen": np.array([False, False, True])}, 3).tolist()
    [True, False, False]
    """
    return row_filter(expr, columns, masks, num_rows, chunk_rows=chunk_rows).evaluate()


def names(expr) -> frozenset:
    """The attribute and mask names `expr` (an Expr or its text) reads."""
    tree = parse(expr) if isinstance(expr, str) else expr
    if isinstance(tree, Junction):
        return frozenset().union(*map(names, tree.operands))
    if isinstance(tree, Not):
        return names(tree.operand)
    if isinstance(tree, (Name, Compare, IsIn)):
        return frozenset({tree.name})
    raise FilterExpressionError(f"where: {tree!r} is not a filter expression")
