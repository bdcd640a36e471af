"""The names of a text catalogue's items and their token ids (`NameTable`),
a frontend output (`text.encode_catalogue`): the compiled set and the
served artifact map decoded sequences back to names with it. Saved as
names.jsonl (`NameTable.to_jsonl`, read back by
`format.names.read_names_jsonl`). Standard library and numpy only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

import numpy as np

from static_compiler.errors import DecodeInputError

_LINE_BREAK_ESCAPES = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""str.translate table for names.jsonl: the line breaks str.splitlines
knows that JSON allows raw in a string (U+0085, U+2028, U+2029) -> their
JSON escapes. The others (U+000A to U+000D, U+001C to U+001E) are control
characters, which json.dumps escapes itself."""


@dataclasses.dataclass(frozen=True, eq=False)
class NameTable:
    """The names of a text catalogue's items, and their token ids.

    Items here are the catalogue's unique token sequences, in the order the
    compiled set numbers them (row u is unique sequence u of its
    `items.index.ItemIndex`; the item index maps each name given to its row).

    Attributes:
      names: one name per item (the first of the names that encode to its tokens).
      tokens: int32 (items, width): the items' token ids, -1 past an item's
        end, rows sorted (a prefix before its extensions) and unique.
      aliases: per item, the other names that encode to the same tokens (in
        input order; usually empty).
    """

    names: tuple
    tokens: np.ndarray
    aliases: tuple

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"NameTable({len(self)} names, up to {self.tokens.shape[1]} tokens)"

    @property
    def lengths(self) -> np.ndarray:
        """int64 (items,): tokens per item."""
        return (self.tokens >= 0).sum(axis=1)

    def _index(self) -> dict:
        """{row bytes: item}, built on first use."""
        index = self.__dict__.get("_by_tokens")
        if index is None:
            index = {row.tobytes(): i for i, row in enumerate(self.tokens)}
            object.__setattr__(self, "_by_tokens", index)
        return index

    def _rows(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """tokens int (n, T) and lengths (n,) -> int32 (n, width) in the
        table's padding (-1 past each length); rows longer than the widest item
        are all -2, which matches no item."""
        width = self.tokens.shape[1]
        out = np.full((tokens.shape[0], width), -1, np.int32)
        take = min(width, tokens.shape[1])
        out[:, :take] = tokens[:, :take]
        out[np.arange(width)[None, :] >= lengths[:, None]] = -1
        out[lengths > width] = -2
        return out

    def name_of(self, tokens) -> Optional[str]:
        """The name of the item with these token ids (end token excluded), or None."""
        row = np.asarray(tokens, np.int64).reshape(1, -1)
        i = self._index().get(self._rows(row, np.asarray([row.shape[1]]))[0].tobytes())
        return None if i is None else self.names[i]

    def texts(self, result, *, prompt_length: Optional[int] = None,
              end_token: Optional[int] = None, max_length: Optional[int] = None) -> list:
        """The names a decoding result, or rows of token ids, hold.

        A decoding result (`tokens` int (..., T), `valid` bool (...) and
        `lengths` int (...), e.g. a DecodeResult) gives nested lists shaped
        like `result.valid` (batch, beams) of str, None where a beam is
        invalid; DecodeInputError when the shapes disagree or a valid beam
        holds a sequence that is no item (a result from another set).

        Token id rows int (N, T) (numpy, jax or torch; or an object with
        `sequences`, as ``generate(..., return_dict_in_generate=True)``
        returns), e.g. Hugging Face ``generate``'s output: each row is
        `prompt_length` tokens of prompt (default 0), then the generated
        tokens, then anything (padding, the end token again). Gives a list
        of N names, None where a row holds no complete item: with the set's
        `end_token`, the tokens before its first end token; without one,
        the first `max_length` generated tokens. end_token, max_length: the
        set's (the compiled set, the served artifact and the torch backend
        pass their own)."""
        if hasattr(result, "sequences") and not hasattr(result, "valid"):
            result = result.sequences
        if not all(hasattr(result, f) for f in ("tokens", "valid", "lengths")):
            return self._row_texts(result, prompt_length, end_token, max_length)
        if prompt_length not in (None, 0):
            raise DecodeInputError(f"texts: prompt_length={prompt_length!r} applies to rows of "
                                   "token ids (generate's output), not to a decoding result")
        tokens = np.asarray(result.tokens)
        valid = np.asarray(result.valid, bool)
        lengths = np.asarray(result.lengths)
        if tokens.ndim < 1 or tokens.shape[:-1] != valid.shape or lengths.shape != valid.shape:
            raise DecodeInputError(
                f"texts: tokens {list(tokens.shape)}, valid {list(valid.shape)} and lengths "
                f"{list(lengths.shape)} do not describe one result (expected tokens (..., T) "
                "with valid and lengths (...))")
        flat = tokens.reshape(-1, tokens.shape[-1]).astype(np.int64)
        rows = self._rows(flat, lengths.reshape(-1).astype(np.int64))
        index = self._index()
        out = []
        for i, (ok, row) in enumerate(zip(valid.reshape(-1), rows)):
            item = index.get(row.tobytes()) if ok else None
            if ok and item is None:
                at = tuple(int(x) for x in np.unravel_index(i, valid.shape))
                seq = [int(t) for t in flat[i, :int(lengths.reshape(-1)[i])]]
                raise DecodeInputError(f"texts: beam {at} holds tokens {seq}, which are no item "
                                       f"of this catalogue of {len(self)} names (a result of "
                                       "another set?)")
            out.append(None if item is None else self.names[item])
        shaped = np.empty(len(out), dtype=object)
        shaped[:] = out
        return shaped.reshape(valid.shape).tolist()

    def _row_texts(self, rows, prompt_length, end_token: Optional[int],
                   max_length: Optional[int]) -> list:
        """`texts` of token id rows (see there)."""
        if hasattr(rows, "detach"):  # a torch tensor, on any device
            rows = rows.detach().cpu().numpy()
        try:
            rows = np.asarray(rows)
        except (TypeError, ValueError):
            rows = np.asarray([], dtype=object)
        if rows.ndim != 2 or rows.dtype.kind not in "iu":
            raise DecodeInputError(f"texts: got {rows.dtype}{list(rows.shape)}: expected a "
                                   "decoding result, or token id rows int (N, T) (generate's "
                                   "output: prompt, generated tokens, padding)")
        T = rows.shape[1]
        start = 0 if prompt_length is None else prompt_length
        if isinstance(start, (bool, np.bool_)) or not isinstance(start, (int, np.integer)) \
                or not 0 <= start <= T:
            raise DecodeInputError(f"texts: prompt_length={prompt_length!r}: expected an int in "
                                   f"[0, {T}] (the prompt tokens in front of each row of {T})")
        made = rows[:, int(start):].astype(np.int64)
        if end_token is not None:
            ends = made == end_token
            complete = ends.any(axis=1)
            lengths = np.where(complete, ends.argmax(axis=1), 0)
        else:
            need = self.tokens.shape[1] if max_length is None else int(max_length)
            complete = np.full(made.shape[0], made.shape[1] >= need)
            lengths = np.full(made.shape[0], need)
        index = self._index()
        items = (index.get(row.tobytes()) if ok else None
                 for ok, row in zip(complete, self._rows(made, lengths)))
        return [None if i is None else self.names[i] for i in items]

    def to_jsonl(self) -> bytes:
        """The bytes of names.jsonl: UTF-8, one object per item, sorted keys,
        each line ended by a line feed alone. JSON leaves U+0085, U+2028 and
        U+2029 raw inside strings, but line-splitting readers (str.splitlines,
        many JSON Lines tools) break lines there, so they are written escaped
        (`_LINE_BREAK_ESCAPES`); the bytes depend on the table alone."""
        lines = []
        for name, row, aliases in zip(self.names, self.tokens, self.aliases):
            obj = {"name": name, "tokens": [int(t) for t in row if t >= 0]}
            if aliases:
                obj["aliases"] = list(aliases)
            line = json.dumps(obj, ensure_ascii=False, sort_keys=True)
            lines.append(line.translate(_LINE_BREAK_ESCAPES) + "\n")
        return "".join(lines).encode("utf-8")
