"""Ranked subsets on the torch door (`TorchConstraints.ranked_subset`):
every verb over a ranked subset returns what it returns over `subset` of
the same selection, bit for bit (masks, allowed tokens, states,
processor steps with and without their columns, prefix masks, beam steps
and whole searches), on the live fuzz's sets (every layout, fixed length
and variable length, items that are prefixes of others included,
capacity, additions, removals), one subset and R stacked per-row ones;
a filter (`where=`) and sorted inputs (the rows are the items: no
scatter) the same; the reads trace under torch.compile(fullgraph=True);
bad inputs are refused naming the value (another set's or version's
ranked subset, a wrong index or selection, a set without
an item index).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from live_cases import (
    CI_EXAMPLES,
    compile_case,
    fuzz_settings,
    grid_logits,
    live_cases,
    paths,
    ragged_set,
    same_tensors,
    sorted_set,
    updated,
)

import static_compiler as sc
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.item_bits.rank import RankedSubset
from static_compiler.torch_backend import TorchConstraints, ops
from static_compiler.torch_backend import rank_kernels as rk

_same = same_tensors


def _logits(rng, shape, V: int) -> torch.Tensor:
    return torch.from_numpy(grid_logits(rng, shape, V))


def check_verbs(tc: TorchConstraints, case, ranked, subset, index) -> None:
    """Every verb over `ranked` (with `index`, ints or None) equals it over
    `subset`."""
    T, V = tc.max_length, case.vocab
    rng = np.random.default_rng(len(case.rows) + T)
    drafts = np.asarray(paths(case.all_rows, case, T), np.int64)
    drafts[::3, -1] = rng.integers(0, V, drafts[::3].shape[0])
    n = drafts.shape[0]
    pick = None if index is None else \
        np.asarray([int(index[i % len(index)]) for i in range(n)], np.int64)
    ours = dict(subset=ranked, subset_index=pick)
    theirs = dict(subset=subset, subset_index=pick)
    tensor_pick = None if pick is None else torch.from_numpy(pick)
    for t in range(T):  # prefix masks: every prefix of the paths
        pre = torch.from_numpy(np.unique(drafts[:, :t], axis=0) if t else drafts[:, :0])
        k = pre.shape[0]
        rows = None if pick is None else pick[:k] if k <= n else np.resize(pick, k)
        _same(tc.allowed(pre, subset=ranked, subset_index=rows),
              tc.allowed(pre, subset=subset, subset_index=rows), ("allowed", t))
    mine = theirs_state = tc.init_processor(n)
    fused = cold = None
    for step in range(T):
        want = tc.allowed_tokens(theirs_state, step, **theirs)
        _same(tc.allowed_tokens(mine, step, **ours), want, ("allowed_tokens", step))
        logits = _logits(rng, (n,), V)
        _same(tc.mask(logits, mine, step, **ours), tc.mask(logits, theirs_state, step, **theirs),
              ("mask", step))
        # a subset_index tensor stays on the device: the same answers
        if pick is not None:
            _same(tc.allowed_tokens(mine, step, subset=ranked, subset_index=tensor_pick), want,
                  ("tensor index", step))
        last = None if step == 0 else torch.from_numpy(drafts[:, step - 1])
        fused = tc.processor_step(mine if fused is None else fused.state, step, tokens=last,
                                  columns=None if fused is None else fused.columns, **ours)
        cold = tc.processor_step(mine if cold is None else cold.state, step, tokens=last, **ours)
        for got in (fused, cold):
            _same(got.allowed, want, ("processor_step", step))
            _same(got.state, theirs_state, ("processor_step state", step))
        tokens = torch.from_numpy(drafts[:, step])
        theirs_state = tc.advance(theirs_state, tokens, step, **theirs)
        mine = tc.advance(mine, tokens, step, **ours)
        _same(mine, theirs_state, ("advance", step))
    # beams: step by step with a width schedule, then whole searches
    B, M = 3, 4
    rows = None if index is None else np.asarray([int(index[i % len(index)]) for i in range(B)])
    a = b = tc.init_beams(B, M)
    for step in range(T):
        logits = _logits(rng, tuple(a.node.shape), V)
        width = M if step % 2 else 3
        a = tc.beam_step(a, logits, step, subset=ranked, subset_index=rows, beam_size=width)
        b = tc.beam_step(b, logits, step, subset=subset, subset_index=rows, beam_size=width)
        _same(a, b, ("beam_step", step))
    table = torch.from_numpy(rng.normal(size=(T, V + 1, V)).astype(np.float32))

    def model(last, step, carry):
        return table[step][last.clamp(0, V)], carry

    for beams in (M, 1):
        _same(tc.beam_search(model, B, beams, subset=ranked, subset_index=rows),
              tc.beam_search(model, B, beams, subset=subset, subset_index=rows),
              ("beam_search", beams))


@fuzz_settings(max(4, CI_EXAMPLES // 2))
@given(live_cases())
def test_every_verb_over_a_ranked_subset_equals_it_over_the_subset(case):
    compiled = updated(compile_case(case), case)
    tc = TorchConstraints.from_compiled(compiled)
    one = tc.ranked_subset(case.subsets[0])
    assert isinstance(one, RankedSubset) and one.num_subsets == 1
    subset = tc.subset(case.subsets[0])
    np.testing.assert_array_equal(one.sizes, subset.sizes)
    check_verbs(tc, case, one, subset, None)
    # R per-row subsets: made at once from (R, N), or stacked from R made apart
    stacked = sc.stack_subsets([tc.subset(m) for m in case.subsets])
    at_once = tc.ranked_subset(np.stack(case.subsets))
    apart = sc.stack_subsets([tc.ranked_subset(m) for m in case.subsets])
    assert isinstance(apart, RankedSubset)
    check_verbs(tc, case, at_once, stacked, case.subset_index)
    positions = np.arange(at_once.items.size + at_once.at.shape[0] + 1)
    for r in range(len(case.subsets)):
        np.testing.assert_array_equal(apart.prefix(positions, r), at_once.prefix(positions, r))


def test_a_filter_and_sorted_rows_give_the_subsets_items(tmp_path):
    """where= gives the filter's items; rows that are the items in order
    are read as the item mask itself (no scatter): the same answers, on
    the compiled set's door and on a loaded artifact's."""
    rows, compiled = sorted_set()
    compiled.save(tmp_path / "set.sc")
    for tc in (TorchConstraints.from_compiled(compiled),
               TorchConstraints.load(tmp_path / "set.sc")):
        assert tc._set_view._rows_are_items.get()
        state = tc.init_processor(2)
        for ranked, subset in ((tc.ranked_subset(where="price < 30"), tc.subset(where="price < 30")),
                               (tc.ranked_subset(rows[:, 0] % 2 == 0),
                                tc.subset(rows[:, 0] % 2 == 0))):
            allowed = tc.allowed(torch.from_numpy(rows[:, :2]), subset=ranked)
            _same(allowed, tc.allowed(torch.from_numpy(rows[:, :2]), subset=subset), "allowed")
            _same(tc.allowed_tokens(state, 0, subset=ranked),
                  tc.allowed_tokens(state, 0, subset=subset), "allowed_tokens")
    # duplicates: rows are not the items, the scatter gives the same
    twice = np.concatenate([rows, rows[:5]])
    dup = TorchConstraints.from_compiled(sc.compile_constraints(twice, 12, export_subsets=True))
    mask = np.arange(twice.shape[0]) % 3 == 0
    assert not dup._set_view._rows_are_items.get()
    for ranked in (dup.ranked_subset(mask), dup.ranked_subset(where="not picked",
                                                               masks={"picked": ~mask})):
        _same(dup.allowed(torch.from_numpy(twice[:, :2]), subset=ranked),
              dup.allowed(torch.from_numpy(twice[:, :2]), subset=dup.subset(mask)), "duplicates")


def test_token_sequences_select_as_subset_does():
    rows, compiled = sorted_set()
    tc = TorchConstraints.from_compiled(compiled)
    picked = rows[::7]
    _same(tc.allowed(torch.from_numpy(rows[:, :2]), subset=tc.ranked_subset(picked)),
          tc.allowed(torch.from_numpy(rows[:, :2]), subset=tc.subset(picked)), "sequences")


@pytest.mark.parametrize("make", [sorted_set, ragged_set])
def test_ranked_steps_trace_under_torch_compile_fullgraph(make):
    rows, compiled = make()
    tc = TorchConstraints.from_compiled(compiled)
    live = tc._engine.place_subset(tc.ranked_subset(np.stack([rows[:, 1] < 5, rows[:, 2] > 6])),
                                   np.array([0, 1, 1]), 3, "test", tc.fingerprint)
    assert isinstance(live[0], rk.RankedLive)

    def run(state, sub):
        out = []
        for t in range(tc.max_length):
            allowed = ops.mask_at(tc.plan, tc._tables, state, t, sub)
            out.append(allowed)
            state = ops.advance_at(tc.plan, tc._tables, state, allowed.long().argmax(1), t, sub)
        return torch.cat(out, dim=1), state.valid

    state = tc.init_processor(3)
    want = run(state, live)
    assert want[0].any()
    _same(torch.compile(run, fullgraph=True, backend="eager")(state, live), want, "compiled")


def test_bad_ranked_subsets_are_refused_naming_the_value(tmp_path):
    rows, compiled = sorted_set()
    tc = TorchConstraints.from_compiled(compiled)
    n = rows.shape[0]
    ranked = tc.ranked_subset(np.arange(n) % 2 == 0)
    state = tc.init_processor(4)
    other = TorchConstraints.from_compiled(sorted_set(seed=4)[1])
    theirs = other.ranked_subset(np.ones(other._set_view.items.num_items, bool))
    with pytest.raises(DecodeInputError, match="allowed_tokens: the ranked subset was made "
                                               "from another set"):
        tc.allowed_tokens(state, 0, subset=theirs)
    # another version (removals): refused as its Subset would be
    later = TorchConstraints.from_compiled(compiled.update(remove=np.arange(n) == 3))
    with pytest.raises(DecodeInputError, match="mask: the ranked subset was made from another"):
        later.mask(torch.zeros(4, 12), later.init_processor(4), 0, subset=ranked)
    stacked = tc.ranked_subset(np.stack([np.arange(n) % k == 0 for k in (2, 3)]))
    with pytest.raises(DecodeInputError, match=r"2 stacked subsets: pass subset_index"):
        tc.allowed_tokens(state, 0, subset=stacked)
    with pytest.raises(DecodeInputError, match=r"subset_index has shape \(3,\)"):
        tc.advance(state, torch.zeros(4, dtype=torch.long), 0, subset=stacked,
                   subset_index=np.zeros(3, np.int64))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 2: expected a subset in "
                                               r"\[0, 2\)"):
        tc.allowed(torch.zeros((4, 1), dtype=torch.long), subset=stacked,
                   subset_index=np.array([0, 2, 1, 0]))
    with pytest.raises(DecodeInputError, match="subset_index"):
        tc.beam_step(tc.init_beams(4, 2), torch.zeros(4, 2, 12), 0, subset=stacked,
                     subset_index=torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ConstraintSetError, match=r"selection has shape \(1, 2, \d+\)"):
        tc.ranked_subset(np.ones((1, 2, n), bool))
    with pytest.raises(ConstraintSetError, match=r"selection has shape \(0, \d+\)"):
        tc.ranked_subset(np.ones((0, n), bool))
    with pytest.raises(ConstraintSetError, match="mask has shape"):
        tc.ranked_subset(np.ones(n + 1, bool))
    with pytest.raises(ConstraintSetError, match="different sets"):
        sc.stack_subsets([ranked, theirs])
    with pytest.raises(ConstraintSetError, match=r"of Subset \(or of RankedSubset\), got "
                                                 r"\['RankedSubset', 'Subset'\]"):
        sc.stack_subsets([ranked, tc.subset(np.ones(n, bool))])
    sc.compile_constraints(rows, 12).save(tmp_path / "bare.sc")  # (no item index saved)
    bare = TorchConstraints.load(tmp_path / "bare.sc")
    with pytest.raises(DecodeInputError, match="ranked_subset: .* has no item index"):
        bare.ranked_subset(np.ones(n, bool))
    with pytest.raises(DecodeInputError, match="allowed_tokens: a ranked subset, but this set "
                                               "has no item index"):
        bare.allowed_tokens(bare.init_processor(4), 0, subset=ranked)
