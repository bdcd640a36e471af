"""Filter expressions from text: a hand-written tokenizer and
recursive-descent parser (`parse`), never eval.

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
"""

from __future__ import annotations

import dataclasses
import math
import re

from static_compiler.errors import FilterExpressionError
from static_compiler.rules.filter_tree import (  # noqa: F401
    KEYWORDS,
    MAX_NESTING,
    NAME,
    And,
    Compare,
    Expr,
    IsIn,
    Literal,
    Name,
    Not,
    Or,
    nesting,
)

# ASCII digits only: `\d` (and int()) would also read other scripts' digits
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def located(text: str, position: int, what: str, detail: str = "") -> FilterExpressionError:
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
        if c == "\0":
            raise located(text, i, "NUL character in a string",
                          ": category values hold none (they are refused when given)")
        if c == "\\":
            escaped = text[i + 1:i + 2]
            if escaped not in ("\\", "'", '"'):
                raise located(text, i, f"unknown escape '\\{escaped}'",
                               ": only \\\\, \\' and \\\" escape in a string")
            chars.append(escaped)
            i += 2
            continue
        chars.append(c)
        i += 1
    raise located(text, start, "unterminated string", f" (no closing {quote})")


def _number_token(text: str, start: int, match) -> tuple:
    """(the number literal `match` spells, the offset after it)."""
    spelled = match.group()
    if re.fullmatch(r"[+-]?[0-9]+", spelled):
        try:
            return int(spelled), match.end()
        except ValueError:  # over Python's digit limit
            raise located(text, start, "integer literal", " is too long") from None
    value = float(spelled)
    if not math.isfinite(value):
        raise located(text, start, f"number {spelled}", " is out of the float range")
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
        elif (name := NAME.match(text, i)):
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
            raise located(text, i, f"unexpected {c!r}",
                           ": expected a comparison (==, !=, <, <=, >, >=)")
        elif c.isdigit() or c.isnumeric():
            raise located(text, i, f"digit {c!r} (U+{ord(c):04X})",
                          ": numbers are written with the ASCII digits 0-9")
        else:
            raise located(text, i, f"unexpected character {c!r}")
        i = end


def _too_deep(text: str, token: _Token, depth: int) -> FilterExpressionError:
    """The error of an expression nested `depth` deep, past MAX_NESTING
    (parentheses and 'not's as the parser reads them, or 'not's, 'and's
    and 'or's inside one another: `filter_tree.nesting`)."""
    return located(text, token.position, f"expression nested {depth} deep",
                   f": at most {MAX_NESTING}")


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
        return located(self.text, token.position, f"unexpected {found}", f": expected {expected}")

    def parse(self) -> Expr:
        if self.peek().kind == "end":
            raise located(self.text, self.peek().position, "empty expression",
                           f": expected {_EXPECTED_CONDITION}")
        tree = self.disjunction()
        if self.peek().kind != "end":
            raise self.fail(self.peek(), "'and', 'or' or the end of the expression")
        return tree

    def built(self, make, operands, token: _Token) -> Expr:
        """`make(operands)` (a `Not` of one, a junction of several), or the
        error of one nested deeper than MAX_NESTING located at `token`, where
        the node's text starts."""
        depth = 1 + max(map(nesting, operands if isinstance(operands, tuple) else (operands,)))
        if depth > MAX_NESTING:
            raise _too_deep(self.text, token, depth)
        return make(operands)

    def disjunction(self) -> Expr:
        start = self.peek()
        operands = [self.conjunction()]
        while self.is_word("or"):
            self.take()
            operands.append(self.conjunction())
        return operands[0] if len(operands) == 1 else self.built(Or, tuple(operands), start)

    def conjunction(self) -> Expr:
        start = self.peek()
        operands = [self.negation()]
        while self.is_word("and"):
            self.take()
            operands.append(self.negation())
        return operands[0] if len(operands) == 1 else self.built(And, tuple(operands), start)

    def nested(self, token: _Token):
        """One more '(' or 'not' open (the parser recurses into it)."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _too_deep(self.text, token, self.depth)

    def negation(self) -> Expr:
        if self.is_word("not"):
            token = self.take()
            self.nested(token)
            operand = self.negation()
            self.depth -= 1
            return self.built(Not, operand, token)
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
