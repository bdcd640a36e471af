"""`TorchConstraints.warm` and `compilations()`: the warm-up runs
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


@pytest.mark.parametrize("name", ["artifact", "plain"])
def test_warm_takes_beam_schedules(sets, name):
    """A schedule warms its steps from the start beam, each at its width
    (as `beam_search` runs it), next to a fixed width; results unchanged."""
    tc = sets[name]
    before = _decode(tc)
    report = tc.warm([2], beam_sizes=[(2, 4, 3), 3, [2, 4, 3], (1, 1, 1)],
                     max_subsets=0 if name == "plain" else 1)
    assert report.beam_sizes == (3, (1, 1, 1), (2, 4, 3)) and report.compilations == 0
    # Two paths (both sets have an item index: every item, and one subset, also at
    # max_subsets=0), each: init_processor and mask / allowed_tokens / allowed / advance at
    # each step; per beam entry: init_beams, a beam_step per step, finalize and beam_search.
    # And one job: a ranked subset made and read (its set's order and ranges built).
    T = tc.max_length
    assert report.calls == 1 + 2 * (1 + 4 * T + 3 * (T + 3)) and report.subset_rows == 1
    assert tc._set_view._order._done and tc._engine.range_table is not None
    for x, y in zip(before, _decode(tc)):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else \
            all(torch.equal(a, b) for a, b in zip(x, y))


@pytest.mark.parametrize("beam_sizes, problem", [
    ([(2, 4)], r"entry \(2, 4\).*sequence of 3 ints"), ([(2, 0, 3)], r"beam_size\[1\]"),
    ([(2, 1.5, 3)], r"beam_size\[1\]"), ([[2, "4", 3]], r"beam_size\[1\]")])
def test_bad_schedules_are_named(sets, beam_sizes, problem):
    with pytest.raises(DecodeInputError, match=problem):
        sets["artifact"].warm([2], beam_sizes=beam_sizes)


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


def _built(tc) -> dict:
    """What a set's first `subset()` builds: its view's lazily built parts
    (trie, bit layout, first rows, ...) and, with numba, the subset
    kernels' compiled signatures."""
    from static_compiler.item_bits import bit_kernels
    from static_compiler.rules.set_view import _Once

    parts = {name: once._done for name, once in vars(tc._set_view).items()
             if isinstance(once, _Once)}
    if bit_kernels.HAVE_NUMBA:
        parts.update({name: len(getattr(bit_kernels, name).signatures)
                      for name in bit_kernels.NUMPY_KERNELS})
    return parts


@pytest.mark.parametrize("max_subsets", [0, 2])
def test_warm_pays_the_first_subsets_costs(sets, tmp_path, max_subsets):
    """The first `subset()` of a process (0.65-3.1 s: numba's kernels, the
    set's trie and bit layout) is paid by `warm()` at any max_subsets: after
    it, a subset builds and compiles nothing."""
    tc = TorchConstraints.load(sets["artifact"].path)  # fresh: nothing built yet
    tc.warm([2], max_subsets=max_subsets)
    before = _built(tc)
    assert before["_trie"] and before["_layout"]
    tc.subset(np.array([True, False, True, True]))
    assert _built(tc) == before


def test_max_subsets_past_the_padding_bound_is_typed(sets):
    """The bound every door keeps on max_subsets (`PADDED_SUBSETS_MAX_BYTES`
    over one subset's bytes): past it a typed error, before anything runs."""
    from static_compiler.item_bits import padding as warming

    tc = sets["artifact"]
    bound = warming.PADDED_SUBSETS_MAX_BYTES // warming.subset_bytes(
        tc.subset(np.zeros(len(ROWS), bool)))
    with pytest.raises(DecodeInputError, match=rf"max_subsets=10000000000.*\[0, {bound}\]"):
        tc.warm([1], max_subsets=10 ** 10)
    assert tc.warm([1], max_subsets=bound).compilations == 0 == tc.compilations()
