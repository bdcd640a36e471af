"""Every decoder of a live set against brute force.

Hypothesis draws small sets (V 2-64, L 1-5, fixed or variable length, a
forced or the default layout, a reserved capacity or none), updates them
(additions within and past capacity, removals), and draws subsets and per-row
subsets; each decoder must then give exactly what the brute-force oracle
(`oracle.py`: the set as Python tuples) gives over the live items:
`beam_search` (exact: beams >= items), `greedy_decode`, `sample` (validity),
`mask` / `advance`, `allowed`, `accept_drafts`, and, through a saved
artifact, the serving `beam_step` / `mask` / `advance` and `sc.load`.

Shapes are drawn so that the count coincidences behind the red team's
findings happen on purpose: a dense root whose (state, token) slots number
exactly the next layer's edges ("slots"), and layers whose capacity padding
makes the padded state count equal the edge count ("padded").

The cases and the oracle over a live set are in live_cases.py. Profiles: CI
runs a few examples per test (`STATIC_COMPILER_FUZZ_EXAMPLES` overrides,
HYPOTHESIS_PROFILE=slow multiplies), each test also the explicit
`UPDATED_CASE` (additions and removals, every example compiles for seconds);
the tests marked slow run `LONG_EXAMPLES` each
(``pytest -m slow tests/item_bits/test_live_fuzz.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import assert_matches, ir_unread
from hypothesis import example, given
from live_cases import (
    CI_EXAMPLES,
    LONG_EXAMPLES,
    LiveCase,
    allowed_tokens,
    beams_for,
    compile_case,
    fuzz_settings,
    live_cases,
    oracle_search,
    oracle_set,
    paths,
    replay,
    updated,
)

import static_compiler as sc
from static_compiler import serving

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
    check_processor(compiled.mask, compiled.advance, compiled.init_processor, case, T, stacked,
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
    accepted, _ = compiled.accept_drafts(compiled.init_processor(drafts.shape[0]), drafts, 0)
    for i, draft in enumerate(drafts.tolist()):
        assert int(accepted[i]) == drafted(live_set, draft), (draft, int(accepted[i]))
    pick = np.asarray([int(index[i % B]) for i in range(drafts.shape[0])], np.int32)
    accepted, _ = compiled.accept_drafts(compiled.init_processor(drafts.shape[0]), drafts, 0,
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
    the library decodes, and sc.load reads back the same live set."""
    from static_compiler.backend.decode.carry import reorder_carry, resolve_carry_axes
    art = serving.load(path)
    T, V = art.max_length, case.vocab
    assert T == compiled.max_length
    stacked = sc.stack_subsets([art.subset(m) for m in case.subsets])
    check_processor(art.mask, art.advance, art.init_processor, case, T, stacked)
    model = oracle.HashModel(V, dup=30)
    beams = art.manifest.beam_sizes()[0]
    index = case.subset_index
    for subset, idx, sets in ((None, None, [oracle_set(case.live_items(), case)] * len(index)),
                              (stacked, index,
                               [oracle_set(case.subset_items(int(r)), case) for r in index])):
        seeds = list(range(5, 5 + len(index)))
        state, carry = art.init_beams(len(index), beams), model.init_carry(seeds, beams)
        for t in range(T):
            logits, carry = model(state.last_tokens, jnp.int32(t), carry)
            state = art.beam_step(state, logits, t, subset=subset, subset_index=idx)
            axes = resolve_carry_axes(carry, model.carry_axes, len(index), beams, None)
            carry = reorder_carry(carry, state.parent, axes, None)
        assert_matches(art.finalize(state), oracle_search(sets, model, seeds, beams, T),
                       "served beam_step")
    loaded = sc.load(path)
    live_set = oracle_set(case.live_items(), case)
    for t in range(T):
        prefixes = sorted({p[:t] for p in paths(case.all_rows, case, T)})
        got = np.asarray(loaded.allowed(np.asarray(prefixes, np.int32).reshape(len(prefixes), t)))
        for i, p in enumerate(prefixes):
            assert set(np.flatnonzero(got[i]).tolist()) == \
                allowed_tokens(live_set, replay(live_set, p)), (t, p, "sc.load")
    again = sc.stack_subsets([loaded.subset(m) for m in case.subsets])
    for a, b in zip(again.live + again.ends, stacked.live + stacked.ends):
        assert (a is None and b is None) or np.array_equal(a, b)


# --------------------------------------------------------------------------
# Tests

# Drawn examples per CI test (each compiles its set's programs: 15-25 s):
# the library test a third of the CI count, the shards and served ones a
# sixth; each test also runs UPDATED_CASE.
LIBRARY_EXAMPLES = max(1, CI_EXAMPLES // 3)
SHARDS_EXAMPLES = SERVED_EXAMPLES = max(1, CI_EXAMPLES // 6)

# A ragged set (traced steps: 7 rows) with a reserved capacity, additions
# (one already present) and removals (an added item and an input one), two
# subsets: the update paths every test meets whatever hypothesis draws.
_UPDATED_ROWS = [(1, 2, 3), (1, 2), (4, 5, 6, 7), (4, 5, 6, 8), (2,), (1, 2, 3), (8, 1, 1, 3)]
_UPDATED_ADDED = [(3, 3, 3), (8, 1), (1, 2)]
UPDATED_CASE = LiveCase(
    vocab=9, end=0, rows=_UPDATED_ROWS, layout="near_unary", capacity=1.5, added=_UPDATED_ADDED,
    remove=np.isin(np.arange(10), [3, 7]),
    subsets=[np.isin(np.arange(10), [0, 2, 7, 8]), np.isin(np.arange(10), [1, 3, 4, 9])],
    subset_index=np.asarray([1, 0, 1], np.int32), shape="random")


def run_library_case(case: LiveCase) -> None:
    check_library(updated(compile_case(case), case), case)


def run_shards_case(case: LiveCase) -> None:
    """A set built from Shards, which holds no IR: its updates, subsets and
    decoders read the tables, and the IR is never built (unless an
    addition outgrew the capacity: that compiles the merged set anew)."""
    compiled = compile_case(case, shards=True)
    assert ir_unread(compiled)
    version, grew = compiled, False
    if case.added:
        version = version.update(add=list(case.added))
        grew = bool(version.build.last_update["grew"])
    if case.remove.any():
        version = version.update(remove=case.remove)
    check_library(version, case)
    assert ir_unread(compiled)
    if not grew:
        assert ir_unread(version), version.build.last_update


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


@fuzz_settings(LIBRARY_EXAMPLES)
@given(case=live_cases())
@example(case=UPDATED_CASE)
def test_every_library_decoder_equals_brute_force(case):
    run_library_case(case)


@fuzz_settings(SHARDS_EXAMPLES)
@given(case=live_cases())
@example(case=UPDATED_CASE)
def test_sets_built_from_shards_stay_in_their_tables_and_equal_brute_force(case):
    run_shards_case(case)


@fuzz_settings(SERVED_EXAMPLES)
@given(case=live_cases())
@example(case=UPDATED_CASE)
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
