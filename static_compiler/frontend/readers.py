"""Reading constraint sets from files.

`read_constraints(path)` picks the format from the file name and content:

- ``*.npy``: one array saved with ``numpy.save`` (no pickled objects),
  normally int (N, L): N sequences of length L. Returned as stored, an
  ``np.ndarray`` of its own shape and dtype.
- ``*.jsonl`` / ``*.json``: one JSON list of integer token ids per line,
  e.g. ``[1, 2, 3]``. Returned as ``list[list[int]]``.
- a text file whose first line starts with ``automaton ``: an IR text dump
  (`ir.print_ir`). Returned as the parsed, verified ``ir.Automaton``.
- any other text file: one sequence per line, integer token ids separated by
  whitespace, e.g. ``1 2 3``. Returned as ``list[list[int]]``.

A text catalogue (names, compiled with a tokenizer) is read by
`read_names(path)`, returned as ``list[str]``:

- ``*.jsonl`` / ``*.json``: one JSON value per line, a string
  (``"Zurich"``) or an object with a string ``"name"`` (``{"name":
  "Zurich"}``, other keys ignored); blank lines and ``#`` lines skipped.
- any other text file: one name per line, exactly as written (only the
  line ending is removed), empty lines skipped.

Which reader applies is the caller's choice (the CLI: `--tokenizer` given).

Text files are UTF-8 (a leading byte-order mark is ignored). In the line
formats, blank lines and lines starting with ``#`` are skipped, and sequences
may have different lengths. The readers check the file format only: the
shape, dtype, token range and end token of a set are checked by the frontend
(`frontend.as_token_matrix`, `compile_constraints`) when the set is compiled.

Every problem with the file raises `ConstraintSetError` naming the file, the
line (1-based) and the offending text; an IR dump that does not parse or
verify raises `IRParseError` / `IRVerificationError` (`ir.parse_ir`'s
message, which names the line or layer and state, after the file name).
"""

from __future__ import annotations

import json
import os
from typing import Union

import numpy as np

from static_compiler.errors import ConstraintSetError, IRParseError, IRVerificationError
from static_compiler.ir import Automaton, parse_ir

NPY_SUFFIXES = (".npy",)
"""File name endings read with `read_npy` (compared case-insensitively)."""

JSONL_SUFFIXES = (".jsonl", ".json")
"""File name endings whose lines are JSON lists (compared case-insensitively)."""

IR_DUMP_PREFIX = "automaton "
"""How an IR text dump starts; a text file starting otherwise is a line format."""

_SHOWN_CHARS = 80
"""Longest piece of an offending line quoted in an error message."""

NAMES_HINT = "a file of names is read with read_names and compiled with a tokenizer"
"""What an error about a line of names in a file of token ids advises (the
CLI words it as its --tokenizer flag)."""

_NAME_LINES = ('one non-empty JSON string ("Zurich") or object with a string "name" '
               '({"name": "Zurich"}) per line')
"""What a line of a .jsonl catalogue of names holds (for error messages)."""

TOKEN_FORMATS = ("save it as .npy or space-separated ids, one sequence per line (or .jsonl, "
                 "one JSON list per line)")
"""What an error about comma-separated token ids (a CSV file) advises."""

Constraints = Union[np.ndarray, list, Automaton]
"""What `read_constraints` returns: see the module docstring."""


def read_constraints(path: Union[str, os.PathLike]) -> Constraints:
    """Reads the constraint set in `path`, in the format its name and content
    say (see the module docstring): an array from .npy, lists of token ids
    from .jsonl / .json and plain text, an `ir.Automaton` from an IR dump.

    Raises ConstraintSetError for a missing or unreadable file, a line that
    is not a sequence of integer token ids, or a file without sequences;
    IRParseError / IRVerificationError for a broken IR dump."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConstraintSetError(f"input {path!r}: no such file")
    if _suffix(path) in NPY_SUFFIXES:
        return read_npy(path)
    text = _read_text(path)
    if text.startswith(IR_DUMP_PREFIX):
        try:
            return parse_ir(text)
        except (IRParseError, IRVerificationError) as e:
            raise type(e)(f"input {path!r}: {e}") from e
    if _suffix(path) in JSONL_SUFFIXES:
        return parse_jsonl(text, path)
    return parse_token_lines(text, path)


def read_names(path: Union[str, os.PathLike]) -> "list[str]":
    """The names in the file `path`: for a .jsonl / .json file one JSON
    string, or object with a string "name", per line (`parse_jsonl_names`);
    for any other text file one name per line, each line without its line
    ending (spaces and '#' are part of a name), empty lines skipped.

    Raises ConstraintSetError for a missing or non-UTF-8 file, one without
    names, or a JSON line that is not a name (naming the line)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConstraintSetError(f"input {path!r}: no such file")
    text = _read_text(path)
    if _suffix(path) in JSONL_SUFFIXES:
        return parse_jsonl_names(text, path)
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    names = [line for line in lines if line]
    if not names:
        raise ConstraintSetError(f"input {path!r}: no names found (expected one per line)")
    return names


def read_npy(path: Union[str, os.PathLike]) -> np.ndarray:
    """The array saved in the .npy file `path`, with the shape and dtype it
    was saved with (normally int (N, L); the frontend checks that). Pickled
    object arrays are refused, so a file cannot run code.

    Raises ConstraintSetError when the file is missing or not a .npy array."""
    path = os.fspath(path)
    try:
        # Memory-mapped first: a header claiming more data than the file
        # holds fails here, instead of allocating what the header claims.
        return np.array(np.load(path, mmap_mode="r", allow_pickle=False))
    except (ValueError, OSError) as e:
        raise ConstraintSetError(f"input {path!r}: not a readable .npy array ({e})") from e


def parse_jsonl(text: str, path: str = "<string>") -> "list[list[int]]":
    """One JSON list of integer token ids per line of `text` (e.g. ``[1, 2, 3]``),
    as Python ints; booleans and floats are refused. `path` only names the
    source in error messages.

    Raises ConstraintSetError naming `path` and the line for a line that is
    not JSON or not such a list, or when `text` holds no sequence."""
    sequences = []
    for number, line in _content_lines(text):
        try:
            seq = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConstraintSetError(f"input {path!r} line {number}: not JSON ({e})") from None
        if not isinstance(seq, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in seq):
            names = f" ({NAMES_HINT})" if isinstance(seq, (str, dict)) else ""
            raise ConstraintSetError(f"input {path!r} line {number}: {line[:_SHOWN_CHARS]!r} is "
                                     f"not a JSON list of integer token ids{names}")
        sequences.append(seq)
    return _nonempty(sequences, path)


def parse_jsonl_names(text: str, path: str = "<string>") -> "list[str]":
    """One name per line of `text`, each a JSON string (``"Zurich"``) or a
    JSON object with a string "name" (``{"name": "Zurich"}``; other keys are
    ignored); blank lines and lines starting with ``#`` are skipped. `path`
    only names the source in error messages.

    Raises ConstraintSetError naming `path` and the line for a line that is
    not JSON, not such a string or object, or an empty name, and when `text`
    holds no name."""
    names = []
    for number, line in _content_lines(text):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConstraintSetError(f"input {path!r} line {number}: not JSON ({e}); a .jsonl "
                                     f"catalogue holds {_NAME_LINES}") from None
        name = value.get("name") if isinstance(value, dict) else value
        if not isinstance(name, str) or not name:
            tokens = " (token ids are read without a tokenizer)" if isinstance(value, list) else ""
            raise ConstraintSetError(f"input {path!r} line {number}: {line[:_SHOWN_CHARS]!r} is "
                                     f"not a name: a .jsonl catalogue holds {_NAME_LINES}{tokens}")
        names.append(name)
    if not names:
        raise ConstraintSetError(f"input {path!r}: no names found (expected {_NAME_LINES})")
    return names


def parse_token_lines(text: str, path: str = "<string>") -> "list[list[int]]":
    """One sequence per line of `text`: integer token ids separated by
    whitespace (e.g. ``1 2 3``). `path` only names the source in error messages.

    Raises ConstraintSetError naming `path` and the line for a line with
    anything but integers, or when `text` holds no sequence."""
    sequences = []
    for number, line in _content_lines(text):
        try:
            sequences.append([int(tok) for tok in line.split()])
        except ValueError:
            what = (f"holds comma-separated ids: {TOKEN_FORMATS}" if _separated_ints(line) else
                    f"is not space-separated integer token ids ({NAMES_HINT})")
            raise ConstraintSetError(f"input {path!r} line {number}: {line[:_SHOWN_CHARS]!r} "
                                     f"{what}") from None
    return _nonempty(sequences, path)


def _separated_ints(line: str) -> bool:
    """Whether `line` is integers separated by commas or semicolons (a CSV row)."""
    parts = [p.strip() for p in line.replace(";", ",").split(",")]
    return len(parts) > 1 and all(p.lstrip("+-").isdigit() for p in parts if p)


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConstraintSetError(f"input {path!r}: not a readable UTF-8 text file ({e})") from e


def _content_lines(text: str):
    """(1-based line number, stripped line) for each line that is neither
    blank nor a '#' comment."""
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            yield number, line


def _nonempty(sequences: list, path: str) -> list:
    if not sequences:
        raise ConstraintSetError(f"input {path!r}: no sequences found (expected one per line)")
    return sequences
