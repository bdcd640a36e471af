"""minimize pass: the language never changes, the result is minimal (checked
against brute-force right languages), the hash-collision path is exact, the
cost model decides, and decoding a minimized set gives the oracle's beams."""

import numpy as np
import oracle
import pytest
from helpers import right_languages
from hypothesis import given, settings
from ir_strategies import fixed_length_sets, ragged_sets, unique_sorted

from static_compiler import beam_search, compile_constraints, parse_pipeline
from static_compiler.errors import PipelineError
from static_compiler.frontend import build_automaton
from static_compiler.ir import parse_ir, verify
from static_compiler.ir.cost_model import estimated_bytes
from static_compiler.ir.merge_states import equal_row_classes, minimize_automaton
from static_compiler.passes import REGISTRY
from static_compiler.passes.minimize import MinimizePass


def check_minimized(before, after):
    verify(after)
    assert list(after.sequences()) == list(before.sequences())
    assert after.num_sequences == before.num_sequences
    assert after.end_token == before.end_token and after.depth == before.depth
    for t, langs in enumerate(right_languages(after)):
        assert len(set(langs)) == len(langs), f"depth {t}: two states accept the same suffixes"
    # Minimal: as many states per depth as distinct right languages of the input.
    for t, langs in enumerate(right_languages(before)):
        assert after.layers[t].num_states == len(set(langs))
    # Final states are free: one per edge of the last layer, implicit targets.
    assert after.layers[-1].implicit_targets
    assert after.num_final_states == after.layers[-1].num_edges
    assert parse_ir(str(after)) == after


@settings(max_examples=80, deadline=None)
@given(ragged_sets(max_vocab=6, max_length=6, max_items=40))
def test_ragged_language_unchanged_and_minimal(case):
    rows, V, end = case
    a = build_automaton(rows, V, end_token=end)
    m, stats = minimize_automaton(a, force=True)
    check_minimized(a, m)
    assert stats.applied and stats.states_before == a.num_states
    assert stats.states_after == m.num_states and stats.edges_after == m.num_edges
    assert list(m.sequences()) == unique_sorted(rows)


@settings(max_examples=60, deadline=None)
@given(fixed_length_sets(max_vocab=5, max_length=5, max_items=60))
def test_fixed_length_language_unchanged_and_minimal(case):
    rows, V = case
    a = build_automaton(np.array(rows), V)
    m, _ = minimize_automaton(a, force=True)
    check_minimized(a, m)
    assert all(layer.accepting is None for layer in m.layers)


@settings(max_examples=40, deadline=None)
@given(ragged_sets(max_vocab=5, max_length=5, max_items=30))
def test_idempotent_and_hash_collisions_do_not_matter(case):
    rows, V, end = case
    a = build_automaton(rows, V, end_token=end)
    m, _ = minimize_automaton(a, force=True)
    assert minimize_automaton(m, force=True)[0] == m
    # Every row hashes to 0: grouping must still be exact (split rounds).
    collide = lambda pairs, indptr: np.zeros(indptr.size - 1, dtype=np.uint64)
    assert minimize_automaton(a, force=True, row_hash=collide)[0] == m


def test_equal_row_classes_splits_collisions_exactly():
    # rows: {1,2} acc, {1,2} acc, {1,3}, {}, {1,2} not acc, {} acc, {1}, {1}
    indptr = np.array([0, 2, 4, 6, 6, 8, 8, 9, 10])
    pairs = np.array([1, 2, 1, 2, 1, 3, 1, 2, 1, 1])
    accepting = np.array([1, 1, 0, 0, 0, 1, 0, 0], dtype=bool)
    want = [0, 0, 1, 2, 3, 4, 5, 5]
    for row_hash in (None, lambda p, ip: np.zeros(ip.size - 1, dtype=np.uint64),
                     lambda p, ip: np.diff(ip).astype(np.uint64)):
        kwargs = {} if row_hash is None else {"row_hash": row_hash}
        classes, first = equal_row_classes(pairs, indptr, accepting, **kwargs)
        assert classes.tolist() == want
        assert first.tolist() == [0, 2, 3, 4, 5, 6]


def test_shared_suffixes_merge_and_targets_become_explicit():
    # "x A END", "y A END", "z A END", "x B": suffix "A END" is shared.
    A, B, END, x, y, z = 1, 2, 3, 4, 5, 6
    rows = [[x, A, END], [y, A, END], [z, A, END], [x, B]]
    a = build_automaton(rows, 8, end_token=0)
    m, stats = minimize_automaton(a, force=True)
    check_minimized(a, m)
    # depth 2: {xA, yA, zA} (then END) and xB (accepts, no edges)
    assert [layer.num_states for layer in m.layers] == [1, 2, 2]
    assert m.layers[0].targets.tolist() == [0, 1, 1]  # x -> {A, B}; y, z -> {A}
    assert m.layers[1].targets.tolist() == [0, 1, 0]  # xA and yA/zA share the state
    assert m.layers[2].implicit_targets  # the last layer keeps one final state per edge
    assert stats.states_before == 1 + 3 + 4 + 3 and stats.states_after == 1 + 2 + 2 + 1


def test_cost_model_keeps_random_tree_and_minimizes_shared_suffixes():
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 256, size=(3000, 6))
    tree = build_automaton(sids, 256)
    kept, stats = minimize_automaton(tree)
    assert not stats.applied and kept is tree
    assert stats.bytes_after > stats.bytes_before
    assert stats.bytes_before == estimated_bytes(tree)
    forced, forced_stats = minimize_automaton(tree, force=True)
    assert forced_stats.applied and forced.num_states < tree.num_states
    # Names: 40 heads x 30 shared tails.
    names = [[h, 100 + w, 200 + s] for h in range(40) for w in range(30) for s in range(2)]
    shared = build_automaton(names + [[h] for h in range(40)], 256, end_token=255)
    small, stats = minimize_automaton(shared)
    assert stats.applied and stats.bytes_after < stats.bytes_before
    assert small.num_states < shared.num_states
    assert estimated_bytes(small) == stats.bytes_after


def test_pass_is_registered_and_parses():
    assert REGISTRY["minimize"] is MinimizePass
    (p,) = parse_pipeline("minimize{force=true}")
    assert p == MinimizePass(force=True) and p.spec() == "minimize{force=true}"
    assert parse_pipeline("minimize")[0].spec() == "minimize"
    with pytest.raises(PipelineError, match="force"):
        parse_pipeline("minimize{force=maybe}")


def test_rejects_an_ir_with_layouts():
    compiled = compile_constraints([[1, 2], [2, 2]], 4)
    with pytest.raises(PipelineError, match="layer 0 already has layout .*before choose-layout"):
        MinimizePass().run(compiled.ir)
    with pytest.raises(PipelineError, match="minimize"):
        compile_constraints([[1, 2], [2, 2]], 4, pipeline="choose-layout,minimize")


@pytest.mark.parametrize("layout", ["csr", "dense_rows", "unary"])
def test_decoding_minimized_sets_matches_the_oracle(layout):
    """Explicit targets through every kernel: beams equal the brute force."""
    rng = np.random.default_rng(1)
    V, end = 12, 0
    if layout == "unary":  # one child per state, shared tails: unary with explicit targets
        heads = {tuple(rng.integers(1, 5, size=2)) for _ in range(20)}
        rows = [list(h) + [int(rng.integers(5, 8)), 9] for h in sorted(heads)]
    else:  # ragged heads x shared ragged tails
        heads = [list(rng.integers(1, V, size=rng.integers(1, 4))) for _ in range(25)]
        tails = [list(rng.integers(1, V, size=rng.integers(0, 3))) for _ in range(4)]
        rows = [h + t for h in heads for t in tails if h + t]
    pipeline = f"minimize{{force=true}},choose-layout{{force={layout}}},pad-branches,pack-dtypes"
    small = compile_constraints(rows, V, end_token=end, pipeline=pipeline)
    trie = build_automaton(rows, V, end_token=end)
    assert small.ir.num_states < trie.num_states
    assert small.build.frontend_stats == {"states": trie.num_states, "edges": trie.num_edges}
    assert any(not layer.implicit_targets for layer in small.ir.layers)
    assert any(step.kind == layout and step.explicit_targets for step in small.plan.steps)
    cset = oracle.ConstraintSet(rows, V, end)
    model = oracle.HashModel(V, dup=40)
    for seeds in ([1, 2], [3, 4], [5, 6]):
        got = beam_search(small, model, batch_size=2, beam_size=7,
                          carry_axes=model.carry_axes, carry=model.init_carry(seeds, 7))
        want = oracle.beam_search(cset, model, seeds, 7)
        np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens)
        np.testing.assert_array_equal(np.asarray(got.valid), want.valid)
        np.testing.assert_array_equal(np.asarray(got.lengths), want.lengths)
        np.testing.assert_allclose(np.asarray(got.scores), want.scores, rtol=1e-6, atol=1e-5)
