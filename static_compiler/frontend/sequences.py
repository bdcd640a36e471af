"""Frontend: validate a constraint set, sort and deduplicate it, and build the
layered automaton IR (a trie) with vectorized numpy, no Python loop over items.

Accepted inputs:
* a 2-D integer numpy array (N, L): N sequences of length L, or of up to L
  tokens each with -1 past a row's end (the layout of `Shards`' .npy shards;
  rows of different lengths need an ``end_token``);
* any iterable of integer sequences (lists, tuples, 1-D arrays), possibly of
  different lengths (ragged sets need an ``end_token``).

Sorting packs each row into 64-bit words (``ceil(log2(V + 1))`` bits a token,
0 is the padding past a row's end so a prefix sorts before its extensions)
and sorts word by word, folding the rank of the prefix sorted so far into the
next word; each round is one argsort of a uint64 array.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, Optional

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.ir import Automaton, Layer, frozen
from static_compiler.items.index import ItemIndex
from static_compiler.support.dtypes import (
    MAX_VOCAB_SIZE,
    index_dtype_for,
    sort_code_dtype_for,
    token_dtype_for,
)


def check_vocab_size(vocab_size) -> int:
    """Returns `vocab_size` as an int, or raises ConstraintSetError unless it is an int >= 1."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ConstraintSetError(f"vocab_size={vocab_size!r}: expected a positive int")
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise ConstraintSetError(f"vocab_size={vocab_size}: expected an int in [1, "
                                 f"{MAX_VOCAB_SIZE}] (token ids are int32 when decoding)")
    return int(vocab_size)


def check_end_token(end_token, vocab_size: int) -> Optional[int]:
    """Returns `end_token` as an int (None stays None), or raises
    ConstraintSetError unless it is an int in [0, vocab_size)."""
    if end_token is None:
        return None
    if isinstance(end_token, bool) or not isinstance(end_token, (int, np.integer)) \
            or not 0 <= end_token < vocab_size:
        raise ConstraintSetError(f"end_token={end_token!r}: expected an int in [0, {vocab_size})")
    return int(end_token)


def _integral(values: np.ndarray, where: str) -> np.ndarray:
    """Returns `values` as int64, rejecting bools, non-finite and non-integral values."""
    kind = values.dtype.kind
    if kind in "iu":
        return values
    if kind == "f":
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            pos = np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), values.shape)
            raise ConstraintSetError(
                f"{where} {tuple(int(p) for p in pos)}: value {values[pos].item()!r} is not a finite "
                "integer; token ids must be integers")
        return values.astype(np.int64)
    raise ConstraintSetError(
        f"{where}: expected integer token ids, got dtype {values.dtype}")


class PaddedRows(NamedTuple):
    """Sequences of different lengths as one padded matrix: matrix int
    (N, W), lengths int (N,) in [1, W]; entries past a row's length are
    ignored. What the text frontend hands the compiler, so a catalogue of a
    million names is not turned into a million arrays and checked token by
    token in Python."""

    matrix: np.ndarray
    lengths: np.ndarray


def as_token_matrix(sequences) -> tuple[np.ndarray, np.ndarray, bool]:
    """Converts the user's input to (matrix (N, Lmax) int, lengths (N,) int64, ragged).

    Entries of `matrix` past a row's length are undefined (zero)."""
    if isinstance(sequences, PaddedRows):
        return _padded_rows(sequences)
    if isinstance(sequences, np.ndarray) and sequences.dtype != object:
        if sequences.ndim != 2:
            raise ConstraintSetError(
                f"constraint array has shape {sequences.shape}: expected 2-D (num_sequences, "
                "length), or an iterable of sequences for ragged sets")
        if sequences.shape[0] == 0:
            raise ConstraintSetError("empty constraint set: expected at least one sequence")
        if sequences.shape[1] == 0:
            raise ConstraintSetError(
                f"constraint array has shape {sequences.shape}: sequences must not be empty")
        mat = _integral(sequences, "constraint array at (row, column)")
        lengths = padded_lengths(mat)
        if lengths is None:
            return mat, np.full(mat.shape[0], mat.shape[1], dtype=np.int64), False
        # Columns past the longest row would become a step with no tokens but the end token.
        mat = mat[:, :int(lengths.max())]
        return mat, lengths, bool((lengths != mat.shape[1]).any())
    if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__iter__"):
        raise ConstraintSetError(
            f"constraint set of type {type(sequences).__name__}: expected a 2-D int array "
            "or an iterable of int sequences")
    seqs = []
    for i, s in enumerate(sequences):
        if isinstance(s, (str, bytes)) or not hasattr(s, "__len__"):
            raise ConstraintSetError(
                f"sequence {i} is {s!r} ({type(s).__name__}): expected a sequence of token ids")
        seqs.append(s)
    if not seqs:
        raise ConstraintSetError("empty constraint set: expected at least one sequence")
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    if (lengths == 0).any():
        raise ConstraintSetError(
            f"sequence {int(np.flatnonzero(lengths == 0)[0])} is empty: every sequence needs "
            "at least one token")
    values = list(itertools.chain.from_iterable(seqs))
    flat = np.asarray(values)
    if flat.dtype.kind in "iu" and any(isinstance(v, (bool, np.bool_)) for v in values):
        e = next(j for j, v in enumerate(values) if isinstance(v, (bool, np.bool_)))
        i = int(np.searchsorted(np.cumsum(lengths), e, side="right"))
        raise ConstraintSetError(f"sequence {i}: value {values[e]!r} is a bool: expected integer "
                                 "token ids")
    if flat.ndim != 1 or flat.dtype == object:
        raise ConstraintSetError(
            "sequences must hold plain integers; found nested or mixed-type values "
            f"(numpy inferred dtype {flat.dtype}, shape {flat.shape})")
    if flat.dtype.kind not in "iuf":
        raise ConstraintSetError(f"sequences hold {flat.dtype} values: expected integer token ids")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if flat.dtype.kind == "f":
        bad = ~np.isfinite(flat) | (flat != np.round(flat))
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            i = int(np.searchsorted(offsets, e, side="right")) - 1
            raise ConstraintSetError(
                f"sequence {i}, position {e - offsets[i]}: value {flat[e].item()!r} is not a finite "
                "integer; token ids must be integers")
        flat = flat.astype(np.int64)
    n, lmax = len(seqs), int(lengths.max())
    mat = np.zeros((n, lmax), dtype=flat.dtype)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(flat.size) - np.repeat(offsets[:-1], lengths)
    mat[rows, cols] = flat
    return mat, lengths, bool((lengths != lmax).any())


def _first_hit(hit: np.ndarray, lengths: np.ndarray, ragged: bool):
    """(row, column) of the first True of `hit` (N, Lmax) inside a row's length, or None."""
    if ragged:
        hit &= np.arange(hit.shape[1])[None, :] < lengths[:, None]
    if not hit.any():
        return None
    r, c = np.unravel_index(int(np.flatnonzero(hit.ravel())[0]), hit.shape)
    return int(r), int(c)


def check_range(mat: np.ndarray, lengths: np.ndarray, ragged: bool, vocab_size: int,
                end_token: Optional[int], where: str = "", first_row: int = 0) -> None:
    """ConstraintSetError naming the first token outside [0, vocab_size), or
    the end token inside a sequence; mat (N, Lmax) as `as_token_matrix`
    (entries past a row's length are not looked at). where / first_row: a
    prefix for the message and the number of row 0 (a chunk of a file)."""
    lo, hi = mat.min(), mat.max()
    if lo < 0 or hi >= vocab_size:
        at = _first_hit((mat < 0) | (mat >= vocab_size), lengths, ragged)
        if at is not None:
            raise ConstraintSetError(
                f"{where}sequence {first_row + at[0]}, position {at[1]}: token {int(mat[at])} "
                f"is outside the vocabulary [0, {vocab_size})")
    if end_token is not None:
        at = _first_hit(mat == end_token, lengths, ragged)
        if at is not None:
            raise ConstraintSetError(
                f"{where}sequence {first_row + at[0]}, position {at[1]}: holds the end token "
                f"{end_token}; sequences must not contain it (the compiler adds the end "
                "transition itself)")


def padded_lengths(mat: np.ndarray, where: str = "", first_row: int = 0) -> Optional[np.ndarray]:
    """The row lengths (int64 (N,)) of an int matrix whose rows hold -1 past
    their end (the layout of variable-length shards), or None when it holds
    no -1 (every row is a full one). Other negative values are left to
    `check_range`, which names them as tokens outside the vocabulary.
    where / first_row: as `check_range`.

    Raises ConstraintSetError naming the row for a token after a -1, or a
    row that is all -1 (every sequence needs a token)."""
    if not mat.size or mat.dtype.kind != "i" or int(mat.min()) >= 0:
        return None
    padding = mat == -1
    if not padding.any():
        return None
    lengths = np.where(padding.any(axis=1), padding.argmax(axis=1), mat.shape[1]).astype(np.int64)
    past = np.arange(mat.shape[1])[None, :] >= lengths[:, None]
    for bad, what in (((past & ~padding).any(axis=1), "has a token after -1 padding: -1 may "
                                                      "only follow a row's last token"),
                      (lengths == 0, "is empty (every sequence needs a token)")):
        hit = np.flatnonzero(bad)
        if hit.size:
            r = int(hit[0])
            raise ConstraintSetError(f"{where}sequence {first_row + r}: {what} "
                                     f"({mat[r].tolist()})")
    return lengths


def _padded_rows(rows: PaddedRows) -> tuple[np.ndarray, np.ndarray, bool]:
    matrix, lengths = rows.matrix, np.asarray(rows.lengths)
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or matrix.dtype.kind not in "iu" \
            or lengths.shape != matrix.shape[:1] or lengths.dtype.kind not in "iu":
        raise ConstraintSetError(
            f"PaddedRows: matrix {getattr(matrix, 'shape', None)} "
            f"{getattr(matrix, 'dtype', type(matrix).__name__)}, lengths {lengths.shape} "
            f"{lengths.dtype}: expected an int matrix (N, W) and int lengths (N,)")
    if matrix.shape[0] == 0:
        raise ConstraintSetError("empty constraint set: expected at least one sequence")
    bad = (lengths < 1) | (lengths > matrix.shape[1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConstraintSetError(f"PaddedRows: sequence {i} has length {int(lengths[i])}: "
                                 f"expected 1..{matrix.shape[1]}")
    lengths = lengths.astype(np.int64)
    # Columns past the longest row would become a step with no tokens but the end token.
    matrix = matrix[:, :int(lengths.max())]
    return matrix, lengths, bool((lengths != matrix.shape[1]).any())


def _bits(v: int) -> int:
    """Bits a sort key needs per value 0..v (at least one)."""
    return max(1, int(v).bit_length())


def sort_unique_rows(mat: np.ndarray, lengths: np.ndarray, vocab_size: int,
                     return_inverse: bool = False):
    """Sorts rows lexicographically (a prefix before its extensions) and drops
    duplicates.

    Returns (codes (N', Lmax) uint16/uint32, lengths (N',) int64) where
    codes = token + 1 inside a row and 0 past its end; with
    `return_inverse`, also int32 (N,): the unique row each input row became.
    """
    n, lmax = mat.shape
    codes = np.empty((n, lmax), dtype=sort_code_dtype_for(vocab_size))
    np.add(mat, 1, out=codes, casting="unsafe")
    if (lengths != lmax).any():
        codes[np.arange(lmax)[None, :] >= lengths[:, None]] = 0
    return sort_unique_codes(codes, lengths, vocab_size, return_inverse)


def _pack_sort(columns, bits: int, position_bits: int, lead=None):
    """One radix digit: positions 0..m-1 ordered by (`lead`, `columns`...)
    packed into one uint64 above the position, ties by position (stable).

    columns: (m,) unsigned arrays of at most `bits` bits; lead: uint64 (m,)
    or None. Returns (digit uint64 (m,) sorted: the packed key without the
    position; position intp (m,)). numpy's vectorized in-place sort of plain
    integers is ~15x faster than an argsort, hence the packing."""
    m = lead.shape[0] if lead is not None else columns[0].shape[0]
    key = np.zeros(m, dtype=np.uint64) if lead is None else lead.astype(np.uint64)
    for column in columns:
        key <<= np.uint64(bits)
        key |= column
    key <<= np.uint64(position_bits)
    key |= np.arange(m, dtype=np.uint64)
    key.sort()
    position = (key & np.uint64((1 << position_bits) - 1)).view(np.intp)
    key >>= np.uint64(position_bits)
    return key, position


def _digits_per_word(rows: int, bits: int) -> tuple[int, int]:
    """(position bits, columns of `bits` bits per radix digit) for sorting
    `rows` rows."""
    position_bits = _bits(max(rows - 1, 1))
    per_digit = (64 - position_bits) // bits
    if per_digit < 1:
        raise ConstraintSetError(f"{rows} sequences are too many to sort with {bits}-bit tokens")
    return position_bits, per_digit


def _lsd_order(rows: np.ndarray, first: int, bits: int, lead: np.ndarray) -> np.ndarray:
    """intp (m,): the stable order of `rows` (m, L) by (`lead`, rows[:, first:])
    lexicographically: a least-significant-digit radix sort, a digit being
    a group of columns (lead uint64 (m,) is the last, most significant one).
    Rows are gathered with `np.take` (fancy indexing of 2-D rows is ~8x
    slower)."""
    m, lmax = rows.shape
    position_bits, per_digit = _digits_per_word(m, bits)
    order = np.arange(m)
    for stop in range(lmax, first, -per_digit):
        start = max(first, stop - per_digit)
        _, moved = _pack_sort([rows[:, c] for c in range(start, stop)], bits, position_bits)
        rows = np.take(rows, moved, axis=0)
        order = np.take(order, moved)
    if _bits(int(lead[-1])) + position_bits > 64:
        raise ConstraintSetError(f"{m} tied sequences are too many to sort")
    _, moved = _pack_sort([], bits, position_bits, lead=np.take(lead, order))
    return np.take(order, moved)


def sort_unique_codes(codes: np.ndarray, lengths: np.ndarray, vocab_size: int,
                      return_inverse: bool = False):
    """`sort_unique_rows` of rows already encoded as sort codes (codes
    (N, Lmax) `sort_code_dtype_for(vocab_size)`: token + 1, 0 past a row's
    end; lengths (N,)).

    Most-significant digit first: one sort of the leading columns that fit
    a uint64 beside the row number; only rows whose leading columns tie with
    a neighbour's (few, for Semantic IDs) are then ordered by the rest
    (`_lsd_order`). Stable, so of equal rows the first one is kept.
    """
    n, lmax = codes.shape
    bits = _bits(vocab_size)
    position_bits, per_digit = _digits_per_word(n, bits)
    if n > 1 and lmax:
        head = min(per_digit, lmax)
        prefix, order = _pack_sort([codes[:, c] for c in range(head)], bits, position_bits)
        same = prefix[1:] == prefix[:-1]
        if head < lmax and same.any():
            tied = np.zeros(n, dtype=bool)
            tied[1:] |= same
            tied[:-1] |= same
            sub = np.flatnonzero(tied)
            group_start = np.ones(n, dtype=bool)
            group_start[1:] = ~same
            group = np.cumsum(group_start[sub], dtype=np.uint64)
            sub_order = order[sub]
            order[sub] = sub_order[_lsd_order(np.take(codes, sub_order, axis=0), head, bits, group)]
        rows = np.take(codes, order, axis=0)
    else:
        rows, order = codes, np.arange(n)
    change = np.ones(n, dtype=bool)
    if n > 1:
        change[1:] = False
        for c in range(lmax):
            change[1:] |= rows[1:, c] != rows[:-1, c]
    if change.all():  # no duplicates (the common case): nothing to drop
        unique = (rows, np.take(lengths, order))
    else:
        keep = np.flatnonzero(change)
        unique = (np.take(rows, keep, axis=0), np.take(lengths, np.take(order, keep)))
    if not return_inverse:
        return unique
    inverse = np.empty(n, dtype=np.int32)
    ids = np.cumsum(change, dtype=np.int32)
    ids -= 1
    inverse[order] = ids
    return unique + (inverse,)


def check_set_rows(mat: np.ndarray, lengths: np.ndarray, ragged: bool, trie, what: str,
                   hint: str = "") -> None:
    """ConstraintSetError unless every row (`as_token_matrix`'s matrix and
    lengths) could be a sequence of the compiled set `trie` (anything with
    `depth`, `vocab_size` and `end_token`: an Automaton, a table trie):
    tokens in [0, V), no end token inside, and for a fixed-length set (no
    end token) its length. `what` starts each message ("update: removed");
    `hint` follows a length message."""
    if trie.end_token is None and (lengths != trie.depth).any():
        i = int(np.flatnonzero(lengths != trie.depth)[0])
        raise ConstraintSetError(f"{what} sequence {i} has length {int(lengths[i])}: this set's "
                                 f"sequences all have length {trie.depth}{hint}")
    check_range(mat, lengths, ragged, trie.vocab_size, trie.end_token, f"{what} ")


def build_automaton(sequences, vocab_size: int, end_token: Optional[int] = None) -> Automaton:
    """Validates `sequences` and builds the trie automaton (implicit targets).

    Args:
      sequences: a 2-D int array (N, L) or an iterable of int sequences.
      vocab_size: V; every token must lie in [0, V).
      end_token: token that ends a sequence; required when lengths differ.

    Raises:
      ConstraintSetError naming the offending value and where it is.
    """
    mat, lengths, ragged, vocab_size, end_token = _checked_input(sequences, vocab_size, end_token)
    codes, lengths = sort_unique_rows(mat, lengths, vocab_size)
    return automaton_from_sorted_codes(codes, lengths, vocab_size, end_token)


def _checked_input(sequences, vocab_size, end_token):
    """(matrix, lengths, ragged, vocab_size, end_token) of valid input."""
    vocab_size = check_vocab_size(vocab_size)
    end_token = check_end_token(end_token, vocab_size)
    mat, lengths, ragged = as_token_matrix(sequences)
    if ragged and end_token is None:
        raise ConstraintSetError(
            f"sequences have different lengths ({int(lengths.min())}..{int(lengths.max())}): "
            "pass end_token=... to compile a variable-length set, or give sequences of equal length")
    check_range(mat, lengths, ragged, vocab_size, end_token)
    return mat, lengths, ragged, vocab_size, end_token


def build_trie(sequences, vocab_size: int, end_token: Optional[int] = None
               ) -> tuple[Automaton, ItemIndex]:
    """`build_automaton`, and the `ItemIndex` of its input rows."""
    mat, lengths, ragged, vocab_size, end_token = _checked_input(sequences, vocab_size, end_token)
    return trie_from_sorted(sort_unique_rows(mat, lengths, vocab_size, return_inverse=True),
                            vocab_size, end_token, ragged)


def trie_from_sorted(sorted_rows: tuple, vocab_size: int, end_token: Optional[int],
                     ragged: bool) -> tuple[Automaton, ItemIndex]:
    """`build_trie` of rows already sorted and checked: sorted_rows is
    `sort_unique_rows(..., return_inverse=True)` of them (codes, lengths,
    inverse); ragged: whether their lengths differ (the item index then
    records each item's depth and state). The text frontend sorts a
    catalogue's encodings once for its name table and once here."""
    codes, lengths, inverse = sorted_rows
    ir = automaton_from_sorted_codes(codes, lengths, vocab_size, end_token)
    if not ragged:
        return ir, ItemIndex(row_item=inverse, num_unique=int(codes.shape[0]))
    return ir, ItemIndex(row_item=inverse, num_unique=int(codes.shape[0]),
                         item_depth=lengths.astype(np.int32),
                         item_state=terminal_states(codes, lengths))


def terminal_states(codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int32 (N',): the state id, at depth lengths[u], where sorted unique
    row u ends (numbered as `automaton_from_sorted_codes` numbers them: at
    each depth, states in the order of the rows that start them)."""
    n, lmax = codes.shape
    out = np.empty(n, dtype=np.int32)
    differs = np.zeros(n, dtype=bool)
    differs[0] = True
    for t in range(lmax):
        differs[1:] |= codes[1:, t] != codes[:-1, t]
        starts = differs & (lengths > t)  # rows starting a state at depth t + 1
        ends = lengths == t + 1
        if ends.any():
            # a row's state at depth t + 1: the states started at or before it, minus one
            out[ends] = (np.cumsum(starts, dtype=np.int64) - 1)[ends]
    return out


def automaton_from_sorted_codes(codes: np.ndarray, lengths: np.ndarray, vocab_size: int,
                                end_token: Optional[int]) -> Automaton:
    """Builds the trie from sorted unique rows (see `sort_unique_rows`).

    A row starts a new state at depth t + 1 exactly when it has a token at
    column t and differs from the previous row somewhere in columns 0..t.
    """
    n, lmax = codes.shape
    tok_dtype = token_dtype_for(vocab_size)
    differs = np.zeros(n, dtype=bool)
    differs[0] = True
    first_rows = np.zeros(1, dtype=np.intp)  # the rows that start the states at depth t
    layers = []
    ragged = bool(n) and int(lengths.min()) < lmax
    for t in range(lmax):
        column = codes[:, t]
        differs[1:] |= column[1:] != column[:-1]
        starts = differs & (lengths > t) if ragged else differs
        child_rows = np.flatnonzero(starts)
        # a state's first child is the first child row at or after its own first row
        children_before = np.cumsum(starts, dtype=index_dtype_for(n))
        indptr = np.empty(first_rows.size + 1, dtype=index_dtype_for(child_rows.size))
        np.subtract(children_before[first_rows], starts[first_rows], out=indptr[:-1],
                    casting="unsafe")
        indptr[-1] = child_rows.size
        accepting = None
        if ragged and t > 0:
            ends_here = np.flatnonzero(lengths == t)
            if ends_here.size:
                accepting = np.zeros(first_rows.size, dtype=bool)
                accepting[np.searchsorted(first_rows, ends_here, side="right") - 1] = True
        layers.append(Layer(indptr=frozen(indptr),
                            tokens=frozen((column[child_rows] - 1).astype(tok_dtype)),
                            accepting=None if accepting is None else frozen(accepting)))
        first_rows = child_rows
    return Automaton(vocab_size=vocab_size, layers=tuple(layers),
                     num_final_states=int(first_rows.size), num_sequences=n, end_token=end_token)


def row_keys(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One hashable-by-value key per sequence (a void view of the row with
    -1 past its length), for set comparisons with np.isin / np.unique.

    tokens: int (N, W); lengths: int (N,). Returns a (N,) void array."""
    tokens = np.asarray(tokens, dtype=np.int64)
    past = np.arange(tokens.shape[1])[None, :] >= np.asarray(lengths)[:, None]
    rows = np.ascontiguousarray(np.where(past, -1, tokens))
    return rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
