"""Compiled host kernels (numba) that cross one trie layer over packed bits:
what `static_compiler.item_bits.layer_walk` runs for each layer of a subset walk.

Bits are little-endian words: bit i of a bit string is bit i % 64 of
uint64 word i // 64 (the same bytes as `numpy.packbits(..., bitorder=
"little")`). A state of a layer with implicit targets is live when one of its
children (a row [start, end) of the next depth's states) is live:

* `near_rows_any`: a near-unary range, where every state but the listed
  exceptions has exactly one child and the children follow in order, so the
  stretches between exceptions are bit copies (a word at a time);
  `near_table_rows_any` the same reading the layer's exception tables
  where they lie (what a walk over a saved set runs);
* `rows_any`: any layer, from its row pointers;

and where the walk starts: `gather_bits` (`inserted_bits`, for an order
given by its insertions) puts an item mask in final-state order as bits,
`mark_selected_words` maps selected input rows (packed by
`selection_words`) to their items;
`inserted_words` is `inserted_bits` for an item mask held as bits. The rank
bits' kernels (`position_words`, `word_counts`) live in `rank_words`; this
module's `NUMPY_KERNELS` and `warm` cover them too.

Each bit kernel writes states [first_state, first_state + n) of `out`,
OR-ing into words that must start zeroed; ranges that start on a multiple of 64 states touch
disjoint words and may run at once on threads (the kernels release the GIL).

numba is optional: without it (`HAVE_NUMBA` False) each kernel is its numpy
twin (the ``*_numpy`` functions at the end: the same arguments, the same
bits, tests/api/test_missing_packages.py; vectorized over a range, several times
slower), so a subset or a removal on the torch backend needs numpy only.
"""

from __future__ import annotations

import numpy as np

from static_compiler.item_bits.jit import (  # (without numba: twins below)
    HAVE_NUMBA,
    njit,
    trailing_zeros,
    uint64,
)
from static_compiler.item_bits.rank_words import (  # noqa: F401 (kernels of the registry below)
    position_words,
    position_words_numpy,
    word_counts,
    word_counts_numpy,
)

_ALL = uint64(0xFFFFFFFFFFFFFFFF)


@njit(nogil=True, cache=True, inline="always")
def _take(src, at, k):
    """k bits (1..64) of `src` from bit `at`, as the low bits of a uint64."""
    w = at >> 6
    o = at & 63
    v = src[w] >> uint64(o)
    if o != 0 and o + k > 64:
        v |= src[w + 1] << uint64(64 - o)
    return v & _low(k)


@njit(nogil=True, cache=True, inline="always")
def _copy(src, src_at, out, out_at, n):
    """OR n bits of `src` from bit src_at into `out` from bit out_at."""
    while n > 0:
        o = out_at & 63
        k = min(n, 64 - o)
        out[out_at >> 6] |= _take(src, src_at, k) << uint64(o)
        src_at += k
        out_at += k
        n -= k


@njit(nogil=True, cache=True, inline="always")
def _any(src, start, end):
    """Whether a bit of `src` in [start, end) is set: the first word's bits
    from start, the whole words between, the last word's up to end (a short
    row: one word, one mask; 2.4x faster than taking a word at a time)."""
    if start >= end:
        return False
    first = start >> 6
    last = (end - 1) >> 6
    head = src[first] >> uint64(start & 63)
    if first == last:
        return head & _low(end - start) != 0
    if head != 0:
        return True
    for w in range(first + 1, last):
        if src[w] != 0:
            return True
    return src[last] & _low(((end - 1) & 63) + 1) != 0


@njit(nogil=True, cache=True, inline="always")
def _low(k):
    """uint64 with the k (1..64) low bits set."""
    return _ALL if k >= 64 else (uint64(1) << uint64(k)) - uint64(1)


@njit(nogil=True, cache=True, inline="always")
def _set_if(bit, out, s):
    """Sets bit s of `out` if `bit`."""
    if bit:
        out[s >> 6] |= uint64(1) << uint64(s & 63)


@njit(nogil=True, cache=True)
def near_rows_any(children, first_child, out, first_state, n, exceptions, starts, ends):
    """States [first_state, first_state + n) of a near-unary layer: the
    state at first_state + i takes bit first_child + i - (children of the
    exceptions before it) + (their count), except `exceptions` (int64
    ascending, absolute state ids in the range) with rows [starts, ends)
    (int64, absolute child bits). children, out: uint64 words."""
    state = first_state
    child = first_child
    stop = first_state + n
    for i in range(exceptions.shape[0]):
        ex = exceptions[i]
        _copy(children, child, out, state, ex - state)
        _set_if(_any(children, starts[i], ends[i]), out, ex)
        state = ex + 1
        child = ends[i]
    _copy(children, child, out, state, stop - state)


@njit(nogil=True, cache=True)
def near_table_rows_any(children, out, first_state, n, states, starts, count, end_extra):
    """`near_rows_any` of states [first_state, first_state + n), reading
    the layer's exception tables as they lie (no int64 arrays per range):
    `states` and `starts`, the ids and row starts of the exceptions from the
    range's first on (its `count` exceptions, then the next one if there is
    one; int32 or int64, as `layers.NearRows.exception_tables` passes them).
    Between exceptions rows follow one per state, so an exception's rows end
    where the next one's start, less the states between them; the layer's
    last exception's end is its id + end_extra + 1 (end_extra: the extra
    children of all of them), and the range's first child is first_state
    + the extra children below its first exception."""
    known = states.shape[0]
    extra = end_extra
    if known > 0:
        extra = np.int64(starts[0]) - np.int64(states[0])
    state = np.int64(first_state)
    child = state + extra
    stop = state + n
    for i in range(count):
        ex = np.int64(states[i])
        after = end_extra
        if i + 1 < known:
            after = np.int64(starts[i + 1]) - np.int64(states[i + 1])
        end = ex + after + 1
        _copy(children, child, out, state, ex - state)
        _set_if(_any(children, np.int64(starts[i]), end), out, ex)
        state = ex + 1
        child = end
    _copy(children, child, out, state, stop - state)


@njit(nogil=True, cache=True)
def rows_any(children, indptr, out, first_state, n):
    """States [first_state, first_state + n): state first_state + i is live
    when a bit of `children` in [indptr[i], indptr[i + 1]) is set (indptr
    int (n + 1,), absolute child bits)."""
    for i in range(n):
        _set_if(_any(children, indptr[i], indptr[i + 1]), out, first_state + i)


@njit(nogil=True, cache=True)
def gather_bits(bits, index, out, first_state, n):
    """States [first_state, first_state + n): state first_state + i takes
    bits[index[i]] (bits bool (m,), index int (n,), in range). Whole words
    are gathered without branches in a register and stored once (twice as
    fast as a test and a store per bit on a 10 % mask)."""
    i = 0
    while i < n and (first_state + i) & 63:  # up to the first whole word
        _set_if(bits[index[i]], out, first_state + i)
        i += 1
    while i + 64 <= n:
        word = uint64(0)
        for j in range(64):
            word |= uint64(bits[index[i + j]]) << uint64(j)
        out[(first_state + i) >> 6] |= word
        i += 64
    while i < n:
        _set_if(bits[index[i]], out, first_state + i)
        i += 1


@njit(nogil=True, cache=True)
def inserted_bits(bits, at, ids, base, out, first_state, n):
    """States [first_state, first_state + n) of an order where the states
    `at` (ascending, all inside the range) take bits[ids[j]] and every other
    state the next of bits[base], bits[base + 1], ... (bits bool (m,)): the
    item mask in final-state order of an item index whose additions are
    listed (`state_order.InsertedOrder`). Whole words without an insertion
    are packed from `bits` in a register, as `gather_bits` does."""
    j, k, b, i = 0, at.shape[0], base, 0
    while i < n:
        s = first_state + i
        nxt = at[j] if j < k else first_state + n
        if s & 63 == 0 and nxt >= s + 64 and i + 64 <= n:
            word = uint64(0)
            for q in range(64):
                word |= uint64(bits[b + q]) << uint64(q)
            out[s >> 6] |= word
            b += 64
            i += 64
            continue
        if nxt == s:
            _set_if(bits[ids[j]], out, s)
            j += 1
        else:
            _set_if(bits[b], out, s)
            b += 1
        i += 1


@njit(nogil=True, cache=True)
def inserted_words(src, at, ids, base, out, first_state, n):
    """`inserted_bits` of an item mask given as packed bits `src` (uint64
    words, bit i of word i // 64 for item i): the stretches between
    insertions are copied a word at a time."""
    j, k, b, s, stop = 0, at.shape[0], base, first_state, first_state + n
    while s < stop:
        nxt = at[j] if j < k else stop
        if nxt > s:
            _copy(src, b, out, s, nxt - s)
            b += nxt - s
            s = nxt
        if j < k and s < stop:  # the insertion at s
            _set_if(_take(src, ids[j], 1) != 0, out, s)
            s += 1
            j += 1


@njit(nogil=True, cache=True)
def mark_selected_words(selected, ids, out):
    """Sets bit ids[r] of `out` (uint64 words) for each set bit r of
    `selected` (uint64 (ceil(n / 64),): rows [0, n) packed as
    `selection_words` packs them, no bit at n or past; ids int (n,) in
    range). Each word's set bits are found by their trailing zeros, so an
    unselected row costs no test of its own and the map is read at the
    selected rows alone: a 10 % mask over 1e7 rows in 2.6 ms with its
    packing, against 7 ms for a test per row (docs/benchmarks.md, "Selected
    rows found by their words")."""
    for w in range(selected.shape[0]):
        word = selected[w]
        base = w << 6
        while word:
            v = ids[base + trailing_zeros(word)]
            word &= word - uint64(1)
            out[v >> 6] |= uint64(1) << uint64(v & 63)


def selection_words(picked: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """uint64 (ceil(n / 64),): bool `picked` (n,) packed little-endian
    (row r is bit r % 64 of word r // 64), 0 past n, into the front of
    `buffer` (uint64, at least that long; reused across chunks): what
    `mark_selected_words` and `bucket_scatter.bucket_selected` read."""
    n = picked.shape[0]
    words = buffer[:-(-n // 64)]
    data = words.view(np.uint8)
    data[:-(-n // 8)] = np.packbits(picked, bitorder="little")
    data[-(-n // 8):] = 0
    return words


@njit(nogil=True, cache=True)
def split_insertions(order, expected, inserted):
    """Marks in `inserted` (bool, zeroed) the entries of `order` (ints) that
    are not the next of expected, expected + 1, ...; returns the next
    expected value (pass it to the following chunk)."""
    for i in range(order.shape[0]):
        if order[i] == expected:
            expected += 1
        else:
            inserted[i] = True
    return expected


# ---------------------------------------------------------------------------
# The same kernels in numpy (what runs without numba). Each reads and writes
# the same bits as its compiled twin, a range at a time, with an int64 or a
# bool per state or child of the range.


def _bits(words: np.ndarray, start: int, stop: int) -> np.ndarray:
    """bool (stop - start,): bits [start, stop) of uint64 `words`."""
    if stop <= start:
        return np.zeros(0, bool)
    lo = start // 8
    data = np.unpackbits(words.view(np.uint8)[lo:(stop + 7) // 8], bitorder="little")
    return data.view(bool)[start - 8 * lo:stop - 8 * lo]


def _bits_at(words: np.ndarray, at: np.ndarray) -> np.ndarray:
    """bool at.shape: bit at[i] of uint64 `words` (at int64 in range)."""
    return ((words[at >> 6] >> (at & 63).astype(np.uint64)) & np.uint64(1)).astype(bool)


def _or_bits(out: np.ndarray, first: int, bits: np.ndarray) -> None:
    """ORs bools `bits` into bits [first, first + len(bits)) of uint64 `out`
    (whole bytes: a range starting on a multiple of 64 touches its own)."""
    if not bits.shape[0]:
        return
    lead = first % 8
    packed = np.packbits(np.concatenate([np.zeros(lead, bool), bits]), bitorder="little")
    held = out.view(np.uint8)[first // 8:first // 8 + packed.shape[0]]
    np.bitwise_or(held, packed, out=held)


def _rows_any(children: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """bool (n,): whether a bit of `children` in [starts[i], ends[i]) is set
    (int64 (n,), absolute bits; an empty or reversed row: False)."""
    if not starts.shape[0]:
        return np.zeros(0, bool)
    lo, hi = int(starts.min()), int(ends.max())
    if hi <= lo:
        return np.zeros(starts.shape[0], bool)
    counts = np.zeros(hi - lo + 1, np.int64)
    np.cumsum(_bits(children, lo, hi), out=counts[1:])
    return counts[np.clip(ends, lo, hi) - lo] > counts[np.clip(starts, lo, hi) - lo]


def near_rows_any_numpy(children, first_child, out, first_state, n, exceptions, starts, ends):
    """`near_rows_any` in numpy."""
    ex = np.asarray(exceptions, np.int64)
    state = np.arange(first_state, first_state + n, dtype=np.int64)
    j = np.searchsorted(ex, state)  # the exceptions before each state
    # a state between exceptions continues the row after the previous one
    child = np.concatenate([[first_child], np.asarray(ends, np.int64)])[j] + state - \
        np.concatenate([[first_state], ex + 1])[j]
    row_start, row_end = child, child + 1
    hit = np.flatnonzero(j < ex.shape[0])
    hit = hit[ex[j[hit]] == state[hit]]
    row_start[hit] = np.asarray(starts, np.int64)[j[hit]]
    row_end[hit] = np.asarray(ends, np.int64)[j[hit]]
    _or_bits(out, first_state, _rows_any(children, row_start, row_end))


def table_exceptions(states, starts, first_state: int, count: int, end_extra: int) -> tuple:
    """(first child, ids, starts, ends) int64 of the `count` exceptions
    `near_table_rows_any` reads from `states` and `starts`: the arguments
    `near_rows_any` takes."""
    known = states.shape[0]
    extra = np.full(count + 1, end_extra, np.int64)
    extra[:known] = np.asarray(starts, np.int64) - np.asarray(states, np.int64)
    ids = np.asarray(states[:count], np.int64)
    return first_state + int(extra[0]), ids, ids + extra[:-1], ids + extra[1:] + 1


def near_table_rows_any_numpy(children, out, first_state, n, states, starts, count, end_extra):
    """`near_table_rows_any` in numpy."""
    first, ids, row_starts, ends = table_exceptions(states, starts, first_state, count,
                                                    end_extra)
    near_rows_any_numpy(children, first, out, first_state, n, ids, row_starts, ends)


def rows_any_numpy(children, indptr, out, first_state, n):
    """`rows_any` in numpy."""
    indptr = np.asarray(indptr[:n + 1], np.int64)
    _or_bits(out, first_state, _rows_any(children, indptr[:-1], indptr[1:]))


def gather_bits_numpy(bits, index, out, first_state, n):
    """`gather_bits` in numpy."""
    _or_bits(out, first_state, np.asarray(bits, bool)[np.asarray(index[:n])])


def _inserted(read, at, ids, base: int, first_state: int, n: int) -> np.ndarray:
    """bool (n,): `inserted_bits`' order, reading the mask with read(int64
    positions) -> bools."""
    at = np.asarray(at, np.int64)
    state = np.arange(first_state, first_state + n, dtype=np.int64)
    j = np.searchsorted(at, state)  # the insertions before each state
    hit = np.zeros(n, bool)
    inside = np.flatnonzero(j < at.shape[0])
    hit[inside] = at[j[inside]] == state[inside]
    result = np.empty(n, bool)
    result[hit] = read(np.asarray(ids, np.int64)[j[hit]])
    result[~hit] = read(base + (state - first_state - j)[~hit])
    return result


def inserted_bits_numpy(bits, at, ids, base, out, first_state, n):
    """`inserted_bits` in numpy."""
    bits = np.asarray(bits, bool)
    _or_bits(out, first_state, _inserted(lambda p: bits[p], at, ids, base, first_state, n))


def inserted_words_numpy(src, at, ids, base, out, first_state, n):
    """`inserted_words` in numpy."""
    _or_bits(out, first_state, _inserted(lambda p: _bits_at(src, p), at, ids, base,
                                         first_state, n))


def mark_selected_words_numpy(selected, ids, out):
    """`mark_selected_words` in numpy."""
    rows = np.unpackbits(np.asarray(selected).view(np.uint8), bitorder="little")
    v = np.asarray(ids)[rows[:np.asarray(ids).shape[0]].view(bool)].astype(np.int64)
    np.bitwise_or.at(out.view(np.uint8), v >> 3, (1 << (v & 7)).astype(np.uint8))


def split_insertions_numpy(order, expected, inserted):
    """`split_insertions` in numpy: the entries in order are the chain
    expected, expected + 1, ... as long as each next value comes later
    (exact for distinct values, as a permutation's are; a part with
    repeated values is walked entry by entry)."""
    order = np.asarray(order)
    n = order.shape[0]
    if not n:
        return expected
    if np.unique(order).shape[0] != n:
        for i in range(n):
            if order[i] == expected:
                expected += 1
            else:
                inserted[i] = True
        return expected
    pos = np.full(n + 1, -1, np.int64)  # pos[v - expected]: where value v is; -1: absent
    mine = np.flatnonzero((order >= expected) & (order < expected + n))
    pos[order[mine].astype(np.int64) - expected] = mine
    ok = (pos >= 0) & np.concatenate([[True], pos[1:] > pos[:-1]])
    length = int(np.argmin(ok))  # pos[n] = -1: the chain stops by n
    matched = np.zeros(n, bool)
    matched[pos[:length]] = True
    inserted[~matched] = True
    return expected + length


NUMPY_KERNELS = {"near_rows_any": near_rows_any_numpy,
                 "near_table_rows_any": near_table_rows_any_numpy, "rows_any": rows_any_numpy,
                 "gather_bits": gather_bits_numpy, "inserted_bits": inserted_bits_numpy,
                 "inserted_words": inserted_words_numpy,
                 "mark_selected_words": mark_selected_words_numpy,
                 "split_insertions": split_insertions_numpy,
                 "position_words": position_words_numpy, "word_counts": word_counts_numpy}
"""kernel name -> its numpy twin (the rank bits' two from `rank_words`)."""

if not HAVE_NUMBA:  # the module's kernels are their numpy twins
    near_rows_any, rows_any, gather_bits = near_rows_any_numpy, rows_any_numpy, gather_bits_numpy
    near_table_rows_any = near_table_rows_any_numpy
    inserted_bits, inserted_words = inserted_bits_numpy, inserted_words_numpy
    mark_selected_words, split_insertions = mark_selected_words_numpy, split_insertions_numpy


def warm() -> None:
    """Loads (or compiles, the first time) each kernel for the argument
    types the walk passes, on tiny inputs: 0.4-0.6 s of numba start-up that
    the first subset would otherwise pay (without numba: nothing to load)."""
    if not HAVE_NUMBA:
        return
    words = np.zeros(2, np.uint64)
    one = np.zeros(1, np.int64)
    near_rows_any(words, 0, words, 0, 0, one[:0], one[:0], one[:0])
    rows_any(words, np.zeros(2, np.int64), words, 0, 1)
    mapped = np.zeros(1, np.int32)
    mapped.flags.writeable = False  # (an item index read from an artifact is read-only)
    for dtype in (np.int32, np.int64):  # (`NearRows.exception_tables`: read-only, one of these)
        table = np.zeros(1, dtype)
        table.flags.writeable = False
        near_table_rows_any(words, words, 0, 1, table, table, 0, 0)
    for positions in (np.zeros(1, np.int32), np.zeros(1, np.int64), mapped):
        position_words(positions, 1, np.zeros(1, np.uint32))
    word_counts(np.zeros(16, np.uint32), np.zeros(16, np.uint16), np.zeros(1, np.uint64), 0, 1)
    for ids in (np.zeros(1, np.int32), mapped):
        gather_bits(np.zeros(1, bool), ids, words, 0, 1)
        mark_selected_words(words, ids, words)
        inserted_bits(np.zeros(2, bool), ids, ids, 0, words, 0, 2)
        inserted_words(words, ids, ids, 0, words, 0, 2)
