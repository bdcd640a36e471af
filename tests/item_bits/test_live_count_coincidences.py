"""Live sets whose counts coincide (a dense step's slots as many as the next
layer's edges, a capacity-padded layer as many states as edges): the
reported constructions, each at its own
small size. The fuzz (test_live_fuzz.py) draws
the same count coincidences at random; these pin the reported cases."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from live_cases import allowed_tokens, replay

import static_compiler as sc
from static_compiler import serving
from static_compiler.item_bits import layers
from static_compiler.lowered import plan as plan_lib

ROOT = np.zeros((1, 0), np.int32)


def dense_root_case():
    """Finding 1: V = 12, L = 3, 32 distinct two-token prefixes whose first
    tokens are 0..9 (a dense root with 32 slots), one third token each."""
    rng = np.random.default_rng(0)
    prefixes = {(a, int(rng.integers(12))) for a in range(10)}
    while len(prefixes) < 32:
        prefixes.add((int(rng.integers(10)), int(rng.integers(12))))
    return np.array([[a, b, 5] for a, b in sorted(prefixes)])


def padded_case():
    """Finding 2: first tokens 10..17, two children each, one third token."""
    return np.array([[f, c, 3] for f in range(10, 18) for c in (1, 2)])


def allowed_at_root(compiled, **subset) -> list:
    return np.flatnonzero(np.asarray(compiled.allowed(ROOT, **subset))[0]).tolist()


def test_is_unary_reads_the_structure_not_the_counts():
    # As many edges as states, but one state has two children and one none.
    assert not layers.is_unary(layers.TrieLayer(np.array([0, 2, 2, 3])))
    assert layers.is_unary(layers.TrieLayer(np.array([0, 1, 2, 3])))
    assert layers.is_unary(layers.TrieLayer(np.array([0])))
    assert not layers.is_unary(layers.TrieLayer(np.array([0, 1, 2]), np.array([True, False])))


def test_a_dense_steps_slots_are_not_taken_for_a_unary_layer():
    items = dense_root_case()
    compiled = sc.compile_constraints(items, vocab_size=12, export_subsets=True)
    assert compiled.plan.steps[0].kind == "dense_rows"
    first = items[:, 0] == 0
    sub = compiled.subset(first)
    assert allowed_at_root(compiled, subset=sub) == [0]
    want = {tuple(r) for r in items[first]}
    model = oracle.HashModel(12)
    got = sc.greedy_decode(compiled, model, batch_size=1, carry=model.init_carry([1], 1),
                           subset=sub)
    assert bool(np.asarray(got.valid)[0, 0])
    assert tuple(np.asarray(got.tokens)[0, 0].tolist()) in want
    drawn = sc.sample(compiled, model, sc_key(0), batch_size=80, temperature=5.0,
                      carry=model.init_carry(list(range(80)), 1), subset=sub)
    assert np.asarray(drawn.valid).all()
    assert {tuple(r) for r in np.asarray(drawn.tokens)[:, 0].tolist()} <= want
    # The same set after removing every other item.
    version = compiled.update(remove=~first)
    assert allowed_at_root(version) == [0]
    state = version.init_processor(1)
    masked = np.asarray(version.mask(np.zeros((1, 12), np.float32), state, 0))
    assert np.flatnonzero(masked[0] > sc.SENTINEL_SCORE).tolist() == [0]


def test_a_capacity_padded_layer_is_not_taken_for_a_unary_one(tmp_path):
    items = padded_case()
    compiled = sc.compile_constraints(items, vocab_size=20, capacity=1.5, export_subsets=True,
                                      export_beam_sizes=(4,))
    last = items[:, 0] == 17
    assert allowed_at_root(compiled, subset=compiled.subset(last)) == [17]
    compiled.save(tmp_path / "a")
    art = serving.load(tmp_path / "a")
    sub = art.subset(last)
    masked = np.asarray(art.mask(np.zeros((1, 20), np.float32), art.init_processor(1), 0,
                                 subset=sub))
    assert np.flatnonzero(masked[0] > sc.SENTINEL_SCORE).tolist() == [17]
    state = art.init_beams(1, 4)
    for t in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, 4, 20), np.float32), t, subset=sub)
    result = art.finalize(state)
    valid = np.asarray(result.valid)[0]
    assert valid.sum() == 2
    assert {tuple(r) for r in np.asarray(result.tokens)[0][valid].tolist()} == \
        {tuple(r) for r in items[last]}
    sc.update_artifact(tmp_path / "a", remove=~last)
    art = serving.load(tmp_path / "a")
    masked = np.asarray(art.mask(np.zeros((1, 20), np.float32), art.init_processor(1), 0))
    assert np.flatnonzero(masked[0] > sc.SENTINEL_SCORE).tolist() == [17]


def test_an_addition_then_a_removal_reaching_the_coincidence_still_serves(tmp_path):
    # 30 two-token prefixes under a dense root, then two more added within
    # capacity: the root's 32 slots meet layer 1's 32 edges, and the served
    # version after a removal decodes over the live items. (The red team's
    # served failure came from a random set; the served fuzz draws such.)
    items = dense_root_case()
    base, extra = items[:30], items[30:]
    compiled = sc.compile_constraints(base, vocab_size=12, capacity=2.0, export_subsets=True,
                                      export_beam_sizes=(4,))
    compiled.save(tmp_path / "a")
    report = sc.update_artifact(tmp_path / "a", add=extra.tolist())
    assert report["modules"] == "reused" and report["added"] == 2
    keep = np.zeros(32, bool)
    keep[:3] = True
    sc.update_artifact(tmp_path / "a", remove=~keep)
    art = serving.load(tmp_path / "a")
    state = art.init_beams(1, 4)
    for t in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, 4, 12), np.float32), t)
    result = art.finalize(state)
    valid = np.asarray(result.valid)[0]
    every = np.concatenate([base, extra])
    assert {tuple(r) for r in np.asarray(result.tokens)[0][valid].tolist()} == \
        {tuple(r) for r in every[:3]}


def test_accept_drafts_honours_removals_and_subsets():
    items = padded_case()
    compiled = sc.compile_constraints(items, vocab_size=20, export_subsets=True)
    gone = items[:, 0] == 12
    version = compiled.update(remove=gone)
    drafts = items.astype(np.int32)
    accepted, state = version.accept_drafts(version.init_processor(len(items)), drafts, 0)
    np.testing.assert_array_equal(np.asarray(accepted), np.where(gone, 0, 3))
    only = items[:, 0] == 15
    accepted, _ = compiled.accept_drafts(compiled.init_processor(len(items)), drafts, 0,
                                         subset=compiled.subset(only))
    np.testing.assert_array_equal(np.asarray(accepted), np.where(only, 3, 0))


def test_load_compiled_takes_subsets_removals_and_decodes_after_them(tmp_path):
    items = padded_case()
    compiled = sc.compile_constraints(items, vocab_size=20, export_subsets=True)
    compiled.save(tmp_path / "a")
    loaded = sc.load(tmp_path / "a")
    assert all(isinstance(s.kind, sc.ir.LayoutKind) for s in loaded.plan.steps)
    assert loaded.plan == compiled.plan and hash(loaded.plan) == hash(compiled.plan)
    last = items[:, 0] == 17
    assert allowed_at_root(loaded, subset=loaded.subset(last)) == [17]
    version = loaded.update(remove=~last)
    assert allowed_at_root(version) == [17]
    live = oracle.ConstraintSet([tuple(r) for r in items[last]], 20)
    model = oracle.HashModel(20)
    got = sc.beam_search(version, model, batch_size=1, beam_size=4,
                         carry=model.init_carry([2], 4), carry_axes=model.carry_axes)
    valid = np.asarray(got.valid)[0]
    assert {tuple(r) for r in np.asarray(got.tokens)[0][valid].tolist()} == live.items
    assert allowed_tokens(live, replay(live, (17,))) == {1, 2}


def test_an_attribute_error_inside_a_property_is_not_hidden(monkeypatch):
    compiled = sc.compile_constraints(padded_case(), vocab_size=20)

    def broken(self):
        raise AttributeError("the real cause")

    monkeypatch.setattr(type(compiled), "fingerprint", property(broken))
    with pytest.raises(AttributeError, match="the real cause"):
        compiled.fingerprint
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        compiled.nothing_here


def test_a_step_plan_read_back_names_its_kind_as_a_layout_kind():
    step = plan_lib.StepPlan(kind="near_unary", k=2, num_states=3, num_next_states=4,
                             explicit_targets=False, has_accepting=False, token_dtype="uint8",
                             state_dtype="int8")
    assert step.kind is sc.ir.LayoutKind.NEAR_UNARY and step.kind.value == "near_unary"
    with pytest.raises(ValueError):
        plan_lib.StepPlan(kind="bogus", k=1, num_states=1, num_next_states=1,
                          explicit_targets=False, has_accepting=False, token_dtype="uint8",
                          state_dtype="int8")


def sc_key(seed: int):
    import jax
    return jax.random.PRNGKey(seed)
