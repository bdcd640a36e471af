"""Item priors on the torch backend: `TorchConstraints.beam_search(prior=)`
gives the JAX backend's beams (tokens, validity and lengths; scores to
float32 rounding) over every layout, weights of both signs, caps, beam
schedules, subsets and torch.compile'd steps; `TorchConstraints.prior` is
the compiled set's; bad priors are named."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
import torch
from helpers import assert_same_beams, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints

V = 8
ROWS = np.asarray(oracle.random_set(np.random.default_rng(21), 80, 4, V), np.int32)
POP = (np.random.default_rng(22).standard_normal(len(ROWS)) * 2).astype(np.float32)
TABLE = np.random.default_rng(23).standard_normal((4, V, V)).astype(np.float32)


def jax_model(last, step, h):
    import jax.numpy as jnp
    return jnp.asarray(TABLE)[step, (h + last) % V], (h * 7 + last) % 1009


def torch_model(last, step, h):
    return torch.from_numpy(TABLE)[step][(h + last) % V], (h * 7 + last) % 1009


def both(compiled, tc, beam_size, weight, **kw):
    first = beam_size if isinstance(beam_size, int) else 1
    compile_steps = kw.pop("compile", False)
    want = sc.beam_search(compiled, jax_model, batch_size=2, beam_size=beam_size,
                          carry=np.zeros((2, first), np.int32),
                          carry_axes=sc.BeamAxis(0, split=True),
                          prior=compiled.prior("pop", weight=weight), **kw)
    kw = {k: (tc.subset(np.arange(len(ROWS)) % 2 == 0) if k == "subset" else v)
          for k, v in kw.items()}
    got = tc.beam_search(torch_model, batch_size=2, beam_size=beam_size,
                         carry=torch.zeros(2, first, dtype=torch.int64),
                         reorder=lambda h, parent: h.gather(1, parent),
                         prior=tc.prior("pop", weight=weight), compile=compile_steps, **kw)
    assert_same_beams(want, got, (beam_size, weight))


@pytest.mark.parametrize("layout", ["default", "dense_rows", "csr", "mixed_csr", "unary"])
@settings(max_examples=examples(3), deadline=None)
@given(weight=st.sampled_from([0.5, 3.0, -1.0]), beam_size=st.sampled_from([3, (2, 4, 7, 5)]),
       cap=st.sampled_from([None, 2]), subset=st.booleans())
def test_priors_match_jax(layout, weight, beam_size, cap, subset):
    compiled = sc.compile_constraints(ROWS, V, pipeline=oracle.pipeline_for(layout, False),
                                      attributes={"pop": POP}, export_subsets=True)
    extra = {"subset": compiled.subset(np.arange(len(ROWS)) % 2 == 0)} if subset else {}
    both(compiled, TorchConstraints.from_compiled(compiled), beam_size, weight,
         tokens_per_beam=cap, **extra)


def test_compiled_steps_take_the_prior():
    compiled = sc.compile_constraints(ROWS, V, attributes={"pop": POP}, export_subsets=True)
    both(compiled, TorchConstraints.from_compiled(compiled), 4, 1.5, compile=True)


def test_the_torch_prior_is_the_compiled_sets():
    compiled = sc.compile_constraints(ROWS, V, attributes={"pop": POP}, export_subsets=True)
    tc = TorchConstraints.from_compiled(compiled)
    np.testing.assert_array_equal(tc.prior("pop", 2.0, where="pop > 0").best,
                                  compiled.prior("pop", 2.0, where="pop > 0").best)


def test_bad_priors_are_named():
    compiled = sc.compile_constraints(ROWS, V, attributes={"pop": POP}, export_subsets=True)
    other = sc.compile_constraints(ROWS[:40], V, attributes={"pop": POP[:40]},
                                   export_subsets=True)
    tc = TorchConstraints.from_compiled(compiled)
    zeros = lambda last, step, carry: (torch.zeros(last.shape + (V,)), carry)
    with pytest.raises(DecodeInputError, match="the prior is of another set"):
        tc.beam_search(zeros, batch_size=1, beam_size=2, prior=other.prior("pop"))
    with pytest.raises(DecodeInputError, match=r"prior=1.0 is a float, expected a Prior"):
        tc.beam_search(zeros, batch_size=1, beam_size=2, prior=1.0)
    with pytest.raises(DecodeInputError, match="prior with length_penalty=0.3"):
        tc.beam_search(zeros, batch_size=1, beam_size=2, prior=tc.prior("pop"),
                       length_penalty=0.3)


def test_priors_with_an_end_token_match_jax():
    items = oracle.random_ragged_set(np.random.default_rng(24), 40, 3, V, end_token=0)
    pop = (np.random.default_rng(25).standard_normal(len(items)) * 2).astype(np.float32)
    compiled = sc.compile_constraints(items, V, end_token=0, attributes={"pop": pop},
                                      export_subsets=True)
    tc = TorchConstraints.from_compiled(compiled)
    for beam_size in (3, (2, 4, 7, 5)):
        both(compiled, tc, beam_size, -1.2)

