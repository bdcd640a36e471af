"""Text catalogues: compile a closed list of names (strings) with a tokenizer.

`encode_catalogue(names, tokenizer, vocab_size, end_token)` encodes every
name, checks the encodings, and returns one token sequence per name given, in
the order given, with a `items.names.NameTable` that maps the unique
sequences back to names (`compile_constraints(names, vocab_size=V,
tokenizer=...)` calls it). The compiled set's item i is therefore the i-th
name given, as item i of a set compiled from token ids is its i-th row: a
bool mask over the names picks items (`subset`, `update(remove=...)`), and
`item_index` of a name's tokens is the first position of that name. Names
given twice, or that encode to the same tokens, are one item (one entry of
the NameTable: the first such name, the others its aliases).

A tokenizer is any of:

* a callable ``str -> list[int]`` (e.g. a model's encode function); it has no
  end token, so pass ``end_token=`` when names encode to different lengths;
* a Hugging Face ``tokenizers.Tokenizer`` (`HFTokenizer`: batch encoding, no
  special tokens unless ``add_special_tokens=True``; the end token is the
  first of `EOS_TOKENS` the vocabulary holds, else pass one);
* a ``transformers`` PreTrainedTokenizer or PreTrainedTokenizerFast
  (`TransformersTokenizer`: batch encoding, no special tokens unless asked;
  the end token is its ``eos_token_id``);
* an adapter: any object with ``encode_batch(names) -> list[list[int]]`` and
  an ``end_token`` attribute (int or None).

Neither ``tokenizers`` nor ``transformers`` is imported here unless a
tokenizer file is loaded (`load_tokenizer`, needs the ``text`` extra:
``pip install static-compiler[text]``); objects are recognized by their
methods.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Callable, Optional, Sequence, Union

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import PaddedRows, check_end_token, check_vocab_size, sort_unique_rows
from static_compiler.items.names import NameTable

EOS_TOKENS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>",
              "<|eot_id|>", "[SEP]")
"""Special tokens `HFTokenizer` takes as the end token, the first the vocabulary holds."""

_SHOWN_CHARS = 60
"""Longest piece of a name quoted in an error message."""


@dataclasses.dataclass(frozen=True)
class CallableTokenizer:
    """A function ``str -> list[int]`` as an adapter (no end token unless given)."""

    encode: Callable[[str], Sequence[int]]
    end_token: Optional[int] = None
    vocab_size: Optional[int] = None  # (unknown: compile_constraints then needs vocab_size)

    def encode_batch(self, names: Sequence[str]) -> list:
        return [self.encode(name) for name in names]


@dataclasses.dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` as an adapter.

    end_token: the end token id; default the first of `eos_tokens` in the
    tokenizer's vocabulary (None when it has none of them)."""

    tokenizer: object
    add_special_tokens: bool = False
    end_token: Optional[int] = None
    eos_tokens: tuple = EOS_TOKENS

    def __post_init__(self):
        if self.end_token is None:
            ids = (self.tokenizer.token_to_id(tok) for tok in self.eos_tokens)
            object.__setattr__(self, "end_token", next((i for i in ids if i is not None), None))

    @property
    def vocab_size(self) -> Optional[int]:
        """The tokenizer's vocabulary, added tokens included (the ids it
        can produce; None for an object that does not say)."""
        size = getattr(self.tokenizer, "get_vocab_size", None)
        return None if size is None else int(size(with_added_tokens=True))

    def encode_batch(self, names: Sequence[str]) -> list:
        encodings = self.tokenizer.encode_batch(list(names),
                                                add_special_tokens=self.add_special_tokens)
        return [e.ids for e in encodings]


@dataclasses.dataclass(frozen=True)
class TransformersTokenizer:
    """A ``transformers`` PreTrainedTokenizer(Fast) as an adapter; the end
    token is its ``eos_token_id`` unless given."""

    tokenizer: object
    add_special_tokens: bool = False
    end_token: Optional[int] = None

    def __post_init__(self):
        if self.end_token is None:
            object.__setattr__(self, "end_token", getattr(self.tokenizer, "eos_token_id", None))

    @property
    def vocab_size(self) -> Optional[int]:
        """``len(tokenizer)``: the vocabulary, added tokens included (None
        for an object without a length)."""
        return len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else None

    def encode_batch(self, names: Sequence[str]) -> list:
        return self.tokenizer(list(names), add_special_tokens=self.add_special_tokens)["input_ids"]


def as_adapter(tokenizer):
    """`tokenizer` (see the module docstring) as an object with
    ``encode_batch`` and ``end_token``; a str or os.PathLike is the path of
    a tokenizers JSON file (``tokenizer.json``, read by `load_tokenizer`,
    as the CLI's --tokenizer). Raises ConstraintSetError for anything else."""
    if isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer)
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "end_token"):
        return tokenizer
    if hasattr(tokenizer, "eos_token_id") and hasattr(tokenizer, "convert_tokens_to_ids"):
        return TransformersTokenizer(tokenizer)
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "token_to_id"):
        return HFTokenizer(tokenizer)
    if callable(tokenizer):
        return CallableTokenizer(tokenizer)
    raise ConstraintSetError(
        f"tokenizer of type {type(tokenizer).__name__}: expected a callable str -> list[int], a "
        "tokenizers.Tokenizer, a transformers tokenizer, the path of a tokenizer.json, or an "
        "adapter with encode_batch and end_token")


def catalogue_vocab_size(vocab_size, adapter) -> int:
    """The vocabulary size to compile a catalogue with: `vocab_size`, or
    when None the tokenizer's own (`adapter.vocab_size`: its length with the
    added tokens). Raises ConstraintSetError when neither is known (a
    callable tokenizer), or when `vocab_size` is below the tokenizer's
    (ids it can produce would be outside [0, vocab_size)), naming both."""
    own = getattr(adapter, "vocab_size", None)
    own = None if own is None or isinstance(own, bool) or not isinstance(own, (int, np.integer)) \
        else int(own)
    if vocab_size is None:
        if own is None:
            raise ConstraintSetError(f"vocab_size=None with a tokenizer of type "
                                     f"{type(adapter).__name__}, which does not say its "
                                     "vocabulary size: pass vocab_size=V (the model's)")
        return check_vocab_size(own)
    vocab_size = check_vocab_size(vocab_size)
    if own is not None and vocab_size < own:
        raise ConstraintSetError(f"vocab_size={vocab_size} is smaller than the tokenizer's "
                                 f"vocabulary of {own} tokens (added tokens included): pass "
                                 f"vocab_size >= {own} (the model's logits width, or leave it "
                                 "out to use the tokenizer's)")
    return vocab_size


def load_tokenizer(path: Union[str, os.PathLike], **options) -> HFTokenizer:
    """An `HFTokenizer` for a ``tokenizers`` JSON file (``tokenizer.json``);
    `options` go to `HFTokenizer`. Needs the ``tokenizers`` package (the
    ``text`` extra). Raises ConstraintSetError for a missing or bad file."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ConstraintSetError(f"tokenizer {os.fspath(path)!r}: reading a tokenizer file needs "
                                 "the 'tokenizers' package (pip install "
                                 "'static-compiler[text]')") from e
    if not os.path.isfile(path):
        raise ConstraintSetError(f"tokenizer {os.fspath(path)!r}: no such file")
    try:
        return HFTokenizer(Tokenizer.from_file(os.fspath(path)), **options)
    except Exception as e:  # tokenizers raises its own Exception types for a bad file
        raise ConstraintSetError(f"tokenizer {os.fspath(path)!r}: not a tokenizers JSON file "
                                 f"({type(e).__name__}: {e})") from None


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """An encoded text catalogue.

    Attributes:
      sequences: the token ids of every name given, in the order given
        (duplicates kept, so row i is names[i] and compiling them numbers
        the items as the names): an int32 (names, L) array, or
        `PaddedRows` (an int32 (names, W) matrix and the lengths) when
        lengths differ.
      names: the `NameTable`: the unique sequences, sorted as the compiled
        set numbers them (`frontend.sort_unique_rows`), with their names.
      end_token: the end token to compile with (None for a fixed-length set).
      stats: {"names", "items", "duplicates" (names merged into an earlier
        one's item), "end_token", "end_token_from" ("argument", "tokenizer"
        or None)}.
      sorted_rows: the sequences' `sort_unique_rows(..., return_inverse=True)`
        (codes, lengths, inverse), which the name table was built from:
        `frontend.trie_from_sorted` builds the trie from it without sorting
        again.
    """

    sequences: object
    names: NameTable
    end_token: Optional[int]
    stats: dict
    sorted_rows: Optional[tuple] = None


def _shown(name: str) -> str:
    return repr(name if len(name) <= _SHOWN_CHARS else name[:_SHOWN_CHARS] + "...")


def _check_names(names) -> list:
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise ConstraintSetError(f"names of type {type(names).__name__}: expected a sequence of "
                                 "str (one name per item)")
    names = list(names)
    if not names:
        raise ConstraintSetError("empty catalogue: expected at least one name")
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise ConstraintSetError(f"name {i} is {name!r} ({type(name).__name__}): expected str")
    return names


ENCODE_CHUNK = 1 << 16
"""Names per `encode_batch` call: a tokenizer's per-name objects (a
`tokenizers` Encoding holds ids, offsets, masks: ~3 KB) live for one chunk,
not the catalogue (3.1 GB at 1e6 names when encoded in one call)."""


def _encode(adapter, names: list) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 token ids, lengths int64 (N,)) of every name, encoded
    ENCODE_CHUNK names at a time (see `_flatten` for what is rejected)."""
    parts = [_flatten(names[i:i + ENCODE_CHUNK], adapter.encode_batch(names[i:i + ENCODE_CHUNK]),
                      offset=i)
             for i in range(0, len(names), ENCODE_CHUNK)]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([f for f, _ in parts]), np.concatenate([n for _, n in parts])


def _flatten(names: list, encoded, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 token ids, lengths int64 (N,)) of the encodings of
    `names` (names[0] is name `offset` of the catalogue); rejects a wrong
    number of encodings, empty ones and non-integer ids, naming the name."""
    encoded = list(encoded)
    if len(encoded) != len(names):
        raise ConstraintSetError(f"the tokenizer returned {len(encoded)} encodings for "
                                 f"{len(names)} names")
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
    if (lengths == 0).any():
        i = int(np.flatnonzero(lengths == 0)[0])
        raise ConstraintSetError(f"name {offset + i} {_shown(names[i])} encodes to no tokens")
    flat = np.asarray(list(itertools.chain.from_iterable(encoded)))
    if flat.ndim != 1 or flat.dtype.kind not in "iu":
        bad = next(((i, t) for i, e in enumerate(encoded) for t in e
                    if isinstance(t, bool) or not isinstance(t, (int, np.integer))),
                   (0, encoded[0]))
        raise ConstraintSetError(f"name {offset + bad[0]} {_shown(names[bad[0]])}: the tokenizer "
                                 f"returned {bad[1]!r} ({type(bad[1]).__name__}), expected int "
                                 "token ids")
    return flat.astype(np.int64), lengths


def _check_tokens(names: list, flat: np.ndarray, lengths: np.ndarray, vocab_size: int,
                  end_token: Optional[int], end_from: Optional[str]) -> None:
    """Every token in [0, vocab_size) and none the end token, else an error
    naming the first offending name, position and token."""
    bad = (flat < 0) | (flat >= vocab_size)
    if end_token is not None:
        bad |= flat == end_token
    if not bad.any():
        return
    e = int(np.flatnonzero(bad)[0])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    i = int(np.searchsorted(starts, e, side="right")) - 1
    token = int(flat[e])
    where = f"name {i} {_shown(names[i])}, token {e - starts[i]}"
    if 0 <= token < vocab_size:
        raise ConstraintSetError(f"{where}: is the end token {token} (from the {end_from}); names "
                                 "must not encode to it")
    raise ConstraintSetError(f"{where}: id {token} is outside the vocabulary [0, {vocab_size})")


def _name_table(names: list, sorted_rows: tuple) -> NameTable:
    """The `NameTable` of the names' encodings: the unique rows in the order
    the compiled set numbers its unique sequences (sorted_rows: the
    encodings' `sort_unique_rows(..., return_inverse=True)`, which the
    compiler builds the trie from, so table row u is unique sequence u of
    the item index), each named by the first name that encodes to it, the
    other distinct names in input order as its aliases."""
    codes, _, inverse = sorted_rows
    first = np.full(codes.shape[0], len(names), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(names)))
    aliases = [[] for _ in range(codes.shape[0])]
    for i in np.flatnonzero(first[inverse] != np.arange(len(names))).tolist():  # input order
        u = inverse[i]
        if names[i] != names[first[u]] and names[i] not in aliases[u]:
            aliases[u].append(names[i])
    return NameTable(names=tuple(names[i] for i in first.tolist()),
                     tokens=codes.astype(np.int32) - 1,
                     aliases=tuple(tuple(a) for a in aliases))


def encode_catalogue(names, tokenizer, vocab_size: Optional[int],
                     end_token: Optional[int] = None) -> Catalogue:
    """Encodes `names` with `tokenizer` (see the module docstring): the
    sequences one per name in the order given (item i of the compiled set is
    names[i]) and the `NameTable` of the names with equal encodings grouped.

    end_token: overrides the tokenizer's end token; a catalogue whose names
    encode to different lengths needs one from either. vocab_size: None
    takes the tokenizer's (`catalogue_vocab_size`).

    Raises ConstraintSetError for an empty catalogue, a name that is not a
    str, encodes to nothing, to an id outside [0, vocab_size) or to the end
    token, or a ragged catalogue without an end token.
    """
    adapter = as_adapter(tokenizer)
    vocab_size = catalogue_vocab_size(vocab_size, adapter)
    names = _check_names(names)
    end_from = "argument" if end_token is not None else None
    if end_token is None and adapter.end_token is not None:
        end_token, end_from = adapter.end_token, "tokenizer"
    try:
        end_token = check_end_token(end_token, vocab_size)
    except ConstraintSetError as e:
        raise ConstraintSetError(f"{e} (the end token from the {end_from})") from None
    flat, lengths = _encode(adapter, names)
    _check_tokens(names, flat, lengths, vocab_size, end_token, end_from)
    ragged = bool((lengths != lengths[0]).any())
    if ragged and end_token is None:
        raise ConstraintSetError(
            f"names encode to {int(lengths.min())}..{int(lengths.max())} tokens and the tokenizer "
            "has no end token: pass end_token=... (the model's end-of-sequence id)")
    width = int(lengths.max())
    matrix = np.zeros((len(names), width), np.int32)
    matrix[np.arange(width)[None, :] < lengths[:, None]] = flat
    sequences = PaddedRows(matrix, lengths) if ragged else matrix
    sorted_rows = sort_unique_rows(matrix, lengths, vocab_size, return_inverse=True)
    table = _name_table(names, sorted_rows)
    stats = {"names": len(names), "items": len(table), "duplicates": len(names) - len(table),
             "end_token": end_token, "end_token_from": end_from}
    return Catalogue(sequences=sequences, names=table, end_token=end_token, stats=stats,
                     sorted_rows=sorted_rows)


def looks_like_names(constraints) -> bool:
    """True when `constraints` is a list or tuple whose first entry is a str
    (names given without a tokenizer)."""
    return isinstance(constraints, (list, tuple)) and bool(constraints) \
        and isinstance(constraints[0], str)
