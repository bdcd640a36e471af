"""The torch engine's host steps (`torch_backend.host_steps` over the numba
kernels of `host_kernels.processor`): `mask`, `advance` and
`processor_step` equal the torch ops (`ops.mask_at` / `advance_at` /
`processor_step`) bit for bit, on the live cases (every layout, capacity,
removals, additions, subsets as liveness bits and ranked, one and stacked
per row, fixed and variable length) along every path and on adversarial
rows (states outside their depth, finished and invalid rows, tokens
outside the vocabulary, subset rows outside the stack); the door picks
them for CPU tensors, liveness bits and ranked subsets, only outside
torch.compile.
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
import torch
from backend.test_processor import make_set
from hypothesis import given
from live_cases import CI_EXAMPLES, compile_case, fuzz_settings, live_cases, paths, updated

import static_compiler as sc
from static_compiler.errors import ConstraintSetError
from static_compiler.host_kernels import processor as host_kernels
from static_compiler.host_kernels import ranked as host_ranked
from static_compiler.torch_backend import TorchConstraints, TorchState, live_bits, ops
from static_compiler.torch_backend.host_steps import HostSteps
from static_compiler.torch_backend.rank_kernels import RankedLive

pytestmark = pytest.mark.skipif(not host_kernels.AVAILABLE, reason="numba is not installed")


def _same_state(a, b, where):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y), where


def _check_step(hs: HostSteps, eng, state, tokens, step, sub, where):
    """Host and ops agree on the mask at `step`, the advance along
    `tokens` at `step` and the fused step at step + 1 (a ranked subset's:
    with the bounds kept and without, every depth walked)."""
    want = ops.mask_at(eng.plan, eng.tables, state, step, sub)
    moved = ops.advance_at(eng.plan, eng.tables, state, tokens, step, sub)
    ranked = sub is not None and isinstance(sub[0], RankedLive)
    for host in (hs, HostSteps(eng.plan, eng.tables, bounds_kept=0)) if ranked else (hs,):
        got = host.mask(state, step, sub)
        assert got.dtype == torch.bool and torch.equal(got, want), ("mask", where)
        _same_state(host.advance(state, tokens, step, sub), moved, ("advance", where))
        if step + 1 < eng.plan.max_length:
            fused = ops.processor_step(eng.plan, eng.tables, state, tokens, None, step + 1, sub)
            mine = host.processor_step(state, tokens, step + 1, sub)
            _same_state(mine.state, fused.state, ("processor_step", where))
            assert torch.equal(mine.allowed, fused.allowed), ("processor_step", where)
    return moved


def _adversarial(rng, count: int, n: int, V: int, end) -> tuple:
    """Rows anywhere: states outside [0, count), invalid and finished rows
    (finished ones not at 0 too), tokens outside [0, V) and the end token."""
    node = torch.from_numpy(rng.integers(-2, count + 3, n).astype(np.int64))
    valid = torch.from_numpy(rng.random(n) < 0.8)
    finished = torch.from_numpy(rng.random(n) < (0.2 if end is not None else 0.0))
    tokens = rng.integers(-1, V + 2, n)
    if end is not None:
        tokens[::3] = end
    return TorchState(node, valid, finished), torch.from_numpy(tokens.astype(np.int64))


def _ranked(tc: TorchConstraints, selection, index, n: int) -> tuple:
    """(RankedLive, rows int64 (n,)): a ranked subset of `selection` placed
    as the door places it (index: ints (n,) or None)."""
    live = tc._engine.place_subset(tc.ranked_subset(selection), index, n, "test", tc.fingerprint)
    assert isinstance(live[0], RankedLive) and tc._engine._host_for(live) is not None
    return live


@fuzz_settings(max(4, CI_EXAMPLES // 2))  # (each example compiles a set)
@given(live_cases())
def test_host_steps_match_the_torch_ops(case):
    compiled = updated(compile_case(case), case)
    tc = TorchConstraints.from_compiled(compiled)
    eng = tc._engine
    hs = eng._host_for(None)
    assert isinstance(hs, HostSteps)  # (CPU tensors, numba installed)
    T, V = compiled.max_length, case.vocab
    stacked = sc.stack_subsets([compiled.subset(m) for m in case.subsets])
    bits = live_bits(stacked)
    R = len(case.subsets)
    rng = np.random.default_rng(len(case.rows) * 7 + V)
    drafts = np.asarray(paths(case.all_rows, case, T), np.int64)
    drafts[::3, -1] = rng.integers(0, V, drafts[::3].shape[0])
    n = drafts.shape[0]
    pick = torch.from_numpy(rng.integers(0, R, n).astype(np.int64))
    base = eng._base_bits
    ranked = _ranked(tc, np.stack(case.subsets), pick, n)  # (R per-row ranked subsets)
    subs = [None, (bits, pick), _ranked(tc, case.subsets[0], None, n), ranked] + \
        ([] if base is None else [(base, torch.zeros(n, dtype=torch.int64))])
    for i, sub in enumerate(subs):
        state = ops.init_state(n)
        for step in range(T):
            state = _check_step(hs, eng, state, torch.from_numpy(drafts[:, step]), step, sub,
                                ("path", step, i))
    # adversarial rows, and subset rows outside [0, R) (an index tensor's values stay unchecked)
    for step in range(T):
        state, tokens = _adversarial(rng, tc.plan.count_at(step), 24, V, tc.end_token)
        wild = torch.from_numpy(rng.integers(-1, R + 2, 24).astype(np.int64))
        for i, sub in enumerate((None, (bits, wild), (ranked[0], wild))):
            _check_step(hs, eng, state, tokens, step, sub, ("adversarial", step, i))


def test_the_door_runs_the_host_steps_on_cpu_only_outside_torch_compile(monkeypatch):
    rows = [(1, 2, 3), (1, 2, 4), (5, 6, 7), (5, 8, 9)]
    tc = TorchConstraints.from_compiled(sc.compile_constraints(rows, 10, end_token=0))
    calls = []
    real = HostSteps.mask
    monkeypatch.setattr(HostSteps, "mask", lambda self, *a: calls.append("mask") or real(self, *a))
    state = tc.init_processor(2)
    first = tc.processor_step(state, 0)
    assert calls == ["mask"] and first.columns.columns is None
    token = torch.tensor([1, 5])
    second = tc.processor_step(first.state, 1, tokens=token, columns=first.columns)
    assert calls == ["mask"] * 2 and second.allowed[:, [2, 6, 8]].tolist() == \
        [[True, False, False], [False, True, True]]

    def run(state, token):
        moved = tc.advance(state, token, 0)
        return tc.allowed_tokens(moved, 1)

    compiled = torch.compile(run, fullgraph=True, backend="eager")(state, token)
    assert torch.equal(compiled, second.allowed) and calls == ["mask"] * 2  # (traced: the ops)
    assert torch.equal(tc.allowed_tokens(second.state, 1), second.allowed)
    assert calls == ["mask"] * 3
    # a ranked subset: the host loops too, the ops when traced (the same answers)
    rows_ranked = tc.ranked_subset(np.array([True, False, True, False]))
    picked = tc.allowed_tokens(second.state, 1, subset=rows_ranked)
    assert calls == ["mask"] * 4 and picked[:, [2, 4, 6, 8]].tolist() == \
        [[True, False, False, False], [False, False, True, False]]
    ranked = torch.compile(lambda s, t: tc.allowed_tokens(tc.advance(s, t, 0, subset=rows_ranked),
                                                          1, subset=rows_ranked),
                           fullgraph=True, backend="eager")(state, token)
    assert torch.equal(ranked, picked) and calls == ["mask"] * 4



@pytest.mark.parametrize("kind, layout, minimize", [
    *[(kind, layout, False) for kind in ("fixed", "ragged") for layout in oracle.LAYOUTS],
    *[("shared", layout, True) for layout in ("csr", "unary", "dense_rows", "near_unary")],
    *[("shared-ragged", layout, True) for layout in ("near_unary", "csr", "unary")]])
def test_host_steps_match_the_torch_ops_on_every_layout(kind, layout, minimize):
    """Every layout of fixed and variable-length sets, and minimized ones
    (states shared, targets explicit), along random walks that mostly take
    allowed tokens, and on adversarial rows."""
    items, end_token = make_set(kind)
    tc = TorchConstraints.from_compiled(oracle.compile_set(items, 8, layout, end_token, minimize))
    eng = tc._engine
    assert not minimize or any(s.explicit_targets for s in tc.plan.steps)
    rng = np.random.default_rng([oracle.LAYOUTS.index(layout) if layout in oracle.LAYOUTS else 9,
                                 len(kind)])
    V, n = tc.vocab_size, 32
    subs: list = [None]
    if minimize:  # (states shared between items: no subset of either form)
        with pytest.raises(ConstraintSetError, match="share states between items"):
            tc.ranked_subset(np.ones(len(items), bool))
    else:  # two ranked subsets per row, some rows outside [0, 2)
        N = tc._set_view.items.num_items
        wild = torch.from_numpy(rng.integers(-1, 4, n))
        subs.append((_ranked(tc, rng.random((2, N)) < 0.5, np.zeros(n, np.int64), n)[0], wild))
    for sub in subs:
        state = ops.init_state(n)
        for step in range(tc.max_length):
            allowed = ops.mask_at(eng.plan, eng.tables, state, step, sub)
            tokens = torch.multinomial(allowed.float() + 1e-3, 1)[:, 0]
            where = (step, sub is None)
            state = _check_step(eng._host_for(sub), eng, state, tokens, step, sub, ("walk", where))
            rows, tokens = _adversarial(rng, tc.plan.count_at(step), n, V, tc.end_token)
            _check_step(eng._host_for(sub), eng, rows, tokens, step, sub, ("adversarial", where))


@pytest.mark.parametrize("size", [1100, 1024, 31])
def test_rank_reads_equal_the_torch_reads_and_clamp_as_they_do(size):
    """`processor._rank` of placed rank bits (`rank_kernels.rank_tensors`:
    a size that fills its words keeps a spare block) equals `rank_at`, and
    `ItemRanks.rank` where in range, for positions outside [0, size] and
    rows outside [0, R) too (clamped)."""
    from static_compiler.item_bits.rank import ItemRanks
    from static_compiler.torch_backend import rank_kernels as rk

    mask = np.random.default_rng(size).random((3, size)) < 0.4
    ranks = ItemRanks.of_mask(mask, fine=True)
    placed = rk.rank_tensors(ranks)
    w, wi, c = (np.ascontiguousarray(x.numpy()) for x in (placed.words, placed.within,
                                                          placed.counts))
    at = np.arange(-3, size + 40)
    for row in range(-2, 5):
        want = rk.rank_at(placed, torch.full((at.shape[0],), row), torch.from_numpy(at)).numpy()
        got = [host_ranked._rank(w, wi, c, row, 0, 0, size, int(a)) for a in at]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(want, ranks.rank(np.clip(at, 0, size), min(max(row, 0), 2)))


@pytest.mark.parametrize("layout", ["near_unary", "csr", "dense_rows"])
def test_kept_bounds_are_the_torch_bounds_of_the_shallowest_depths_that_fit(layout):
    """`host_steps.host_ranges` keeps `rank_kernels.below` of every state of
    depths 1, 2, ... while they fit in `kept` entries, none past the first
    that does not."""
    from static_compiler.torch_backend import host_steps
    from static_compiler.torch_backend import rank_kernels as rk
    from static_compiler.torch_backend.host_steps import host_ranges

    items, end_token = make_set("ragged")
    tc = TorchConstraints.from_compiled(oracle.compile_set(items, 8, layout, end_token))
    ranges = tc._engine.ranges("test")
    sizes = [ranges.counts[d] + 1 for d in range(1, ranges.depth)]
    # the door's: at most a tenth of the tables' bytes (at least BOUNDS_KEPT)
    hs = tc._engine._host_for(None)
    tc.allowed_tokens(tc.init_processor(2), 1, subset=tc.ranked_subset(np.ones(len(items), bool)))
    table_bytes = sum(t.numel() * t.element_size() for tabs in tc._engine.tables
                      for t in tabs.values())
    assert hs.bounds_kept == max(host_steps.BOUNDS_KEPT, int(table_bytes / 10))
    kept_bytes = hs._ranges[1].ints.nbytes - host_ranges(ranges, 0).ints.nbytes
    assert 0 < kept_bytes <= hs.bounds_kept
    for kept in (0, sizes[0], sizes[0] + sizes[1] - 1, sum(sizes)):
        packed = host_ranges(ranges, kept)
        budget = kept
        fit = next((i for i in range(len(sizes)) if sum(sizes[:i + 1]) > budget), len(sizes))
        starts = packed.meta[1:ranges.depth, host_ranked.BELOW]
        assert (starts >= 0).tolist() == [i < fit for i in range(len(sizes))], (kept, starts)
        for d, start in enumerate(starts[:fit], 1):
            want = rk.below(ranges, d, torch.arange(sizes[d - 1])[None]).numpy()[0]
            np.testing.assert_array_equal(packed.ints[start:start + sizes[d - 1]], want)
