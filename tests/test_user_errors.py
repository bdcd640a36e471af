"""User errors that used to pass silently or raise bare Python errors
(issue 14, findings 10 and 11): each is now one of ours, naming the value and
what was expected, and each test failed before its fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ConstraintSetError, DecodeInputError, PipelineError


def zeros(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (3,), jnp.float32), carry


@pytest.fixture(scope="module")
def compiled():
    return sc.compile_constraints([[0, 1], [1, 2]], 3, export_beam_sizes=(2,))


def test_a_pass_option_given_twice_is_refused():
    with pytest.raises(PipelineError, match="'multiple' is given twice"):
        sc.parse_pipeline("verify,pad-branches{multiple=8,multiple=16}")


@pytest.mark.parametrize("items", [[[True, 1]], [(0, np.bool_(False))]])
def test_bools_are_not_token_ids(items):
    with pytest.raises(ConstraintSetError, match="is a bool: expected integer token ids"):
        sc.compile_constraints(items, 3)


@pytest.mark.parametrize("sizes", [("a",), (), (0,), (True,), 70])
def test_bad_export_beam_sizes_are_refused_when_compiling(sizes):
    with pytest.raises(DecodeInputError, match="export_beam_sizes="):
        sc.compile_constraints([[0, 1]], 3, export_beam_sizes=sizes)


def test_export_beam_sizes_accept_any_sequence_of_ints():
    assert sc.compile_constraints([[0, 1]], 3,
                                  export_beam_sizes=np.array([2, 4])).export_beam_sizes == (2, 4)


@pytest.mark.parametrize("key", [0, np.zeros(3, np.uint32), "seed"])
def test_sample_needs_a_prng_key(compiled, key):
    with pytest.raises(DecodeInputError, match="expected a jax PRNG key"):
        sc.sample(compiled, zeros, key, batch_size=1)


def test_sample_takes_both_kinds_of_key(compiled):
    for key in (jax.random.PRNGKey(0), jax.random.key(0)):
        assert np.asarray(sc.sample(compiled, zeros, key, batch_size=1).valid).all()


def test_a_state_of_the_wrong_shape_is_refused_by_mask_and_advance(compiled):
    pair = (jnp.zeros(1, jnp.int32), jnp.ones(1, bool))
    with pytest.raises(DecodeInputError, match="mask: state"):
        compiled.mask(jnp.zeros((1, 3)), pair, 0)
    with pytest.raises(DecodeInputError, match="advance: state"):
        compiled.advance(pair, jnp.zeros(1, jnp.int32), 0)


def test_load_refuses_a_device_that_is_not_one(compiled, tmp_path):
    compiled.save(tmp_path / "a")
    with pytest.raises(DecodeInputError, match="device='bogus': expected a jax.Device"):
        serving.load(tmp_path / "a", device="bogus")
    assert serving.load(tmp_path / "a", device=jax.devices()[0]).num_sequences == 2

