"""Adding items (`compiled.update(add=...)`, `additions.merge_items`) and the
capacity reserved for them (`compile_constraints(capacity=...)`,
`reserve-capacity`).

- merging new sequences into a trie gives exactly the trie built from all
  of them, and every old item keeps its id;
- decoding a version with added items equals the brute-force oracle over the
  live items, for every layout, fixed and variable length, and while the
  additions fit the capacity the same compiled program serves it;
- a stateful test interleaves additions, removals, subsets and decodes, and
  checks each decode against the oracle on the live items.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import oracle
import pytest
from helpers import assert_matches, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_subsets import CASES, oracle_result

import static_compiler as sc
from static_compiler.backend.decode import search
from static_compiler.compiler_items import additions
from static_compiler.errors import ConstraintSetError, DecodeInputError, IRVerificationError
from static_compiler.frontend import build_trie
from static_compiler.ir import Automaton, Layout, parse_ir, verify
from static_compiler.item_bits.state_order import item_order


def sequences(vocab: int, length: int, ragged: bool, end: int = 0, max_size: int = 12):
    """Hypothesis: lists of token sequences (over tokens other than `end`
    when ragged, lengths 1..length)."""
    low = 1 if ragged else 0
    lengths = st.integers(1, length) if ragged else st.just(length)
    seq = lengths.flatmap(lambda n: st.lists(st.integers(low, vocab - 1), min_size=n,
                                             max_size=n).map(tuple))
    return st.lists(seq, min_size=1, max_size=max_size)


def assert_same_trie(got: Automaton, want: Automaton):
    assert got.depth == want.depth and got.num_final_states == want.num_final_states
    assert got.num_sequences == want.num_sequences
    for t, (a, b) in enumerate(zip(got.layers, want.layers)):
        np.testing.assert_array_equal(a.indptr, b.indptr, f"layer {t} indptr")
        np.testing.assert_array_equal(a.tokens, b.tokens, f"layer {t} tokens")
        assert (a.accepting is None) == (b.accepting is None), f"layer {t} accepting"
        if a.accepting is not None:
            np.testing.assert_array_equal(a.accepting, b.accepting, f"layer {t} accepting")


def item_ends(items, depth: int):
    """(depth, state) int arrays of each unique sequence's end, whichever
    way the index holds them (`ItemIndex`)."""
    if items.item_depth is not None:
        return items.item_depth, items.item_state
    n = items.num_unique
    order = item_order(items)
    states = np.arange(n) if order is None else np.argsort(order[np.arange(n)])
    return np.full(n, depth), states


def check_merge(old: list, new: list, vocab: int, end):
    ir, items = build_trie(old, vocab, end_token=end)
    merged = additions.merge_items(ir, items, new)
    want, want_items = build_trie(old + new, vocab, end_token=end)
    assert_same_trie(merged.ir, want)
    got = merged.items
    np.testing.assert_array_equal(got.row_item[:len(old)], items.row_item)  # ids stay
    got_depth, got_state = item_ends(got, merged.ir.depth)
    for row, seq in enumerate(old + new):  # every row ends where a fresh build ends it
        u, w = got.row_item[row], want_items.row_item[row]
        state = w if want_items.item_state is None else want_items.item_state[w]
        assert (got_depth[u], got_state[u]) == (len(seq), state), (row, seq)
    assert got.num_unique == want_items.num_unique
    return merged


@settings(max_examples=60, deadline=None)
@given(data=st.data(), vocab=st.integers(2, 5), length=st.integers(1, 4))
def test_merging_into_a_fixed_length_trie_equals_building_from_all_items(data, vocab, length):
    old = data.draw(sequences(vocab, length, False), label="old")
    new = data.draw(sequences(vocab, length, False), label="added")
    merged = check_merge(old, new, vocab, None)
    assert merged.report["added"] + merged.report["already_present"] == len(set(new))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), vocab=st.integers(3, 5))
def test_merging_into_a_ragged_trie_equals_building_from_all_items(data, vocab):
    """Prefixes of items, items that lengthen the set, accepting states new to
    a layer: all as a fresh build numbers them."""
    old = data.draw(sequences(vocab, 3, True), label="old")
    new = data.draw(sequences(vocab, 5, True), label="added")
    check_merge(old, new, vocab, 0)


def test_added_items_take_the_next_ids_and_item_index_finds_them():
    old = [(0, 1), (1, 1), (0, 1), (0, 2)]
    c = sc.compile_constraints(old, 3, capacity=2.0)
    v = c.update(add=[(2, 2), (0, 1), (1, 0)])
    assert v.build.last_update == {"added": 2, "already_present": 1, "restored": 0, "grew": []}
    np.testing.assert_array_equal(v.item_index([(0, 1), (1, 1), (0, 2), (2, 2), (1, 0),
                                                (2, 0)]), [0, 1, 3, 4, 6, -1])
    assert v.items.num_items == 7 and v.ir.num_sequences == 5


# ---------------------------------------------------------------------------
# Decoding after additions, against the oracle.

CAPACITY_LAYOUTS = {"fixed": ("dense_rows", "csr", "near_unary", "mixed_csr", "default"),
                    "ragged": ("csr", "near_unary", "mixed_csr", "default"),
                    "unary-tail": ("unary", "default")}


@functools.lru_cache(maxsize=None)
def capacity_case(name: str, layout: str):
    case = CASES[name]
    rng = np.random.default_rng(21)
    items = case.make(rng)
    base, extra = items[: len(items) * 2 // 3], items[len(items) * 2 // 3:]
    compiled = sc.compile_constraints(list(base), case.vocab, end_token=case.end,
                                      pipeline=oracle.pipeline_for(layout), capacity=2.0)
    return base, extra, compiled


def decode(compiled, model, seeds, case, **kwargs):
    return sc.beam_search(compiled, model, batch_size=len(seeds), beam_size=case.beams,
                          tokens_per_beam=case.tokens_per_beam,
                          carry=model.init_carry(seeds, case.beams), carry_axes=model.carry_axes,
                          **kwargs)


@pytest.mark.parametrize("name, layout", [(n, lay) for n in CAPACITY_LAYOUTS
                                          for lay in CAPACITY_LAYOUTS[n]])
def test_added_items_decode_like_the_oracle_with_the_same_program(name, layout):
    case = CASES[name]
    base, extra, compiled = capacity_case(name, layout)
    if layout == "near_unary":  # keeps its form with room (not csr)
        assert any(step.kind == "near_unary" for step in compiled.plan.steps)
    model = oracle.HashModel(case.vocab, dup=40, nan=10)
    seeds = [3, 4]
    assert_matches(decode(compiled, model, seeds, case),
                   oracle_result(base, np.ones(len(base), bool), case, model, seeds,
                                 compiled.max_length), "before")
    programs = search._beam_search.compilations()
    version = compiled.update(add=extra)
    assert version.build.last_update["grew"] == []
    assert version.plan == compiled.plan
    everything = base + extra
    assert_matches(decode(version, model, seeds, case),
                   oracle_result(everything, np.ones(len(everything), bool), case, model, seeds,
                                 compiled.max_length), "after the addition")
    assert search._beam_search.compilations() == programs  # no new compilation
    mask = np.random.default_rng(1).random(len(everything)) < 0.5
    assert_matches(decode(version, model, seeds, case, subset=version.subset(mask)),
                   oracle_result(everything, mask, case, model, seeds, compiled.max_length),
                   "a subset of the new version")


def test_an_addition_past_the_capacity_compiles_anew_and_says_why():
    case = CASES["fixed"]
    rng = np.random.default_rng(2)
    base = oracle.random_set(rng, 10, 4, case.vocab)
    compiled = sc.compile_constraints(base, case.vocab, capacity=1.0)
    more = oracle.random_set(rng, 40, 4, case.vocab)
    version = compiled.update(add=more)
    grew = version.build.last_update["grew"]
    assert grew and "exceed the capacity" in grew[0]
    assert version.plan != compiled.plan
    assert "reserve-capacity{growth=1.0}" in version.build.pipeline
    verify(version.ir)
    model = oracle.HashModel(case.vocab, dup=40)
    assert_matches(decode(version, model, [1, 2], case),
                   oracle_result(base + more, np.ones(len(base + more), bool), case, model, [1, 2],
                                 compiled.max_length))


def test_a_set_without_capacity_grows_on_every_addition():
    c = sc.compile_constraints([(0, 1), (1, 0)], 3)
    v = c.update(add=[(2, 2)])
    assert any("no capacity reserved" in line for line in v.build.last_update["grew"])
    assert v.item_index([(2, 2)]).tolist() == [2]


def test_removal_wins_over_addition_and_adding_a_removed_item_restores_it():
    c = sc.compile_constraints([(0, 1), (1, 0), (1, 1)], 3, capacity=2.0)
    v = c.update(remove=[(1, 0)])
    assert v.item_index([(1, 0)]).tolist() == [-1]
    w = v.update(add=[(1, 0), (2, 2)], remove=[(2, 2)])
    assert w.build.last_update["restored"] == 1 and w.build.last_update["removed"] == 1
    # (restored as row 3: row 1 ended with its removal, `ItemIndex.stale_rows`)
    assert w.item_index([(1, 0), (2, 2)]).tolist() == [3, -1]


def test_subsets_of_an_older_version_are_refused():
    c = sc.compile_constraints([(0, 1), (1, 0)], 3, capacity=2.0)
    old = c.subset(np.ones(2, bool))
    v = c.update(add=[(2, 1)])
    model = oracle.HashModel(3)
    with pytest.raises(DecodeInputError, match="another compiled set"):
        sc.beam_search(v, model, batch_size=1, beam_size=2, carry=model.init_carry([1], 2),
                       carry_axes=model.carry_axes, subset=old)


@pytest.mark.parametrize("add, match", [
    ([(0, 5)], "outside the vocabulary|out of range|\\[0, 3\\)"),
    ([(0, 1, 2)], "length 3: this set's sequences all have length 2"),
    ([], "empty"),
    ("ab", "sequence|token"),
])
def test_bad_additions_are_refused_naming_the_value(add, match):
    c = sc.compile_constraints([(0, 1), (1, 0)], 3, capacity=2.0)
    with pytest.raises(ConstraintSetError, match=match):
        c.update(add=add)


def test_additions_need_a_trie_of_token_sequences():
    minimized = sc.compile_constraints([(0, 1), (1, 1)], 3,
                                       pipeline="verify,minimize,choose-layout,pack-dtypes")
    with pytest.raises(ConstraintSetError, match="minimize"):
        minimized.update(add=[(2, 1)])
    named = sc.compile_constraints(["ab", "ba"], 5, tokenizer=lambda s: [ord(c) - 96 for c in s],
                                   end_token=0)
    with pytest.raises(ConstraintSetError, match="text catalogue"):
        named.update(add=[(1, 1)])


def test_a_ragged_addition_to_a_fixed_length_set_is_refused_but_a_ragged_set_lengthens():
    ragged = sc.compile_constraints([(1, 2), (2,)], 4, end_token=0, capacity=2.0)
    v = ragged.update(add=[(1, 2, 3, 1)])
    assert v.ir.depth == 4 and v.build.last_update["grew"] == ["depth 2 -> 4"]
    model = oracle.HashModel(4)
    got = sc.beam_search(v, model, batch_size=1, beam_size=3, carry=model.init_carry([5], 3),
                         carry_axes=model.carry_axes)
    want = oracle.beam_search(oracle.ConstraintSet([(1, 2), (2,), (1, 2, 3, 1)], 4, 0), model,
                              [5], 3, None)
    assert_matches(got, want)


# ---------------------------------------------------------------------------
# The capacity in the IR and the pipeline.


def test_capacity_round_trips_through_the_ir_text_and_pads_the_tables():
    c = sc.compile_constraints([(0, 1, 2), (0, 2, 2), (1, 1, 1)], 3, capacity=1.5)
    assert "reserve-capacity{growth=1.5}" in c.build.pipeline
    text = c.ir.to_text()
    assert "capacity=1/3" in text  # depth 1: at most V states
    assert parse_ir(text) == c.ir
    for layer, step, tabs in zip(c.ir.layers, c.plan.steps, c.lowered.tables):
        assert step.num_states == layer.layout.states_capacity >= layer.num_states
        assert step.num_next_states == layer.layout.edges_capacity
        for name, arr in tabs.items():
            if name in ("indptr",):
                assert arr.shape[0] == step.num_states + 1
                assert (arr[layer.num_states:] == layer.num_edges).all()  # padded rows are empty
            elif name == "tokens" and step.kind == "csr":
                assert arr.shape[0] == step.num_next_states


@pytest.mark.parametrize("text, match", [
    ("csr(k=2,capacity=4)", "states/edges"),
    ("csr(k=2,capacity=4/0)", "both 0"),
])
def test_bad_capacities_in_a_layout_are_refused(text, match):
    with pytest.raises((IRVerificationError, Exception), match=match):
        Layout.from_text(text)


def test_near_unary_layers_keep_their_form_with_room():
    """Capacity pads a near_unary layer (one token per state plus its
    exceptions' rows) instead of turning it into csr: room for growth times
    its states, edges and exceptions; the padding entries are ids past every
    state with no children, and verification refuses room below the
    exceptions the layer has."""
    rows = [(a, b, c) for a in range(1, 4) for b in range(1, 6) for c in (1, 2)][::3]
    pipeline = "verify,choose-layout{force=near_unary},reserve-capacity{growth=2.0},pack-dtypes"
    c = sc.compile_constraints(rows, 7, pipeline=pipeline)
    for layer, step, tabs in zip(c.ir.layers, c.plan.steps, c.lowered.tables):
        if step.kind != "near_unary":
            continue
        lay = layer.layout
        assert lay.reserved and lay.exceptions >= int((layer.branch() != 1).sum())
        real = int((layer.branch() != 1).sum())
        assert tabs["ex_states"].shape == (lay.exceptions,)
        assert (tabs["ex_states"][real:] == step.num_states).all()
        assert (tabs["ex_branch"][real:] == 0).all()
        assert tabs["tokens"].shape == (step.num_next_states,)
    layer = next(l for l in c.ir.layers if l.layout.kind == "near_unary")
    bad = c.ir.with_layers([l if l is not layer else l.replace(
        layout=dataclasses.replace(l.layout, exceptions=0)) for l in c.ir.layers])
    with pytest.raises(IRVerificationError, match="exceptions"):
        verify(bad)


def test_inconsistent_capacities_fail_verification():
    c = sc.compile_constraints([(0, 1), (1, 1)], 3, capacity=2.0)
    layer = c.ir.layers[1]
    bad = c.ir.with_layers([c.ir.layers[0], layer.replace(layout=Layout(
        "csr", 2, states_capacity=layer.layout.states_capacity + 8, edges_capacity=8))])
    with pytest.raises(IRVerificationError, match="reserves"):
        verify(bad)


def test_capacity_argument_errors():
    with pytest.raises(sc.errors.PipelineError, match="growth"):
        sc.compile_constraints([(0, 1)], 3, capacity=0.5)
    with pytest.raises(sc.errors.PipelineError, match="give one"):
        sc.compile_constraints([(0, 1)], 3, capacity=1.5,
                               pipeline="verify,choose-layout,reserve-capacity,pack-dtypes")
    with pytest.raises(sc.errors.PipelineError, match="choose-layout"):
        sc.compile_constraints([(0, 1)], 3, capacity=1.5, pipeline="verify")
    with pytest.raises(sc.errors.PipelineError, match="share states"):
        sc.compile_constraints([(0, 1), (1, 1)], 3, capacity=1.5,
                               pipeline="verify,minimize,choose-layout,pack-dtypes")


# ---------------------------------------------------------------------------
# Stateful: additions, removals, subsets and decodes interleaved.


class LiveSetMachine(RuleBasedStateMachine):
    """A ragged set under random updates; every decode equals the oracle over
    the items live at that moment, and while nothing grew no decode compiled
    a new program."""

    vocab, end, max_len = 4, 0, 3

    @initialize(data=st.data())
    def start(self, data):
        self.rows = list(data.draw(sequences(self.vocab, self.max_len, True, max_size=8),
                                   label="initial items"))
        self.removed: set = set()
        self.compiled = sc.compile_constraints(self.rows, self.vocab, end_token=self.end,
                                               capacity=2.0)
        self.model = oracle.HashModel(self.vocab, dup=40)

    def live(self) -> list:
        return [s for s in dict.fromkeys(self.rows) if s not in self.removed]

    @rule(data=st.data())
    def add(self, data):
        new = data.draw(sequences(self.vocab, self.max_len, True, max_size=4), label="added")
        self.compiled = self.compiled.update(add=new)
        self.rows += new
        self.removed -= set(new)

    @rule(data=st.data())
    def remove(self, data):
        picked = data.draw(st.lists(st.sampled_from(self.rows), max_size=3), label="removed")
        if picked:
            self.compiled = self.compiled.update(remove=picked)
            self.removed |= set(picked)

    @rule(seed=st.integers(0, 2 ** 31))
    def decode(self, seed):
        live = self.live()
        programs = search._beam_search.compilations()
        got = sc.beam_search(self.compiled, self.model, batch_size=1, beam_size=4,
                             carry=self.model.init_carry([seed], 4),
                             carry_axes=self.model.carry_axes)
        want = oracle_result(live, np.ones(len(live), bool),
                             dataclass_case(self.vocab, self.end, 4), self.model, [seed],
                             self.compiled.max_length)
        assert_matches(got, want, f"{len(live)} live items")
        last = self.compiled.build.last_update
        if last is None or not last.get("grew"):
            assert search._beam_search.compilations() <= programs + 1  # base program, once

    @rule(data=st.data(), seed=st.integers(0, 2 ** 31))
    def decode_a_subset(self, data, seed):
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(self.rows),
                                           max_size=len(self.rows)), label="mask"))
        chosen = [s for s, m in zip(self.rows, mask) if m and s not in self.removed]
        got = sc.beam_search(self.compiled, self.model, batch_size=1, beam_size=4,
                             carry=self.model.init_carry([seed], 4),
                             carry_axes=self.model.carry_axes,
                             subset=self.compiled.subset(mask))
        want = oracle_result(chosen, np.ones(len(chosen), bool),
                             dataclass_case(self.vocab, self.end, 4), self.model, [seed],
                             self.compiled.max_length)
        assert_matches(got, want, f"subset of {len(chosen)} items")

    @invariant()
    def ids_stay(self):
        if hasattr(self, "compiled"):
            assert self.compiled.items.num_items == len(self.rows)


def dataclass_case(vocab, end, beams):
    from test_subsets import Case
    return Case(make=None, vocab=vocab, end=end, beams=beams)


# (Each run compiles its set's programs: 6 in CI, 10x under the slow profile.)
LiveSetMachine.TestCase.settings = settings(max_examples=examples(6), stateful_step_count=8,
                                            deadline=None)
TestLiveSet = LiveSetMachine.TestCase


def test_small_pages_turns_numpys_huge_pages_off_inside_and_restores_them():
    """Additions allocate without MADV_HUGEPAGE (see `additions.small_pages`)
    and leave numpy's process-wide switch as they found it, also on error."""
    from numpy._core import multiarray

    switch = multiarray._set_madvise_hugepage  # sets a value, returns the previous one
    for outside in (True, False):
        switch(outside)
        with additions.small_pages():
            assert switch(False) is False
        assert switch(outside) is outside
        with pytest.raises(KeyError):
            with additions.small_pages():
                raise KeyError
        assert switch(outside) is outside
