"""Filter expressions over item attributes: `subset(where=...)`.

A filter is a boolean expression over named item columns (attributes) and
named per-request item masks, given as text or built in Python; it selects
the input rows it is true for.

Text (a hand-written tokenizer and recursive-descent parser; never eval)::

    expr  := conj ('or' conj)*
    conj  := neg ('and' neg)*
    neg   := 'not' neg | atom
    atom  := '(' expr ')' | name | name OP literal | literal OP name
           | name 'in' list | name 'not' 'in' list
    list  := '(' [literal (',' literal)* [',']] ')'
    OP    := '==' | '!=' | '<' | '<=' | '>' | '>='

Names are ``[A-Za-z_][A-Za-z0-9_]*`` (not a keyword); literals are integers
(``7``, ``-3``), floats (``1.5``, ``-2e3``, ``.5``), strings in single or
double quotes (``\\'``, ``\\"`` and ``\\\\`` escape) and ``true``/``false``
(also ``True``/``False``). Keywords are lower-case; ``not`` binds tighter
than ``and``, which binds tighter than ``or``.

Python: ``(attr("age") < 7) & attr("category").isin(["a", "b"]) &
~item_mask("seen")``, with ``&``, ``|`` and ``~`` (parenthesize comparisons:
``&`` binds tighter than ``<`` in Python). ``str(expr)`` prints the
canonical text, which parses to an equal expression.

Semantics are exact comparisons of a row's value with the literal: an int
column against a float literal, or a float32 column against a literal no
float32 equals, compare as the numbers themselves (no rounding of the
literal); NaN compares false except by ``!=`` (and ``not in``). A bool
column (or a mask) is used bare or with ``==``/``!=``/``in`` and booleans; a
category column (int32 codes into its categories) only with ``==``, ``!=``,
``in`` and ``not in`` and strings, and a string that is not one of its
categories matches no row. Anything else is a `FilterExpressionError`
naming the position, the attribute and its kind.

`evaluate` checks every name and kind before it reads a value, then
evaluates the rows a chunk at a time with numpy ufuncs writing into the
output, so a memory-mapped column of 1e9 rows needs the (N,) bool output
and O(chunk) temporaries.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping, Optional, Union

import numpy as np

from static_compiler.frontend.attributes import Column, checked_attributes  # noqa: F401
from static_compiler.errors import FilterExpressionError

KINDS = ("int", "float", "bool", "category")
"""The kinds of column a filter reads."""
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
"""The comparison operators, as written."""
KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false", "True", "False"})
"""Words that are not names."""
MAX_NESTING = 200
"""Nested parentheses and `not`s a text may have (the parser recurses)."""
FEW_VALUES = 8
"""An `in` list of at most this many values is evaluated as an or of `==`."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_UFUNCS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
           ">": np.greater, ">=": np.greater_equal}
_ORDERING = frozenset({"<", "<=", ">", ">="})

Literal = Union[bool, int, float, str]


# Columns: `frontend.attributes.Column` (kind, values (N,), categories).

def column_of(array, name: str) -> Column:
    """A `Column` of a plain array (N,) by the rules of item attributes
    (`frontend.attributes.checked_attributes`: bool -> "bool", integer ->
    "int", floating -> "float", str -> "category", categories in the order
    first seen); raises AttributeColumnError naming `name` for anything
    else."""
    rows = np.shape(array)[0] if np.ndim(array) else 0
    return checked_attributes({name: array}, rows, "where")[name]


# The expression tree.

def _literal(value) -> Literal:
    """`value` as a plain Python literal (numpy scalars unwrapped); raises
    FilterExpressionError for another type or a non-finite float."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FilterExpressionError(f"where: literal {value!r} is not finite: compare with a "
                                        "finite number")
        return value
    raise FilterExpressionError(f"where: literal {value!r} of type {type(value).__name__}: "
                                "expected a bool, int, float or str")


def _literal_key(value: Literal) -> tuple:
    """`value` with its type, so that 1, 1.0 and True are told apart."""
    return type(value).__name__, value


def _literal_text(value: Literal) -> str:
    """The canonical text of a literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _check_name(name) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in KEYWORDS:
        raise FilterExpressionError(f"where: {name!r} is not a name: expected letters, digits and "
                                    "'_' not starting with a digit, and not a keyword")
    return name


class Expr:
    """A filter expression: a node of the tree `parse` returns.

    Nodes are frozen and compare (and hash) by structure and literal types;
    ``&``, ``|`` and ``~`` combine them, ``str`` prints the canonical text.
    A node's ``position`` (where `parse` found it; None when built in
    Python) takes no part in equality.
    """

    __slots__ = ()

    def _key(self) -> tuple:
        raise NotImplementedError

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self):
        return hash((type(self).__name__, self._key()))

    def __and__(self, other):
        if not isinstance(other, Expr):
            return NotImplemented
        return And((*self.operands, other) if isinstance(self, And) else (self, other))

    def __or__(self, other):
        if not isinstance(other, Expr):
            return NotImplemented
        return Or((*self.operands, other) if isinstance(self, Or) else (self, other))

    def __invert__(self):
        return Not(self)

    def __bool__(self):
        raise FilterExpressionError("where: a filter expression has no truth value: combine "
                                    "expressions with &, | and ~ (not and/or/not)")

    def __repr__(self):
        return f"parse({str(self)!r})"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Name(Expr):
    """A bool column or a per-request mask used as a condition; built by
    `attr` or `item_mask`, it also builds comparisons (``attr("age") < 7``,
    ``attr("category") == "news"``, ``attr("category").isin([...])``).

    Attributes
    ----------
    name : str
        the attribute's or the mask's name.
    position : int or None
        its character offset in the parsed text.
    """

    name: str
    position: Optional[int] = None

    def __post_init__(self):
        _check_name(self.name)

    def _key(self):
        return (self.name,)

    def __str__(self):
        return self.name

    def _compare(self, op: str, value) -> "Compare":
        return Compare(self.name, op, value)

    def __eq__(self, other):
        if isinstance(other, Expr):
            return Expr.__eq__(self, other)
        return self._compare("==", other)

    def __ne__(self, other):
        if isinstance(other, Expr):
            return Expr.__ne__(self, other)
        return self._compare("!=", other)

    __hash__ = Expr.__hash__

    def __lt__(self, other):
        return self._compare("<", other)

    def __le__(self, other):
        return self._compare("<=", other)

    def __gt__(self, other):
        return self._compare(">", other)

    def __ge__(self, other):
        return self._compare(">=", other)

    def isin(self, values) -> "IsIn":
        """The rows whose value is one of `values` (literals)."""
        return IsIn(self.name, values)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Compare(Expr):
    """``name OP value``: an attribute compared with a literal.

    Attributes
    ----------
    name : str
        the attribute (or mask).
    op : str
        one of ``COMPARISONS``.
    value : bool, int, float or str
        the literal.
    position : int or None
        the name's character offset in the parsed text.
    """

    name: str
    op: str
    value: Literal
    position: Optional[int] = None

    def __post_init__(self):
        _check_name(self.name)
        if self.op not in COMPARISONS:
            raise FilterExpressionError(f"where: comparison {self.op!r}: expected one of "
                                        f"{', '.join(COMPARISONS)}")
        object.__setattr__(self, "value", _literal(self.value))

    def _key(self):
        return self.name, self.op, _literal_key(self.value)

    def __str__(self):
        return f"{self.name} {self.op} {_literal_text(self.value)}"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class IsIn(Expr):
    """``name in (values)`` (``name not in (values)`` when `negated`).

    Attributes
    ----------
    name : str
        the attribute (or mask).
    values : tuple of bool, int, float or str
        the literals.
    negated : bool
        whether the rows are those whose value is none of `values`.
    position : int or None
        the name's character offset in the parsed text.
    """

    name: str
    values: tuple
    negated: bool = False
    position: Optional[int] = None

    def __post_init__(self):
        _check_name(self.name)
        if isinstance(self.values, (str, bytes)) or not hasattr(self.values, "__iter__"):
            raise FilterExpressionError(f"where: {self.name} in {self.values!r}: expected a "
                                        "sequence of literals")
        object.__setattr__(self, "values", tuple(_literal(v) for v in self.values))
        object.__setattr__(self, "negated", bool(self.negated))

    def _key(self):
        return self.name, tuple(map(_literal_key, self.values)), self.negated

    def __str__(self):
        items = ", ".join(map(_literal_text, self.values))
        listed = f"({items},)" if len(self.values) == 1 else f"({items})"
        return f"{self.name} {'not in' if self.negated else 'in'} {listed}"


def _operand_text(operand: Expr, parenthesized: tuple) -> str:
    text = str(operand)
    return f"({text})" if isinstance(operand, parenthesized) else text


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Not(Expr):
    """``not operand``.

    Attributes
    ----------
    operand : Expr
        the negated expression.
    """

    operand: Expr

    def __post_init__(self):
        if not isinstance(self.operand, Expr):
            raise FilterExpressionError(f"where: not {self.operand!r}: expected an expression")

    def _key(self):
        return (self.operand,)

    def __str__(self):
        return "not " + _operand_text(self.operand, (And, Or))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class _Junction(Expr):
    """Two or more operands joined by one word (`And`, `Or`).

    Attributes
    ----------
    operands : tuple of Expr
        two or more expressions.
    """

    operands: tuple
    word = ""  # a class attribute, not a field

    def __post_init__(self):
        operands = tuple(self.operands)
        if len(operands) < 2 or not all(isinstance(o, Expr) for o in operands):
            raise FilterExpressionError(f"where: '{self.word}' of {operands!r}: expected two "
                                        "or more expressions")
        object.__setattr__(self, "operands", operands)

    def _key(self):
        return self.operands

    def __str__(self):
        grouped = (And, Or) if isinstance(self, And) else (Or,)  # kept apart in the text
        return f" {self.word} ".join(_operand_text(o, grouped) for o in self.operands)


class And(_Junction):
    """``a and b and ...``: the rows every operand (`operands`) selects."""

    word = "and"


class Or(_Junction):
    """``a or b or ...``: the rows some operand (`operands`) selects."""

    word = "or"


def attr(name: str) -> Name:
    """An item attribute in a filter expression built in Python.

    Parameters
    ----------
    name : str
        the attribute's name.

    Returns
    -------
    Name
        compare it (``attr("age") < 7``, ``attr("category").isin(["a"])``)
        or, for a bool attribute, use it as a condition; combine with ``&``,
        ``|`` and ``~``.

    Raises
    ------
    FilterExpressionError
        `name` is not a name (letters, digits, ``_``; not a keyword).

    Examples
    --------
    >>> str((attr("age") < 7) & attr("category").isin(["news"]))
    "age < 7 and category in ('news',)"
    """
    return Name(name)


def item_mask(name: str) -> Name:
    """A named per-request item mask (e.g. ``seen``) in a filter expression.

    Parameters
    ----------
    name : str
        the mask's name; its bool (N,) values are passed with the request
        (``masks={"seen": ...}``).

    Returns
    -------
    Name
        a condition, true on the rows the mask holds.

    Raises
    ------
    FilterExpressionError
        `name` is not a name (letters, digits, ``_``; not a keyword).

    Examples
    --------
    >>> str(attr("in_stock") & ~item_mask("seen"))
    'in_stock and not seen'
    """
    return Name(name)


def names(expr) -> frozenset:
    """The attribute and mask names `expr` (an Expr or its text) reads."""
    tree = parse(expr) if isinstance(expr, str) else expr
    if isinstance(tree, _Junction):
        return frozenset().union(*map(names, tree.operands))
    if isinstance(tree, Not):
        return names(tree.operand)
    if isinstance(tree, (Name, Compare, IsIn)):
        return frozenset({tree.name})
    raise FilterExpressionError(f"where: {tree!r} is not a filter expression")


# Text -> tree.

def _located(text: str, position: int, what: str, detail: str = "") -> FilterExpressionError:
    """The error "`what` at position P`detail`" for `position` of `text`: one
    line with the position, the text and what remains of it there."""
    rest = text[position:]
    if not rest.strip():
        where = "at its end"
    else:
        where = "at " + repr(rest if len(rest) <= 40 else rest[:37] + "...")
    return FilterExpressionError(f"where: {what} at position {position}{detail}; in {text!r} "
                                 f"{where}")


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # "name", "keyword", "number", "string", "op", "(", ")", ",", "end"
    text: str
    value: object
    position: int


def _string_token(text: str, start: int) -> tuple:
    """(the string literal opening at `start`, the offset after it)."""
    quote, chars, i = text[start], [], start + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            return "".join(chars), i + 1
        if c == "\\":
            escaped = text[i + 1:i + 2]
            if escaped not in ("\\", "'", '"'):
                raise _located(text, i, f"unknown escape '\\{escaped}'",
                               ": only \\\\, \\' and \\\" escape in a string")
            chars.append(escaped)
            i += 2
            continue
        chars.append(c)
        i += 1
    raise _located(text, start, "unterminated string", f" (no closing {quote})")


def _number_token(text: str, start: int, match) -> tuple:
    """(the number literal `match` spells, the offset after it)."""
    spelled = match.group()
    if re.fullmatch(r"[+-]?\d+", spelled):
        try:
            return int(spelled), match.end()
        except ValueError:  # over Python's digit limit
            raise _located(text, start, "integer literal", " is too long") from None
    value = float(spelled)
    if not math.isfinite(value):
        raise _located(text, start, f"number {spelled}", " is out of the float range")
    return value, match.end()


def _tokens(text: str) -> list:
    tokens, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            tokens.append(_Token("end", "", None, i))
            return tokens
        c = text[i]
        number = _NUMBER.match(text, i)
        if number:
            value, end = _number_token(text, i, number)
            tokens.append(_Token("number", number.group(), value, i))
        elif c in "'\"":
            value, end = _string_token(text, i)
            tokens.append(_Token("string", text[i:end], value, i))
        elif (name := _NAME.match(text, i)):
            word, end = name.group(), name.end()
            tokens.append(_Token("keyword" if word in KEYWORDS else "name", word, word, i))
        elif text.startswith(("==", "!=", "<=", ">="), i):
            end = i + 2
            tokens.append(_Token("op", text[i:end], text[i:end], i))
        elif c in "<>":
            end = i + 1
            tokens.append(_Token("op", c, c, i))
        elif c in "(),":
            end = i + 1
            tokens.append(_Token(c, c, c, i))
        elif c in "=!":
            raise _located(text, i, f"unexpected {c!r}",
                           ": expected a comparison (==, !=, <, <=, >, >=)")
        else:
            raise _located(text, i, f"unexpected character {c!r}")
        i = end


_LITERAL_WORDS = {"true": True, "True": True, "false": False, "False": False}
_EXPECTED_CONDITION = "a comparison, a name, 'not' or '('"


class _Parser:
    """Recursive descent over `_tokens(text)`; one method per rule."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.depth = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.at += 1
        return token

    def is_word(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "keyword" and token.text == word

    def fail(self, token: _Token, expected: str) -> FilterExpressionError:
        found = "end of the expression" if token.kind == "end" else repr(token.text)
        return _located(self.text, token.position, f"unexpected {found}", f": expected {expected}")

    def parse(self) -> Expr:
        if self.peek().kind == "end":
            raise _located(self.text, self.peek().position, "empty expression",
                           f": expected {_EXPECTED_CONDITION}")
        tree = self.disjunction()
        if self.peek().kind != "end":
            raise self.fail(self.peek(), "'and', 'or' or the end of the expression")
        return tree

    def disjunction(self) -> Expr:
        operands = [self.conjunction()]
        while self.is_word("or"):
            self.take()
            operands.append(self.conjunction())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def conjunction(self) -> Expr:
        operands = [self.negation()]
        while self.is_word("and"):
            self.take()
            operands.append(self.negation())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def nested(self, token: _Token):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _located(self.text, token.position,
                           f"expression nested more than {MAX_NESTING} deep")

    def negation(self) -> Expr:
        if self.is_word("not"):
            self.nested(self.take())
            operand = self.negation()
            self.depth -= 1
            return Not(operand)
        return self.atom()

    def atom(self) -> Expr:
        token = self.peek()
        if token.kind == "(":
            self.nested(self.take())
            tree = self.disjunction()
            if self.peek().kind != ")":
                raise self.fail(self.peek(), f"')' closing the '(' at position {token.position}")
            self.take()
            self.depth -= 1
            return tree
        if token.kind == "name":
            return self.after_name(self.take())
        if self.literal_ahead():
            value = self.literal("a literal")
            op = self.take()
            if op.kind != "op":
                raise self.fail(op, f"a comparison (==, !=, <, <=, >, >=) after {token.text}")
            name = self.take()
            if name.kind != "name":
                raise self.fail(name, f"an attribute name after {token.text} {op.text}")
            return Compare(name.text, _FLIPPED[op.text], value, name.position)
        raise self.fail(token, _EXPECTED_CONDITION)

    def literal_ahead(self) -> bool:
        token = self.peek()
        return token.kind in ("number", "string") or (token.kind == "keyword"
                                                      and token.text in _LITERAL_WORDS)

    def literal(self, expected: str) -> Literal:
        if not self.literal_ahead():
            raise self.fail(self.peek(), expected)
        token = self.take()
        return _LITERAL_WORDS[token.text] if token.kind == "keyword" else token.value

    def after_name(self, name: _Token) -> Expr:
        token = self.peek()
        if token.kind == "op":
            self.take()
            value = self.literal(f"a literal (number, string, true or false) after "
                                 f"'{name.text} {token.text}'")
            return Compare(name.text, token.text, value, name.position)
        if self.is_word("in"):
            self.take()
            return IsIn(name.text, self.listed(name), False, name.position)
        if self.is_word("not"):
            self.take()
            if not self.is_word("in"):
                raise self.fail(self.peek(), f"'in' after '{name.text} not'")
            self.take()
            return IsIn(name.text, self.listed(name), True, name.position)
        return Name(name.text, name.position)

    def listed(self, name: _Token) -> tuple:
        if self.peek().kind != "(":
            raise self.fail(self.peek(), f"'(' opening the list of values of {name.text!r}")
        self.take()
        values = []
        while self.peek().kind != ")":
            values.append(self.literal("a literal or ')' in the list of values"))
            if self.peek().kind == ",":
                self.take()
            elif self.peek().kind != ")":
                raise self.fail(self.peek(), "',' or ')' in the list of values")
        self.take()
        return tuple(values)


def parse(text: str) -> Expr:
    """The expression tree of a filter's text.

    Parameters
    ----------
    text : str
        e.g. ``"age <= 7 and category in ('news', 'sport') and not seen"``.

    Returns
    -------
    Expr
        its tree; ``str`` of it is the canonical text, which parses to an
        equal tree.

    Raises
    ------
    FilterExpressionError
        the text does not parse; the message names the position (a
        character offset), what was expected and what was found.

    Examples
    --------
    >>> str(parse("not a or b == 1 and c in ('x')"))
    "not a or b == 1 and c in ('x',)"
    """
    if not isinstance(text, str):
        raise FilterExpressionError(f"where: {type(text).__name__} {text!r}: expected the text "
                                    "of a filter expression or an Expr")
    return _Parser(text).parse()


# Tree -> rows.

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
        wide = math.copysign(math.inf, number)
    with np.errstate(over="ignore"):
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
        return _located(self.text, node.position or 0, what, detail)

    def column(self, node) -> Column:
        """The column (a mask as a bool column) `node` names."""
        name = node.name
        if name in self.columns and name in self.masks:
            raise self.fail(node, " is both an attribute and a mask", f"name {name!r}")
        if name in self.masks:
            _check_mask(name, self.masks[name], self.num_rows)
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
        if isinstance(node, _Junction):
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
                raise self.fail(node, f": compared with {_literal_text(value)}, expected "
                                      f"{expected}")


def _category_code(column, label: str):
    """The code of category `label`, or None when no row can hold it."""
    try:
        return np.int32(column.categories.index(label))
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


def evaluate(expr, columns: Mapping, masks: Optional[Mapping] = None, num_rows: int = 0, *,
             chunk_rows: int = 1 << 22) -> np.ndarray:
    """The rows a filter expression selects.

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
        rows evaluated at a time (the temporaries' size).

    Returns
    -------
    bool array (N,)
        True where the expression holds.

    Raises
    ------
    FilterExpressionError
        the text does not parse; a name is neither an attribute nor a mask;
        a comparison does not fit its column's kind (the message names the
        position, the attribute and its kind); a mask is not bool (N,); a
        column's values are not (N,).

    Examples
    --------
    >>> age = column_of(np.array([3, 9, 5]), "age")
    >>> evaluate("age < 6 and not seen", {"age": age},
    ...          {"seen": np.array([False, False, True])}, 3).tolist()
    [True, False, False]
    """
    masks = {} if masks is None else masks
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
    plan = _Checker(text, columns, masks, num_rows).plan(parse(text))
    for name, selection in masks.items():
        _check_mask(name, selection, num_rows)
    out = np.empty(num_rows, bool)
    scratch = []
    for lo in range(0, num_rows, int(chunk_rows)):
        hi = min(lo + int(chunk_rows), num_rows)
        _run(plan, lo, hi, out[lo:hi], scratch, 0)
    return out
