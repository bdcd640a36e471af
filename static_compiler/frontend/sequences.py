"""Frontend: validate a constraint set, sort and deduplicate it, and build the
layered automaton IR (a trie) with vectorized numpy, no Python loop over items.

Accepted inputs:
* a 2-D integer numpy array (N, L): N sequences of length L;
* any iterable of integer sequences (lists, tuples, 1-D arrays), possibly of
  different lengths (ragged sets need an ``end_token``).

Sorting packs each row into 64-bit words (``ceil(log2(V + 1))`` bits a token,
0 is the padding past a row's end so a prefix sorts before its extensions)
and sorts word by word, folding the rank of the prefix sorted so far into the
next word; each round is one argsort of a uint64 array.
"""

from __future__ import annotations


import itertools
from typing import Optional

import numpy as np

from static_compiler.dtypes import (MAX_VOCAB_SIZE, index_dtype_for, sort_code_dtype_for,
                                    token_dtype_for)
from static_compiler.errors import ConstraintSetError
from static_compiler.ir import Automaton, Layer, frozen
from static_compiler.live.liveness import ItemIndex


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


def as_token_matrix(sequences) -> tuple[np.ndarray, np.ndarray, bool]:
    """Converts the user's input to (matrix (N, Lmax) int, lengths (N,) int64, ragged).

    Entries of `matrix` past a row's length are undefined (zero)."""
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
        return mat, np.full(mat.shape[0], mat.shape[1], dtype=np.int64), False
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


def sort_unique_codes(codes: np.ndarray, lengths: np.ndarray, vocab_size: int,
                      return_inverse: bool = False):
    """`sort_unique_rows` of rows already encoded as sort codes (codes
    (N, Lmax) `sort_code_dtype_for(vocab_size)`: token + 1, 0 past a row's
    end; lengths (N,))."""
    n, lmax = codes.shape
    bits = _bits(vocab_size)
    order = None
    col = 0
    rank_bits = 0
    rank = None
    while col < lmax:
        per_word = max(1, (64 - rank_bits) // bits)
        stop = min(lmax, col + per_word)
        key = np.zeros(n, dtype=np.uint64) if rank is None else rank.astype(np.uint64)
        src = codes if order is None else None
        for c in range(col, stop):
            key <<= np.uint64(bits)
            column = src[:, c] if src is not None else codes[order, c]
            key |= column
        perm = np.argsort(key, kind="stable")
        key = key[perm]
        order = perm if order is None else order[perm]
        change = np.empty(n, dtype=bool)
        change[0] = True
        np.not_equal(key[1:], key[:-1], out=change[1:])
        col = stop
        if col < lmax:
            rank = np.cumsum(change, dtype=np.int64) - 1
            rank_bits = _bits(int(rank[-1]))
            if rank_bits > 64 - bits:
                raise ConstraintSetError(f"{n} sequences are too many to sort with {bits}-bit tokens")
    keep = order[change]
    if not return_inverse:
        return codes[keep], lengths[keep]
    inverse = np.empty(n, dtype=np.int32)
    inverse[order] = np.cumsum(change, dtype=np.int64) - 1
    return codes[keep], lengths[keep], inverse


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
    codes, lengths, inverse = sort_unique_rows(mat, lengths, vocab_size, return_inverse=True)
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
    starts_prev = np.zeros(n, dtype=bool)  # rows that start a state at depth t
    starts_prev[0] = True
    layers = []
    for t in range(lmax):
        column = codes[:, t]
        differs[1:] |= column[1:] != column[:-1]
        starts = differs & (lengths > t)
        # state id (at depth t) of the state that each row belongs to
        state_of_row = np.cumsum(starts_prev, dtype=index_dtype_for(n)) - 1
        num_states = int(state_of_row[-1]) + 1
        child_rows = np.flatnonzero(starts)
        parents = state_of_row[child_rows]
        counts = np.bincount(parents, minlength=num_states)
        indptr = np.zeros(num_states + 1, dtype=index_dtype_for(child_rows.size))
        np.cumsum(counts, out=indptr[1:])
        accepting = None
        if t > 0:
            ends_here = np.flatnonzero(lengths == t)
            if ends_here.size:
                accepting = np.zeros(num_states, dtype=bool)
                accepting[state_of_row[ends_here]] = True
        layers.append(Layer(indptr=frozen(indptr),
                            tokens=frozen((column[child_rows] - 1).astype(tok_dtype)),
                            accepting=None if accepting is None else frozen(accepting)))
        starts_prev = starts
    num_final = int(starts_prev.sum())
    return Automaton(vocab_size=vocab_size, layers=tuple(layers), num_final_states=num_final,
                     num_sequences=n, end_token=end_token)


def row_keys(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One hashable-by-value key per sequence (a void view of the row with
    -1 past its length), for set comparisons with np.isin / np.unique.

    tokens: int (N, W); lengths: int (N,). Returns a (N,) void array."""
    tokens = np.asarray(tokens, dtype=np.int64)
    past = np.arange(tokens.shape[1])[None, :] >= np.asarray(lengths)[:, None]
    rows = np.ascontiguousarray(np.where(past, -1, tokens))
    return rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
