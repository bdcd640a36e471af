"""Brute-force numpy oracles for constrained decoding (test helper, not a test).

Everything here works on the constraint set as a Python set of tuples and on
plain numpy, with no automaton, no table and no jax in the search itself, so
that it checks `static_compiler.backend.decode` independently. The semantics
are those of decode.py's module docstring:

* log-probabilities are float32 ``log_softmax`` over the full vocabulary
  (`log_softmax32`, the same float32 operations as the kernel): a NaN logit is
  an invalid token, +inf logits share all the probability, a -inf
  log-probability is an invalid token;
* step 0 expands beam 0 only; each live beam lists its valid children in
  token order, then the end token (when its prefix is a complete sequence);
  a finished beam is one 'stay' candidate with log-prob 0; with
  ``tokens_per_beam`` each beam keeps its best that many; the best
  ``beam_size`` candidates of a batch row survive, ordered by score
  descending, then parent beam, then that order inside the beam;
* a valid score is ``max(parent + logprob, MIN_VALID_SCORE)`` in float32;
* beams that cannot be filled are invalid: `PAD_TOKEN` tokens,
  `SENTINEL_SCORE`, length 0; tokens after the end token are `PAD_TOKEN`.

`HashModel` is the model used by the tests: its logits are a deterministic
function of (batch row seed, start token, prefix), computed bit-identically
in jax (inside beam search, where the prefix hash lives in `carry` and so
tests that carry is reordered by parent) and in numpy (here). Knobs create
exact ties, NaN, -inf, +inf and huge finite logits on purpose.

The float32 logits are identical on both sides; the kernel's exp/log may
differ from numpy's by an ulp, so scores are compared within a tolerance.
Ties that matter are exact by construction (equal logits in a row, or the
same row on both sides), so an ulp never decides an order.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterable, Optional

import numpy as np

from static_compiler.support.decode_state import MIN_VALID_SCORE, PAD_TOKEN, SENTINEL_SCORE

F32 = np.float32


# --------------------------------------------------------------------------
# The constraint set


class ConstraintSet:
    """A finite set of token tuples, with the queries decoding needs.

    Args:
      sequences: iterable of int sequences (duplicates allowed).
      vocab_size: V.
      end_token: token ending variable-length sequences, or None.
    """

    def __init__(self, sequences: Iterable, vocab_size: int, end_token: Optional[int] = None):
        self.items = frozenset(tuple(int(t) for t in s) for s in sequences)
        self.vocab_size = int(vocab_size)
        self.end_token = end_token
        self.depth = max(len(s) for s in self.items)
        self.max_length = self.depth + (0 if end_token is None else 1)
        kids = {}
        for s in self.items:
            for t in range(len(s)):
                kids.setdefault(s[:t], set()).add(s[t])
        self._children = {p: tuple(sorted(c)) for p, c in kids.items()}

    def children(self, prefix: tuple) -> tuple:
        """Sorted tokens that extend `prefix` towards some item."""
        return self._children.get(tuple(prefix), ())

    def accepts(self, prefix: tuple) -> bool:
        """Whether `prefix` may take the end token (it is a complete item)."""
        return self.end_token is not None and tuple(prefix) in self.items

    def allowed(self, prefix: tuple) -> tuple:
        """Tokens allowed after `prefix`: children, then the end token if accepted."""
        return self.children(prefix) + ((self.end_token,) if self.accepts(prefix) else ())

    def sorted_items(self) -> list:
        return sorted(self.items)


# --------------------------------------------------------------------------
# Scores


def log_softmax32(logits) -> np.ndarray:
    """float32 log_softmax over the last axis with decode.py's special values
    (NaN -> invalid, +inf share all mass, -inf stays -inf); any shape (..., V)."""
    x = np.asarray(logits, dtype=F32)
    x = np.where(np.isnan(x), F32(-np.inf), x)
    posinf = x == np.inf
    has_posinf = posinf.any(axis=-1, keepdims=True)
    x = np.where(has_posinf, np.where(posinf, F32(0), F32(-np.inf)), x)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, F32(0))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=F32))
        out = np.where(x == -np.inf, F32(-np.inf), x - lse)
    return out.astype(F32)


def add_logprob(score, logprob):
    """float32 max(score + logprob, MIN_VALID_SCORE)."""
    with np.errstate(over="ignore"):
        return F32(max(F32(score) + F32(logprob), F32(MIN_VALID_SCORE)))


# --------------------------------------------------------------------------
# The test model


def _mix32(x):
    """murmur3's 32-bit finalizer; works on numpy and jax uint32 arrays alike."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


_KNOBS = ("nan", "neginf", "dup", "zero_row", "posinf_row", "huge_row")


@dataclasses.dataclass(frozen=True)
class HashModel:
    """A deterministic 'language model': logits are a hash of the prefix.

    As a jax ``logits_fn`` it reads everything but the vocabulary from
    `carry` ({"h": uint32 (B, M) prefix hashes, "knobs": int32 (6,)}), so
    instances that differ only in knobs compare equal and reuse one compiled
    beam search; `init_carry` seeds the hashes (one seed per batch row) and
    stores the knobs.

    Knobs are counts out of 256 (probabilities), drawn per row (prefix) or per
    token from hash bits:
      nan, neginf: a token's logit is NaN / -inf;
      dup: a token's logit is 4.0, above every other finite logit (ties at the top);
      zero_row: every finite logit of the row is 0.0 (all-equal logits);
      posinf_row: the row's 'dup' tokens are +inf instead of 4.0;
      huge_row: finite logits are scaled by 8e37, so log-probs reach -6e38:
        some overflow to -inf (invalid), others fall below MIN_VALID_SCORE.
    Ordinary logits are multiples of 2**-21 in [-4, 4), exact in float32.
    """

    vocab_size: int
    nan: int = dataclasses.field(default=0, compare=False)
    neginf: int = dataclasses.field(default=0, compare=False)
    dup: int = dataclasses.field(default=0, compare=False)
    zero_row: int = dataclasses.field(default=0, compare=False)
    posinf_row: int = dataclasses.field(default=0, compare=False)
    huge_row: int = dataclasses.field(default=0, compare=False)

    def __post_init__(self):
        knobs = [getattr(self, k) for k in _KNOBS]
        if min(knobs) < 0 or knobs[0] + knobs[1] + knobs[2] > 256 or sum(knobs[3:]) > 256:
            raise ValueError(f"HashModel knobs {dict(zip(_KNOBS, knobs))}: expected counts "
                             "out of 256 (token knobs and row knobs each summing to <= 256)")

    @property
    def knobs(self) -> np.ndarray:
        return np.asarray([getattr(self, k) for k in _KNOBS], dtype=np.int32)

    # -- hashing (numpy and jax) --

    @staticmethod
    def update(h, token):
        """Hash of a prefix extended by `token` (uint32 h, int token; any xp)."""
        return _mix32(h * np.uint32(0x01000193) ^ (token.astype(np.uint32) + np.uint32(1)))

    def logits_from_hash(self, h, knobs, xp=np):
        """float32 (..., V) logits of prefixes with hashes h uint32 (...,); knobs int32 (6,)."""
        nan, neginf, dup, zero_row, posinf_row, huge_row = (knobs[i] for i in range(6))
        v = _mix32(np.arange(self.vocab_size, dtype=np.uint32) * np.uint32(0x9E3779B1)
                   + np.uint32(0x7F4A7C15))
        u = _mix32(h[..., None] ^ xp.asarray(v))
        cat = (u & np.uint32(255)).astype(np.int32)
        value = (u >> 8).astype(np.float32) * np.float32(2.0 ** -21) - np.float32(4.0)
        row = (_mix32(h ^ np.uint32(0xDEADBEEF)) & np.uint32(255)).astype(np.int32)[..., None]
        zero = row < zero_row
        posinf = (row >= zero_row) & (row < zero_row + posinf_row)
        huge = (row >= zero_row + posinf_row) & (row < zero_row + posinf_row + huge_row)
        is_nan = cat < nan
        is_neginf = (cat >= nan) & (cat < nan + neginf)
        is_dup = (cat >= nan + neginf) & (cat < nan + neginf + dup)
        value = xp.where(is_dup, np.float32(4.0), value)
        value = xp.where(huge, value * np.float32(8e37), value)
        value = xp.where(zero, np.float32(0.0), value)
        value = xp.where(posinf & is_dup, np.float32(np.inf), value)
        value = xp.where(is_neginf, np.float32(-np.inf), value)
        return xp.where(is_nan, np.float32(np.nan), value).astype(np.float32)

    # -- jax side --

    @property
    def carry_axes(self) -> dict:
        """`carry_axes` of `init_carry`'s carry: "h" holds the beams as (B, M)."""
        from static_compiler.backend.decode.carry import BeamAxis
        return {"h": BeamAxis(0, split=True), "knobs": None}

    def init_carry(self, seeds, beam_size: int) -> dict:
        """carry for `sc.beam_search`: {"h": uint32 (B, M) row seeds, "knobs": int32 (6,)}."""
        import jax.numpy as jnp
        seeds = np.asarray(seeds, dtype=np.uint32)
        return {"h": jnp.asarray(np.repeat(seeds[:, None], beam_size, axis=1)),
                "knobs": jnp.asarray(self.knobs)}

    def __call__(self, last_tokens, step, carry):
        """logits_fn: (last_tokens int32 (B, M), step, carry) -> (float32 (B, M, V), carry)."""
        import jax.numpy as jnp
        h = self.update(carry["h"], last_tokens)
        return self.logits_from_hash(h, carry["knobs"], jnp), {"h": h, "knobs": carry["knobs"]}

    # -- numpy side --

    def prefix_hash(self, seed: int, start_token: int, prefix: tuple) -> np.ndarray:
        """uint32 (1,): hash of (start_token,) + prefix in a row seeded `seed`."""
        h = np.asarray([seed], dtype=np.uint32)
        for tok in (start_token,) + tuple(prefix):
            h = self.update(h, np.asarray([tok]))
        return h

    def logits(self, seed: int, start_token: int, prefix: tuple) -> np.ndarray:
        """float32 (V,): the logits after `prefix` in a batch row seeded `seed`."""
        return self.logits_from_hash(self.prefix_hash(seed, start_token, prefix), self.knobs)[0]

    def logprobs(self, seed: int, start_token: int, prefix: tuple) -> np.ndarray:
        return log_softmax32(self.logits(seed, start_token, prefix))


# --------------------------------------------------------------------------
# Beam search


@dataclasses.dataclass
class _Beam:
    prefix: tuple        # tokens so far, the end token included
    score: np.float32
    finished: bool


@dataclasses.dataclass
class Result:
    """Oracle result in the shapes of decode.DecodeResult (numpy)."""

    tokens: np.ndarray   # int32 (B, M, T)
    scores: np.ndarray   # float32 (B, M)
    valid: np.ndarray    # bool (B, M)
    lengths: np.ndarray  # int32 (B, M), end token excluded


def _candidates(cset: ConstraintSet, beam: _Beam, parent: int, logprobs) -> list:
    """(score, parent, order, token, finished) of one beam, in slot order:
    children by token, then the end token (order V), a finished beam's stay (V + 1)."""
    V = cset.vocab_size
    if beam.finished:
        return [(beam.score, parent, V + 1, None, True)]
    lp = logprobs()
    out = [(add_logprob(beam.score, lp[tok]), parent, tok, tok, False)
           for tok in cset.children(beam.prefix) if lp[tok] > -np.inf]
    if cset.accepts(beam.prefix) and lp[cset.end_token] > -np.inf:
        out.append((add_logprob(beam.score, lp[cset.end_token]), parent, V, cset.end_token, True))
    return out


def _best_first(cands: list) -> list:
    return sorted(cands, key=lambda c: (-c[0], c[1], c[2]))


def step_caps(tokens_per_beam, max_length: int) -> list:
    """The per-step cap on each beam's children: an int caps steps 1.. (step 0
    expands the start beam to its top beam_size children, as the paper and
    its reference do); a sequence gives each step's cap (None: no cap)."""
    if tokens_per_beam is None or isinstance(tokens_per_beam, int):
        return [None] + [tokens_per_beam] * (max_length - 1)
    assert len(tokens_per_beam) == max_length
    return list(tokens_per_beam)


def step_widths(beam_size, max_length: int) -> list:
    """The beams kept after each step: an int keeps as many at every step; a
    sequence (a beam schedule) gives each step's."""
    if isinstance(beam_size, int):
        return [beam_size] * max_length
    assert len(beam_size) == max_length
    return list(beam_size)


class prior_lookahead:
    """The look-ahead of item priors, by brute force, over `items_terms`
    ({item tuple: float32 weight x prior} of the live items): `below(prefix)`
    the best term of the items that start with the prefix (the prefix
    itself included), `own(prefix)` the term of the item that is the
    prefix; -inf where none."""

    def __init__(self, items_terms: dict):
        self.items_terms = items_terms

    def below(self, prefix: tuple):
        found = [t for item, t in self.items_terms.items() if item[:len(prefix)] == prefix]
        return max(found) if found else F32(-np.inf)

    def own(self, prefix: tuple):
        return self.items_terms.get(prefix, F32(-np.inf))


def _ranked(cset, cands: list, beams: list, prior) -> list:
    """(rank, parent, order, token, finished, score) of each candidate: with a
    prior (`prior_lookahead`), rank = max(score + term, MIN_VALID_SCORE) in
    float32, term: a child's `below`, the end token's `own` of its beam's
    prefix; a finished beam carried over keeps its score (its rank); else
    the score."""
    out = []
    for score, p, order, tok, fin in cands:
        rank = score
        if prior is not None and tok is not None:
            prefix = beams[p].prefix
            term = prior.own(prefix) if fin else prior.below(prefix + (tok,))
            rank = F32(max(F32(score + term), F32(MIN_VALID_SCORE)))
        out.append((rank, p, order, tok, fin, score))
    return out


def _beam_search_row(cset, model, seed, beam_size, tokens_per_beam, start_token,
                     prior=None) -> list:
    beams = [_Beam((), F32(0), False)]
    widths = step_widths(beam_size, cset.max_length)
    steps = list(zip(step_caps(tokens_per_beam, cset.max_length), widths))
    for t, (cap, width) in enumerate(steps):
        cands = []
        for i, beam in enumerate(beams):
            mine = _ranked(cset, _candidates(cset, beam, i,
                                             lambda b=beam: model.logprobs(seed, start_token,
                                                                           b.prefix)),
                           beams, prior)
            if cap is not None:
                mine = _best_first(mine)[:cap]
            cands += mine
        last = t == len(steps) - 1
        beams = [_Beam(beams[p].prefix + (() if tok is None else (tok,)),
                       rank if (prior is not None and (last or fin)) else score, fin)
                 for rank, p, _, tok, fin, score in _best_first(cands)[:width]]
    return beams


def _pack(rows: list, beam_size: int, max_length: int, end_token) -> Result:
    B = len(rows)
    tokens = np.full((B, beam_size, max_length), PAD_TOKEN, np.int32)
    scores = np.full((B, beam_size), SENTINEL_SCORE, np.float32)
    valid = np.zeros((B, beam_size), bool)
    lengths = np.zeros((B, beam_size), np.int32)
    for b, beams in enumerate(rows):
        for j, beam in enumerate(beams):
            tokens[b, j, :len(beam.prefix)] = beam.prefix
            scores[b, j] = beam.score
            valid[b, j] = True
            lengths[b, j] = len(beam.prefix) - (1 if beam.finished else 0)
    return Result(tokens, scores, valid, lengths)


def _length_rerank(rows: list, length_penalty: float) -> list:
    """GNMT re-ranking: score / ((5 + length) / 6) ** penalty, floored at
    MIN_VALID_SCORE, ordered by (normalized score desc, beam index)."""
    out = []
    for beams in rows:
        normed = []
        for j, beam in enumerate(beams):
            n = len(beam.prefix) - (1 if beam.finished else 0)
            denom = F32((F32(5.0) + F32(n)) / F32(6.0)) ** F32(length_penalty)
            normed.append((F32(max(F32(beam.score / denom), F32(MIN_VALID_SCORE))), j))
        order = sorted(normed, key=lambda x: (-x[0], x[1]))
        out.append([_Beam(beams[j].prefix, s, beams[j].finished) for s, j in order])
    return out


def beam_search(cset: ConstraintSet, model: HashModel, seeds, beam_size: int,
                tokens_per_beam: Optional[int] = None, start_token: int = 0,
                length_penalty: float = 0.0, prior=None) -> Result:
    """Brute-force constrained beam search, one batch row per seed. beam_size:
    an int, or one width per step (a beam schedule: step t keeps its best
    beam_size[t] candidates; the result has beam_size[-1] beams). prior: a
    `prior_lookahead` (fixed-length sets): candidates ranked with it, the
    final scores are the last step's ranks."""
    rows = [_beam_search_row(cset, model, int(s), beam_size, tokens_per_beam, start_token,
                             prior) for s in seeds]
    if length_penalty:
        rows = _length_rerank(rows, length_penalty)
    return _pack(rows, step_widths(beam_size, cset.max_length)[-1], cset.max_length,
                 cset.end_token)


def greedy(cset: ConstraintSet, model: HashModel, seeds, start_token: int = 0) -> Result:
    """Greedy decoding written directly: the best allowed token at each step
    (highest log-prob, lower token id on ties, the end token after children)."""
    rows = []
    for seed in seeds:
        beam = _Beam((), F32(0), False)
        for _ in range(cset.max_length):
            if beam.finished:
                continue
            cands = _candidates(cset, beam, 0,
                                lambda b=beam: model.logprobs(int(seed), start_token, b.prefix))
            if not cands:
                beam = None
                break
            score, _, _, tok, fin = _best_first(cands)[0]
            beam = _Beam(beam.prefix + (tok,), score, fin)
        rows.append([] if beam is None else [beam])
    return _pack(rows, 1, cset.max_length, cset.end_token)


def sequence_scores(cset: ConstraintSet, model: HashModel, seed: int,
                    start_token: int = 0) -> dict:
    """Every item's float32 score (summed as beam search sums them), for items
    whose every token (and end token) is valid: {item tuple: score}."""
    out = {}
    for item in cset.items:
        path = item + ((cset.end_token,) if cset.end_token is not None else ())
        score = F32(0)
        for t, tok in enumerate(path):
            lp = model.logprobs(seed, start_token, path[:t])[tok]
            if not lp > -np.inf:
                break
            score = add_logprob(score, lp)
        else:
            out[item] = score
    return out


def sample_distribution(cset: ConstraintSet, model: HashModel, seed: int, temperature: float,
                        top_k: Optional[int] = None, start_token: int = 0) -> dict:
    """Exact distribution of `sample`: {token path (end token included): prob}.

    Per step, the allowed tokens with a finite log-prob get weight lp / T,
    those below the top_k-th largest weight (ties kept) are dropped, and the
    rest are drawn with probability softmax(weight)."""
    dist = {}

    def walk(prefix, prob):
        if prefix and cset.end_token is not None and prefix[-1] == cset.end_token:
            dist[prefix] = dist.get(prefix, 0.0) + prob
            return
        if len(prefix) == cset.max_length:
            dist[prefix] = dist.get(prefix, 0.0) + prob
            return
        lp = model.logprobs(seed, start_token, prefix).astype(np.float64)
        toks = [t for t in cset.allowed(prefix) if lp[t] > -np.inf]
        if not toks:
            return
        w = np.array([lp[t] for t in toks]) / temperature
        if top_k is not None and top_k < len(toks):
            w = np.where(w >= np.sort(w)[::-1][top_k - 1], w, -np.inf)
        p = np.exp(w - w.max())
        p /= p.sum()
        for tok, q in zip(toks, p):
            if q > 0:
                walk(prefix + (tok,), prob * q)

    walk((), 1.0)
    return dist


# --------------------------------------------------------------------------
# The logits-processor pair


@dataclasses.dataclass
class ProcessorRow:
    prefix: tuple = ()
    valid: bool = True
    finished: bool = False


def mask(cset: ConstraintSet, logits, rows: list) -> np.ndarray:
    """float32 (B, V): logits of allowed tokens (not NaN), SENTINEL_SCORE elsewhere.

    A finished row allows only the end token; an invalid row nothing."""
    x = np.asarray(logits, dtype=F32)
    out = np.full(x.shape, SENTINEL_SCORE, F32)
    for b, row in enumerate(rows):
        if not row.valid:
            continue
        allowed = (cset.end_token,) if row.finished else cset.allowed(row.prefix)
        for tok in allowed:
            if not np.isnan(x[b, tok]):
                out[b, tok] = x[b, tok]
    return out


def advance(cset: ConstraintSet, rows: list, tokens) -> list:
    """Rows after taking `tokens` (B,); a token not allowed invalidates a row."""
    out = []
    for row, tok in zip(rows, np.asarray(tokens).tolist()):
        if not row.valid:
            out.append(ProcessorRow(row.prefix, False, False))
        elif row.finished:
            ok = tok == cset.end_token
            out.append(ProcessorRow(row.prefix, ok, ok))
        elif tok in cset.children(row.prefix):
            out.append(ProcessorRow(row.prefix + (tok,), True, False))
        elif cset.accepts(row.prefix) and tok == cset.end_token:
            out.append(ProcessorRow(row.prefix, True, True))
        else:
            out.append(ProcessorRow(row.prefix, False, False))
    return out


# --------------------------------------------------------------------------
# Sets


LAYOUTS = ("dense_rows", "csr", "near_unary", "unary", "mixed_csr", "mixed_near_unary", "default")
"""Layouts a test compiles for: a kind every layer takes where it can;
"mixed_<kind>": that kind, each of its layers mixed with light_k=1 and two
wide slots (so both the wide slots and their fallback run); "default": the
default pipeline."""


def pipeline_for(layout: str, minimize: bool = False) -> Optional[str]:
    """Pipeline spec pinning every layer it can to `layout` ("default": the
    default pipeline); `minimize` merges equivalent states first (explicit
    targets)."""
    import static_compiler as sc
    if layout == "default" and not minimize:
        return None
    passes = sc.DEFAULT_PIPELINE.split(",")
    if layout.startswith("mixed_"):
        passes = ["verify", f"choose-layout{{force={layout[len('mixed_'):]}}}",
                  "split-heavy{light-k=1,wide-slots=2}", "pack-dtypes"]
    elif layout != "default":
        passes = ["verify", f"choose-layout{{force={layout}}}", "pad-branches{multiple=8}",
                  "pack-dtypes"]
    if minimize:
        passes.insert(1, "minimize{force=true}")
    return ",".join(passes)


def compile_set(items, vocab_size: int, layout: str = "default", end_token=None,
                minimize: bool = False):
    """`sc.compile_constraints` of `items` under `pipeline_for(layout, minimize)`."""
    import static_compiler as sc
    return sc.compile_constraints(list(items), vocab_size, end_token=end_token,
                                  pipeline=pipeline_for(layout, minimize))


def random_set(rng: np.random.Generator, num_items: int, length: int, vocab_size: int,
               skew: float = 0.0) -> list:
    """`num_items` random sequences (duplicates possible) of `length` tokens;
    with skew > 0, tokens follow a Zipf-like law so some states branch a lot."""
    if skew:
        p = 1.0 / np.arange(1, vocab_size + 1) ** skew
        toks = rng.choice(vocab_size, size=(num_items, length), p=p / p.sum())
    else:
        toks = rng.integers(0, vocab_size, size=(num_items, length))
    return [tuple(int(t) for t in row) for row in toks]


def random_ragged_set(rng: np.random.Generator, num_items: int, max_length: int,
                      vocab_size: int, end_token: int) -> list:
    """Random sequences of lengths 1..max_length over the tokens other than
    `end_token`, with prefixes of one another added on purpose."""
    tokens = np.array([t for t in range(vocab_size) if t != end_token])
    out = []
    for _ in range(num_items):
        n = int(rng.integers(1, max_length + 1))
        seq = tuple(int(t) for t in rng.choice(tokens, size=n))
        out.append(seq)
        if n > 1 and rng.random() < 0.3:
            out.append(seq[:int(rng.integers(1, n))])
    return out


def random_then_unary(rng: np.random.Generator, num_pairs: int, vocab_size: int) -> list:
    """Random token pairs, each followed by one token: layer 2 is unary."""
    return [(a, b, (3 * a + b) % vocab_size)
            for a, b in random_set(rng, num_pairs, 2, vocab_size)]


def ragged_then_unary(rng: np.random.Generator, num_items: int, vocab_size: int,
                      end_token: int) -> list:
    """Ragged items of 1..2 tokens; every 2-token item also continues with
    one more token, so layer 2 is unary and its states accept."""
    tokens = [t for t in range(vocab_size) if t != end_token]
    out = []
    for s in random_ragged_set(rng, num_items, 2, vocab_size, end_token):
        out.append(s)
        if len(s) == 2:
            out.append(s + (tokens[(3 * s[0] + s[1]) % len(tokens)],))
    return out


def shared_suffix_set(rng: np.random.Generator, num_pairs: int, vocab_size: int) -> list:
    """Random pairs (a, b), each followed by c in {1, 2} (chosen by a + b)
    and then 3: minimized, the depth-3 states merge into one and the depth-2
    states into two, so layers 1 and 2 get explicit targets (layer 2 unary)."""
    return [(a, b, 1 + (a + b) % 2, 3) for a, b in random_set(rng, num_pairs, 2, vocab_size)]


def shared_suffix_ragged_set(rng: np.random.Generator, vocab_size: int, end_token: int) -> list:
    """Ragged items (a,), (a, b), (a, b, c(b)) over tokens other than the end
    token, with random accepting prefixes: minimized, depth-2 states merge by
    (accepting, c(b)), giving explicit targets into and out of them."""
    tokens = [t for t in range(vocab_size) if t != end_token]
    out = []
    for a in tokens:
        if rng.random() < 0.4:
            out.append((a,))
        for b in rng.choice(tokens, size=int(rng.integers(1, 4)), replace=False).tolist():
            if rng.random() < 0.4:
                out.append((a, b))
            out.append((a, b, tokens[b % 2]))
    return out


def full_product(vocab_size: int, length: int) -> list:
    """Every sequence of `length` tokens: V ** length items."""
    return list(itertools.product(range(vocab_size), repeat=length))


def relabel(ir, rng: np.random.Generator) -> list:
    """A new set with the trie shape of `ir` (an unminimized frontend
    automaton: same branch of every state, same accepting states) and random
    tokens: compiled, it gets the same plan and table shapes, so a jitted
    decoder compiled for `ir`'s shapes serves it without recompiling.
    Tokens avoid the end token; returns the sequences as tuples."""
    from static_compiler.ir import Automaton
    V, end = ir.vocab_size, ir.end_token
    pool = np.array([t for t in range(V) if t != end])
    layers = []
    for layer in ir.layers:
        tokens = np.concatenate([np.sort(rng.choice(pool, size=int(b), replace=False))
                                 for b in layer.branch()] or [np.zeros(0, int)])
        layers.append(layer.replace(tokens=tokens.astype(layer.tokens.dtype), layout=None))
    shaped = Automaton(vocab_size=V, layers=tuple(layers), num_final_states=ir.num_final_states,
                       num_sequences=ir.num_sequences, end_token=end)
    return list(shaped.sequences())


def stats_without_subsets(compiled) -> str:
    """`report.stats_table(compiled)` less its "item subsets" line: what
    `show-ir --stats` prints for the same set read back without its items
    (an artifact saved without subsets, an IR dump)."""
    from static_compiler import report
    lines = report.stats_table(compiled).splitlines(True)
    kept = [line for line in lines if not line.startswith("item subsets:")]
    assert len(kept) == len(lines) - 1, "the compiled set reports no subsets"
    return "".join(kept)
