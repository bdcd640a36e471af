"""The torch backend's beam search (`TorchConstraints.beam_search` /
`beam_step` / `finalize`) against the JAX backend's `sc.beam_search` on the
same model: the same tokens, validity and lengths, scores to float32
rounding, over the live fuzz's sets (every layout, fixed and variable
length, capacity, updates, per-row subsets), caps, carries and length
penalties; tie-heavy and NaN / +inf logits; torch.compile and the compiled
steps; both rankings of the selection; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import PROFILE, assert_same_beams
from hypothesis import given
from hypothesis import strategies as st
from live_cases import CI_EXAMPLES, beams_for, compile_case, fuzz_settings, live_cases, updated

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints, beam, live_bits, selection

MODULUS = 1009
FULL_MATRIX = PROFILE == "slow"
"""Every beam count with and without subsets (the CI profile: each once)."""


class TableModel:
    """A model both backends run on the same float32 table (T, V, V): at
    `step` a beam reads row ``(h + last_token) % V`` where h, its carry,
    hashes the beam's history (``h * 7 + last_token`` mod 1009): the logits
    depend on the whole path, so carries must follow their beams."""

    def __init__(self, table: np.ndarray):
        self.table = table
        self.torch_table = torch.from_numpy(table)

    def jax_fn(self, last, step, h):
        import jax.numpy as jnp
        V = self.table.shape[-1]
        logits = jnp.asarray(self.table)[step, (h + last) % V]
        return logits, (h * 7 + last) % MODULUS

    def torch_fn(self, last, step, h):
        V = self.table.shape[-1]
        return self.torch_table[step][(h + last) % V], (h * 7 + last) % MODULUS


def reorder(h, parent):
    return h.gather(1, parent)


def _table(rng, T: int, V: int, ties: bool) -> np.ndarray:
    if not ties:
        return rng.standard_normal((T, V, V)).astype(np.float32)
    # few distinct values and -inf: many exact ties, within and across beams
    table = rng.integers(0, 3, (T, V, V)).astype(np.float32)
    table[rng.random((T, V, V)) < 0.2] = -np.inf
    return table


def _search_both(compiled, tc, model, B: int, M: int, **options):
    h = np.zeros((B, M), np.int32)
    want = sc.beam_search(compiled, model.jax_fn, batch_size=B, beam_size=M, carry=h,
                          carry_axes=sc.BeamAxis(0, split=True), **options)
    got = tc.beam_search(model.torch_fn, batch_size=B, beam_size=M, carry=torch.zeros(B, M,
                         dtype=torch.int64), reorder=reorder, **options)
    return want, got


@fuzz_settings(max(4, CI_EXAMPLES // 2))  # (each example compiles both backends: the slow profile runs 10x)
@given(live_cases(), st.booleans(), st.sampled_from([None, 1, 2]))
def test_beams_match_jax(case, ties, cap):
    compiled = updated(compile_case(case), case)
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, case.vocab
    model = TableModel(_table(np.random.default_rng(len(case.rows)), T, V, ties))
    stacked = sc.stack_subsets([compiled.subset(m) for m in case.subsets])
    B = case.subset_index.shape[0]
    more = beams_for(len(case.live_items()) + 1)  # more beams than items: invalid beams
    # Each beam count once per kind of search (each search compiles its program):
    # the slow profile runs the whole cross product.
    both = ("live", "subsets")
    for M, kinds in ((1, both if FULL_MATRIX else ("live",)),
                     (3, both if FULL_MATRIX else ("subsets",)), (more, both)):
        if "live" in kinds:
            want, got = _search_both(compiled, tc, model, 1, M, tokens_per_beam=cap)
            assert_same_beams(want, got, ("live", M, cap))
        if "subsets" in kinds:
            want, got = _search_both(compiled, tc, model, B, M, tokens_per_beam=cap,
                                     subset=stacked, subset_index=case.subset_index)
            assert_same_beams(want, got, ("subsets", M, cap))
    want, got = _search_both(compiled, tc, model, 1, 4, length_penalty=0.7,
                             start_token=int(V - 1))
    assert_same_beams(want, got, "length penalty")


def _ragged_set():
    rng = np.random.default_rng(5)
    rows = [tuple(int(x) for x in rng.integers(1, 12, rng.integers(1, 5))) for _ in range(60)]
    return sc.compile_constraints(rows, 12, end_token=0, export_subsets=True)


@pytest.mark.parametrize("poison", ["nan", "posinf", "all_neginf"])
def test_nan_and_inf_logits(poison):
    """NaN logits are invalid tokens, +inf logits share all the probability,
    a beam whose logits are all -inf has no valid child: as in JAX."""
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, compiled.vocab_size
    table = np.random.default_rng(1).standard_normal((T, V, V)).astype(np.float32)
    rows = np.arange(V) % 3 == 0
    if poison == "nan":
        table[:, rows, 1::2] = np.nan
    elif poison == "posinf":
        table[:, rows, 2::5] = np.inf
    else:
        table[1:, rows] = -np.inf
    want, got = _search_both(compiled, tc, TableModel(table), 2, 6)
    assert_same_beams(want, got, poison)


def test_beam_step_compiles_fullgraph():
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, compiled.vocab_size
    bits = live_bits(compiled.subset(np.arange(60) % 2 == 0))
    logits = torch.from_numpy(np.random.default_rng(2).standard_normal((T, 2, 5, V))
                              .astype(np.float32))

    def run(logits, index):
        state = tc.init_beams(2, 5)
        for step in range(T):
            state = tc.beam_step(state, logits[step], step, tokens_per_beam=2, subset=bits,
                                 subset_index=index)
        return tc.finalize(state, 0.5)

    index = torch.tensor([0, 0])
    want = run(logits, index)
    got = torch.compile(run, fullgraph=True, backend="eager")(logits, index)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_bad_input():
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    V = compiled.vocab_size
    state = tc.init_beams(2, 3)
    good = torch.zeros(2, 3, V)
    cases = [
        (lambda: tc.beam_step(state, torch.zeros(2, 3, V - 1), 0), r"logits have shape \(2, 3, 11\)"),
        (lambda: tc.beam_step(state, torch.zeros(2, 3, V, dtype=torch.int64), 0),
         "logits have dtype torch.int64"),
        (lambda: tc.beam_step(state, good.numpy(), 0), "logits is a ndarray"),
        (lambda: tc.beam_step(state, good, compiled.max_length), "step=5 must be an int"),
        (lambda: tc.beam_step(state[:3], good, 0), "expected a tuple of 8 tensors"),
        (lambda: tc.beam_step(state._replace(node=state.node[:, :2]), good, 0),
         "do not have the shapes of a beam state"),
        (lambda: tc.beam_step(state, good, 0, tokens_per_beam=0), "tokens_per_beam=0"),
        (lambda: tc.beam_step(state, good, 0, log_probs=1), "log_probs=1: expected a bool"),
        (lambda: tc.init_beams(0, 3), "batch_size=0"),
        (lambda: tc.init_beams(2, 3, start_token=[1, 2, 3]), "start_token"),
        (lambda: tc.beam_search(lambda t, s, c: (good, c), batch_size=2, beam_size=3,
                                carry=torch.zeros(1)), "needs reorder="),
        (lambda: tc.beam_search(lambda t, s, c: good, batch_size=2, beam_size=3),
         "logits_fn must return"),
        (lambda: tc.beam_search(lambda t, s, c: (good[:1], c), batch_size=2, beam_size=3),
         r"beam_search \(step 0\): logits have shape"),
        (lambda: tc.beam_search(lambda t, s, c: (good, c), batch_size=2, beam_size=3,
                                tokens_per_beam=[1]), "tokens_per_beam"),
        (lambda: tc.finalize(state, float("nan")), "length_penalty=nan"),
        (lambda: tc.beam_search(lambda t, s, c: (good, c), batch_size=2, beam_size=3,
                                subset=_ragged_set().update(remove=np.arange(60) < 3)
                                .subset(np.ones(60, bool))), "subset"),
    ]
    for call, message in cases:
        with pytest.raises(DecodeInputError, match=message):
            call()


@pytest.mark.parametrize("penalty", [0.0, 0.7])
def test_log_probs_read_at_the_allowed_tokens_give_the_search(penalty):
    """beam_step(log_probs=True) on log_softmax over the full vocabulary,
    kept only at the tokens `allowed` gives each live beam's prefix (-inf
    elsewhere: what an engine returns for the tokens asked), steps to
    beam_search's beams on the logits, bit for bit, subset and length
    penalty included."""
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    T, V, B, M = compiled.max_length, compiled.vocab_size, 2, 4
    subset = tc.subset(np.arange(60) % 4 != 1)
    model = TableModel(_table(np.random.default_rng(9), T, V, ties=False))
    want = tc.beam_search(model.torch_fn, B, M, carry=torch.zeros(B, M, dtype=torch.int64),
                          reorder=reorder, subset=subset, length_penalty=penalty)
    state, h = tc.init_beams(B, M), torch.zeros(B, M, dtype=torch.int64)
    for step in range(T):
        logits, h = model.torch_fn(state.last_tokens, step, h)
        allowed = tc.allowed(state.tokens[:, :, :step].reshape(B * M, step), subset=subset,
                             subset_index=np.zeros(B * M, np.int32), check_values=False
                             ).reshape(B, M, V)
        live = (state.valid & ~state.finished)[:, :, None]
        engine = torch.where(allowed & live, torch.log_softmax(logits, -1), -float("inf"))
        state = tc.beam_step(state, engine, step, subset=subset, log_probs=True)
        h = reorder(h, state.parent)
    got = tc.finalize(state, penalty)
    assert bool(got.valid.any())
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("sort_max", [0, 1 << 20])
def test_best_is_score_then_position(monkeypatch, sort_max):
    """Both rankings of `selection.best` (keys + topk, stable sort) order by
    (score desc, position asc), -0.0 tying with 0.0."""
    monkeypatch.setattr(selection, "SORT_MAX", sort_max)
    rng = np.random.default_rng(3)
    values = np.array([0.0, -0.0, -1.5, -1e30, 2.0, -np.inf], np.float32)
    scores = values[rng.integers(0, len(values), (4, 3, 40))]
    got_values, got_positions = selection.best(torch.from_numpy(scores), 7)
    for row, values_row, positions_row in zip(scores.reshape(-1, 40),
                                              got_values.reshape(-1, 7).numpy(),
                                              got_positions.reshape(-1, 7).numpy()):
        want = sorted(range(40), key=lambda i: (-row[i], i))[:7]
        assert positions_row.tolist() == want
        assert np.array_equal(values_row, row[want] + np.float32(0.0))


def test_log_probs_shortcut_equals_the_full_passes():
    """`LogProbs.of`'s CPU shortcut (finite row maxima) gives `full`'s values
    bit for bit, -inf logits included."""
    logits = torch.from_numpy(np.random.default_rng(4).standard_normal((6, 50))
                              .astype(np.float32))
    logits[:, ::7] = -float("inf")
    tokens = torch.from_numpy(np.random.default_rng(5).integers(0, 50, (6, 9)))
    fast, full = beam.LogProbs.of(logits), beam.LogProbs.full(logits)
    assert fast.logits is None and full.logits is not None
    for got, want in ((fast.take(tokens), full.take(tokens)), (fast.all(), full.all()),
                      (fast.column(3), full.column(3))):
        assert torch.equal(got, want)


def test_key_ranking_matches_jax(monkeypatch):
    """Every selection through packed keys (SORT_MAX = 0), on tie-heavy
    logits: the JAX beams."""
    monkeypatch.setattr(selection, "SORT_MAX", 0)
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, compiled.vocab_size
    model = TableModel(_table(np.random.default_rng(6), T, V, ties=True))
    want, got = _search_both(compiled, tc, model, 2, 7, tokens_per_beam=2)
    assert_same_beams(want, got, "keys")


def test_compiled_steps_equal_eager_steps():
    """`CompiledSteps` (dynamo, the eager backend here: inductor's compile
    takes seconds a step) returns `beam_step`'s states bit for bit, one
    program per step and shape; beam_search(compile=True) runs them."""
    compiled = _ragged_set()
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, compiled.vocab_size
    steps = beam.CompiledSteps(tc.plan, tc._tables, backend="eager")
    bits = live_bits(compiled.subset(np.arange(60) % 3 != 0))
    rng = np.random.default_rng(7)
    for B, M, cap, sub in ((2, 5, 2, (bits, torch.tensor([0, 0]))), (3, 4, None, None)):
        logits = torch.from_numpy(rng.standard_normal((T, B, M, V)).astype(np.float32))
        want = got = tc.init_beams(B, M)
        for step in range(T):
            want = beam.beam_step(tc.plan, tc._tables, want, logits[step], step, cap, None, sub)
            got = steps(got, logits[step], step, cap, None, sub)
            assert all(torch.equal(a, b) for a, b in zip(want, got)), (B, M, step)
    assert len(steps.programs) == 2 * T
    beam._COMPILED_STEPS[tc] = steps  # (beam_search(compile=True) reuses tc's)
    model = TableModel(_table(np.random.default_rng(8), T, V, ties=False))
    eager = tc.beam_search(model.torch_fn, 2, 5, carry=torch.zeros(2, 5, dtype=torch.int64),
                           reorder=reorder)
    with_programs = tc.beam_search(model.torch_fn, 2, 5, carry=torch.zeros(
        2, 5, dtype=torch.int64), reorder=reorder, compile=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, with_programs))
    assert len(steps.programs) > 2 * T
