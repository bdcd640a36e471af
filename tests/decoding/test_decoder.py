"""The verb family written once (`decoding.decoder.Decoder`) over an engine:
every door's verbs and item rules are the decoder's (no door keeps a copy),
every door's engine has every hook of the `Engine` protocol, and the glue
the decoder owns resolves a call's subset as every door did: the version's
base subset when none is given, a `subset_index` without a subset refused,
and after `warm(max_subsets=K)` a stack of pad_from <= R < K subsets
(the base subset too) padded to K once, its index checked against R first.
A recording engine (no device work) shows what the decoder hands an engine.
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import pytest

import static_compiler as sc
from static_compiler.decoding.decoder import Decoder, Engine
from static_compiler.errors import DecodeInputError

torch = pytest.importorskip("torch")
from static_compiler import serving  # noqa: E402
from static_compiler.torch_backend import TorchConstraints  # noqa: E402

ONCE = ("init_processor", "allowed_tokens", "advance", "init_beams", "finalize", "texts",
        "subset", "prior", "fingerprint", "attributes")
"""What no door overrides. (A door may add options of its own to a verb by
a one-line override that calls the decoder's: mask, allowed, beam_step,
beam_search.)"""


class Recorder:
    """An engine that runs nothing: it records the subset the decoder
    resolved for each call."""

    max_length, vocab_size, end_token = 3, 10, None

    def __init__(self, pad_from, pad_to):
        self.pad_from, self._pad_to, self.placed = pad_from, pad_to, []

    def pad_to(self):
        return self._pad_to

    def counting(self):
        return contextlib.nullcontext()

    def place_subset(self, subset, subset_index, batch_size, where, fingerprint):
        self.placed.append((subset, None if subset_index is None else list(subset_index)))
        return "live"

    def processor_state(self, state, where):
        return state, len(state)

    def mask(self, logits, state, step, live):
        return live


class Door(Decoder):
    def __init__(self, view, engine):
        self._set_view, self.names, self._recorder = view, None, engine

    @property
    def _engine(self):
        return self._recorder


@pytest.fixture(scope="module")
def compiled():
    rows = np.random.default_rng(5).integers(0, 10, (40, 3))
    return sc.compile_constraints(rows, 10)


def _stack(compiled, count):
    return sc.stack_subsets([compiled.subset(np.arange(40) % (r + 2) == 0) for r in range(count)])


@pytest.mark.parametrize("door", [sc.CompiledConstraints, serving.Artifact, TorchConstraints])
def test_every_door_speaks_the_decoders_verbs_and_rules(door):
    assert issubclass(door, Decoder)
    for name in ONCE:
        assert inspect.getattr_static(door, name) is inspect.getattr_static(Decoder, name), name


def test_every_doors_engine_has_every_hook(compiled, tmp_path):
    compiled.save(tmp_path / "set.static")
    hooks = {name for name in dir(Engine) if not name.startswith("_")}
    for door in (compiled, serving.load(tmp_path / "set.static"),
                 TorchConstraints.from_compiled(compiled)):
        assert hooks <= set(dir(door._engine)), type(door).__name__


def test_no_subset_is_the_base_subset_and_an_index_alone_is_refused(compiled):
    engine = Recorder(None, None)
    assert Door(compiled._set_view, engine).mask(None, [0, 0], 0) is None  # nothing removed
    assert engine.placed == []
    version = compiled.update(remove=np.arange(40) < 5)
    assert Door(version._set_view, engine).mask(None, [0, 0], 0) == "live"
    assert engine.placed == [(version._set_view.base_subset(), None)]
    with pytest.raises(DecodeInputError, match=r"^mask: subset_index without a subset"):
        Door(version._set_view, engine).mask(None, [0, 0], 0, subset_index=[0, 0])


@pytest.mark.parametrize("pad_from", [1, 2])
def test_after_warm_stacks_are_padded_once_from_pad_from(compiled, pad_from):
    engine = Recorder(pad_from, 4)
    door = Door(compiled._set_view, engine)
    for count in (1, 2, 3, 4, 5):
        stack = _stack(compiled, count)
        index = np.arange(2) % count
        door.mask(None, [0, 0], 0, subset=stack, subset_index=index)
        placed, rows = engine.placed[-1]
        padded = pad_from <= count < 4
        assert placed.num_subsets == (4 if padded else count), count
        assert (placed is not stack) == padded and rows == index.tolist()
        if padded:  # the same padded stack for every call with this subset
            door.mask(None, [0, 0], 0, subset=stack, subset_index=index)
            assert engine.placed[-1][0] is placed
            for words, padded_words in zip(stack.live, placed.live):
                np.testing.assert_array_equal(padded_words[:count], words)
                assert not padded_words[count:].any()


def test_a_base_subset_pads_where_single_subsets_do(compiled):
    version = compiled.update(remove=np.arange(40) < 5)
    for pad_from, padded in ((1, True), (2, False)):
        engine = Recorder(pad_from, 3)
        Door(version._set_view, engine).mask(None, [0, 0], 0)
        assert (engine.placed[-1][0].num_subsets == 3) == padded


def test_an_index_past_the_stack_is_refused_before_padding(compiled):
    door = Door(compiled._set_view, Recorder(2, 4))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 2: expected a subset in "
                                               r"\[0, 2\)"):
        door.mask(None, [0, 0], 0, subset=_stack(compiled, 2), subset_index=np.array([0, 2]))


def test_a_prior_or_texts_the_door_cannot_take_is_typed(compiled):
    other = sc.compile_constraints(np.arange(12).reshape(4, 3), 12)
    door = Door(compiled._set_view, Recorder(None, None))
    with pytest.raises(DecodeInputError, match=r"^beam_step: prior=.* is a str, expected a Prior "
                                               r"\(made by Door.prior"):
        door._ranking("prior", "beam_step")
    with pytest.raises(DecodeInputError, match=r"texts: this set has no names"):
        door.texts(None)
    with pytest.raises(DecodeInputError, match="subset was made from another compiled set"):
        compiled.mask(np.zeros((2, 10), np.float32), compiled.init_processor(2), 0,
                      subset=other.subset(np.ones(4, bool)))
