"""Baseline constraint methods for the benchmark suite, and the harness that
runs them (our own code; none of it is part of the library).

Every method is run by the same beam search (`masked_beam_search`), which is
built like the library's `beam_search`: log_softmax over the full
vocabulary, disallowed tokens set to `SENTINEL_SCORE`, each beam pruned to its
`tokens_per_beam` best tokens, the best `beam_size` candidates of a batch row
kept (`decode.selection.select_beams`, the library's own selection), and only beam 0
expanded at step 0. A method only decides which tokens are allowed:

==================  ======================================================
`Unconstrained`     every token (the reference the overhead is measured against)
`HostTrie`          CSR trie in host numpy, queried by `jax.pure_callback`
                    every step (a host round trip per step)
`ExactBinarySearch` the sorted set on the device; per beam and token, a
                    binary search for the token in the beam's range of items
`ApproxBinarySearch` the same, but only the `top_n` (50) most likely tokens
                    of each beam are searched; the others are disallowed, so
                    valid continuations can be lost (not exact)
`HashBitmap`        a bitmap of hashed valid prefixes on the device; hash
                    collisions let invalid prefixes through (false positives,
                    measured by `HashBitmap.false_positive_rate`)
==================  ======================================================

The model is `TableModel`, a deterministic table lookup, so what differs
between methods is the constraint handling only.

Shapes: B = batch, M = beams, V = vocabulary, L = sequence length, N = items.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.decode import PAD_TOKEN, SENTINEL_SCORE
from static_compiler.backend.decode.logprobs import add_logprob, safe_log_softmax
from static_compiler.backend.decode.selection import select_beams
from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import as_token_matrix, automaton_from_sorted_codes, sort_unique_rows
from static_compiler.support.decode_state import check_tokens_per_beam

# --------------------------------------------------------------------------
# The model


class TableModel:
    """A deterministic stand-in for an LLM: logits are rows of a fixed random
    table, picked by a hash of (last token, step).

    `table` float32 (rows, V) is passed as the decode's carry (an argument,
    not a constant baked into the program). `logits_fn` has the signature
    `static_compiler.beam_search` expects."""

    def __init__(self, vocab_size: int, rows: int = 61, scale: float = 3.0, seed: int = 0):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"TableModel: vocab_size={vocab_size!r}, expected an int >= 1")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"TableModel: rows={rows!r}, expected an int >= 1")
        self.vocab_size = vocab_size
        rng = np.random.default_rng(seed)
        self.table = jnp.asarray((scale * rng.standard_normal((rows, vocab_size))).astype(np.float32))

    @staticmethod
    def logits(table, last_tokens, step):
        """float32 (B, M, V) logits for last_tokens int32 (B, M) at `step`."""
        row = (last_tokens.astype(jnp.int32) * 7919 + 104729 * (step + 1)) % table.shape[0]
        return jnp.take(table, row, axis=0)

    @staticmethod
    def logits_fn(last_tokens, step, carry):
        """`static_compiler.beam_search` model callback; carry is the table."""
        return TableModel.logits(carry, last_tokens, step), carry


# --------------------------------------------------------------------------
# The constraint set as the baselines see it


class SortedSet:
    """The constraint set sorted and deduplicated (the frontend's own sort).

    Attributes:
      vocab_size: V.
      tokens: (N, L) uint16/int32 sorted unique rows.
      max_range: L ints: at depth t, the most items sharing one prefix of
        length t (the widest range a binary search at step t must cover).
    """

    def __init__(self, sequences, vocab_size: int):
        mat, lengths, ragged = as_token_matrix(sequences)
        if ragged:
            raise ConstraintSetError("baselines take fixed-length sets only: sequence lengths "
                                     f"range {int(lengths.min())}..{int(lengths.max())}")
        if mat.min() < 0 or mat.max() >= vocab_size:
            raise ConstraintSetError(f"tokens span [{int(mat.min())}, {int(mat.max())}], "
                                     f"expected [0, {vocab_size})")
        codes, _ = sort_unique_rows(mat, lengths, vocab_size)
        del mat
        self.vocab_size = int(vocab_size)
        dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
        self.tokens = (codes - 1).astype(dtype)
        n, L = self.tokens.shape
        self.max_range = []
        starts = np.zeros(n, dtype=bool)
        starts[0] = True
        for t in range(L):
            bounds = np.append(np.flatnonzero(starts), n)
            self.max_range.append(int(np.diff(bounds).max()))
            starts[1:] |= self.tokens[1:, t] != self.tokens[:-1, t]
        self._codes = codes

    @property
    def num_items(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def automaton(self):
        """The trie (frontend automaton, implicit targets) of the set."""
        lengths = np.full(self.num_items, self.length, dtype=np.int64)
        return automaton_from_sorted_codes(self._codes, lengths, self.vocab_size, None)

    def states_of_rows(self, rows: np.ndarray) -> list:
        """For each depth t in 0..L-1, int64 (len(rows),): the trie state (id at
        depth t, as numbered by `automaton`) of the length-t prefix of each row."""
        n = self.num_items
        starts = np.zeros(n, dtype=bool)
        starts[0] = True
        out = []
        for t in range(self.length):
            out.append((np.cumsum(starts, dtype=np.int64) - 1)[rows])
            starts[1:] |= self.tokens[1:, t] != self.tokens[:-1, t]
        return out


# --------------------------------------------------------------------------
# The harness


class MaskedBeamState(NamedTuple):
    """tokens int32 (B, M, L), PAD_TOKEN where a beam holds nothing; scores
    float32 (B, M), SENTINEL_SCORE where not valid; valid bool (B, M);
    last_tokens int32 (B, M); constraint: the method's per-beam state, a
    pytree whose leaves have leading dims (B, M)."""

    tokens: Any
    scores: Any
    valid: Any
    last_tokens: Any
    constraint: Any


def _take_beams(x, parent):
    idx = parent.reshape(parent.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def pick_candidate(x, parent, token):
    """x (B, M', K...) -> x[b, parent[b, m], token[b, m]] (B, M)."""
    return jnp.take_along_axis(_take_beams(x, parent), token[..., None], axis=2)[..., 0]


def init_masked_state(method, tables, batch_size: int, beam_size: int, length: int,
                      start_token: int = 0) -> MaskedBeamState:
    first = jnp.broadcast_to(jnp.arange(beam_size)[None, :] == 0, (batch_size, beam_size))
    return MaskedBeamState(
        tokens=jnp.full((batch_size, beam_size, length), PAD_TOKEN, jnp.int32),
        scores=jnp.where(first, 0.0, SENTINEL_SCORE).astype(jnp.float32),
        valid=first,
        last_tokens=jnp.full((batch_size, beam_size), start_token, jnp.int32),
        constraint=method.init(tables, batch_size, beam_size))


def harness_live_beams(step: int, beam_size: int, vocab_size: int,
                       tokens_per_beam: Optional[int]) -> int:
    """Beams that can be valid at `step` of a search (1 at step 0, then at most
    min(V, the step's cap) times more per step): the library's
    `decode.search.live_beam_bounds` with V candidates per beam."""
    live = 1
    for s in range(step):
        cap = step_cap(s, tokens_per_beam)
        live = min(beam_size, live * min(vocab_size, cap or vocab_size))
    return live


def step_cap(step: int, tokens_per_beam: Optional[int]) -> Optional[int]:
    """The cap at `step` as the library applies `tokens_per_beam`
    (`decode_state.check_tokens_per_beam`: none at step 0, the int after)."""
    return check_tokens_per_beam(tokens_per_beam, step + 1)[step]


def masked_beam_step(method, tables, state: MaskedBeamState, logits, step: int,
                     tokens_per_beam: Optional[int]) -> MaskedBeamState:
    """One beam-search step with `method` deciding the allowed tokens.

    logits: float32 (B, M, V). Beams past `harness_live_beams` (known to be
    empty) are not expanded, as in the library's beam search."""
    B, M = state.scores.shape
    live = harness_live_beams(step, M, logits.shape[-1], tokens_per_beam)
    sub = jax.tree_util.tree_map(lambda x: x[:, :live], state)
    logprobs = safe_log_softmax(logits[:, :live])
    allowed, aux = method.allowed(tables, sub.constraint, logprobs, step)
    ok = sub.valid[..., None] & (logprobs > -jnp.inf)
    if allowed is not None:
        ok = ok & allowed
    scores = jnp.where(ok, add_logprob(sub.scores[..., None], logprobs), SENTINEL_SCORE)
    top, parent, token, real = select_beams(scores, M, step_cap(step, tokens_per_beam))
    valid = real & pick_candidate(ok, parent, token)
    history = _take_beams(sub.tokens, parent).at[:, :, step].set(token)
    constraint = method.advance(tables, jax.tree_util.tree_map(
        lambda x: _take_beams(x, parent), sub.constraint), aux, parent, token, step)
    return MaskedBeamState(
        tokens=jnp.where(valid[..., None], history, PAD_TOKEN),
        scores=jnp.where(valid, top, SENTINEL_SCORE).astype(jnp.float32),
        valid=valid,
        last_tokens=jnp.where(valid, token, 0).astype(jnp.int32),
        constraint=constraint)


def model_and_step(method, tables, model_table, state, step: int, tokens_per_beam):
    """The model, then `masked_beam_step` (what one decoding step costs)."""
    logits = TableModel.logits(model_table, state.last_tokens, step)
    return masked_beam_step(method, tables, state, logits, step, tokens_per_beam)


@functools.partial(jax.jit, static_argnames=("method", "batch_size", "beam_size", "length",
                                             "tokens_per_beam"))
def masked_beam_search(method, tables, model_table, *, batch_size: int, beam_size: int, length: int,
                       tokens_per_beam: Optional[int]):
    """Full decode: (tokens int32 (B, M, L), scores float32 (B, M), valid bool (B, M))."""
    state = init_masked_state(method, tables, batch_size, beam_size, length)
    for step in range(length):
        state = model_and_step(method, tables, model_table, state, step, tokens_per_beam)
    return state.tokens, state.scores, state.valid


# --------------------------------------------------------------------------
# Methods. Each is hashable (a static argument) and keeps its arrays in
# `tables` (passed as an argument), never in the traced program.


class Unconstrained:
    """Every token allowed."""

    name = "unconstrained"
    exact = False  # enforces nothing
    tables = ()

    def init(self, tables, batch_size, beam_size):
        return ()

    def allowed(self, tables, constraint, logprobs, step):
        return None, None

    def advance(self, tables, constraint, aux, parent, token, step):
        return ()


class HostTrie:
    """The trie in host memory (the frontend's CSR arrays), queried through
    `jax.pure_callback` at every step: the device sends the beams' trie
    states (B, M) and receives the next state of every token (B, M, V), -1
    where the token is not allowed."""

    name = "host_trie"
    exact = True
    tables = ()

    def __init__(self, sorted_set: SortedSet):
        ir = sorted_set.automaton()
        self.vocab_size = sorted_set.vocab_size
        self._indptr = [np.asarray(layer.indptr, dtype=np.int64) for layer in ir.layers]
        self._tokens = [np.asarray(layer.tokens, dtype=np.int64) for layer in ir.layers]

    def host_arrays(self) -> tuple:
        """The host-side trie: (row pointers per layer, tokens per layer)."""
        return tuple(self._indptr), tuple(self._tokens)

    def children(self, node: np.ndarray, step: int) -> np.ndarray:
        """Host side: int32 (..., V) next state per token, -1 where none."""
        node = np.asarray(node, dtype=np.int64)
        flat = node.reshape(-1)
        indptr, tokens = self._indptr[step], self._tokens[step]
        flat = np.clip(flat, 0, indptr.shape[0] - 2)
        start, end = indptr[flat], indptr[flat + 1]
        count = end - start
        out = np.full((flat.shape[0], self.vocab_size), -1, dtype=np.int32)
        rows = np.repeat(np.arange(flat.shape[0]), count)
        edges = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) \
            + np.repeat(start, count)
        out[rows, tokens[edges]] = edges
        return out.reshape(node.shape + (self.vocab_size,))

    def init(self, tables, batch_size, beam_size):
        return jnp.zeros((batch_size, beam_size), jnp.int32)

    def allowed(self, tables, node, logprobs, step):
        shape = jax.ShapeDtypeStruct(node.shape + (self.vocab_size,), jnp.int32)
        nxt = jax.pure_callback(functools.partial(self.children, step=step), shape, node)
        return nxt >= 0, nxt

    def advance(self, tables, node, nxt, parent, token, step):
        return jnp.maximum(pick_candidate(nxt, parent, token), 0)


def _lower_bound(column, lo, hi, value, iterations: int):
    """Vectorized binary search: first i in [lo, hi) with column[i] >= value
    (hi if none); lo, hi, value broadcast together; `iterations` >=
    ceil(log2(max(hi - lo) + 1))."""
    n = column.shape[0]
    lo, hi = jnp.broadcast_arrays(lo, hi, value)[:2]

    def body(_, bounds):
        lo, hi = bounds
        active = lo < hi
        mid = (lo + hi) >> 1
        less = jnp.take(column, jnp.minimum(mid, n - 1), mode="clip").astype(jnp.int32) < value
        return (jnp.where(active & less, mid + 1, lo), jnp.where(active & ~less, mid, hi))

    return lax.fori_loop(0, iterations, body, (lo, hi))[0]


class ExactBinarySearch:
    """The sorted set on the device, one array per position (tables: L
    arrays (N,)). A beam's state is its range [lo, hi) of items sharing its
    prefix; at step t, for every token v in 0..V, a binary search finds the
    first item of the range whose token t is >= v: token v is allowed when
    bound(v + 1) > bound(v), and [bound(v), bound(v + 1)) is the new range.
    Each search runs ceil(log2(widest range at depth t + 1)) iterations."""

    name = "exact_bsearch"
    exact = True

    def __init__(self, sorted_set: SortedSet):
        self.vocab_size = sorted_set.vocab_size
        self.num_items = sorted_set.num_items
        self.iterations = tuple(max(1, math.ceil(math.log2(r + 1))) for r in sorted_set.max_range)
        self.tables = tuple(jnp.asarray(np.ascontiguousarray(sorted_set.tokens[:, t]))
                            for t in range(sorted_set.length))

    def init(self, tables, batch_size, beam_size):
        return (jnp.zeros((batch_size, beam_size), jnp.int32),
                jnp.full((batch_size, beam_size), self.num_items, jnp.int32))

    def allowed(self, tables, bounds, logprobs, step):
        lo, hi = bounds
        values = lax.iota(jnp.int32, self.vocab_size + 1)
        bound = _lower_bound(tables[step], lo[..., None], hi[..., None], values,
                             self.iterations[step])
        return bound[..., 1:] > bound[..., :-1], bound

    def advance(self, tables, bounds, bound, parent, token, step):
        return (pick_candidate(bound, parent, token), pick_candidate(bound, parent, token + 1))


class ApproxBinarySearch(ExactBinarySearch):
    """Binary search over the sorted set for the `top_n` most likely tokens
    of each beam only (the paper's approximate baseline): a valid token
    outside a beam's top_n is lost, so results can differ from exact ones."""

    name = "approx_bsearch"
    exact = False

    def __init__(self, sorted_set: SortedSet, top_n: int = 50,
                 base: Optional[ExactBinarySearch] = None):
        """base: an ExactBinarySearch of the same set whose device arrays to share."""
        if base is None:
            super().__init__(sorted_set)
        else:
            self.vocab_size, self.num_items = base.vocab_size, base.num_items
            self.iterations, self.tables = base.iterations, base.tables
        self.top_n = min(int(top_n), self.vocab_size)

    def allowed(self, tables, bounds, logprobs, step):
        lo, hi = bounds
        _, cand = lax.top_k(logprobs, self.top_n)  # (B, M', n)
        both = jnp.concatenate([cand, cand + 1], axis=-1)
        bound = _lower_bound(tables[step], lo[..., None], hi[..., None], both,
                             self.iterations[step])
        start, end = bound[..., :self.top_n], bound[..., self.top_n:]
        shape = cand.shape[:-1] + (self.vocab_size,)
        put = lambda x, fill: jnp.full(shape, fill, x.dtype).at[
            tuple(jnp.indices(cand.shape)[:-1]) + (cand,)].set(x)
        start_v, end_v = put(start, 0), put(end, 0)
        return end_v > start_v, (start_v, end_v)

    def advance(self, tables, bounds, aux, parent, token, step):
        start_v, end_v = aux
        return (pick_candidate(start_v, parent, token), pick_candidate(end_v, parent, token))


_HASH_SEED = 0x2545F491


def _mix(h, token, xp):
    """uint32 hash of (prefix hash h, token); identical in numpy and jax
    (murmur3 finalizer over h ^ (token * golden ratio))."""
    u = xp.uint32
    with np.errstate(over="ignore"):  # numpy warns on uint32 scalar wraparound
        x = h ^ (token.astype(u) * u(0x9E3779B1) + u(0x7F4A7C15))
        x = x ^ (x >> u(16))
        x = x * u(0x85EBCA6B)
        x = x ^ (x >> u(13))
        x = x * u(0xC2B2AE35)
        return x ^ (x >> u(16))


class HashBitmap:
    """A bitmap of hashed valid prefixes on the device (tables: uint32 words
    (2^b / 32,)). A beam's state is the hash of its prefix; token v is allowed
    when the bit of hash(prefix, v) is set. One hash function and at least
    `bits_per_prefix` bits per distinct prefix (rounded up to a power of
    two), so about 1 / bits_per_prefix of the invalid tokens pass."""

    name = "hash_bitmap"
    exact = False

    def __init__(self, sorted_set: SortedSet, bits_per_prefix: int = 32):
        self.vocab_size = sorted_set.vocab_size
        tokens = sorted_set.tokens
        n, L = tokens.shape
        prefixes = 0
        starts = np.zeros(n, dtype=bool)
        for t in range(L):
            starts[0] = True
            starts[1:] |= tokens[1:, t] != tokens[:-1, t]
            prefixes += int(starts.sum())
        self.num_prefixes = prefixes
        self.log2_bits = max(5, math.ceil(math.log2(prefixes * bits_per_prefix)))
        words = np.zeros(1 << (self.log2_bits - 5), dtype=np.uint32)
        h = np.full(n, _HASH_SEED, dtype=np.uint32)
        mask = np.uint32((1 << self.log2_bits) - 1) if self.log2_bits < 32 else np.uint32(0xFFFFFFFF)
        for t in range(L):
            h = _mix(h, tokens[:, t], np)
            bit = h & mask
            np.bitwise_or.at(words, bit >> np.uint32(5), np.uint32(1) << (bit & np.uint32(31)))
        self._words = words
        self.tables = (jnp.asarray(words),)

    def _lookup(self, words, h, xp, take):
        mask = xp.uint32((1 << self.log2_bits) - 1) if self.log2_bits < 32 else xp.uint32(0xFFFFFFFF)
        bit = h & mask
        word = take(words, (bit >> xp.uint32(5)).astype(xp.int32))
        return ((word >> (bit & xp.uint32(31))) & xp.uint32(1)) == 1

    def init(self, tables, batch_size, beam_size):
        return jnp.full((batch_size, beam_size), _HASH_SEED, jnp.uint32)

    def allowed(self, tables, h, logprobs, step):
        values = lax.iota(jnp.uint32, self.vocab_size)
        return self._lookup(tables[0], _mix(h[..., None], values, jnp), jnp,
                            lambda a, i: jnp.take(a, i, mode="clip")), None

    def advance(self, tables, h, aux, parent, token, step):
        return _mix(h, token, jnp)

    def false_positive_rate(self, sorted_set: SortedSet, samples: int = 512, seed: int = 0) -> float:
        """Fraction of invalid (prefix, token) pairs the bitmap lets through,
        over `samples` random real prefixes at every depth and all V tokens."""
        rng = np.random.default_rng(seed)
        rows = rng.integers(0, sorted_set.num_items, size=min(samples, sorted_set.num_items))
        trie = HostTrie(sorted_set)
        states = sorted_set.states_of_rows(rows)
        h = np.full(rows.shape[0], _HASH_SEED, dtype=np.uint32)
        false_pos = negatives = 0
        values = np.arange(self.vocab_size, dtype=np.uint32)
        for t in range(sorted_set.length):
            truth = trie.children(states[t], t) >= 0
            hit = self._lookup(self._words, _mix(h[:, None], values[None, :], np), np,
                               lambda a, i: a[i])
            false_pos += int((hit & ~truth).sum())
            negatives += int((~truth).sum())
            h = _mix(h, sorted_set.tokens[rows, t], np)
        return false_pos / max(1, negatives)
