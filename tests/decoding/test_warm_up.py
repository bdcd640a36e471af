"""`decoding.warm_up`, the one warm-up planner of every front door: over a
recording door (numpy verbs that log their calls, the set view of a small
compiled set), it walks every request path through the public verbs (the
processor verbs at every step, `allowed` at every prefix length, the beam
verbs at every step of each beam size and schedule, `beam_search`), over
one subset where the door has removals or max_subsets > 0 and over the
padded stack for max_subsets > 1; checks everything before any call;
reports the same `WarmReport` (a Future of one in the background); keeps
the padding bound only when the whole warm-up ran."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import static_compiler as sc
from static_compiler.decoding import warm_up
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.warmth import Warmth
from static_compiler.support import arguments
from static_compiler.support.decode_types import BeamState, DecodeResult, ProcessorState, WarmReport

ROWS = [[1, 2, 3], [1, 4, 5], [2, 2, 2], [3, 1, 6]]
V, T = 8, 3


class RecordingDoor:
    """A door of numpy verbs that record (verb, step, rows, subset rows)."""

    def __init__(self, set_view):
        self._set_view, self.vocab_size, self.max_length = set_view, V, T
        self.log: list = []

    def _note(self, verb, step, rows, subset=None, subset_index=None):
        self.log.append((verb, step, rows, None if subset is None else subset.num_subsets,
                         subset_index is not None))

    def subset(self, selection=None):
        return self._set_view.subset(selection, "subset")

    def init_processor(self, batch_size):
        self._note("init_processor", None, batch_size)
        return ProcessorState(*(np.zeros(batch_size, np.int32),) * 3)

    def mask(self, logits, state, step, **kw):
        self._note("mask", step, len(logits), **kw)
        return logits

    def allowed_tokens(self, state, step, **kw):
        self._note("allowed_tokens", step, len(state.node), **kw)
        return np.ones((len(state.node), V), bool)

    def allowed(self, prefixes, **kw):
        self._note("allowed", prefixes.shape[1], len(prefixes), **kw)
        return np.ones((len(prefixes), V), bool)

    def advance(self, state, tokens, step, **kw):
        self._note("advance", step, len(tokens), **kw)
        return state

    def init_beams(self, batch_size, beam_size):
        self._note("init_beams", beam_size, batch_size)
        return BeamState(*(np.zeros((batch_size, beam_size)),) * 8)

    def beam_step(self, state, logits, step, *, beam_size=None, **kw):
        self._note("beam_step", (step, logits.shape[1], beam_size), len(logits), **kw)
        return state

    def finalize(self, state):
        self._note("finalize", None, len(state.tokens))
        return DecodeResult(*state[:4])

    def beam_search(self, logits_fn, batch_size, beam_size, **kw):
        self._note("beam_search", beam_size, batch_size, **kw)


class Paths(warm_up.WarmPaths):
    search_model = staticmethod(lambda last, step, carry: (None, carry))

    def __init__(self, removals=False, warmth=None, fail=False):
        self.removals, self.warmth, self.fail = removals, warmth, fail

    def beam_widths(self, beam_size, batch_size):
        return arguments.check_beam_schedule(beam_size, T, batch_size)

    def ready(self, value):
        if self.fail:  # (the first result the walk waits on)
            raise MemoryError("dummy inputs")
        return value


@pytest.fixture(scope="module")
def set_view():
    return sc.compile_constraints(ROWS, V, export_subsets=True)._set_view


def _door(set_view):
    return RecordingDoor(set_view)


def test_every_path_is_walked_through_the_public_verbs(set_view):
    door = _door(set_view)
    report = warm_up.warm(door, Paths(), [2, 1, 2], [(1, 2, 2), 2], 0, False)
    assert report == WarmReport(0, report.calls, report.seconds, (1, 2), (2, (1, 2, 2)), None)
    assert report.calls == len(door.log)
    for B in (1, 2):
        mine = [entry for entry in door.log if entry[2] == B]
        for verb in ("mask", "allowed_tokens", "advance", "allowed"):
            assert sorted(e[1] for e in mine if e[0] == verb) == list(range(T)), (B, verb)
        steps = [e[1] for e in mine if e[0] == "beam_step"]
        assert steps == [(t, 2, None) for t in range(T)] + [(0, 1, 1), (1, 1, 2), (2, 2, 2)]
        assert [e[1] for e in mine if e[0] == "init_beams"] == [2, 1]
        assert [e[1] for e in mine if e[0] == "beam_search"] == [2, (1, 2, 2)]
        assert all(e[3] is None for e in mine)  # no subset: no removals, max_subsets=0


def test_removals_and_max_subsets_walk_one_subset_and_the_padded_stack(set_view):
    door = _door(set_view)
    report = warm_up.warm(door, Paths(removals=True), 2, None, 0, False)
    assert report.subset_rows == 1 and report.beam_sizes == ()
    assert {e[3] for e in door.log if e[0] == "mask"} == {None, 1}
    door = _door(set_view)
    report = warm_up.warm(door, Paths(), 2, [2], 3, False)
    assert report.subset_rows == 3
    walked = {(e[3], e[4]) for e in door.log if e[0] in ("mask", "beam_step", "beam_search")}
    assert walked == {(None, False), (1, False), (3, True)}  # the stack picks by subset_index


@pytest.mark.parametrize("args, words", [
    (([], None, 0), "empty"), ((0, None, 0), "batch_size"), (("2", None, 0), "batch_sizes"),
    (([2, True], None, 0), "batch_size"), ((2, [0], 0), "beam_size"),
    ((2, [(1, 2)], 0), "entry"), ((2, None, -1), "max_subsets"),
    ((2, None, 1.5), "max_subsets"), ((2 ** 20, [2 ** 12], 0), "2\\*\\*31"),
])
def test_bad_arguments_are_typed_and_nothing_runs(set_view, args, words):
    door = _door(set_view)
    for background in (False, True):
        with pytest.raises(DecodeInputError, match=words):
            warm_up.warm(door, Paths(), *args, background)
    with pytest.raises(DecodeInputError, match="background"):
        warm_up.warm(door, Paths(), 2, None, 0, "yes")
    assert door.log == []


def test_max_subsets_needs_item_subsets(set_view):
    bare = sc.compile_constraints([(0, 1), (1, 1)], 3,  # (items share states)
                                  pipeline="verify,minimize,choose-layout,pack-dtypes")
    door = RecordingDoor(bare._set_view)
    with pytest.raises(DecodeInputError, match="no item subsets"):
        warm_up.warm(door, Paths(), 2, None, 1, False)
    assert door.log == []


def test_background_gives_a_future_of_the_report(set_view):
    door = _door(set_view)
    future = warm_up.warm(door, Paths(), 2, [2], 0, True)
    assert isinstance(future, concurrent.futures.Future)
    report = future.result(timeout=30)
    assert isinstance(report, WarmReport) and report.calls == len(door.log) > 0


def test_the_padding_is_kept_only_when_the_whole_warm_up_ran(set_view):
    warmth = Warmth()
    warm_up.warm(_door(set_view), Paths(warmth=warmth), 2, None, 2, False)
    assert warmth.pad_to == 2
    for background in (False, True):
        with pytest.raises(MemoryError):
            run = warm_up.warm(_door(set_view), Paths(warmth=warmth, fail=True), 2, [2], 3,
                               background)
            run.result(timeout=30)  # (the background's error; in the foreground: raised above)
        assert warmth.pad_to == 2
    assert warm_up.warm(_door(set_view), Paths(warmth=warmth), 2, None, 3, False).subset_rows == 3
    assert warmth.pad_to == 3
    # a smaller bound later keeps the larger one (its programs are compiled)
    assert warm_up.warm(_door(set_view), Paths(warmth=warmth), 2, None, 1, False).subset_rows == 3
