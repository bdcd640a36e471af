"""The carry contract: per-beam model state is declared (`carry_axes`, like
jax.vmap's in_axes, or a `reorder` function), never guessed; params travel
as a traced argument; the final carry comes back. Also the per-step
tokens_per_beam schedule, decoding compiled as loops, and traced steps in
the logits-processor pair."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import assert_matches

import static_compiler as sc
from static_compiler.backend import decode
from static_compiler.backend.decode.search import _beam_search
from static_compiler.backend.decode.step import step_segments
from static_compiler.errors import DecodeInputError
from static_compiler.support.decode_state import check_tokens_per_beam

V = 7
ITEMS = oracle.random_set(np.random.default_rng(5), 60, 4, V)
CSET = oracle.ConstraintSet(ITEMS, V)
B, M = 2, 4
SEEDS = [31, 32]
# Three disjoint bit masks: the prefix hash is split into three shares, one
# per carry leaf, so a leaf reordered wrongly (or not at all) changes the logits.
MASKS = (np.uint32(0x0000FFFF), np.uint32(0x00FF0000), np.uint32(0xFF000000))


@pytest.fixture(scope="module")
def compiled():
    return oracle.compile_set(ITEMS, V)


class LayoutModel:
    """oracle.HashModel with its per-beam hash kept in the cache layouts real
    models use: "flat" (B*M, 2) as serving engines lay out KV caches,
    "layers" (3, 2, B*M) layers-first, "split" (B, M, 1); plus "knobs" (6,)
    and "weights" (B, M) float32 that are not per beam (a (B, M)-shaped leaf
    that must never be permuted)."""

    AXES = {"flat": 0, "layers": 2, "split": sc.BeamAxis(0, split=True), "knobs": None,
            "weights": None}

    def __init__(self):
        self.hash_model = oracle.HashModel(V)

    def carry(self, seeds, beams):
        h = self.hash_model.init_carry(seeds, beams)["h"]
        return {**self._store(h, beams), "knobs": jnp.asarray(self.hash_model.knobs),
                "weights": jnp.arange(len(seeds) * beams, dtype=jnp.float32).reshape(-1, beams)}

    @staticmethod
    def _store(h, beams):
        n = h.shape[0] * beams
        flat = (h & MASKS[0]).reshape(n)
        return {"flat": jnp.stack([flat, flat], axis=1),
                "layers": jnp.broadcast_to((h & MASKS[1]).reshape(n), (3, 2, n)),
                "split": (h & MASKS[2])[..., None]}

    def __call__(self, last_tokens, step, carry):
        b, m = last_tokens.shape
        h = carry["flat"][:, 0].reshape(b, m) | carry["layers"][1, 0].reshape(b, m) \
            | carry["split"][..., 0]
        h = self.hash_model.update(h, last_tokens)
        logits = self.hash_model.logits_from_hash(h, carry["knobs"], jnp)
        return logits, {**carry, **self._store(h, m)}


def test_every_cache_layout_decodes_exactly(compiled):
    model = LayoutModel()
    got, carry = sc.beam_search(compiled, model, batch_size=B, beam_size=M, tokens_per_beam=3,
                                carry=model.carry(SEEDS, M), carry_axes=LayoutModel.AXES,
                                return_carry=True)
    assert_matches(got, oracle.beam_search(CSET, model.hash_model, SEEDS, M, 3))
    np.testing.assert_array_equal(carry["weights"], np.arange(B * M).reshape(B, M))
    assert carry["flat"].shape == (B * M, 2) and carry["layers"].shape == (3, 2, B * M)


def test_a_reorder_function_equals_declared_axes(compiled):
    model = LayoutModel()

    def reorder(carry, parent):
        flat = (jnp.arange(B)[:, None] * M + parent).reshape(-1)
        return {**carry, "flat": carry["flat"][flat], "layers": carry["layers"][:, :, flat],
                "split": carry["split"][jnp.arange(B)[:, None], parent]}

    got = sc.beam_search(compiled, model, batch_size=B, beam_size=M, carry=model.carry(SEEDS, M),
                         reorder=reorder)
    assert_matches(got, oracle.beam_search(CSET, model.hash_model, SEEDS, M))


def test_an_undeclared_carry_is_an_error_that_shows_how_to_declare_it(compiled):
    model = LayoutModel()
    with pytest.raises(DecodeInputError, match=r"carry has 5 leaves \(\['flat'\], .*carry_axes="):
        sc.beam_search(compiled, model, batch_size=B, beam_size=M, carry=model.carry(SEEDS, M))
    # one beam: nothing can be permuted, so nothing needs declaring
    sc.greedy_decode(compiled, model, batch_size=B, carry=model.carry(SEEDS, 1))


@pytest.mark.parametrize("axes, match", [
    ({**LayoutModel.AXES, "flat": 2}, r"carry leaf \['flat'\] has shape \(8, 2\): beam axis 2 is "
                                      r"out of range"),
    ({**LayoutModel.AXES, "flat": 1}, r"carry leaf \['flat'\] has shape \(8, 2\): axis 1 should "
                                      r"hold the beams, of size \(8,\)"),
    ({**LayoutModel.AXES, "weights": 0}, r"\['weights'\] has shape \(2, 4\): axis 0 should hold"),
    ({**LayoutModel.AXES, "split": 0}, r"\['split'\] has shape \(2, 4, 1\): axis 0"),
    ({**LayoutModel.AXES, "knobs": sc.BeamAxis(0, split=True)}, r"\['knobs'\] has shape \(6,\)"),
    ({"flat": 0}, r"carry_axes=.* is not a prefix of the carry's structure"),
    ({**LayoutModel.AXES, "flat": True}, r"carry_axes entry True: expected an int, a BeamAxis"),
])
def test_bad_carry_axes_name_the_leaf(compiled, axes, match):
    model = LayoutModel()
    with pytest.raises(DecodeInputError, match=match):
        sc.beam_search(compiled, model, batch_size=B, beam_size=M, carry=model.carry(SEEDS, M),
                       carry_axes=axes)


def test_carry_axes_and_reorder_together_are_rejected(compiled):
    model = LayoutModel()
    with pytest.raises(DecodeInputError, match="either carry_axes or reorder"):
        sc.beam_search(compiled, model, batch_size=B, beam_size=M, carry=model.carry(SEEDS, M),
                       carry_axes=LayoutModel.AXES, reorder=lambda c, p: c)


def test_a_carry_that_changes_shape_is_named(compiled):
    def grows(last_tokens, step, carry):
        return jnp.zeros(last_tokens.shape + (V,)), {"x": jnp.concatenate([carry["x"],
                                                                          carry["x"]])}

    with pytest.raises(DecodeInputError, match=r"carry leaf \['x'\] as float32\[16\], expected "
                                                r"float32\[8\]"):
        sc.beam_search(compiled, grows, batch_size=B, beam_size=M,
                       carry={"x": jnp.zeros(B * M)}, carry_axes={"x": 0})


def params_model(params, last_tokens, step, carry):
    """Logits from a (V, V) table in params: one compiled search for every table."""
    return params["table"][last_tokens], carry


def test_params_are_traced_new_values_do_not_recompile(compiled):
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((V, V)).astype(np.float32) for _ in range(3)]
    before = _beam_search.compilations()
    results = [sc.beam_search(compiled, params_model, batch_size=B, beam_size=M,
                              params={"table": jnp.asarray(t)}) for t in tables]
    assert _beam_search.compilations() == before + 1
    assert not np.array_equal(results[0].tokens, results[1].tokens)
    bigram = lambda last, step, table: (table[last], table)  # the same model through the carry
    want = sc.beam_search(compiled, bigram, batch_size=B, beam_size=M, carry=tables[2],
                          carry_axes=None)
    np.testing.assert_array_equal(results[2].tokens, want.tokens)


@pytest.mark.parametrize("caps", [  # an int cap: test_every_cache_layout_decodes_exactly
    [3, 1, 2, None], *[pytest.param(c, marks=pytest.mark.slow) for c in ([None, 2, None, 1], 2)]])
def test_per_step_tokens_per_beam_match_the_oracle(compiled, caps):
    model = oracle.HashModel(V, dup=30)
    got = sc.beam_search(compiled, model, batch_size=B, beam_size=5, tokens_per_beam=caps,
                         carry=model.init_carry(SEEDS, 5), carry_axes=model.carry_axes)
    assert_matches(got, oracle.beam_search(CSET, model, SEEDS, 5, caps))


def test_step_zero_keeps_beam_size_children_whatever_tokens_per_beam(compiled):
    """The paper's rule: the start beam expands to its top beam_size children."""
    model = oracle.HashModel(V)
    got = sc.beam_search(compiled, model, batch_size=1, beam_size=6, tokens_per_beam=1,
                         carry=model.init_carry([3], 6), carry_axes=model.carry_axes)
    first = {int(t) for t in np.asarray(got.tokens)[0, :, 0] if t >= 0}
    assert len(first) == min(6, len(CSET.children(())))


@pytest.mark.parametrize("caps, match", [
    ([None, 2], r"tokens_per_beam=\[None, 2\]: expected None, an int >= 1, or a sequence of 4"),
    ([None, 0, 1, 1], r"tokens_per_beam\[1\]=0: expected an int >= 1"),
    ("abcd", r"tokens_per_beam='abcd'"),
])
def test_bad_tokens_per_beam_schedules_are_rejected(compiled, caps, match):
    with pytest.raises(DecodeInputError, match=match):
        sc.beam_search(compiled, params_model, batch_size=1, beam_size=2, tokens_per_beam=caps,
                       params={"table": jnp.zeros((V, V))})


def test_runs_of_similar_steps_compile_as_one_loop():
    deep = [tuple(int(x) for x in row) for row in
            np.random.default_rng(1).integers(0, 50, size=(3000, 12))]
    compiled = oracle.compile_set(deep, 50)
    caps = check_tokens_per_beam(30, compiled.plan.max_length)
    live = decode.search.live_beam_bounds(compiled.plan, 70, caps)
    segments = step_segments(compiled.plan, caps, live, 70)
    assert sum(len(s) for s in segments) == 12 and max(len(s) for s in segments) >= 6
    jaxpr = jax.make_jaxpr(lambda t: decode.beam_search(
        compiled.plan, t, params_model, batch_size=1, beam_size=70, tokens_per_beam=30,
        params={"table": jnp.zeros((50, 50))}))(compiled.lowered.device_tables)
    assert "scan" in str(jaxpr) or "while" in str(jaxpr)  # fori_loop with fixed bounds: a scan


def test_mask_and_advance_take_a_traced_step():
    compiled = oracle.compile_set([(1,), (1, 2), (2, 2)], 3, end_token=0)
    state = compiled.init_processor(2)
    logits = jnp.zeros((2, 3))
    traced = jax.jit(lambda s, t: compiled.advance(s, jnp.array([1, 2]), t))(state, jnp.int32(0))
    static = compiled.advance(state, jnp.array([1, 2]), 0)
    for a, b in zip(traced, static):
        np.testing.assert_array_equal(a, b)
    traced_mask = jax.jit(compiled.mask)  # one program for every step
    for t in range(3):
        np.testing.assert_array_equal(
            traced_mask(logits, static, jnp.int32(t)), compiled.mask(logits, static, t))


def test_decoding_stops_once_every_beam_has_ended():
    """With an end token, the loop stops when no beam is live: the model runs
    2 steps for an item of one token, not the set's 7, and the result equals
    the oracle's."""
    compiled = oracle.compile_set([(1,), (2, 3, 4, 5, 6, 7)], 8, end_token=0)
    table = np.full((8, 8), -5.0, np.float32)
    table[3, 1] = table[1, 0] = 5.0  # from the start token 3: take 1, then end

    def counting(last_tokens, step, carry):
        return carry["table"][last_tokens], {**carry, "calls": carry["calls"] + 1}

    carry = {"table": jnp.asarray(table), "calls": jnp.int32(0)}
    got, final = sc.beam_search(compiled, counting, batch_size=1, beam_size=1, start_token=3,
                                carry=carry, carry_axes=None, return_carry=True)
    assert int(final["calls"]) == 2 and compiled.plan.max_length == 7
    assert np.asarray(got.tokens)[0, 0, :2].tolist() == [1, 0] and bool(got.valid[0, 0])
    two, final = sc.beam_search(compiled, counting, batch_size=1, beam_size=2, start_token=3,
                                carry=carry, carry_axes=None, return_carry=True)
    assert int(final["calls"]) == 7  # the second beam stays live to the end
    assert np.asarray(two.valid).tolist() == [[True, True]]
