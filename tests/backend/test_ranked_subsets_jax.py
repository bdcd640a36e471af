"""Ranked subsets on the JAX doors (`CompiledConstraints.ranked_subset`,
`backend.decode.ranked`): every verb over a ranked subset returns what it
returns over `subset` of the same selection, bit for bit (masks, allowed
tokens, advances at a static and a traced step, the step processor,
speculative drafts, prefix masks, beam steps at a static and a traced
step, the compiled beam search, greedy decoding, sampling, priors over a
selection), on the live fuzz's sets (every layout, fixed length and
variable length, capacity, additions, removals), one subset and R stacked
per-row ones; bad inputs are refused naming the value (another set's or
version's ranked subset, a wrong index; a served artifact's exported
modules decode them: tests/serving/test_served_ranked_subsets.py); after
`warm(..., ranked=True)` a new ranked subset of a warmed stack size
compiles nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from live_cases import (
    CI_EXAMPLES,
    compile_case,
    fuzz_settings,
    grid_logits,
    live_cases,
    paths,
    ragged_set,
    sorted_set,
    updated,
)

import static_compiler as sc
from static_compiler import serving
from static_compiler.backend.decode import ranked as ranked_lib
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.item_bits.rank import RankedSubset


def _same(a, b, where) -> None:
    """Arrays, or pytrees of them, equal bit for bit."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb), where
    for i, (x, y) in enumerate(zip(la, lb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str((where, i)))


def check_verbs(c, case_vocab: int, drafts: np.ndarray, ranked, subset, index) -> None:
    """Every JAX verb over `ranked` (with `index`, ints or None) equals it
    over `subset`, on the paths `drafts` int (n, T)."""
    T, V = c.max_length, case_vocab
    rng = np.random.default_rng(drafts.shape[0] + T)
    n = drafts.shape[0]
    pick = None if index is None else \
        np.asarray([int(index[i % len(index)]) for i in range(n)], np.int32)
    ours, theirs = dict(subset=ranked, subset_index=pick), dict(subset=subset, subset_index=pick)
    for t in range(T):  # prefix masks: every prefix of the paths
        pre = np.unique(drafts[:, :t], axis=0) if t else drafts[:, :0]
        k = pre.shape[0]
        rows = None if pick is None else np.resize(pick, k)
        _same(c.allowed(pre, subset=ranked, subset_index=rows),
              c.allowed(pre, subset=subset, subset_index=rows), ("allowed", t))
    mine = want_state = c.init_processor(n)
    proc, theirs_proc = c.processor(n, **ours), c.processor(n, **theirs)
    for step in range(T):
        want = c.allowed_tokens(want_state, step, **theirs)
        _same(c.allowed_tokens(mine, step, **ours), want, ("allowed_tokens", step))
        traced = jnp.asarray(step, jnp.int32)
        _same(c.allowed_tokens(mine, traced, **ours), want, ("allowed_tokens traced", step))
        logits = grid_logits(rng, (n,), V)
        masked = c.mask(logits, want_state, step, **theirs)
        _same(c.mask(logits, mine, step, **ours), masked, ("mask", step))
        _same(proc.mask(logits, mine, step), theirs_proc.mask(logits, want_state, step),
              ("processor.mask", step))
        _same(c.accept_drafts(mine, drafts[:, step:], step, **ours),
              c.accept_drafts(want_state, drafts[:, step:], step, **theirs), ("drafts", step))
        tokens = drafts[:, step]
        if step + 1 < T:
            _same(proc.advance_and_mask(mine, tokens, step, logits),
                  theirs_proc.advance_and_mask(want_state, tokens, step, logits),
                  ("advance_and_mask", step))
        moved = c.advance(want_state, tokens, step, **theirs)
        _same(c.advance(mine, tokens, traced, **ours), moved, ("advance traced", step))
        _same(proc.advance(mine, tokens, step), moved, ("processor.advance", step))
        mine = c.advance(mine, tokens, step, **ours)
        want_state = moved
        _same(mine, want_state, ("advance", step))
    # beams: step by step (static and traced steps, a width schedule), then whole searches
    B, M = 3, 4
    rows = None if index is None else np.asarray([int(index[i % len(index)]) for i in range(B)],
                                                 np.int32)
    a = b = traced_state = c.init_beams(B, M)
    for step in range(T):
        logits = grid_logits(rng, tuple(a.node.shape), V)
        width = M if step % 2 else 3
        b = c.beam_step(b, logits, step, subset=subset, subset_index=rows, beam_size=width)
        a = c.beam_step(a, logits, step, subset=ranked, subset_index=rows, beam_size=width)
        _same(a, b, ("beam_step", step))
        traced_state = c.beam_step(traced_state, logits, jnp.asarray(step, jnp.int32),
                                   subset=ranked, subset_index=rows, beam_size=width)
        _same(traced_state, b, ("beam_step traced", step))
    _same(c.finalize(a), c.finalize(b), "finalize")
    table = jnp.asarray(rng.normal(size=(T, V + 1, V)).astype(np.float32))

    def model(last, step, carry):
        return table[step][jnp.clip(last, 0, V)], carry

    for beams in (M, 1):
        _same(sc.beam_search(c, model, batch_size=B, beam_size=beams, subset=ranked,
                             subset_index=rows),
              sc.beam_search(c, model, batch_size=B, beam_size=beams, subset=subset,
                             subset_index=rows), ("beam_search", beams))
    _same(c.beam_search(model, B, M, subset=ranked, subset_index=rows),
          c.beam_search(model, B, M, subset=subset, subset_index=rows), "door beam_search")
    _same(sc.greedy_decode(c, model, batch_size=B, subset=ranked, subset_index=rows),
          sc.greedy_decode(c, model, batch_size=B, subset=subset, subset_index=rows), "greedy")
    key = jax.random.PRNGKey(3)
    _same(sc.sample(c, model, key, batch_size=B, subset=ranked, subset_index=rows),
          sc.sample(c, model, key, batch_size=B, subset=subset, subset_index=rows), "sample")


@fuzz_settings(max(2, CI_EXAMPLES // 3))
@given(live_cases())
def test_every_jax_verb_over_a_ranked_subset_equals_it_over_the_subset(case):
    c = updated(compile_case(case), case)
    drafts = np.asarray(paths(case.all_rows, case, c.max_length), np.int32)
    drafts[::3, -1] = np.random.default_rng(1).integers(0, case.vocab, drafts[::3].shape[0])
    one = c.ranked_subset(case.subsets[0])
    assert isinstance(one, RankedSubset) and one.num_subsets == 1
    subset = c.subset(case.subsets[0])
    np.testing.assert_array_equal(one.sizes, subset.sizes)
    check_verbs(c, case.vocab, drafts, one, subset, None)
    stacked = sc.stack_subsets([c.subset(m) for m in case.subsets])
    check_verbs(c, case.vocab, drafts, c.ranked_subset(np.stack(case.subsets)), stacked,
                case.subset_index)


@pytest.mark.parametrize("make", [sorted_set, ragged_set])
def test_filters_priors_and_loaded_sets_decode_as_their_subsets(make, tmp_path):
    """where= and a prior over a selection, on the compiled set and on the
    same set loaded (`sc.load`): the same beams as `subset`'s."""
    rows, compiled = make()
    compiled.save(tmp_path / "set.sc")
    loaded = sc.load(tmp_path / "set.sc")
    n = compiled.items.num_items
    mask = np.arange(n) % 3 != 1
    for c in (compiled, loaded):
        ranked, subset = c.ranked_subset(mask), c.subset(mask)
        T, V = c.max_length, c.vocab_size
        table = jnp.asarray(np.random.default_rng(2).normal(size=(T, V + 1, V)), jnp.float32)

        def model(last, step, carry):
            return table[step][jnp.clip(last, 0, V)], carry

        _same(sc.beam_search(c, model, batch_size=2, beam_size=4, subset=ranked),
              sc.beam_search(c, model, batch_size=2, beam_size=4, subset=subset), "search")
        if c.attributes is not None and "price" in c.attributes:
            prior = c.prior("price", 0.1, mask)
            _same(sc.beam_search(c, model, batch_size=2, beam_size=4, subset=ranked, prior=prior),
                  sc.beam_search(c, model, batch_size=2, beam_size=4, subset=subset, prior=prior),
                  "prior")
            state = c.init_processor(2)
            _same(c.allowed_tokens(state, 0, subset=c.ranked_subset(where="price < 30")),
                  c.allowed_tokens(state, 0, subset=c.subset(where="price < 30")), "where")


def test_bad_ranked_subsets_are_refused_naming_the_value(tmp_path):
    rows, compiled = sorted_set()
    n = rows.shape[0]
    ranked = compiled.ranked_subset(np.arange(n) % 2 == 0)
    state = compiled.init_processor(4)
    other = sorted_set(seed=4)[1]
    theirs = other.ranked_subset(np.ones(other.items.num_items, bool))
    with pytest.raises(DecodeInputError, match="allowed_tokens: the ranked subset was made "
                                               "from another set"):
        compiled.allowed_tokens(state, 0, subset=theirs)
    later = compiled.update(remove=np.arange(n) == 3)  # another version: refused
    with pytest.raises(DecodeInputError, match="mask: the ranked subset was made from another"):
        later.mask(np.zeros((4, 12), np.float32), later.init_processor(4), 0, subset=ranked)
    stacked = compiled.ranked_subset(np.stack([np.arange(n) % k == 0 for k in (2, 3)]))
    with pytest.raises(DecodeInputError, match=r"2 stacked subsets: pass subset_index"):
        compiled.allowed_tokens(state, 0, subset=stacked)
    with pytest.raises(DecodeInputError, match=r"subset_index has shape \(3,\)"):
        compiled.advance(state, np.zeros(4, np.int32), 0, subset=stacked,
                         subset_index=np.zeros(3, np.int32))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 2: expected a subset in "
                                               r"\[0, 2\)"):
        compiled.allowed(np.zeros((4, 1), np.int32), subset=stacked,
                         subset_index=np.array([0, 2, 1, 0]))
    with pytest.raises(DecodeInputError, match="subset_index"):
        compiled.beam_step(compiled.init_beams(4, 2), np.zeros((4, 2, 12), np.float32), 0,
                           subset=stacked, subset_index=np.zeros((4, 2), np.int32))
    with pytest.raises(DecodeInputError, match="subset_index has shape"):
        sc.beam_search(compiled, lambda last, t, c: (jnp.zeros(last.shape + (12,)), c),
                       batch_size=2, beam_size=2, subset=stacked, subset_index=np.zeros(3, int))
    # a served artifact's ranked modules (tests/serving/test_served_ranked_subsets.py) refuse
    # the compiled set's ranked subset (another fingerprint: the artifact's own is asked for)
    compiled.save(tmp_path / "set.sc")
    art = serving.load(tmp_path / "set.sc")
    served = art.ranked_subset(np.arange(n) % 2 == 0)
    assert isinstance(served, RankedSubset) and served.fingerprint == art.fingerprint
    _same(art.allowed_tokens(art.init_processor(4), 0, subset=served),
          art.allowed_tokens(art.init_processor(4), 0, subset=art.subset(np.arange(n) % 2 == 0)),
          "served")
    sc.compile_constraints(rows, 12).save(tmp_path / "bare.sc")  # (no item index saved)
    bare = sc.load(tmp_path / "bare.sc")
    with pytest.raises(ConstraintSetError, match="ranked_subset: .* has no item index"):
        bare.ranked_subset(np.ones(n, bool))  # (as its subset() raises)
    with pytest.raises(DecodeInputError, match="allowed_tokens: a ranked subset, but this set "
                                               "has no item index"):
        bare.allowed_tokens(bare.init_processor(4), 0, subset=ranked)


def test_ranges_and_rank_bits_are_placed_once():
    """The set's ranges once per set view (versions after removals share
    them), a subset's rank bits once per subset; positions int32."""
    rows, compiled = ragged_set()
    view = compiled._set_view
    ranked = compiled.ranked_subset(np.ones(compiled.items.num_items, bool))
    state = compiled.init_processor(2)
    compiled.allowed_tokens(state, 0, subset=ranked)
    puts = ranked.placements.puts, view.placements.puts
    compiled.allowed_tokens(state, 1, subset=ranked)
    # the rank bits and the last mask's holder (`ranked_arrays._LastMask`); the ranges
    assert (ranked.placements.puts, view.placements.puts) == puts == (2, 1)
    assert ("jax-ranked", None) in ranked.placements
    ranges = ranked_lib.set_ranges(view).arrays
    assert ranges.at.dtype == jnp.int32 and ranges.counts.dtype == jnp.int32
    assert all(r is None or (r[1] if isinstance(r, tuple) else r).dtype == jnp.int32
               for r in ranges.rows)


def test_a_step_asking_again_gets_the_last_mask_and_a_new_index_is_checked_again():
    """`ranked_mask` keeps the last mask made for concrete rows: the same
    index values (a Python-stepped search's every step) give the same
    mask, checked once; other values, the same array changed in place, or
    another set make and check a new one."""
    rows, compiled = sorted_set()
    n = rows.shape[0]
    stacked = compiled.ranked_subset(np.stack([np.arange(n) % k == 0 for k in (2, 3)]))
    index = np.array([0, 1, 1, 0], np.int32)
    first = compiled._live(stacked, index, 4, "mask")
    assert compiled._live(stacked, index.copy(), 4, "mask") is first
    assert compiled._live(stacked, [0, 1, 1, 0], 4, "mask") is not first  # (int64: another key)
    index[1] = 0  # (changed in place: its values are the key, not the array)
    again = compiled._live(stacked, index, 4, "mask")
    assert again is not first and np.array_equal(again.rows, [0, 0, 1, 0])
    assert again.rows.dtype == np.int32
    index[2] = 2
    with pytest.raises(DecodeInputError, match=r"subset_index\[2\] = 2: expected a subset in"):
        compiled._live(stacked, index, 4, "mask")
    with pytest.raises(DecodeInputError, match=r"subset_index has shape \(3,\)"):
        compiled._live(stacked, index[:3], 4, "mask")  # (the same values cut: the batch checked)
    assert compiled._live(stacked, np.array([0, 0, 1, 0]), 4, "mask").rows.tolist() == \
        [0, 0, 1, 0]
    later = compiled.update(remove=np.arange(n) == 3)  # another version: its fingerprint
    with pytest.raises(DecodeInputError, match="mask: the ranked subset was made from another"):
        later._live(stacked, np.array([0, 0, 1, 0]), 4, "mask")
    state, zeros = compiled.init_processor(4), np.zeros((4, 12), np.float32)
    want = compiled.mask(zeros, state, 0, subset=stacked, subset_index=np.array([0, 0, 1, 0]))
    _same(compiled.mask(zeros, state, 0, subset=stacked, subset_index=[0, 0, 1, 0]), want,
          "the last mask's answer")


def test_after_warm_a_new_ranked_subset_compiles_nothing():
    """warm(..., ranked=True) walks one ranked subset and max_subsets
    stacked: afterwards new ranked subsets of those stack sizes run every
    verb (processor pair, prefixes, traced steps, beam steps, the step
    processor, the compiled search) with no compilation."""
    rows, c = ragged_set()
    n, B, M = c.items.num_items, 2, 3
    V, T = c.vocab_size, c.max_length
    table = jnp.asarray(np.random.default_rng(0).normal(size=(T, V + 1, V)), jnp.float32)

    def model(last, step, carry):
        return table[step][jnp.clip(last, 0, V)], carry

    c.warm([B], beam_sizes=[M], max_subsets=2, ranked=True, logits_fn=model)
    before = c.compilations()
    rng = np.random.default_rng(1)
    for kw in ({"subset": c.ranked_subset(rng.random(n) < 0.5)},
               {"subset": c.ranked_subset(rng.random((2, n)) < 0.5),
                "subset_index": np.array([1, 0], np.int32)}):
        state = c.init_processor(B)
        proc = c.processor(B, **kw)
        for t in range(T):
            logits = np.zeros((B, V), np.float32)
            c.mask(logits, state, t, **kw)
            c.allowed(np.zeros((B, t), np.int32), **kw)
            c.allowed_tokens(state, jnp.asarray(t, jnp.int32), **kw)
            proc.mask(logits, state, t)
            state = c.advance(state, np.asarray(c.allowed_tokens(state, t, **kw)).argmax(1), t,
                              **kw)
        beams = c.init_beams(B, M)
        for t in range(T):
            beams = c.beam_step(beams, np.zeros((B, M, V), np.float32), t, **kw)
        jax.block_until_ready(c.finalize(beams))
        jax.block_until_ready(c.beam_search(model, B, M, **kw))
    assert c.compilations() == before
