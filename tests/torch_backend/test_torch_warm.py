"""`TorchConstraints.warm` and `compilations()` (issue 40): the warm-up runs
every request path once on dummy inputs, reports 0 compilations (eager
torch compiles nothing), refuses bad arguments with DecodeInputError, and
changes no result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints

ROWS = [[1, 2, 3], [1, 4, 5], [2, 2, 2], [3, 1, 6]]
V = 8


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    compiled = sc.compile_constraints(ROWS, vocab_size=V, export_subsets=True)
    version = compiled.update(remove=np.array([False, False, False, True]))
    path = version.save(tmp_path_factory.mktemp("torch_warm") / "set.sc")
    plain = sc.compile_constraints(ROWS, vocab_size=V)
    bare = plain.save(tmp_path_factory.mktemp("torch_warm_bare") / "bare.sc")
    return {"bare": TorchConstraints.load(bare), "artifact": TorchConstraints.load(path),
            "compiled": TorchConstraints.from_compiled(version),
            "plain": TorchConstraints.from_compiled(plain)}


def _decode(tc):
    """Every request path's results on fixed inputs."""
    torch.manual_seed(0)
    table = torch.randn(tc.max_length, V, V)
    fn = lambda last, step, carry: (table[step][last], None)
    state, masks = tc.init_processor(2), []
    for t in range(tc.max_length):
        masks.append(tc.allowed_tokens(state, t))
        state = tc.advance(state, masks[-1].int().argmax(1), t)
    result = tc.beam_search(fn, batch_size=2, beam_size=3)
    return (torch.stack(masks), state, tc.allowed([[1, 4]]), result.tokens, result.valid,
            result.lengths, result.scores)


@pytest.mark.parametrize("name", ["artifact", "compiled", "plain", "bare"])
def test_warm_runs_and_compiles_nothing(sets, name):
    tc = sets[name]
    before = _decode(tc)
    subsets = 0 if name == "bare" else 3
    report = tc.warm([1, 2], beam_sizes=[1, 3], max_subsets=subsets)
    assert report.compilations == 0 and tc.compilations() == 0
    assert report.calls > 0 and report.seconds >= 0
    assert report.batch_sizes == (1, 2) and report.beam_sizes == (1, 3)
    assert report.subset_rows == (subsets or None)
    after = _decode(tc)
    for x, y in zip(before, after):
        assert all(torch.equal(a, b) for a, b in zip(x, y)) if isinstance(x, tuple) \
            else torch.equal(x, y)


def test_warm_single_int_and_no_beams(sets):
    report = sets["artifact"].warm(2)
    assert report.batch_sizes == (2,) and report.beam_sizes == ()


@pytest.mark.parametrize("kwargs", [
    dict(batch_sizes=0), dict(batch_sizes=[]), dict(batch_sizes=1.5), dict(batch_sizes="2"),
    dict(batch_sizes=[2, True]), dict(batch_sizes=[2], beam_sizes=[0]),
    dict(batch_sizes=[2], beam_sizes=["1"]), dict(batch_sizes=[2], max_subsets=-1),
    dict(batch_sizes=[2], max_subsets=1.0)])
def test_bad_arguments_typed(sets, kwargs):
    with pytest.raises(DecodeInputError):
        sets["artifact"].warm(**kwargs)


def test_subsets_need_an_item_index(sets):
    """An artifact saved without export_subsets has no subsets to warm."""
    with pytest.raises(DecodeInputError, match="no item subsets"):
        sets["bare"].warm([2], max_subsets=1)
    assert sets["bare"].warm([2]).compilations == 0
