"""Item subsets (`compiled.subset`, `sc.stack_subsets`): decoding over some
items of a compiled set equals the brute-force oracle over those items alone,
for every layout, fixed and variable length, with and without a cap per beam,
one subset or one per batch row, and reuses the compiled program.

The compiled set is fixed per (family, layout) and hypothesis varies the
subset, so each case compiles once.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import oracle
import pytest
from helpers import assert_matches, packed_words
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler import frontend as sc_frontend
from static_compiler import report
from static_compiler.backend import decode as decode_lib
from static_compiler.backend import kernels
from static_compiler.backend.decode import search
from static_compiler.compiler_items import subsets
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.frontend import datasets
from static_compiler.item_bits import layer_walk, layers
from static_compiler.lowered import plan as plan_lib


@dataclasses.dataclass(frozen=True)
class Case:
    make: object  # rng -> items (the input rows, duplicates kept)
    vocab: int
    end: object
    beams: int
    tokens_per_beam: object = None


CASES = {
    "fixed": Case(lambda rng: oracle.random_set(rng, 50, 4, 6, skew=1.0), 6, None, 5, 2),
    "ragged": Case(lambda rng: oracle.random_ragged_set(rng, 25, 4, 7, end_token=0), 7, 0, 6),
    "unary-tail": Case(lambda rng: oracle.random_then_unary(rng, 30, 8), 8, None, 4),
}
LAYOUTS = {"fixed": oracle.LAYOUTS,
           "ragged": ("csr", "near_unary", "mixed_csr", "dense_rows", "default"),
           "unary-tail": ("unary", "dense_rows")}


@functools.lru_cache(maxsize=None)
def compiled_case(name: str, layout: str):
    case = CASES[name]
    items = case.make(np.random.default_rng(11))
    items = items + items[:3]  # duplicate rows: one item each
    return items, oracle.compile_set(items, case.vocab, layout, case.end)


def oracle_result(items, mask, case: Case, model, seeds, max_length: int):
    """The oracle over the selected items (all beams invalid when none),
    padded to the compiled set's length."""
    chosen = [items[i] for i in np.flatnonzero(mask)]
    B, M = len(seeds), case.beams
    if not chosen:
        return oracle.Result(np.full((B, M, max_length), sc.PAD_TOKEN, np.int32),
                             np.full((B, M), sc.SENTINEL_SCORE, np.float32),
                             np.zeros((B, M), bool), np.zeros((B, M), np.int32))
    want = oracle.beam_search(oracle.ConstraintSet(chosen, case.vocab, case.end), model, seeds,
                              M, case.tokens_per_beam)
    pad = max_length - want.tokens.shape[-1]
    tokens = np.pad(want.tokens, ((0, 0), (0, 0), (0, pad)), constant_values=sc.PAD_TOKEN)
    return oracle.Result(tokens, want.scores, want.valid, want.lengths)


def decode(compiled, model, seeds, case: Case, **kwargs):
    return sc.beam_search(compiled, model, batch_size=len(seeds), beam_size=case.beams,
                          tokens_per_beam=case.tokens_per_beam,
                          carry=model.init_carry(seeds, case.beams), carry_axes=model.carry_axes,
                          **kwargs)


masks = st.sampled_from(["random", "empty", "all", "one"])


def draw_mask(data, n: int) -> np.ndarray:
    kind = data.draw(masks, label="mask kind")
    if kind == "empty":
        return np.zeros(n, bool)
    if kind == "all":
        return np.ones(n, bool)
    if kind == "one":
        mask = np.zeros(n, bool)
        mask[data.draw(st.integers(0, n - 1), label="the item")] = True
        return mask
    seed = data.draw(st.integers(0, 2 ** 32 - 1), label="mask seed")
    return np.random.default_rng(seed).random(n) < data.draw(st.sampled_from([0.1, 0.3, 0.7]))


@pytest.mark.parametrize("name, layout", [(n, lay) for n in CASES for lay in LAYOUTS[n]])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_beam_search_over_a_subset_matches_the_oracle_over_its_items(name, layout, data):
    case = CASES[name]
    items, compiled = compiled_case(name, layout)
    mask = draw_mask(data, len(items))
    model = oracle.HashModel(case.vocab, dup=40, nan=10)
    seeds = data.draw(st.lists(st.integers(0, 2 ** 32 - 1), min_size=2, max_size=2))
    got = decode(compiled, model, seeds, case, subset=compiled.subset(mask))
    assert_matches(got, oracle_result(items, mask, case, model, seeds, compiled.max_length),
                   f"({name}, {layout}, {int(mask.sum())} of {len(items)} rows)")


def slow_unless(default: set, combos: list) -> list:
    """`combos` as parameters: those in `default` in CI, the rest only under
    `-m slow` (each compiles its programs anew)."""
    return [c if c in default else pytest.param(*c, marks=pytest.mark.slow) for c in combos]


@pytest.mark.parametrize("name, packed", slow_unless(
    {("fixed", True), ("ragged", False), ("unary-tail", True)},
    [(n, p) for n in sorted(CASES) for p in (True, False)]))
def test_per_row_subsets_each_match_the_oracle(name, packed, monkeypatch):
    """Per-row subsets, through packed runs and through the per-step switch
    (in CI each set once, both ways across the sets; every pair under slow)."""
    if not packed:
        monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", -1)
    jax.clear_caches()
    case = CASES[name]
    items, compiled = compiled_case(name, "default")
    rng = np.random.default_rng(5)
    masks = [rng.random(len(items)) < 0.4, np.zeros(len(items), bool), np.ones(len(items), bool)]
    stacked = sc.stack_subsets([compiled.subset(m) for m in masks])
    assert stacked.num_subsets == 3
    index = np.array([2, 0, 1, 0])
    seeds = [7, 8, 9, 10]
    model = oracle.HashModel(case.vocab, dup=40)
    got = decode(compiled, model, seeds, case, subset=stacked, subset_index=index)
    for b, r in enumerate(index):
        want = oracle_result(items, masks[r], case, model, [seeds[b]], compiled.max_length)
        row = jax.tree_util.tree_map(lambda x: np.asarray(x)[b:b + 1], got)
        assert_matches(row, want, f"row {b}, subset {r}")
    jax.clear_caches()


def test_a_subset_equals_the_set_compiled_from_its_items_and_reuses_the_program():
    case = CASES["ragged"]
    items, compiled = compiled_case("ragged", "default")
    model = oracle.HashModel(case.vocab, dup=40)
    seeds = [1, 2]
    rng = np.random.default_rng(0)
    first = None
    for _ in range(3):
        mask = rng.random(len(items)) < 0.5
        got = decode(compiled, model, seeds, case, subset=compiled.subset(mask))
        alone = oracle.compile_set([items[i] for i in np.flatnonzero(mask)], case.vocab,
                                   "default", case.end)
        want = decode(alone, model, seeds, case)
        for a, b in zip(got, want):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_array_equal(a[..., :b.shape[-1]] if a.ndim == 3 else a, b)
        if first is None:
            first = search._beam_search.compilations()
    assert search._beam_search.compilations() == first + 2  # the two sets alone, not the subsets


def test_greedy_and_sample_stay_in_the_subset():
    case = CASES["fixed"]
    items, compiled = compiled_case("fixed", "default")
    mask = np.zeros(len(items), bool)
    mask[[3, 17, 29]] = True
    chosen = {tuple(items[i]) for i in (3, 17, 29)}
    model = oracle.HashModel(case.vocab)
    seeds = [4, 5, 6]
    sub = compiled.subset(mask)
    greedy = sc.greedy_decode(compiled, model, batch_size=3, carry=model.init_carry(seeds, 1),
                              subset=sub)
    want = oracle.greedy(oracle.ConstraintSet(chosen, case.vocab), model, seeds)
    assert_matches(greedy, want)
    drawn = sc.sample(compiled, model, jax.random.PRNGKey(0), batch_size=3,
                      carry=model.init_carry(seeds, 1), subset=sub)
    for row in np.asarray(drawn.tokens)[:, 0]:
        assert tuple(int(t) for t in row) in chosen


def test_liveness_bits_equal_brute_force():
    items, compiled = compiled_case("ragged", "csr")
    mask = np.random.default_rng(2).random(len(items)) < 0.3
    live, ends = subsets.liveness(compiled.ir, compiled.items,
                                  subsets.rows_item_mask(mask, compiled.items, "test"))
    chosen = {tuple(items[i]) for i in np.flatnonzero(mask)}
    every = sorted({tuple(s) for s in items})
    # States at each depth are numbered in the sorted order of their prefixes.
    for d in range(1, compiled.ir.depth + 1):
        prefixes = sorted({s[:d] for s in every if len(s) >= d})
        assert live[d - 1].tolist() == [any(c[:d] == p for c in chosen) for p in prefixes]
        if ends[d] is not None:
            assert ends[d].tolist() == [p in chosen for p in prefixes]


SLOT_CASES = [("fixed", "dense_rows", None), ("fixed", "default", None),
              ("fixed", "dense_rows", 1.5), ("ragged", "dense_rows", None),
              ("ragged", "dense_rows", 2.0), ("unary-tail", "dense_rows", None),
              ("unary-tail", "unary", None)]


@functools.lru_cache(maxsize=None)
def slot_case(name: str, layout: str, capacity):
    if capacity is None:
        return compiled_case(name, layout)
    case = CASES[name]
    items = case.make(np.random.default_rng(11))
    return items, sc.compile_constraints(items, case.vocab, end_token=case.end, capacity=capacity,
                                         pipeline=oracle.pipeline_for(layout))


@pytest.mark.parametrize("name, layout, capacity", SLOT_CASES)
def test_slot_bits_and_shared_depths_hold_the_per_state_liveness(name, layout, capacity):
    """A subset's bits, unpacked, equal the per-state liveness (`liveness`,
    checked against brute force above): at the children of dense steps at
    least half full, in (state, token) order (the slot of state s and token
    v holds its child's bit, absent children and padding 0); elsewhere per
    state, padded to the tables' capacity; a unary layer's two depths are
    one array, counted once in nbytes."""
    items, compiled = slot_case(name, layout, capacity)
    ir, plan = compiled.ir, compiled.plan
    mask = np.random.default_rng(5).random(len(items)) < 0.4
    sub = compiled.subset(mask)
    live, _ = subsets.liveness(ir, compiled.items, subsets.rows_item_mask(mask, compiled.items, "t"))
    slots = set(plan_lib.slot_steps(plan))
    counts = plan_lib.state_counts(plan)
    W = layers.slot_words(ir.vocab_size)
    unpack = lambda words: np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    for d in range(1, ir.depth + 1):
        (got,) = [unpack(row) for row in sub.live[d - 1]]
        if d - 1 in slots:
            layer = ir.layers[d - 1]
            want = np.zeros((counts[d - 1], 32 * W), bool)
            want[np.repeat(np.arange(layer.num_states), layer.branch()), layer.tokens] = live[d - 1]
            np.testing.assert_array_equal(got, want.reshape(-1), err_msg=f"depth {d}")
        else:
            want = np.zeros(32 * -(-counts[d] // 32), bool)
            want[:live[d - 1].shape[0]] = live[d - 1]
            np.testing.assert_array_equal(got, want, err_msg=f"depth {d}")
    walks = layers.layer_walks(ir.layers)
    shared = [d for d in range(1, ir.depth) if walks[d].kind == "unary" and
              {d - 1, d}.isdisjoint(slots) and counts[d] == counts[d + 1]]
    for d in shared:
        assert sub.live[d - 1] is sub.live[d], d
    assert sub.nbytes == sum(w.nbytes for w in {id(w): w for w in sub.live + sub.ends
                                                if w is not None}.values())
    if (name, layout) == ("unary-tail", "unary"):
        assert shared  # the case holds unary depths once
    if layout == "dense_rows":
        assert slots  # the case reads slot bits


def test_slot_bits_only_where_dense_rows_are_at_least_half_full():
    """Sparser dense steps keep per-state bits (slot bits would cost more
    than 2 bits per child there)."""
    items, compiled = compiled_case("fixed", "dense_rows")
    plan = compiled.plan
    V = compiled.ir.vocab_size
    fill = [s.num_next_states / (s.num_states * V) for s in plan.steps]
    assert set(plan_lib.slot_steps(plan)) == {t for t, f in enumerate(fill) if f >= 0.5}
    assert any(f < 0.5 for f in fill) and any(f >= 0.5 for f in fill)
    live_w, _ = decode_lib.live.subset_widths(plan)
    sub = compiled.subset(np.ones(len(items), bool))
    assert [w.shape[1] for w in sub.live] == list(live_w)


def test_bits_of_another_layout_are_refused_by_the_decoder():
    """A LiveMask whose dense step holds per-state bits (the layout of
    format version 4 modules) has the wrong width there: the decoder names
    the depth and the width it expects."""
    items, compiled = compiled_case("fixed", "dense_rows")
    plan = compiled.plan
    t = plan_lib.slot_steps(plan)[-1]
    sub = compiled.subset(np.ones(len(items), bool))
    per_state = -(-plan.steps[t].num_next_states // 32)
    live = list(sub.live)
    live[t] = np.zeros((1, per_state), np.uint32)
    mask = decode_lib.live.LiveMask(tuple(live), sub.ends, np.zeros(2, np.int32))
    want = decode_lib.live.subset_widths(plan)[0][t]
    assert want != per_state
    with pytest.raises(DecodeInputError, match=rf"subset live bits at depth {t + 1} are uint32 "
                                               rf"\(1, {per_state}\): expected uint32 \(R, {want}\)"):
        search.beam_search(plan, compiled.lowered.device_tables, lambda *a: None, batch_size=2,
                           beam_size=2, subset=mask)


def test_stacked_subsets_keep_shared_depths_shared():
    items, compiled = compiled_case("unary-tail", "unary")
    masks = [np.random.default_rng(s).random(len(items)) < 0.5 for s in range(3)]
    stacked = sc.stack_subsets([compiled.subset(m) for m in masks])
    one = compiled.subset(masks[0])
    pairs = [(i, j) for i in range(len(one.live)) for j in range(i + 1, len(one.live))
             if one.live[i] is one.live[j]]
    assert pairs
    for i, j in pairs:
        assert stacked.live[i] is stacked.live[j]
    assert stacked.nbytes == 3 * one.nbytes
    live, _ = stacked.placed(jnp.asarray)
    for i, j in pairs:
        assert live[i] is live[j]


def test_subset_memory_at_scale_is_under_one_bit_per_state():
    """A synthetic Semantic-ID set like the benchmark's (dense root, then
    near-unary and unary layers): slot bits at the root, unary depths held
    once, well under one bit per state and subset."""
    n, V = 3000, 64
    compiled = sc.compile_constraints(datasets.synthetic_sids(n, 8, V, seed=0), V)
    sub = compiled.subset(np.random.default_rng(0).random(n) < 0.1)
    assert plan_lib.slot_steps(compiled.plan) == (0, 1)
    bits = sub.bits_per_state(compiled.ir.num_states)
    assert bits < 0.7
    # show-ir --stats reports the same figures
    (line,) = [s for s in report.stats_table(compiled).splitlines() if s.startswith("item subsets")]
    assert line == (f"item subsets: {sub.nbytes} bytes per subset ({bits:.3f} bits per state); "
                    "slot bits for the children of steps [0, 1]; depths [5, 6, 7] hold the next "
                    "depth's bits")


# -- bad input ---------------------------------------------------------------


def test_bad_masks_are_rejected():
    items, compiled = compiled_case("fixed", "default")
    n = len(items)
    with pytest.raises(ConstraintSetError, match=rf"shape \({n - 1},\): expected \({n},\)"):
        compiled.subset(np.ones(n - 1, bool))
    with pytest.raises(ConstraintSetError, match="dtype int64: expected a bool mask"):
        compiled.subset(np.ones(n, np.int64))


def test_a_subset_of_another_set_is_rejected():
    case = CASES["fixed"]
    items, compiled = compiled_case("fixed", "default")
    _, other = compiled_case("fixed", "csr")
    other_items, third = compiled_case("ragged", "default")
    model = oracle.HashModel(case.vocab)
    with pytest.raises(DecodeInputError, match="made from another compiled set"):
        decode(compiled, model, [1], case, subset=third.subset(np.ones(len(other_items), bool)))
    with pytest.raises(ConstraintSetError, match="different compiled sets"):
        sc.stack_subsets([compiled.subset(np.ones(len(items), bool)),
                          third.subset(np.ones(len(other_items), bool))])
    # The same items under another layout: other tables and bit rows, another fingerprint.
    assert other.plan != compiled.plan and other.fingerprint != compiled.fingerprint
    with pytest.raises(DecodeInputError, match="made from another compiled set"):
        decode(other, model, [1], case, subset=compiled.subset(np.ones(len(items), bool)))


def test_bad_subset_index_is_rejected():
    case = CASES["fixed"]
    items, compiled = compiled_case("fixed", "default")
    one = compiled.subset(np.ones(len(items), bool))
    two = sc.stack_subsets([one, one])
    model = oracle.HashModel(case.vocab)
    with pytest.raises(DecodeInputError, match="2 stacked subsets: pass subset_index"):
        decode(compiled, model, [1, 2], case, subset=two)
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 2: expected a subset in \[0, 2\)"):
        decode(compiled, model, [1, 2], case, subset=two, subset_index=np.array([0, 2]))
    with pytest.raises(DecodeInputError, match=r"subset_index has shape \(3,\)"):
        decode(compiled, model, [1, 2], case, subset=two, subset_index=np.array([0, 1, 1]))
    with pytest.raises(DecodeInputError, match="subset_index without a subset"):
        decode(compiled, model, [1, 2], case, subset_index=np.array([0, 1]))
    with pytest.raises(DecodeInputError, match="expected a Subset"):
        decode(compiled, model, [1, 2], case, subset=np.ones(len(items), bool))
    with pytest.raises(ConstraintSetError, match="non-empty list of Subset"):
        sc.stack_subsets([])


def test_sets_whose_items_share_states_refuse_subsets():
    rng = np.random.default_rng(3)
    items = oracle.shared_suffix_set(rng, 10, 12)
    minimized = oracle.compile_set(items, 12, "default", minimize=True)
    with pytest.raises(ConstraintSetError, match="'minimize' pass"):
        minimized.subset(np.ones(len(items), bool))
    graph = nx.DiGraph()
    graph.add_node("s", start=True)
    graph.add_edge("s", "a", token=1)
    graph.add_edge("a", "f", token=2)
    graph.nodes["f"]["accept"] = True
    try:
        compiled = sc.compile_constraints(graph, 4)
    except ConstraintSetError:
        pytest.skip("graph frontend expects another graph form")
    with pytest.raises(ConstraintSetError, match="no item index"):
        compiled.subset(np.ones(1, bool))


@pytest.mark.parametrize("layout", ["mixed_csr", "mixed_near_unary", "near_unary", "csr"])
def test_subsets_through_each_steps_own_kernel(layout, monkeypatch):
    """With packing off every run takes the per-step switch, so the mixed
    layout's light and wide slices read the subset bits themselves."""
    monkeypatch.setattr(kernels, "PACK_MAX_ENTRIES", -1)
    jax.clear_caches()
    case = CASES["fixed"]
    items, compiled = compiled_case("fixed", layout)
    model = oracle.HashModel(case.vocab, dup=40)
    rng = np.random.default_rng(9)
    for _ in range(2):
        mask = rng.random(len(items)) < 0.3
        seeds = [int(x) for x in rng.integers(0, 2 ** 32, size=2)]
        got = decode(compiled, model, seeds, case, subset=compiled.subset(mask))
        assert_matches(got, oracle_result(items, mask, case, model, seeds, compiled.max_length))
    jax.clear_caches()


@pytest.mark.parametrize("chunk", [1 << 22, 1, 3])
@pytest.mark.parametrize("share", [0.25, -1.0, 1.0])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), ragged=st.booleans())
def test_every_way_across_a_layer_gives_the_same_liveness(share, chunk, seed, ragged):
    """Unary, near-unary (bit copies between exceptions) and per-row walks
    all give the liveness brute force gives, over a layer at once or a few
    states at a time (`WALK_CHUNK`: how 1e9 states are walked)."""
    rng = np.random.default_rng(seed)
    items = (oracle.random_ragged_set(rng, 30, 5, 5, end_token=0) if ragged else
             oracle.random_set(rng, 30, 5, 3))
    ir, index = sc_frontend.build_trie(items, 5, end_token=0 if ragged else None)
    mask = rng.random(len(items)) < 0.4
    item_live = subsets.rows_item_mask(mask, index, "test")
    old = (layers.NEAR_UNARY_SHARE, layer_walk.WALK_CHUNK)
    layers.NEAR_UNARY_SHARE, layer_walk.WALK_CHUNK = share, chunk
    try:
        live, ends = subsets.liveness(ir, index, item_live)
    finally:
        layers.NEAR_UNARY_SHARE, layer_walk.WALK_CHUNK = old
    chosen = {tuple(items[i]) for i in np.flatnonzero(mask)}
    every = sorted({tuple(s) for s in items})
    for d in range(1, ir.depth + 1):
        prefixes = sorted({s[:d] for s in every if len(s) >= d})
        assert live[d - 1].tolist() == [any(c[:d] == p for c in chosen) for p in prefixes], d
        if ends[d] is not None:
            assert ends[d].tolist() == [p in chosen for p in prefixes], d


@pytest.mark.parametrize("widest", [7, 63, 64, 65, 70_000])
def test_a_general_layer_with_wide_rows_tests_every_row(widest):
    """Rows of a general layer wider than a word (the bits of one row span
    many words, starting and ending mid-word) are live exactly when one of
    their children is, with a dead row between live ones."""
    rng = np.random.default_rng(widest)
    branch = rng.integers(2, 6, size=60_000)
    branch[rng.integers(0, branch.size)] = widest
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    layer = layers.TrieLayer(indptr)
    (walk,) = layers.layer_walks([layer])
    assert walk.kind == "general"
    for share in (0.0, 0.01, 0.5, 1.0):
        live_next = rng.random(int(indptr[-1])) < share
        live_next[indptr[1]:indptr[2]] = False  # a dead row between live ones
        got = layer_walk.bools(layer_walk.child_live(layer, walk, live_next))
        want = np.logical_or.reduceat(live_next, indptr[:-1])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("branch", [[1, 1, 2, 1, 3], [1, 2, 1, 0, 0], [0, 1, 1, 1, 0],
                                    [2, 0, 1, 1, 1], [3, 0, 0, 0, 0]])
def test_near_unary_rows_at_the_end_of_the_layer(branch, monkeypatch):
    """Exceptions whose rows end at the layer's last edge, or are empty there
    (the row bounds the reduction takes stop short of the end), give the
    liveness of a plain per-row reduction, for every pattern of live
    children. A state without children accepts (a trie's layer)."""
    monkeypatch.setattr(layers, "NEAR_UNARY_SHARE", 1.0)
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    layer = layers.TrieLayer(indptr, np.asarray(branch) == 0)
    (walk,) = layers.layer_walks([layer])
    assert walk.kind == "near"
    edges = int(indptr[-1])
    for pattern in range(1 << edges):
        live_next = np.array([(pattern >> e) & 1 for e in range(edges)], dtype=bool)
        want = [bool(live_next[a:b].any()) for a, b in zip(indptr[:-1], indptr[1:])]
        got = layer_walk.bools(layer_walk.child_live(layer, walk, live_next))
        assert got.tolist() == want, pattern


@pytest.mark.parametrize("name, traced", slow_unless(
    {("ragged", False), ("fixed", True)},
    [(n, t) for t in (False, True) for n in ("ragged", "fixed")]))
def test_mask_and_advance_follow_each_rows_subset(name, traced):
    """(In CI each set once, a Python-int and a traced step across them;
    every pair under slow.)"""
    case = CASES[name]
    items, compiled = compiled_case(name, "default")
    rng = np.random.default_rng(21)
    masks = [rng.random(len(items)) < 0.3, np.zeros(len(items), bool), rng.random(len(items)) < 0.6]
    stacked = sc.stack_subsets([compiled.subset(m) for m in masks])
    index = np.array([0, 2, 1, 0, 2])
    csets = [oracle.ConstraintSet([items[i] for i in np.flatnonzero(m)] or [items[0]],
                                  case.vocab, case.end) for m in masks]
    empty = [not m.any() for m in masks]
    B = index.shape[0]
    state = compiled.init_processor(B)
    rows = [oracle.ProcessorRow() for _ in range(B)]
    mask_fn, advance_fn = compiled.mask, compiled.advance
    if traced:
        mask_fn = jax.jit(lambda x, s, t: compiled.mask(x, s, t, subset=stacked,
                                                        subset_index=index))
        advance_fn = jax.jit(lambda s, tok, t: compiled.advance(s, tok, t, subset=stacked,
                                                                subset_index=index))
    for step in range(compiled.max_length):
        logits = rng.standard_normal((B, case.vocab)).astype(np.float32)
        t = np.int32(step) if traced else step
        got = np.asarray(mask_fn(logits, state, t) if traced else
                         mask_fn(logits, state, t, subset=stacked, subset_index=index))
        tokens = []
        for b, r in enumerate(index):
            want = (np.full((1, case.vocab), sc.SENTINEL_SCORE, np.float32) if empty[r] else
                    oracle.mask(csets[r], logits[b:b + 1], [rows[b]]))
            np.testing.assert_array_equal(got[b:b + 1], want, err_msg=f"step {step} row {b}")
            allowed = np.flatnonzero(got[b] > sc.SENTINEL_SCORE)
            # Mostly an allowed token; sometimes any token (the row may turn invalid).
            tokens.append(int(rng.choice(allowed)) if allowed.size and rng.random() < 0.8
                          else int(rng.integers(case.vocab)))
        tokens = np.array(tokens, np.int32)
        state = advance_fn(state, tokens, t) if traced else \
            advance_fn(state, tokens, t, subset=stacked, subset_index=index)
        for b, r in enumerate(index):
            if empty[r]:
                rows[b] = oracle.ProcessorRow(rows[b].prefix, False, False)
            else:
                rows[b] = oracle.advance(csets[r], [rows[b]], tokens[b:b + 1])[0]
        np.testing.assert_array_equal(np.asarray(state.valid), [r.valid for r in rows])
        np.testing.assert_array_equal(np.asarray(state.finished), [r.finished for r in rows])


@pytest.mark.parametrize("name", ["fixed", "ragged"])
def test_item_index_and_subsets_of_sequences(name):
    case = CASES[name]
    items, compiled = compiled_case(name, "default")
    rng = np.random.default_rng(4)
    absent = [tuple(int(x) for x in rng.integers(1, case.vocab, size=len(items[0])))
              for _ in range(20)]
    absent = [a for a in absent if a not in set(map(tuple, items))][:3]
    queries = [items[5], items[len(items) - 1], items[2]]
    ids = compiled.item_index(queries + absent)
    for q, i in zip(queries, ids):
        assert i >= 0 and tuple(items[i]) == tuple(q)
        assert all(tuple(items[j]) != tuple(q) for j in range(i))  # the first such row
    assert (ids[len(queries):] == -1).all()
    if name == "ragged":  # a prefix of an item that is not an item itself
        prefixes = {tuple(s[:k]) for s in items for k in range(1, len(s))} - set(map(tuple, items))
        if prefixes:
            assert compiled.item_index([sorted(prefixes)[0]])[0] == -1
    chosen = [items[i] for i in (1, 4, 9)]
    mask = np.zeros(len(items), bool)
    mask[compiled.item_index(chosen)] = True
    by_seq, by_mask = compiled.subset(chosen), compiled.subset(mask)
    for a, b in zip(by_seq.live + by_seq.ends, by_mask.live + by_mask.ends):
        assert (a is None and b is None) or np.array_equal(a, b)
    if absent:
        with pytest.raises(ConstraintSetError, match=r"1 of 2 sequences are not in the compiled set"):
            compiled.subset([items[0], absent[0]])


@pytest.mark.parametrize("name", ["ragged", "fixed"])
def test_allowed_follows_each_rows_subset(name):
    case = CASES[name]
    items, compiled = compiled_case(name, "default")
    rng = np.random.default_rng(8)
    masks = [rng.random(len(items)) < 0.3, rng.random(len(items)) < 0.6]
    stacked = sc.stack_subsets([compiled.subset(m) for m in masks])
    csets = [oracle.ConstraintSet([items[i] for i in np.flatnonzero(m)], case.vocab, case.end)
             for m in masks]
    for t in range(compiled.max_length):
        # Prefixes of items (so most rows are alive), and a random one.
        rows = [tuple(items[int(i)])[:t] for i in rng.integers(len(items), size=5)]
        rows = [r + (0,) * (t - len(r)) if case.end is not None else r for r in rows]
        rows = [r for r in rows if len(r) == t][:4] + [tuple(int(x) for x in
                                                          rng.integers(case.vocab, size=t))]
        index = np.arange(len(rows)) % 2
        got = np.asarray(compiled.allowed(np.array(rows, np.int32).reshape(len(rows), t),
                                          subset=stacked, subset_index=index))
        for b, (prefix, r) in enumerate(zip(rows, index)):
            row = oracle.ProcessorRow()
            for tok in prefix:
                row = oracle.advance(csets[r], [row], [tok])[0]
            logits = np.zeros((1, case.vocab), np.float32)
            want = oracle.mask(csets[r], logits, [row])[0] != sc.SENTINEL_SCORE
            np.testing.assert_array_equal(got[b], want, err_msg=f"t={t} prefix={prefix} subset {r}")


# -- updates: removal as liveness ---------------------------------------------


@pytest.mark.parametrize("name", ["fixed", "ragged"])
def test_update_remove_leaves_items_out_of_every_decode(name, tmp_path):
    case = CASES[name]
    items, compiled = compiled_case(name, "default")
    rng = np.random.default_rng(31)
    gone = rng.random(len(items)) < 0.3
    v2 = compiled.update(remove=gone)
    assert v2.lowered.tables is compiled.lowered.tables and v2.fingerprint != compiled.fingerprint
    picked = {tuple(items[i]) for i in np.flatnonzero(gone)}
    assert v2.build.last_update == {"removed": len(picked), "already_removed": 0, "absent": 0}
    model = oracle.HashModel(case.vocab, dup=40)
    seeds = [11, 12]
    keep = np.array([tuple(s) not in picked for s in items])
    want = oracle_result(items, keep, case, model, seeds, compiled.max_length)
    assert_matches(decode(v2, model, seeds, case), want, "after removal, no subset")
    # A subset of v2 leaves the removed items out too; one made before is refused.
    mask = rng.random(len(items)) < 0.6
    got = decode(v2, model, seeds, case, subset=v2.subset(mask))
    assert_matches(got, oracle_result(items, mask & keep, case, model, seeds, compiled.max_length))
    with pytest.raises(DecodeInputError, match="made from another compiled set"):
        decode(v2, model, seeds, case, subset=compiled.subset(mask))
    assert (v2.item_index([items[i] for i in np.flatnonzero(gone)]) == -1).all()
    # Removing again (and sequences that are not in the set) is counted, not an error;
    # a row no sequence of the set can be (another length than a fixed-length set's) is one.
    present = {tuple(int(t) for t in item) for item in items}
    width = 9 if case.end is not None else len(items[0])
    absent = next(row for row in ((case.vocab - 1 - k,) * width for k in range(case.vocab))
                  if row not in present)
    v3 = v2.update(remove=[items[int(np.flatnonzero(gone)[0])], absent])
    assert v3.build.last_update == {"removed": 0, "already_removed": 1, "absent": 1}
    if case.end is None:
        with pytest.raises(ConstraintSetError, match=r"removed sequence 0 has length 9"):
            v2.update(remove=[(case.vocab - 1,) * 9])
    # The original is untouched: it still decodes over every item.
    assert_matches(decode(compiled, model, seeds, case),
                   oracle_result(items, np.ones(len(items), bool), case, model, seeds,
                                 compiled.max_length))


def test_later_removals_compile_nothing_new():
    case = CASES["fixed"]
    items, compiled = compiled_case("fixed", "default")
    model = oracle.HashModel(case.vocab)
    rng = np.random.default_rng(32)
    v = compiled.update(remove=rng.random(len(items)) < 0.1)
    decode(v, model, [1], case)
    size = search._beam_search.compilations()
    for _ in range(3):
        v = v.update(remove=rng.random(len(items)) < 0.1)
        decode(v, model, [1], case)
    assert search._beam_search.compilations() == size


def test_an_updated_set_saves_its_removals_and_serves_without_them(tmp_path):
    from static_compiler import serving
    rng = np.random.default_rng(33)
    items = oracle.random_ragged_set(rng, 30, 4, 7, end_token=0)
    plain = sc.compile_constraints(items, 7, end_token=0, export_beam_sizes=(4,))
    gone = rng.random(len(items)) < 0.3
    with pytest.raises(DecodeInputError, match="export_subsets=True"):
        plain.update(remove=gone).save(tmp_path / "plain")
    compiled = sc.compile_constraints(items, 7, end_token=0, export_beam_sizes=(4,),
                                      export_subsets=True)
    v2 = compiled.update(remove=gone)
    v2.save(tmp_path / "v2")
    art = serving.load(tmp_path / "v2")
    assert art.items.removed is not None and art.fingerprint.endswith(v2.items.removal_tag)
    zeros = np.zeros((1, 4, 7), np.float32)
    state = art.init_beams(1, 4)
    for t in range(art.max_length):
        state = art.beam_step(state, zeros, t)
    want = sc.beam_search(v2, lambda last, step, c: (jnp.zeros(last.shape + (7,)), c),
                          batch_size=1, beam_size=4)
    got = art.finalize(state)
    for field in ("tokens", "valid", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(got, field)),
                                      np.asarray(getattr(want, field)))
    # All-equal logits: the exported module's log-sum-exp may round 1 ulp
    # apart from the jitted search's (so on main before subsets too).
    np.testing.assert_allclose(np.asarray(got.scores), np.asarray(want.scores), rtol=1e-6)
    picked = {tuple(items[i]) for i in np.flatnonzero(gone)}
    tokens, valid, lengths = (np.asarray(x)[0] for x in (want.tokens, want.valid, want.lengths))
    for j in np.flatnonzero(valid):
        assert tuple(int(x) for x in tokens[j, :lengths[j]]) not in picked


def test_the_fingerprint_hashes_in_chunks_and_does_not_depend_on_them(monkeypatch):
    """set_fingerprint hashes each table a chunk of rows at a time (bounded
    memory on large or memory-mapped tables); the digest is the one of each
    table hashed whole (a chunk larger than every table)."""
    import hashlib
    import io

    import static_compiler as sc
    from static_compiler.compiler_items import subsets as subsets_lib

    compiled = sc.compile_constraints([[1, 2, 3], [1, 3, 2], [2, 2, 2], [3, 1]], 5, end_token=0)
    monkeypatch.setattr(subsets_lib, "FINGERPRINT_CHUNK_BYTES", 1 << 40)
    whole = subsets_lib.set_fingerprint(compiled.plan, compiled.lowered.tables)
    for chunk in (1, 2, 3, 5, 1 << 21):
        monkeypatch.setattr(subsets_lib, "FINGERPRINT_CHUNK_BYTES", chunk)
        assert subsets_lib.set_fingerprint(compiled.plan, compiled.lowered.tables) == whole
    assert whole == compiled.fingerprint  # the set's own, at the default chunk
    for table in (t for layer in compiled.lowered.tables for t in layer.values()):  # np.save's bytes
        buf = io.BytesIO()
        np.save(buf, np.asarray(table))
        assert subsets_lib.table_digest(table) == hashlib.sha256(buf.getvalue()).hexdigest()
    # any change of a table entry changes it
    tables = [dict(t) for t in compiled.lowered.tables]
    tokens = tables[-1]["tokens"].copy()
    tokens[0] += 1
    tables[-1]["tokens"] = tokens
    assert subsets_lib.set_fingerprint(compiled.plan, tables) != whole


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 300), odd=st.floats(0, 1),
       density=st.sampled_from([0.0, 0.02, 0.5, 1.0]), lead_state=st.integers(0, 2),
       lead_child=st.integers(0, 130))
def test_the_bit_kernels_match_brute_force(seed, n, odd, density, lead_state, lead_child):
    """`near_rows_any` and `rows_any` (the compiled kernels every walk runs)
    give each state's any-over-its-row, for exceptions with no child,
    several, at either end, adjacent, or none; stretches longer than a word;
    a range starting at a later word of the output and its children at any
    bit of theirs (how a range of a large layer is walked); nothing written
    outside the range."""
    from static_compiler.item_bits.bit_kernels import near_rows_any, rows_any

    rng = np.random.default_rng(seed)
    branch = np.where(rng.random(n) < odd, rng.integers(0, 5, n), 1)
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    children = rng.random(int(indptr[-1])) < density
    want = np.array([children[indptr[s]:indptr[s + 1]].any() for s in range(n)], dtype=bool)
    first = 64 * lead_state
    src = packed_words(children, lead_child)
    ex = np.flatnonzero(branch != 1)
    for run in ("rows", "near"):
        out = np.zeros(-(-(first + n) // 64) + 1, np.uint64)
        if run == "rows":
            rows_any(src, indptr + lead_child, out, first, n)
        else:
            near_rows_any(src, lead_child, out, first, n, ex + first, indptr[ex] + lead_child,
                          indptr[ex + 1] + lead_child)
        got = np.unpackbits(out.view(np.uint8), bitorder="little").view(bool)
        np.testing.assert_array_equal(got[first:first + n], want, err_msg=run)
        assert not got[:first].any() and not got[first + n:].any(), run


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("form", ["starts", "bounds"])
def test_near_unary_row_pointers_from_exception_starts_equal_the_layers(seed, form):
    """`NearRows` takes each exception's extra children from its row start
    (the ex_starts table, or an older artifact's ex_bounds as its reader
    reads it: `normalize.current_tables`), padding entries
    past the states included: every row range and the whole array equal the
    layer's row pointers, whatever mix of empty, single and wide rows."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    branch = np.where(rng.random(n) < rng.random(), 1, rng.integers(0, 5, n))
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    ex = np.flatnonzero(branch != 1)
    pad = int(rng.integers(0, 3))
    ex_states = np.concatenate([ex, np.full(pad, n)]).astype(np.int32)
    starts = np.concatenate([indptr[ex], np.full(pad, indptr[-1])]).astype(np.int32)
    widths = np.concatenate([branch[ex], np.zeros(pad, np.int64)]).astype(np.uint8)
    tables = {"tokens": np.zeros(int(indptr[-1]), np.int32), "ex_states": ex_states}
    if form == "starts":
        tables.update(ex_starts=starts, ex_branch=widths)
    else:
        from static_compiler.format.normalize import current_tables
        tables["ex_bounds"] = np.stack([starts, starts + widths], axis=1)
        (tables,) = current_tables([tables])
    for num_states in {n, max(1, n // 2)}:
        rows = layers.NearRows(tables, num_states)
        for a, b in [(0, num_states), *np.sort(rng.integers(0, num_states + 1, (8, 2)))]:
            np.testing.assert_array_equal(rows.range(int(a), int(b)), indptr[a:b + 1])
        everyone = np.arange(num_states + 1)
        np.testing.assert_array_equal(rows[everyone], indptr[:num_states + 1])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 300), odd=st.floats(0, 1),
       density=st.sampled_from([0.0, 0.02, 0.5, 1.0]), pad=st.integers(0, 2),
       dtypes=st.sampled_from([("int32", "int32"), ("int64", "int64"), ("int16", "int16"),
                               ("uint32", "uint32"), ("int32", "int64")]),
       mapped=st.booleans())
def test_near_unary_walk_reads_the_exception_tables_in_place(seed, n, odd, density, pad,
                                                             dtypes, mapped):
    """A near-unary layer held as `NearRows` is walked straight from its
    exception tables (`exception_tables` + `bit_kernels.near_table_rows_any`):
    every range, the whole layer and ranges holding none, one or the last
    of the exceptions (rows with no child, several, at either end, adjacent;
    padding entries past the states), whatever the tables' dtypes, read-only
    or not, give each state's any-over-its-row as brute force does, and the
    numpy twin the same bits; `child_live` over the layer too."""
    from static_compiler.item_bits import bit_kernels

    rng = np.random.default_rng(seed)
    branch = np.where(rng.random(n) < odd, rng.integers(0, 5, n), 1)
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    children = rng.random(int(indptr[-1])) < density
    want = np.array([children[indptr[s]:indptr[s + 1]].any() for s in range(n)], dtype=bool)
    ex = np.flatnonzero(branch != 1)
    tables = {"tokens": np.zeros(int(indptr[-1]), np.int32),
              "ex_states": np.concatenate([ex, np.full(pad, n)]).astype(dtypes[0]),
              "ex_starts": np.concatenate([indptr[ex], np.full(pad, indptr[-1])]
                                          ).astype(dtypes[1]),
              "ex_branch": np.concatenate([branch[ex], np.zeros(pad, np.int64)]).astype(np.uint8)}
    if mapped:  # (as an artifact's: read-only)
        for table in tables.values():
            table.flags.writeable = False
    rows = layers.NearRows(tables, n)
    src = packed_words(children)
    bounds = sorted({0, n, *(int(x) for x in rng.integers(0, n + 1, 4))})
    kernels = [bit_kernels.near_table_rows_any, bit_kernels.near_table_rows_any_numpy]
    for kernel in kernels:
        out = np.zeros(-(-n // 64) + 1, np.uint64)
        for a, b in zip(bounds, bounds[1:]):  # (any cut: in order, no thread)
            lo, hi, states, starts, end_extra = rows.exception_tables(a, b)
            assert states.dtype in (np.int32, np.int64) and starts.dtype == states.dtype
            assert not states.flags.writeable and not starts.flags.writeable
            kernel(src, out, a, b - a, states, starts, hi - lo, end_extra)
            rows.release(lo, hi)
        got = np.unpackbits(out.view(np.uint8), bitorder="little").view(bool)
        np.testing.assert_array_equal(got[:n], want, err_msg=str(kernel))
        assert not got[n:].any()
    walk = layers.LayerWalk("near", ex)
    layer = layers.TableLayer("near_unary", tables, n, True, None, None)
    live = layer_walk.child_live(layer, walk, layer_walk.PackedBits.of(children))
    np.testing.assert_array_equal(layer_walk.bools(live)[:n], want)
