"""Item priors: a float attribute as a log-prior with a
weight. Exact against the brute-force oracle with the look-ahead ranking
(tests/oracle.py, `prior_lookahead`), property-based over layouts, weights
(negative and zero included), caps, beam schedules and subsets; against the
exhaustive ranking (every item by log-probability plus weight x prior)
when the beams cover the set; the look-ahead tables against brute force;
the prior honouring removals and filters; bad input."""

from __future__ import annotations

import importlib.util

import numpy as np
import oracle
import pytest
from helpers import assert_matches, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.errors import (
    AttributeColumnError,
    ConstraintSetError,
    DecodeInputError,  # noqa: F401
)
from static_compiler.lowered.plan import prior_offsets
from static_compiler.rules.priors import OUTSIDE_GAP
from static_compiler.support.decode_state import MIN_VALID_SCORE

V = 8
ITEMS = oracle.random_set(np.random.default_rng(11), 70, 4, V)
ROWS = np.asarray(ITEMS, np.int32)
POP = (np.random.default_rng(12).standard_normal(len(ITEMS)) * 3).astype(np.float32)


def compiled_with(layout: str = "default", **kw):
    return sc.compile_constraints(ROWS, V, pipeline=oracle.pipeline_for(layout, False),
                                  attributes={"pop": POP, "day": np.arange(len(ROWS)),
                                              "kind": np.array(["a", "b"])[np.arange(len(ROWS)) % 2]},
                                  export_subsets=True, **kw)


def terms(weight: float, live=None) -> dict:
    """{item: float32 term}: weight x prior (its first row's) for the unique
    items some row of `live` (bool per row; None: all) picks; for the
    others one constant, OUTSIDE_GAP below the lowest live term and 0."""
    out, picked = {}, set()
    for i, item in enumerate(ITEMS):
        out.setdefault(item, np.float32(weight) * POP[i])
        if live is None or live[i]:
            picked.add(item)
    lowest = min([0.0] + [float(t) for item, t in out.items() if item in picked])
    outside = np.float32(np.float32(lowest) - np.float32(OUTSIDE_GAP))
    return {item: t if item in picked else outside for item, t in out.items()}


def search(compiled, prior, beam_size, seeds=(3, 9), **kw):
    model = oracle.HashModel(V)
    first = beam_size if isinstance(beam_size, int) else 1
    return sc.beam_search(compiled, model, batch_size=len(seeds), beam_size=beam_size,
                          carry=model.init_carry(list(seeds), first),
                          carry_axes=model.carry_axes, prior=prior, **kw)


@pytest.mark.parametrize("layout", ["default", "dense_rows", "csr", "mixed_csr", "unary"])
@settings(max_examples=examples(4), deadline=None)
@given(weight=st.sampled_from([0.0, 0.5, 2.0, -1.5]),
       beam_size=st.sampled_from([1, 4, (2, 3, 6, 5)]), cap=st.sampled_from([None, 2]),
       seeds=st.lists(st.integers(0, 2 ** 32 - 1), min_size=2, max_size=2))
def test_priors_match_the_oracle(layout, weight, beam_size, cap, seeds):
    compiled = compiled_with(layout)
    got = search(compiled, compiled.prior("pop", weight=weight), beam_size, seeds,
                 tokens_per_beam=cap)
    want = oracle.beam_search(oracle.ConstraintSet(ITEMS, V), oracle.HashModel(V), seeds,
                              beam_size, cap, prior=oracle.prior_lookahead(terms(weight)))
    assert_matches(got, want, f"{layout} w={weight} M={beam_size} cap={cap}")


@settings(max_examples=examples(6), deadline=None)
@given(weight=st.floats(-3, 3, width=32), seed=st.integers(0, 2 ** 32 - 1))
def test_beams_covering_the_set_rank_every_item_by_its_final_score(weight, seed):
    """With as many beams as items nothing is pruned: the result is every
    item, ranked by log-probability plus weight x prior (ties: the oracle's
    order), whatever the look-ahead did."""
    compiled = compiled_with()
    n = len(set(ITEMS))
    got = search(compiled, compiled.prior("pop", weight=weight), n, seeds=(seed,))
    model = oracle.HashModel(V)
    scores = oracle.sequence_scores(oracle.ConstraintSet(ITEMS, V), model, seed)
    final = {item: np.float32(max(np.float32(s + t), np.float32(MIN_VALID_SCORE)))
             for item, s in scores.items() for t in [terms(weight)[item]]}
    valid = np.asarray(got.valid)[0]
    assert valid.sum() == len(final)
    beams = [tuple(int(x) for x in row) for row in np.asarray(got.tokens)[0][valid]]
    assert set(beams) == set(final)
    np.testing.assert_allclose(np.asarray(got.scores)[0][valid], [final[b] for b in beams],
                               rtol=1e-6, atol=1e-5)
    assert (np.diff(np.asarray(got.scores)[0][valid]) <= 0).all()


def test_the_look_ahead_is_the_best_prior_below_each_state():
    compiled = compiled_with()
    prior = compiled.prior("pop", weight=-0.5)
    look = oracle.prior_lookahead(terms(-0.5))
    trie = compiled._set_view.trie()
    # every prefix of length d reaches one state at depth d; walk them in the tables' order
    for d in range(1, 5):
        prefixes = sorted({item[:d] for item in ITEMS})
        start = prior_offsets(compiled.plan)[0][d - 1]
        row = prior.best[start:start + len(prefixes)]
        np.testing.assert_array_equal(row, [look.below(p) for p in prefixes])
    assert trie.depth == 4


def test_a_filtered_prior_ranks_the_other_items_last():
    """Items outside the prior's selection get no prior but one constant
    term below every live one: they rank after the live items, by the
    model among themselves; decoding over the same subset never meets
    them."""
    compiled = compiled_with()
    keep = np.arange(len(ROWS)) % 3 == 0
    prior = compiled.prior("pop", weight=1.0, selection=keep)
    got = search(compiled, prior, 60, seeds=(5,))
    want = oracle.beam_search(oracle.ConstraintSet(ITEMS, V), oracle.HashModel(V), [5], 60,
                              prior=oracle.prior_lookahead(terms(1.0, keep)))
    assert_matches(got, want)
    over = search(compiled, prior, 60, seeds=(5,), subset=compiled.subset(keep))
    assert (np.asarray(over.scores)[np.asarray(over.valid)] > MIN_VALID_SCORE).all()
    by_where = compiled.prior("pop", weight=1.0, where="kind == 'a'")
    np.testing.assert_array_equal(
        by_where.best, compiled.prior("pop", weight=1.0, selection=np.arange(len(ROWS)) % 2 == 0)
        .best)


@pytest.mark.parametrize("weight", [1.0, -2.0, 0.0])
@pytest.mark.parametrize("pick", ["selection", "where", "nothing"])
def test_outside_a_prior_s_selection_items_still_rank_by_the_model(pick, weight):
    """With beams covering the set, the result is every item, ranked by brute
    force: the live ones by log-probability plus weight x prior, then the
    others by their log-probability alone (before: all at the floor score,
    in token-id order), on the compiled set and the torch backend (one
    prior table: the served artifact reads the same `SetView.prior`)."""
    compiled = compiled_with()
    keep = {"selection": np.arange(len(ROWS)) % 3 == 0, "where": np.arange(len(ROWS)) % 2 == 0,
            "nothing": np.zeros(len(ROWS), bool)}[pick]
    prior = compiled.prior("pop", weight=weight, where="kind == 'a'") if pick == "where" else \
        compiled.prior("pop", weight=weight, selection=keep)
    n, seed = len(set(ITEMS)), 7
    got = search(compiled, prior, n, seeds=(seed,))
    scores = oracle.sequence_scores(oracle.ConstraintSet(ITEMS, V), oracle.HashModel(V), seed)
    live = {item for item, k in zip(ITEMS, keep) if k}
    final = {item: np.float32(s + terms(weight, keep)[item]) for item, s in scores.items()}
    want = sorted(final, key=lambda item: (item not in live, -final[item]))
    valid = np.asarray(got.valid)[0]
    beams = [tuple(int(x) for x in row) for row in np.asarray(got.tokens)[0][valid]]
    assert len(beams) == n and set(beams) == set(final)
    outside = [b for b in beams if b not in live]
    assert beams[:len(beams) - len(outside)] == [b for b in want if b in live]
    assert [scores[b] for b in outside] == sorted((scores[b] for b in outside), reverse=True)
    np.testing.assert_allclose(np.asarray(got.scores)[0][valid], [final[b] for b in beams],
                               rtol=1e-6, atol=2e-3)
    assert len(outside) == n - len(live) and outside != sorted(outside)  # not token-id order
    if importlib.util.find_spec("torch") is not None:
        from static_compiler.torch_backend import TorchConstraints
        tc = TorchConstraints.from_compiled(compiled)
        np.testing.assert_array_equal(tc.prior("pop", weight=weight, selection=keep).best,
                                      prior.best)


def test_a_removal_takes_the_item_out_of_the_prior():
    compiled = compiled_with()
    best = int(np.argmax(POP))
    later = compiled.update(remove=ROWS[best:best + 1])
    prior = later.prior("pop", weight=1.0)
    assert prior.best.max() < POP[best]
    with pytest.raises(DecodeInputError, match="the prior is of another set"):
        search(later, compiled.prior("pop"), 4)


def test_priors_change_without_recompiling():
    compiled = compiled_with()
    search(compiled, compiled.prior("pop", weight=1.0), 4)
    before = compiled.compilations()
    search(compiled, compiled.prior("pop", weight=-2.0), 4)
    search(compiled, compiled.prior("day", weight=0.01), 4)
    assert compiled.compilations() == before


@pytest.mark.parametrize("call, error, match", [
    (lambda c: c.prior("nope"), AttributeColumnError, r"no attribute 'nope'"),
    (lambda c: c.prior("kind"), AttributeColumnError, r"'kind' is a category column"),
    (lambda c: c.prior("pop", weight=float("nan")), DecodeInputError,
     r"weight=nan: expected a finite float"),
    (lambda c: c.prior("pop", weight=True), DecodeInputError, r"weight=True"),
    (lambda c: c.prior("pop", weight=1e38), AttributeColumnError, r"overflows float32"),
    (lambda c: c.prior("pop", selection=np.ones(3, bool)), ConstraintSetError,
     r"expected \(70,\)"),
    (lambda c: search(c, "pop", 4), DecodeInputError, r"prior='pop' is a str, expected a Prior"),
    (lambda c: search(c, c.prior("pop"), 4, length_penalty=0.5), DecodeInputError,
     r"prior with length_penalty=0.5"),
])
def test_bad_priors_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call(compiled_with())


def test_a_nan_prior_is_refused():
    pop = POP.copy()
    pop[7] = np.nan
    compiled = sc.compile_constraints(ROWS, V, attributes={"pop": pop}, export_subsets=True)
    with pytest.raises(AttributeColumnError, match=r"'pop' holds nan at input row 7"):
        compiled.prior("pop")


RAGGED = oracle.random_ragged_set(np.random.default_rng(13), 30, 3, 6, end_token=0)
RAGGED_POP = (np.random.default_rng(14).standard_normal(len(RAGGED)) * 2).astype(np.float32)


@pytest.mark.parametrize("layout", ["default", "dense_rows", "csr", "unary"])
@settings(max_examples=examples(4), deadline=None)
@given(weight=st.sampled_from([1.0, -0.8, 3.0]),
       beam_size=st.sampled_from([2, 40, (2, 4, 3, 5)]), cap=st.sampled_from([None, 1]),
       seeds=st.lists(st.integers(0, 2 ** 32 - 1), min_size=3, max_size=3))
def test_priors_with_an_end_token_match_the_oracle(layout, weight, beam_size, cap, seeds):
    """Items of several lengths, some prefixes of others: the end token's
    candidate reads its item's own term, a finished beam keeps its rank."""
    compiled = sc.compile_constraints(RAGGED, 6, end_token=0,
                                      pipeline=oracle.pipeline_for(layout, False),
                                      attributes={"pop": RAGGED_POP}, export_subsets=True)
    model = oracle.HashModel(6)
    first = beam_size if isinstance(beam_size, int) else 1
    got = sc.beam_search(compiled, model, batch_size=3, beam_size=beam_size,
                         tokens_per_beam=cap, carry=model.init_carry(seeds, first),
                         carry_axes=model.carry_axes,
                         prior=compiled.prior("pop", weight=weight))
    terms = {}
    for i, item in enumerate(RAGGED):
        terms.setdefault(item, np.float32(weight) * RAGGED_POP[i])
    want = oracle.beam_search(oracle.ConstraintSet(RAGGED, 6, 0), model, seeds, beam_size, cap,
                              prior=oracle.prior_lookahead(terms))
    assert_matches(got, want, f"{layout} w={weight} M={beam_size} cap={cap}")


def test_the_model_never_sees_a_prior():
    """The prior changes the ranking, not the logits: a weight of 0 decodes
    as no prior at all."""
    compiled = compiled_with()
    a, b = search(compiled, None, 6), search(compiled, compiled.prior("pop", weight=0.0), 6)
    for field in ("tokens", "valid", "scores"):
        np.testing.assert_array_equal(np.asarray(getattr(a, field)),
                                      np.asarray(getattr(b, field)))


def test_the_step_verbs_take_the_prior():
    """compiled.beam_step(prior=) at each step (static and traced) gives the
    search's beams; so does the torch backend's beam_step."""
    import jax.numpy as jnp
    torch = pytest.importorskip("torch")  # (the newest environment has no torch)

    from static_compiler.torch_backend import TorchConstraints

    compiled = compiled_with()
    prior = compiled.prior("pop", weight=1.5)

    def logits_fn(last, step, carry):
        return jnp.sin((last[..., None] + 1.0) * (jnp.arange(V) + 1) * (step + 1.3)), carry

    want = compiled.beam_search(logits_fn, batch_size=2, beam_size=5, prior=prior)
    tc = TorchConstraints.from_compiled(compiled)
    for door in ("static", "traced", "torch"):
        state = tc.init_beams(2, 5) if door == "torch" else compiled.init_beams(2, 5)
        for t in range(4):
            logits, _ = logits_fn(jnp.asarray(np.asarray(state.last_tokens)), t, None)
            if door == "torch":
                state = tc.beam_step(state, torch.from_numpy(np.array(logits)), t,
                                     prior=tc.prior("pop", weight=1.5))
            else:
                state = compiled.beam_step(state, logits, jnp.int32(t) if door == "traced" else t,
                                           prior=prior)
        got = tc.finalize(state) if door == "torch" else compiled.finalize(state)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens), door)


def test_a_warmed_search_with_a_schedule_and_a_prior_compiles_nothing():
    """compiled.warm(beam_sizes=[schedule], prior=...) compiles the search a
    request will run: afterwards a search with another prior of the set
    (new values, the same shape) compiles nothing (jax's compile events)."""
    import jax.numpy as jnp

    compiled = compiled_with()

    def logits_fn(last, step, carry):
        return jnp.cos((last[..., None] + 1.0) * (jnp.arange(V) + 2) * (step + 0.5)), carry

    schedule = (2, 5, 3, 4)
    compiled.warm([2], beam_sizes=[schedule], logits_fn=logits_fn,
                  prior=compiled.prior("pop", weight=1.0))
    before = compiled.compilations()
    compiled.beam_search(logits_fn, batch_size=2, beam_size=schedule,
                         prior=compiled.prior("pop", weight=-3.0, where="kind == 'b'"))
    assert compiled.compilations() == before
