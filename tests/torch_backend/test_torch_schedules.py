"""Beam schedules on the torch backend: `TorchConstraints.beam_search` with
one width per step gives the JAX backend's beams (tokens, validity and
lengths; scores to float32 rounding) over the live fuzz's sets (every
layout, fixed and variable length, updates, per-row subsets), with caps and
carries; `beam_step(beam_size=)`; torch.compile'd steps; bad schedules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_same_beams
from hypothesis import given
from hypothesis import strategies as st
from live_cases import CI_EXAMPLES, compile_case, fuzz_settings, live_cases, updated

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints

MODULUS = 1009


class TableModel:
    """Both backends read one float32 table (T, V, V): row ``(h + last) % V``
    at `step`, h (the carry) a hash of the beam's history, so the carry
    must follow its beam through every change of width."""

    def __init__(self, table: np.ndarray):
        self.table, self.torch_table = table, torch.from_numpy(table)

    def jax_fn(self, last, step, h):
        import jax.numpy as jnp
        return jnp.asarray(self.table)[step, (h + last) % self.table.shape[-1]], \
            (h * 7 + last) % MODULUS

    def torch_fn(self, last, step, h):
        return self.torch_table[step][(h + last) % self.table.shape[-1]], \
            (h * 7 + last) % MODULUS


def search_both(compiled, tc, model, B: int, schedule, **options):
    want = sc.beam_search(compiled, model.jax_fn, batch_size=B, beam_size=schedule,
                          carry=np.zeros((B, 1), np.int32),  # (the start beam)
                          carry_axes=sc.BeamAxis(0, split=True), **options)
    got = tc.beam_search(model.torch_fn, batch_size=B, beam_size=schedule,
                         carry=torch.zeros(B, 1, dtype=torch.int64),
                         reorder=lambda h, parent: h.gather(1, parent), **options)
    return want, got


@fuzz_settings(max(3, CI_EXAMPLES // 3))
@given(live_cases(), st.data(), st.sampled_from([None, 1, 2]))
def test_schedules_match_jax(case, data, cap):
    compiled = updated(compile_case(case), case)
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, case.vocab
    schedule = tuple(data.draw(st.lists(st.integers(1, 6), min_size=T, max_size=T),
                               label="schedule"))
    model = TableModel(np.random.default_rng(len(case.rows)).standard_normal((T, V, V))
                       .astype(np.float32))
    stacked = sc.stack_subsets([compiled.subset(m) for m in case.subsets])
    want, got = search_both(compiled, tc, model, case.subset_index.shape[0], schedule,
                            tokens_per_beam=cap, subset=stacked, subset_index=case.subset_index)
    assert_same_beams(want, got, (schedule, cap))


def _set():
    rows = np.random.default_rng(2).integers(0, 10, (120, 4))
    return sc.compile_constraints(rows, 10)


def test_beam_step_keeps_the_width_asked_for():
    compiled = _set()
    tc = TorchConstraints.from_compiled(compiled)
    state = tc.init_beams(2, 3)
    logits = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0))
    assert tc.beam_step(state, logits, 0, beam_size=5).node.shape == (2, 5)
    with pytest.raises(DecodeInputError, match=r"beam_size=0: expected an int >= 1"):
        tc.beam_step(state, logits, 0, beam_size=0)


def test_compiled_steps_follow_the_schedule():
    compiled = _set()
    tc = TorchConstraints.from_compiled(compiled)
    model = TableModel(np.random.default_rng(4).standard_normal((4, 10, 10)).astype(np.float32))
    schedule = (2, 5, 3, 4)
    eager = tc.beam_search(model.torch_fn, batch_size=2, beam_size=schedule,
                           carry=torch.zeros(2, 1, dtype=torch.int64),
                           reorder=lambda h, parent: h.gather(1, parent))
    compiled_run = tc.beam_search(model.torch_fn, batch_size=2, beam_size=schedule,
                                  carry=torch.zeros(2, 1, dtype=torch.int64),
                                  reorder=lambda h, parent: h.gather(1, parent), compile=True)
    for name in ("tokens", "scores", "valid", "lengths"):
        assert torch.equal(getattr(eager, name), getattr(compiled_run, name)), name


@pytest.mark.parametrize("beam_size, message", [
    ((2, 3), r"beam_size=\(2, 3\): expected an int >= 1, or a sequence of 4 ints"),
    ((2, 0, 3, 4), r"beam_size\[1\]=0: expected an int >= 1"),
    ([2, "3", 3, 4], r"beam_size\[1\]='3': expected an int >= 1"),
])
def test_bad_schedules_are_named(beam_size, message):
    tc = TorchConstraints.from_compiled(_set())
    with pytest.raises(DecodeInputError, match=message):
        tc.beam_search(lambda last, step, carry: (torch.zeros(last.shape + (10,)), carry),
                       batch_size=1, beam_size=beam_size)
