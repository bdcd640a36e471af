"""The decode package's public surface: `decode.__all__` is the calls a user
makes (one `beam_step` / `mask` / `advance` for a static and a traced step),
the types and constants import from the package without being in it, and
the traced-step `_switch` functions live in their modules only (the
package-level spellings went before the first release).
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest

from static_compiler.backend import decode
from static_compiler.backend.decode import processor, step
from static_compiler.errors import DecodeInputError
from static_compiler.support import decode_types

CALLS = ["beam_search", "greedy_decode", "sample", "init_beam_state", "beam_step", "finalize",
         "init_processor_state", "mask", "advance", "StepProcessor", "allowed", "accept_drafts",
         "BeamAxis", "reorder_carry"]
TYPES = ["BeamState", "ProcessorState", "DecodeResult", "PAD_TOKEN", "SENTINEL_SCORE",
         "MIN_VALID_SCORE"]
SWITCHES = {"beam_step_switch": (step, "beam_step"), "mask_switch": (processor, "mask"),
            "advance_switch": (processor, "advance")}


def test_all_is_the_calls_and_every_name_resolves():
    assert decode.__all__ == CALLS
    for name in CALLS:
        obj = getattr(decode, name)
        assert callable(obj), name
        assert inspect.getdoc(obj).splitlines()[0].strip(), f"{name}: no one-line summary"


def test_types_and_constants_import_from_the_package_outside_all():
    assert list(decode.TYPES) == TYPES
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in TYPES:
            assert name not in decode.__all__
            assert getattr(decode, name) is getattr(decode_types, name), name
    assert not any(name.endswith("_switch") for name in decode.__all__)


@pytest.fixture(scope="module")
def ended_set():
    return oracle.compile_set([(1,), (1, 2), (2, 1, 2), (2, 2)], 4, "csr", end_token=0)


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_switch_functions_live_in_their_modules_and_equal_the_verb(ended_set, name):
    """`decode.mask_switch` and the other package-level spellings are gone
    (AttributeError, not in dir()); each function stays in its module, where
    the exported modules call it, and gives what the package's verb gives
    for a traced step."""
    module, verb = SWITCHES[name]
    with pytest.raises(AttributeError, match=name):
        getattr(decode, name)
    assert name not in dir(decode)
    plan, tables = ended_set.plan, ended_set.lowered.device_tables
    if name == "beam_step_switch":
        args = (decode.init_beam_state(plan, 1, 2), jnp.zeros((1, 2, 4)), jnp.int32(1))
    elif name == "mask_switch":
        args = (jnp.zeros((2, 4)), decode.init_processor_state(2), jnp.int32(0))
    else:
        args = (decode.init_processor_state(2), jnp.asarray([1, 2], jnp.int32), jnp.int32(0))
    got = getattr(module, name)(plan, tables, *args)
    want = getattr(decode, verb)(plan, tables, *args)
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("with_subset", [False, True])
def test_beam_step_is_bit_identical_for_a_static_and_a_traced_step(ended_set, with_subset):
    """One verb, both kinds of step: the same states at every step (a
    per-step cap schedule reads the same for both; a subset too)."""
    plan, tables = ended_set.plan, ended_set.lowered.device_tables
    chosen = np.asarray([True, False, True, True])
    live = decode.live.subset_live_mask(ended_set.subset(chosen), ended_set.fingerprint,
                                        None, 2, "test") if with_subset \
        else None
    caps = (None,) + (1,) * (plan.max_length - 1)
    traced = jax.jit(lambda t, s, x, i: decode.beam_step(plan, t, s, x, i, caps, live))
    rng = np.random.default_rng(3)
    a = b = decode.init_beam_state(plan, 2, 3)
    for t in range(plan.max_length):
        logits = jnp.asarray(rng.normal(size=(2, 3, 4)), jnp.float32)
        a = decode.beam_step(plan, tables, a, logits, t, caps, live)
        b = traced(tables, b, logits, jnp.int32(t))
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.asarray(a.valid).any()


def test_beam_step_takes_live_beams_with_a_static_step_only(ended_set):
    plan, tables = ended_set.plan, ended_set.lowered.device_tables
    state, logits = decode.init_beam_state(plan, 1, 2), jnp.zeros((1, 2, 4))
    decode.beam_step(plan, tables, state, logits, 0, live_beams=1)
    with pytest.raises(DecodeInputError, match=r"live_beams=1 needs a static step"):
        decode.beam_step(plan, tables, state, logits, jnp.int32(0), live_beams=1)
