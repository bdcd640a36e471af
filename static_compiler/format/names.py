"""Text catalogues' names.jsonl read back (`read_names_jsonl`, for
`snapshot.read_names`): the `items.names.NameTable` it holds, checked
line by line. Standard library and numpy only.
"""

from __future__ import annotations

import json

import numpy as np

from static_compiler.format.spec import NAMES_FILE, _reject_constant, format_error, require
from static_compiler.items.names import NameTable


def read_names_jsonl(data: bytes, path, rel: str = NAMES_FILE) -> NameTable:
    """The `NameTable` of the bytes of names.jsonl (`NameTable.to_jsonl`) of
    the artifact at `path`; raises ArtifactFormatError naming the line.

    Lines are split on line feeds only (a final one ends the last
    line), not on every Unicode line break as str.splitlines does: a
    name holding U+0085, U+2028 or U+2029 raw (as writers before the
    escapes wrote it) is inside its JSON string, not a line end."""
    names, rows, aliases = [], [], []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise format_error(path, f"{rel} is not UTF-8 ({e})") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        where = f"{rel} line {number}"
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except ValueError as e:
            raise format_error(path, f"{where} is not JSON ({e})") from None
        name = require(obj, "name", str, where, path)
        tokens = require(obj, "tokens", list, where, path)
        more = obj.get("aliases", [])
        if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                 for t in tokens):
            raise format_error(path, f"{where}: tokens {tokens!r} are not a non-empty list "
                                     "of token ids")
        if not isinstance(more, list) or not all(isinstance(a, str) for a in more):
            raise format_error(path, f"{where}: aliases {more!r} are not a list of str")
        names.append(name)
        rows.append(tokens)
        aliases.append(tuple(more))
    width = max((len(r) for r in rows), default=1)
    matrix = np.full((len(rows), width), -1, np.int32)
    for i, r in enumerate(rows):
        matrix[i, :len(r)] = r
    return NameTable(tuple(names), matrix, tuple(aliases))
