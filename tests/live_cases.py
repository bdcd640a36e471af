"""The live fuzz's cases (tests/item_bits/test_live_fuzz.py): hypothesis draws small
sets (V 2-64, L 1-5, fixed or variable length, a forced or the default
layout, a reserved capacity or none), their updates (additions within and
past capacity, removals) and subsets, and the oracle over the live items.
The torch backend's tests draw the same cases.

Profiles: CI runs CI_EXAMPLES per test (`STATIC_COMPILER_FUZZ_EXAMPLES`
overrides; HYPOTHESIS_PROFILE=slow multiplies it, see helpers.examples); the
tests marked slow run LONG_EXAMPLES each.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np
import oracle
from helpers import examples
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import static_compiler as sc

CI_EXAMPLES = int(os.environ.get("STATIC_COMPILER_FUZZ_EXAMPLES", examples(6)))
LONG_EXAMPLES = 300


def fuzz_settings(examples: int, shrink: bool = False):
    """Every example compiles a set and its programs (seconds each): CI
    runs derandomized and reports a failure unshrunk; the long profile
    shrinks it."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=examples, deadline=None, derandomize=not shrink, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class LiveCase:
    """A set, its updates and subsets, with what the oracle needs."""

    vocab: int
    end: Optional[int]
    rows: list            # input rows (tuples), duplicates kept
    layout: str
    capacity: Optional[float]
    added: list           # rows added by update(add=...), in order
    remove: np.ndarray    # bool over rows + added
    subsets: list         # bool masks over rows + added
    subset_index: np.ndarray  # int (R',): each batch row's subset
    shape: str

    @property
    def all_rows(self) -> list:
        return self.rows + self.added

    def live_items(self) -> set:
        """The items of the version after the updates: every row's sequence
        (additions restore removed ones), less those removed after."""
        gone = {self.all_rows[i] for i in np.flatnonzero(self.remove)}
        return set(self.all_rows) - gone

    def subset_items(self, r: int) -> set:
        picked = {self.all_rows[i] for i in np.flatnonzero(self.subsets[r])}
        return picked & self.live_items()


def _sequence(draw, tokens: list, length: int, ragged: bool) -> tuple:
    n = draw(st.integers(1, length)) if ragged else length
    return tuple(draw(st.lists(st.sampled_from(tokens), min_size=n, max_size=n)))


@st.composite
def live_cases(draw) -> LiveCase:
    shape = draw(st.sampled_from(["random", "random", "slots", "padded"]))
    V = draw(st.integers(6 if shape == "slots" else 2, 64))
    ragged = V >= 3 and draw(st.booleans())
    end = 0 if ragged else None
    tokens = [t for t in range(V) if t != end]
    if shape == "slots":
        # A dense root (one state) with 32 * W slots, W = ceil(V / 32), and
        # exactly that many two-token prefixes below it, each with one child:
        # the slot layer has as many "states" as the next layer has edges.
        slots = 32 * -(-V // 32)
        firsts = tokens[:max(1, len(tokens) - draw(st.integers(0, len(tokens) // 3)))]
        pairs = sorted({(a, b) for a in firsts for b in tokens},
                       key=lambda p: (p[1] + 7 * p[0]) % 97)
        if len(pairs) < slots:
            shape, rows = "random", None
        else:
            chosen = pairs[:slots]
            tail = draw(st.sampled_from(tokens))
            rows = [(a, b, tail) for a, b in chosen]
            if ragged:  # some items stop after two tokens as well
                rows += [p for p in chosen[:draw(st.integers(0, 3))]]
        layout = draw(st.sampled_from(["dense_rows", "default"]))
        capacity = draw(st.sampled_from([None, None, 1.25, 2.0]))
    if shape == "padded":
        # F first tokens, B children each, one child below those: padding a
        # layer to the capacity can give as many states as it has edges.
        F = draw(st.sampled_from([2, 4, 8]))
        B = draw(st.integers(1, 3))
        if len(tokens) < max(F, B):
            shape = "random"
        else:
            tail = draw(st.sampled_from(tokens))
            rows = [(tokens[-1 - f], tokens[b], tail) for f in range(F) for b in range(B)]
            layout = draw(st.sampled_from(["default", "csr", "near_unary", "unary"]))
            capacity = draw(st.sampled_from([1.25, 1.5, 2.0, 3.0]))
    if shape == "random":
        L = draw(st.integers(1, 5))
        n = draw(st.integers(1, 24))
        rows = [_sequence(draw, tokens, L, ragged) for _ in range(n)]
        rows += [rows[i] for i in draw(st.lists(st.integers(0, n - 1), max_size=3))]
        layout = draw(st.sampled_from(["default", "dense_rows", "csr", "near_unary",
                                       "unary", "mixed_csr"]))
        capacity = draw(st.sampled_from([None, 1.25, 1.5, 2.0]))
    L = max(len(r) for r in rows)
    added = [_sequence(draw, tokens, L, ragged) for _ in range(draw(st.integers(0, 3)))]
    if added and draw(st.booleans()):
        added.append(draw(st.sampled_from(rows)))  # already present
    total = len(rows) + len(added)
    bools = lambda: np.asarray(draw(st.lists(st.booleans(), min_size=total, max_size=total)),
                               bool)
    remove = bools() if draw(st.booleans()) else np.zeros(total, bool)
    subsets = [bools() for _ in range(draw(st.integers(1, 3)))]
    index = np.asarray(draw(st.lists(st.integers(0, len(subsets) - 1), min_size=1, max_size=3)),
                       np.int32)
    return LiveCase(V, end, rows, layout, capacity, added, remove, subsets, index, shape)


def compile_case(case: LiveCase, shards: bool = False, **options):
    """The case's set compiled from its rows; with `shards`, built in
    partitions (`sc.Shards`) straight into its tables, never as an IR."""
    rows = list(case.rows)
    if shards:
        L = max(len(r) for r in rows)
        rows = sc.Shards(np.asarray([list(r) + [-1] * (L - len(r)) for r in rows], np.int64),
                         partitions=2)
    return sc.compile_constraints(rows, case.vocab, end_token=case.end,
                                  pipeline=oracle.pipeline_for(case.layout),
                                  capacity=case.capacity, export_subsets=True, **options)


def updated(compiled, case: LiveCase):
    """The version after the case's additions, then its removals."""
    if case.added:
        compiled = compiled.update(add=list(case.added))
    if case.remove.any():
        compiled = compiled.update(remove=case.remove)
    return compiled


# --------------------------------------------------------------------------
# The oracle over a live set


class EmptySet:
    """The oracle's view of a set with no item."""

    end_token = None

    def children(self, prefix):
        return ()

    def accepts(self, prefix):
        return False

    def allowed(self, prefix):
        return ()


def oracle_set(items: set, case: LiveCase):
    if not items:
        empty = EmptySet()
        empty.end_token = case.end
        return empty
    return oracle.ConstraintSet(items, case.vocab, case.end)


def oracle_rows(results: list, max_length: int) -> oracle.Result:
    """One oracle.Result per batch row -> one, padded to max_length."""
    pad = lambda r: np.pad(r.tokens, ((0, 0), (0, 0), (0, max_length - r.tokens.shape[-1])),
                           constant_values=sc.PAD_TOKEN)
    return oracle.Result(np.concatenate([pad(r) for r in results]),
                         np.concatenate([r.scores for r in results]),
                         np.concatenate([r.valid for r in results]),
                         np.concatenate([r.lengths for r in results]))


def invalid_result(beams: int, max_length: int) -> oracle.Result:
    return oracle.Result(np.full((1, beams, max_length), sc.PAD_TOKEN, np.int32),
                         np.full((1, beams), sc.SENTINEL_SCORE, np.float32),
                         np.zeros((1, beams), bool), np.zeros((1, beams), np.int32))


def oracle_search(sets: list, model, seeds, beams: Optional[int], max_length: int,
                  tokens_per_beam=None) -> oracle.Result:
    """Per batch row b: the oracle over sets[b] (beams None: greedy)."""
    out = []
    for cset, seed in zip(sets, seeds):
        if isinstance(cset, EmptySet):
            out.append(invalid_result(beams or 1, max_length))
        elif beams is None:
            out.append(oracle.greedy(cset, model, [seed]))
        else:
            out.append(oracle.beam_search(cset, model, [seed], beams, tokens_per_beam))
    return oracle_rows(out, max_length)


def replay(cset, prefix: tuple) -> oracle.ProcessorRow:
    """The processor row after taking `prefix` from the root."""
    rows = [oracle.ProcessorRow()]
    for tok in prefix:
        rows = oracle.advance(cset, rows, [tok])
    return rows[0]


def allowed_tokens(cset, row: oracle.ProcessorRow) -> set:
    if not row.valid:
        return set()
    return {cset.end_token} if row.finished else set(cset.allowed(row.prefix))


def paths(items, case: LiveCase, max_length: int) -> list:
    """Each item as the tokens a decoder emits: the item, then the end token
    up to max_length (variable length)."""
    fill = () if case.end is None else (case.end,)
    return [tuple(s) + fill * (max_length - len(s)) for s in items]


def beams_for(count: int) -> int:
    """A beam size >= count, from few values (fewer compiled programs)."""
    return next(m for m in (4, 8, 16, 32, 72) if m >= count)


# --------------------------------------------------------------------------
# Small sets of the ranked-subset tests (both doors: tests/torch_backend/
# test_ranked_subsets.py, tests/backend/test_ranked_subsets_jax.py)


def sorted_set(n: int = 300, seed: int = 3, **options):
    """A fixed-length set compiled from sorted unique rows (row i is item
    i), with an attribute column."""
    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, 12, (n, 3)), axis=0)
    price = rng.integers(0, 100, rows.shape[0])
    return rows, sc.compile_constraints(rows, 12, export_subsets=True,
                                        attributes={"price": price}, **options)


def ragged_set():
    """A variable-length set whose items end at every depth, with additions
    and removals."""
    rng = np.random.default_rng(5)
    rows = [tuple(int(x) for x in rng.integers(1, 9, rng.integers(1, 5))) for _ in range(60)]
    compiled = sc.compile_constraints(rows, 9, end_token=0, export_subsets=True)
    compiled = compiled.update(add=[(1, 1, 1, 2), (2, 2), (3,)]).update(
        remove=np.arange(len(rows) + 3) % 5 == 0)
    return np.asarray([list(r) + [0] * (4 - len(r)) for r in rows + [(1, 1, 1, 2), (2, 2), (3,)]]), \
        compiled


def grid_logits(rng, shape: tuple, V: int) -> np.ndarray:
    """float32 logits (shape + (V,)) with ties (a coarse grid) and a few -inf."""
    x = np.round(rng.normal(size=shape + (V,)), 1).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = -np.inf
    return x


def same_tensors(a, b, where) -> None:
    """torch tensors, or tuples of them, equal bit for bit (the torch
    door's ranked-subset tests: a ranked subset's answers against
    `subset()`'s)."""
    import torch  # (here: the JAX tests that draw these cases need no torch)

    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
        return
    assert len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
        same_tensors(x, y, (where, i))
