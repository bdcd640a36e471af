"""Every decoder of a live set against brute force (issue 27).

Hypothesis draws small sets (V 2-64, L 1-5, fixed or variable length, a
forced or the default layout, a reserved capacity or none), updates them
(additions within and past capacity, removals), and draws subsets and per-row
subsets; each decoder must then give exactly what the brute-force oracle
(`oracle.py`: the set as Python tuples) gives over the live items:
`beam_search` (exact: beams >= items), `greedy_decode`, `sample` (validity),
`mask` / `advance`, `allowed`, `accept_drafts`, and, through a saved
artifact, the serving `beam_step` / `mask` / `advance` and `load_compiled`.

Shapes are drawn so that the count coincidences behind the red team's
findings happen on purpose: a dense root whose (state, token) slots number
exactly the next layer's edges ("slots"), and layers whose capacity padding
makes the padded state count equal the edge count ("padded").

Profiles: CI runs a few examples per test (`STATIC_COMPILER_FUZZ_EXAMPLES`
overrides); the tests marked slow run `LONG_EXAMPLES` each
(``pytest -m slow tests/test_live_fuzz.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import oracle
import static_compiler as sc
from static_compiler.artifact import serving
from test_decode import assert_matches

CI_EXAMPLES = int(os.environ.get("STATIC_COMPILER_FUZZ_EXAMPLES", "6"))
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
# Checks


def check_library(compiled, case: LiveCase) -> None:
    V, T = case.vocab, compiled.max_length
    live = case.live_items()
    R = len(case.subsets)
    stacked = sc.stack_subsets([compiled.subset(m) for m in case.subsets])
    index = case.subset_index
    row_sets = [oracle_set(case.subset_items(int(r)), case) for r in index]
    live_set = oracle_set(live, case)
    model = oracle.HashModel(V, dup=30)
    seeds = list(range(3, 3 + index.shape[0]))
    B = index.shape[0]

    # beam search, exact with as many beams as items
    beams = beams_for(max(len(live), 1))
    got = sc.beam_search(compiled, model, batch_size=1, beam_size=beams,
                         carry=model.init_carry(seeds[:1], beams), carry_axes=model.carry_axes)
    assert_matches(got, oracle_search([live_set], model, seeds[:1], beams, T), "live set")
    got_valid = {tuple(int(t) for t in np.asarray(got.tokens)[0, j, :np.asarray(got.lengths)[0, j]])
                 for j in np.flatnonzero(np.asarray(got.valid)[0])}
    assert got_valid == live, (sorted(got_valid), sorted(live))
    beams = beams_for(max([len(case.subset_items(r)) for r in range(R)] + [1]))
    got = sc.beam_search(compiled, model, batch_size=B, beam_size=beams,
                         carry=model.init_carry(seeds, beams), carry_axes=model.carry_axes,
                         subset=stacked, subset_index=index)
    assert_matches(got, oracle_search(row_sets, model, seeds, beams, T), "per-row subsets")

    # greedy and sampling
    got = sc.greedy_decode(compiled, model, batch_size=B, carry=model.init_carry(seeds, 1),
                           subset=stacked, subset_index=index)
    assert_matches(got, oracle_search(row_sets, model, seeds, None, T), "greedy")
    drawn = sc.sample(compiled, model, jax.random.PRNGKey(len(live)), batch_size=B,
                      temperature=5.0, carry=model.init_carry(seeds, 1), subset=stacked,
                      subset_index=index)
    tokens, valid = np.asarray(drawn.tokens)[:, 0], np.asarray(drawn.valid)[:, 0]
    lengths = np.asarray(drawn.lengths)[:, 0]
    for b in range(B):
        items = case.subset_items(int(index[b]))
        assert bool(valid[b]) == bool(items), (b, items)
        if items:
            assert tuple(int(t) for t in tokens[b, :lengths[b]]) in items

    # mask / advance along every row's path (rows of removed or unselected
    # items turn invalid where they leave the live items)
    # (a traced step for half the cases: one switch program for every step)
    traced = len(case.rows) % 2 == 1
    check_processor(compiled.mask, compiled.advance, compiled.init_state, case, T, stacked,
                    traced)

    # allowed: every prefix of every row, and random ones
    rng = np.random.default_rng(len(case.rows))
    for t in range(T):
        prefixes = sorted({p[:t] for p in paths(case.all_rows, case, T)} |
                          {tuple(int(x) for x in rng.integers(0, V, t)) for _ in range(3)})
        pick = np.asarray([int(index[i % B]) for i in range(len(prefixes))], np.int32)
        got = np.asarray(compiled.allowed(np.asarray(prefixes, np.int32).reshape(len(prefixes), t),
                                          subset=stacked, subset_index=pick))
        for i, p in enumerate(prefixes):
            cset = oracle_set(case.subset_items(int(pick[i])), case)
            assert set(np.flatnonzero(got[i]).tolist()) == allowed_tokens(cset, replay(cset, p)), \
                (t, p, int(pick[i]))
        got = np.asarray(compiled.allowed(np.asarray(prefixes, np.int32).reshape(len(prefixes), t)))
        for i, p in enumerate(prefixes):
            assert set(np.flatnonzero(got[i]).tolist()) == \
                allowed_tokens(live_set, replay(live_set, p)), (t, p, "live")

    check_logits_processor(compiled, case, T, stacked)

    # accept_drafts: each row's whole path as the draft, from the root
    drafts = np.asarray(paths(case.all_rows, case, T), np.int32)
    accepted, _ = compiled.accept_drafts(compiled.init_state(drafts.shape[0]), drafts, 0)
    for i, draft in enumerate(drafts.tolist()):
        assert int(accepted[i]) == drafted(live_set, draft), (draft, int(accepted[i]))
    pick = np.asarray([int(index[i % B]) for i in range(drafts.shape[0])], np.int32)
    accepted, _ = compiled.accept_drafts(compiled.init_state(drafts.shape[0]), drafts, 0,
                                         subset=stacked, subset_index=pick)
    for i, draft in enumerate(drafts.tolist()):
        cset = oracle_set(case.subset_items(int(pick[i])), case)
        assert int(accepted[i]) == drafted(cset, draft), (draft, int(pick[i]))


def check_logits_processor(compiled, case: LiveCase, T: int, stacked) -> None:
    """StaticLogitsProcessor (Hugging Face's protocol, torch tensors) keeps
    exactly the scores of the tokens the oracle allows after each prefix of
    every row: over the live items, and with per-prompt subsets (two rows
    per prompt, as generate lays out beams)."""
    torch = pytest.importorskip("torch")
    from static_compiler.integrations.torch import StaticLogitsProcessor
    prompt = 2
    live_set = oracle_set(case.live_items(), case)
    index = case.subset_index
    for t in range(T):
        prefixes = sorted({p[:t] for p in paths(case.all_rows, case, T)})
        if len(prefixes) % 2:
            prefixes.append(prefixes[0])
        ids = torch.tensor([[1] * prompt + list(p) for p in prefixes], dtype=torch.long)
        scores = torch.zeros((len(prefixes), case.vocab + 3), dtype=torch.float64)
        per_row = [(StaticLogitsProcessor(compiled, prompt), [live_set] * len(prefixes))]
        prompts = len(prefixes) // 2
        pick = np.resize(index, prompts)
        per_row.append((StaticLogitsProcessor(compiled, prompt, subset=stacked, subset_index=pick),
                        [oracle_set(case.subset_items(int(r)), case) for r in np.repeat(pick, 2)]))
        for processor, sets in per_row:
            out = processor(ids, scores)
            assert out.dtype == torch.float64
            kept = np.isfinite(out.numpy())
            for i, p in enumerate(prefixes):
                want = allowed_tokens(sets[i], replay(sets[i], p))
                assert set(np.flatnonzero(kept[i]).tolist()) == want, (t, p)


def drafted(cset, draft: list) -> int:
    """How many of `draft`'s tokens a processor row accepts from the root."""
    row, count = oracle.ProcessorRow(), 0
    for tok in draft:
        if not row.valid or row.finished:
            break
        moved = oracle.advance(cset, [row], [tok])[0]
        if not moved.valid:
            break
        row, count = moved, count + 1
    return count


def check_processor(mask, advance, init_state, case: LiveCase, T: int, subset,
                    traced: bool = False) -> None:
    """mask / advance (a library set's or a served artifact's) over every
    row's path, each row over the subset `case.subset_index` cycles to;
    traced: the step as a jax int32 scalar, not a Python int."""
    rows = paths(case.all_rows, case, T)
    B = len(rows)
    pick = np.asarray([int(case.subset_index[i % case.subset_index.shape[0]])
                       for i in range(B)], np.int32)
    sets = [oracle_set(case.subset_items(int(r)), case) for r in pick]
    state, want_rows = init_state(B), [oracle.ProcessorRow() for _ in range(B)]
    rng = np.random.default_rng(B)
    for t in range(T):
        logits = rng.standard_normal((B, case.vocab)).astype(np.float32)
        step = jnp.int32(t) if traced else t
        got = np.asarray(mask(logits, state, step, subset=subset, subset_index=pick))
        want = np.concatenate([oracle.mask(s, logits[b:b + 1], [r])
                               for b, (s, r) in enumerate(zip(sets, want_rows))])
        np.testing.assert_array_equal(got, want, err_msg=f"mask at step {t}")
        tokens = np.asarray([r[t] for r in rows], np.int32)
        state = advance(state, tokens, step, subset=subset, subset_index=pick)
        want_rows = [oracle.advance(s, [r], [tok])[0]
                     for s, r, tok in zip(sets, want_rows, tokens.tolist())]
        np.testing.assert_array_equal(np.asarray(state.valid), [r.valid for r in want_rows])
        np.testing.assert_array_equal(np.asarray(state.finished),
                                      [r.finished for r in want_rows])


def check_served(path, compiled, case: LiveCase) -> None:
    """The artifact at `path` (the case's set after its updates) serves what
    the library decodes, and load_compiled reads back the same live set."""
    from static_compiler.backend.decode import reorder_carry, resolve_carry_axes
    art = serving.load(path)
    T, V = art.max_length, case.vocab
    assert T == compiled.max_length
    stacked = sc.stack_subsets([art.subset(m) for m in case.subsets])
    check_processor(art.mask, art.advance, art.init_processor_state, case, T, stacked)
    model = oracle.HashModel(V, dup=30)
    beams = art.manifest.beam_sizes()[0]
    index = case.subset_index
    for subset, idx, sets in ((None, None, [oracle_set(case.live_items(), case)] * len(index)),
                              (stacked, index,
                               [oracle_set(case.subset_items(int(r)), case) for r in index])):
        seeds = list(range(5, 5 + len(index)))
        state, carry = art.init_state(len(index), beams), model.init_carry(seeds, beams)
        for t in range(T):
            logits, carry = model(state.last_tokens, jnp.int32(t), carry)
            state = art.beam_step(state, logits, t, subset=subset, subset_index=idx)
            axes = resolve_carry_axes(carry, model.carry_axes, len(index), beams, None)
            carry = reorder_carry(carry, state.parent, axes, None)
        assert_matches(art.finalize(state), oracle_search(sets, model, seeds, beams, T),
                       "served beam_step")
    loaded = sc.load_compiled(path)
    live_set = oracle_set(case.live_items(), case)
    for t in range(T):
        prefixes = sorted({p[:t] for p in paths(case.all_rows, case, T)})
        got = np.asarray(loaded.allowed(np.asarray(prefixes, np.int32).reshape(len(prefixes), t)))
        for i, p in enumerate(prefixes):
            assert set(np.flatnonzero(got[i]).tolist()) == \
                allowed_tokens(live_set, replay(live_set, p)), (t, p, "load_compiled")
    again = sc.stack_subsets([loaded.subset(m) for m in case.subsets])
    for a, b in zip(again.live + again.ends, stacked.live + stacked.ends):
        assert (a is None and b is None) or np.array_equal(a, b)


# --------------------------------------------------------------------------
# Tests


def run_library_case(case: LiveCase) -> None:
    check_library(updated(compile_case(case), case), case)


def run_shards_case(case: LiveCase) -> None:
    """A set built from Shards, which holds no IR: its updates, subsets and
    decoders read the tables, and the IR is never built (unless an
    addition outgrew the capacity: that compiles the merged set anew)."""
    compiled = compile_case(case, shards=True)
    assert "ir" not in compiled.__dict__
    version, grew = compiled, False
    if case.added:
        version = version.update(add=list(case.added))
        grew = bool(version.last_update["grew"])
    if case.remove.any():
        version = version.update(remove=case.remove)
    check_library(version, case)
    assert "ir" not in compiled.__dict__
    if not grew:
        assert "ir" not in version.__dict__, version.last_update


def run_served_case(case: LiveCase, tmp_path) -> None:
    import shutil
    beams = beams_for(max(len(set(case.all_rows)), 1))
    compiled = compile_case(case, export_beam_sizes=(beams,))
    path = tmp_path / "fuzz.static"
    shutil.rmtree(path, ignore_errors=True)
    compiled.save(path)
    if case.added:
        sc.update_artifact(path, add=list(case.added))
    if case.remove.any():
        sc.update_artifact(path, remove=case.remove)
    check_served(path, updated(compiled, case), case)


@fuzz_settings(CI_EXAMPLES)
@given(case=live_cases())
def test_every_library_decoder_equals_brute_force(case):
    run_library_case(case)


@fuzz_settings(max(2, CI_EXAMPLES // 2))
@given(case=live_cases())
def test_sets_built_from_shards_stay_in_their_tables_and_equal_brute_force(case):
    run_shards_case(case)


@fuzz_settings(max(2, CI_EXAMPLES // 2))
@given(case=live_cases())
def test_served_artifacts_and_load_compiled_equal_brute_force(case, tmp_path_factory):
    run_served_case(case, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.slow
@fuzz_settings(LONG_EXAMPLES, shrink=True)
@given(case=live_cases())
def test_every_library_decoder_equals_brute_force_long(case):
    run_library_case(case)


@pytest.mark.slow
@fuzz_settings(LONG_EXAMPLES, shrink=True)
@given(case=live_cases())
def test_sets_built_from_shards_stay_in_their_tables_long(case):
    run_shards_case(case)


@pytest.mark.slow
@fuzz_settings(LONG_EXAMPLES // 4, shrink=True)
@given(case=live_cases())
def test_served_artifacts_and_load_compiled_equal_brute_force_long(case, tmp_path_factory):
    run_served_case(case, tmp_path_factory.mktemp("fuzz"))
