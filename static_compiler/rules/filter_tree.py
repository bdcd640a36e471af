"""Filter expressions as trees (`rules.where`'s nodes): frozen nodes that
compare by structure and literal types (1, 1.0 and True differ) and print
as canonical text that `filter_text.parse` reads back.

Python: ``(attr("age") < 7) & attr("category").isin(["a", "b"]) &
~item_mask("seen")``, with ``&``, ``|`` and ``~`` (parenthesize comparisons:
``&`` binds tighter than ``<`` in Python). ``str(expr)`` prints the
canonical text, which parses to an equal expression.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional, Union

import numpy as np

from static_compiler.errors import FilterExpressionError
from static_compiler.items.attributes import RESERVED_NAMES

COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
"""The comparison operators, as written."""
KEYWORDS = RESERVED_NAMES
"""Words that are not names (no attribute may take one either)."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A name: an attribute's or a mask's."""

Literal = Union[bool, int, float, str]

MAX_NESTING = 200
"""How deeply an expression may nest: the `not`s and junctions (and, or)
along its deepest path from the root to a leaf (`nesting`; a text's
redundant parentheses count too, as the parser reads them). One limit for
a parsed text and for a tree built in Python (each `Not` and junction
checks it when built), so that printing, comparing, parsing back and
evaluating an expression never run out of stack."""


def nesting(expr: "Expr") -> int:
    """The `not`s and junctions along `expr`'s deepest path (0 for a leaf;
    ``a or (b and not c)``: 3). Recorded on each node when it is built."""
    return getattr(expr, "_nesting", 0)


def _set_nesting(node: "Expr", depth: int) -> None:
    """Records `node`'s nesting, or raises FilterExpressionError naming the
    depth and `MAX_NESTING`."""
    if depth > MAX_NESTING:
        raise FilterExpressionError(f"where: expression nested {depth} deep ('not's, 'and's and "
                                    f"'or's inside one another): at most {MAX_NESTING}; "
                                    "build it flatter (a & b & c is one 'and')")
    object.__setattr__(node, "_nesting", depth)


def _literal(value) -> Literal:
    """`value` as a plain Python literal (numpy scalars unwrapped); raises
    FilterExpressionError for another type, a non-finite float or a string
    with a NUL character (no category holds one: `attributes`)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str) and "\0" in value:
        raise FilterExpressionError(f"where: literal {value!r} holds a NUL character: category "
                                    "values hold none (they are refused when given)")
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FilterExpressionError(f"where: literal {value!r} is not finite: compare with a "
                                        "finite number")
        return value
    raise FilterExpressionError(f"where: literal {value!r} of type {type(value).__name__}: "
                                "expected a bool, int, float or str")


def _typed(value):
    """A node's field for equality: a literal with its type (so that 1,
    1.0 and True are told apart), a tuple field by field, a node as it is."""
    if isinstance(value, tuple):
        return tuple(map(_typed, value))
    return value if isinstance(value, Expr) else (type(value).__name__, value)


def literal_text(value: Literal) -> str:
    """The canonical text of a literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _check_name(name) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in KEYWORDS:
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
        """What equality compares: the node's fields but `position`, each
        literal with its type; a `Not`'s or junction's is flat, its
        operands' keys between markers, made once when it is built (so
        comparing and hashing a deep tree does not recurse)."""
        flat = getattr(self, "_flat", None)
        if flat is not None:
            return flat
        return tuple(_typed(getattr(self, f.name)) for f in dataclasses.fields(self)
                     if f.name != "position")

    def _set_key(self, operands) -> None:
        """Records the flat key of a node over `operands` (`_key`)."""
        key = [type(self).__name__, "("]
        for operand in operands:
            flat = getattr(operand, "_flat", None)
            key.extend(flat) if flat is not None else \
                key.append((type(operand).__name__,) + operand._key())
        key.append(")")
        object.__setattr__(self, "_flat", tuple(key))

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

    def __str__(self):
        return f"{self.name} {self.op} {literal_text(self.value)}"


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

    def __str__(self):
        items = ", ".join(map(literal_text, self.values))
        listed = f"({items},)" if len(self.values) == 1 else f"({items})"
        return f"{self.name} {'not in' if self.negated else 'in'} {listed}"


def _text(expr: Expr) -> str:
    """The canonical text of `expr`: a leaf's own, a junction's operands
    (parenthesized where precedence needs it) joined by its word; one frame
    per level (`MAX_NESTING` levels fit the stack)."""
    if isinstance(expr, Not):
        inner = _text(expr.operand)
        return "not " + (f"({inner})" if isinstance(expr.operand, Junction) else inner)
    if not isinstance(expr, Junction):
        return str(expr)
    grouped, parts = expr.grouped(), []
    for operand in expr.operands:
        inner = _text(operand)
        parts.append(f"({inner})" if isinstance(operand, grouped) else inner)
    return f" {expr.word} ".join(parts)


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
        _set_nesting(self, 1 + nesting(self.operand))
        self._set_key((self.operand,))

    def __str__(self):
        return _text(self)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Junction(Expr):
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
        _set_nesting(self, 1 + max(map(nesting, operands)))
        self._set_key(operands)

    def grouped(self) -> tuple:
        """The operand types this junction's text parenthesizes."""
        return (And, Or) if isinstance(self, And) else (Or,)  # kept apart in the text

    def __str__(self):
        return _text(self)


class And(Junction):
    """``a and b and ...``: the rows every operand (`operands`) selects."""

    word = "and"


class Or(Junction):
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
