"""The torch beam step's lazy selection over ranked subsets
(`selection.ranked_select`): the liveness of each row's best LIST_FACTORS[i]
* beam_size candidates read, the whole step's only where every list
falls short. Every BeamState of `beam_step` and every `beam_search` result
over a ranked subset equals it over `subset()` of the same selection, bit
for bit: on the live fuzz's sets (every layout, fixed and variable
length, capacity, additions, removals), one subset and stacked per-row
ones, random and all-zero (tied) logits, with the list as short as the
beams (the fallback taken where a list holds too few live candidates),
then longer ones (`LISTS`: the default's first list holds every
candidate of these small sets); dense subsets decided by the list alone, sparse
ones by the list with its invalid places filled or by the fallback, each
asserted taken; a binding tokens_per_beam on the full path; eager and
under torch.compile(fullgraph=True) (`beam.CompiledSteps`, one
`torch.cond` a list).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given
from live_cases import (
    CI_EXAMPLES,
    compile_case,
    fuzz_settings,
    grid_logits,
    live_cases,
    ragged_set,
    same_tensors,
    sorted_set,
    updated,
)

import static_compiler as sc
from static_compiler.torch_backend import TorchConstraints, beam, selection

_same = same_tensors


LISTS = (2, 8)
"""List lengths (in beam sizes) for these small sets: the default's
first list (`selection.LIST_FACTORS`) holds every candidate of a step here."""


@contextlib.contextmanager
def paths(factors: tuple = LISTS):
    """The lazy selection with lists of `factors` * beam_size; yields the
    way each ranked step took: "listed" (decided by its first list),
    "longer" (by a longer one), "fallback" (every list fell short: every
    child's liveness read), "full" (no list)."""
    steps: list = []
    select, listed, live_scores = beam.ranked_select, selection._listed, selection.live_scores

    def spy(name, fn):
        def called(*args, **kwargs):
            steps[-1].append(name)
            return fn(*args, **kwargs)
        return called

    def spy_select(*args, **kwargs):
        steps.append([])
        return select(*args, **kwargs)

    def way(events: list) -> str:
        if events[-1] == "full":
            return "fallback" if len(events) > 1 else "full"
        return "listed" if len(events) == 1 else "longer"

    ways: list = []
    with mock.patch.object(selection, "LIST_FACTORS", factors), \
            mock.patch.object(beam, "ranked_select", spy_select), \
            mock.patch.object(selection, "_listed", spy("listed", listed)), \
            mock.patch.object(selection, "live_scores", spy("full", live_scores)):
        yield ways
        ways.extend(way(s) for s in steps)


def check_beams(tc: TorchConstraints, ranked, subset, index, seed: int, B: int = 3,
                M: int = 4, search: bool = True, **options) -> None:
    """beam_step state by state (a width schedule) and beam_search over
    `ranked` equal them over `subset`, with grid logits and all-zero ones."""
    T, V = tc.max_length, tc.vocab_size
    rng = np.random.default_rng(seed)
    rows = None if index is None else np.asarray([int(index[i % len(index)])
                                                  for i in range(B)])
    for zeros in (False, True):
        a = b = tc.init_beams(B, M)
        for step in range(T):
            logits = torch.zeros(tuple(a.node.shape) + (V,)) if zeros else \
                torch.from_numpy(grid_logits(rng, tuple(a.node.shape), V))
            width = M if step % 2 else M - 1
            a = tc.beam_step(a, logits, step, subset=ranked, subset_index=rows,
                             beam_size=width, **options)
            b = tc.beam_step(b, logits, step, subset=subset, subset_index=rows,
                             beam_size=width, **options)
            _same(a, b, ("beam_step", zeros, step))
        if not search:
            continue
        table = torch.zeros((T, V + 1, V)) if zeros else \
            torch.from_numpy(rng.normal(size=(T, V + 1, V)).astype(np.float32))

        def model(last, step, carry):
            return table[step][last.clamp(0, V)], carry  # noqa: B023

        _same(tc.beam_search(model, B, M, subset=ranked, subset_index=rows, **options),
              tc.beam_search(model, B, M, subset=subset, subset_index=rows, **options),
              ("beam_search", zeros))


@fuzz_settings(max(4, CI_EXAMPLES // 2))
@given(live_cases())
def test_beams_over_a_ranked_subset_equal_them_over_the_subset(case):
    """The live fuzz: one subset and stacked per-row ones, lists of one
    beam_size (the fallback wherever a list falls short) and of the
    lengths of `LISTS`."""
    tc = TorchConstraints.from_compiled(updated(compile_case(case), case))
    stacked = sc.stack_subsets([tc.subset(m) for m in case.subsets])
    at_once = tc.ranked_subset(np.stack(case.subsets))
    for factors in ((1,), (1, 2), LISTS):
        with paths(factors):
            check_beams(tc, tc.ranked_subset(case.subsets[0]), tc.subset(case.subsets[0]),
                        None, len(case.rows))
            check_beams(tc, at_once, stacked, case.subset_index, len(case.rows) + 1)


def test_a_dense_subset_is_decided_by_the_list_alone():
    """Every item selected: each list's candidates are all live, no list
    falls back to the whole step's liveness (steps whose candidates fit
    one list read them all)."""
    rows, compiled = sorted_set()
    tc = TorchConstraints.from_compiled(compiled)
    mask = np.ones(rows.shape[0], bool)
    with paths() as events:
        check_beams(tc, tc.ranked_subset(mask), tc.subset(mask), None, 0)
    assert "listed" in events and "fallback" not in events


def test_a_sparse_subset_falls_back_where_its_list_falls_short():
    """Two items in 10 rows' subsets: with lists of beam_size candidates
    (a test-only length) most steps' lists hold too few live ones while
    valid candidates lie past them: the fallback, taken and exact; a
    longer list after such a one decides; lists of 8 beam sizes hold
    every valid candidate of one of them (the places left filled with
    invalid ones in position order, as `select` does): no fallback."""
    rows, compiled = sorted_set()
    tc = TorchConstraints.from_compiled(compiled)
    masks = np.zeros((2, rows.shape[0]), bool)
    masks[0, [5, 170]] = True
    masks[1, ::10] = True
    ranked, subset = tc.ranked_subset(masks), sc.stack_subsets([tc.subset(m) for m in masks])
    with paths((1,)) as events:
        check_beams(tc, ranked, subset, np.array([0, 1, 0]), 1)
    assert "fallback" in events
    with paths((8,)) as events:
        check_beams(tc, tc.ranked_subset(masks[0]), tc.subset(masks[0]), None, 2)
    assert "listed" in events and "fallback" not in events
    with paths((1, 8)) as events:  # a longer list decides where the first falls short
        check_beams(tc, tc.ranked_subset(masks[0]), tc.subset(masks[0]), None, 2)
    assert "longer" in events


def test_a_binding_tokens_per_beam_takes_the_full_path():
    """tokens_per_beam below the beams: no list (a beam's candidates past
    its cap would need counting), the same beams."""
    rows, compiled = sorted_set()
    tc = TorchConstraints.from_compiled(compiled)
    mask = np.arange(rows.shape[0]) % 3 == 0
    with paths() as events:  # (beam_search caps from step 1 on: beam steps alone)
        check_beams(tc, tc.ranked_subset(mask), tc.subset(mask), None, 3, search=False,
                    tokens_per_beam=2)
    assert set(events) == {"full"}
    with paths() as events:  # a cap that cannot bind: the list
        check_beams(tc, tc.ranked_subset(mask), tc.subset(mask), None, 3, tokens_per_beam=4)
    assert "listed" in events


@pytest.mark.parametrize("make", [sorted_set, ragged_set])
def test_the_lazy_selection_under_torch_compile(make):
    """`beam_search(compile=True)` (dynamo, the eager backend) over a
    ranked subset equals the eager searches over it and over `subset()`:
    a dense selection and a sparse one, with lists of beam_size and
    random logits (the eager search falls back: the step's `torch.cond`
    takes both ways) and of the lengths of `LISTS` and zero logits."""
    rows, compiled = make()
    tc = TorchConstraints.from_compiled(compiled)
    n = rows.shape[0]
    masks = np.zeros((2, n), bool)
    masks[0] = True
    masks[1, [3, n // 2]] = True
    ranked, subset = tc.ranked_subset(masks), sc.stack_subsets([tc.subset(m) for m in masks])
    B, M, T, V = 3, 4, tc.max_length, tc.vocab_size
    index = np.array([0, 1, 1])
    rng = np.random.default_rng(6)
    tables = (torch.from_numpy(rng.normal(size=(T, V + 1, V)).astype(np.float32)),
              torch.zeros((T, V + 1, V)))
    for factors, table in zip(((1,), LISTS), tables):
        def model(last, step, carry):
            return table[step][last.clamp(0, V)], carry  # noqa: B023

        want = tc.beam_search(model, B, M, subset=subset, subset_index=index)
        with paths(factors) as ways:
            _same(tc.beam_search(model, B, M, subset=ranked, subset_index=index), want,
                  ("eager", factors))
        assert ("fallback" if factors == (1,) else "listed") in ways
        with mock.patch.object(selection, "LIST_FACTORS", factors):  # (no spies in a cond)
            beam._COMPILED_STEPS[tc] = beam.CompiledSteps(tc.plan, tc._tables, backend="eager")
            _same(tc.beam_search(model, B, M, subset=ranked, subset_index=index, compile=True),
                  want, ("compiled", factors))
