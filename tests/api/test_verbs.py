"""The verb table: the three front doors, the compiled set
(`CompiledConstraints`), the served artifact (`serving.Artifact`) and the
torch backend (`TorchConstraints`), speak one verb family, declared in
`static_compiler/contract.py` (docs/README.md's table).

* every door is a `contract.FrontDoor`: every verb of the contract (`warm`
  and `prior` included) with its parameters (names, order, kinds,
  defaults; a door may add keyword-only options of its own, with
  defaults), and returns the same kind of value; mypy checks the same
  statically (tests/api/doors_conform.py);
* a door's public names (of its class and of a built instance) are the
  contract's and its own (`OWN`, each with its reason), nothing else: door
  internals are private;
* on small sets of several shapes (fixed length, ragged with an end token,
  forced layouts, an update's removals, per-row subsets) the doors give
  the same masks, allowed tokens, advances and beams: bit for bit, except
  torch's beam scores (torch's log_softmax is not XLA's in the last bit;
  tests/torch_backend/test_torch_beam.py) and the compiled search's (one fused program
  rather than a step at a time), compared to float32 rounding;
* the compiled set's own names are few: its records (`lowered`, `build`,
  `export_options`) hold the rest, their names pinned (`RECORDS`);
* the deprecated forms left (torch's ``mask(state, step)``, the compiled
  set's names moved into its records: `compiled.MOVED`) warn with a
  DeprecationWarning naming what to use and the release and date it goes,
  and still return what that gives; the old names that were only
  spellings of a verb are gone;
* bad input to a new verb is one of the library's typed errors.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import tomllib
import types
import warnings

import jax.numpy as jnp
import numpy as np
import oracle
import pytest
import torch
from doors_conform import front_doors
from helpers import REPO

import static_compiler as sc
from static_compiler import contract, serving
from static_compiler.compiled import MOVED
from static_compiler.errors import ArtifactFormatError, DecodeInputError, StaticCompilerError
from static_compiler.support.deprecation import REMOVED_IN
from static_compiler.torch_backend import TorchConstraints

BEAMS = 4
K = inspect.Parameter.KEYWORD_ONLY
NONE = inspect.Parameter.empty

# The contract (static_compiler/contract.py): verb -> its parameters on every door
# (after self); a door may add keyword-only parameters with defaults after these.
CONTRACT = contract.members(contract.FrontDoor)
VERBS = {name: sig for name, sig in CONTRACT.items() if sig is not None}
ATTRIBUTES = sorted(name for name, sig in CONTRACT.items() if sig is None)
# The one door parameter allowed a default the contract does not give: torch's
# deprecated mask(state, step), still told apart (until REMOVED_IN).
OLD_FORMS = {("TorchConstraints", "mask", "state"), ("TorchConstraints", "mask", "step")}
LOADERS = {"CompiledConstraints": sc.load, "Artifact": serving.load,
           "TorchConstraints": TorchConstraints.load}


# --------------------------------------------------------------------------
# Sets and their three doors


def _sets():
    rng = np.random.default_rng(41)
    return {
        "fixed": dict(rows=oracle.random_set(rng, 18, 3, 10), vocab=10, end=None,
                      layout="default", remove=3),
        "ragged": dict(rows=oracle.random_ragged_set(rng, 14, 4, 9, end_token=0), vocab=9,
                       end=0, layout="csr", remove=0),
        "dense": dict(rows=oracle.random_set(rng, 30, 2, 6), vocab=6, end=None,
                      layout="dense_rows", remove=5),
    }


SETS = _sets()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """set name -> its doors (`_build`), built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _build(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


@pytest.fixture(scope="module", params=sorted(SETS))
def doors(request, built):
    return built(request.param)


def _build(name: str, folder):
    """The three doors of one set (after an update that removed some rows),
    the set's rows and three subsets of them."""
    spec = SETS[name]
    compiled = sc.compile_constraints(spec["rows"], spec["vocab"], end_token=spec["end"],
                                      pipeline=oracle.pipeline_for(spec["layout"]),
                                      export_subsets=True, export_beam_sizes=(BEAMS,))
    n = len(spec["rows"])
    if spec["remove"]:
        compiled = compiled.update(remove=np.arange(n) % spec["remove"] == 1)
    path = folder / "set.sc"
    compiled.save(path)
    rng = np.random.default_rng(7)
    picks = [rng.random(n) < 0.5 for _ in range(3)]
    return types.SimpleNamespace(
        name=name, compiled=compiled, artifact=serving.load(path),
        torch=TorchConstraints.load(path), path=path, picks=picks, T=compiled.max_length,
        V=spec["vocab"], rows=spec["rows"])


def _all(d):
    return (("compiled", d.compiled), ("artifact", d.artifact), ("torch", d.torch))


def _in(door, array):
    """`array` as the door takes it: numpy for the JAX doors, a tensor for torch."""
    return torch.from_numpy(np.asarray(array)) if isinstance(door, TorchConstraints) else array


def _np(value) -> np.ndarray:
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _subsets(d, door):
    stacked = sc.stack_subsets([door.subset(p) for p in d.picks])
    return [{}, dict(subset=door.subset(d.picks[0])),
            dict(subset=stacked, subset_index=np.array([2, 0, 1, 2], np.int32))]


def _same(results: dict, where, exact: bool = True):
    (first, want), *rest = results.items()
    for name, got in rest:
        for field in range(len(want)) if isinstance(want, tuple) else [None]:
            a = _np(want if field is None else want[field])
            b = _np(got if field is None else got[field])
            assert a.shape == b.shape, (where, first, name, field)
            if exact:
                assert np.array_equal(a, b), (where, first, name, field)
            else:
                assert np.allclose(a, b, rtol=1e-5, atol=1e-5), (where, first, name, field)


# --------------------------------------------------------------------------
# The table


@pytest.fixture(scope="module")
def fixed(built):
    """Type name -> door, of the fixed-length set."""
    d = built("fixed")
    return {"CompiledConstraints": d.compiled, "Artifact": d.artifact,
            "TorchConstraints": d.torch}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_has_the_contracts_signature_on_every_door(fixed, verb):
    """Positional parameters in the contract's order; keyword-only ones (any
    order) with the contract's defaults; a door's own options keyword-only,
    with defaults."""
    want = VERBS[verb].parameters
    for door_name, door in fixed.items():
        params = inspect.signature(getattr(door, verb)).parameters
        positional = [p for p in params.values() if p.kind != K and p.kind != p.VAR_KEYWORD]
        assert [(p.name, p.kind) for p in positional] == \
            [(p.name, p.kind) for p in want.values() if p.kind != K], (door_name, verb, params)
        for name, p in want.items():
            assert name in params and params[name].kind == p.kind, (door_name, verb, name)
            if (door_name, verb, name) not in OLD_FORMS:
                assert params[name].default == p.default, (door_name, verb, name)
        extra = [p for p in params.values() if p.name not in want]
        assert all(p.kind == p.VAR_KEYWORD or (p.kind == K and p.default is not NONE)
                   for p in extra), (door_name, verb, [p.name for p in extra])


def test_the_contract_is_the_documented_family():
    """The contract holds the docs table's verbs, `warm` and `prior`
    included, and the attributes every door has."""
    assert {"init_processor", "mask", "allowed_tokens", "advance", "allowed", "init_beams",
            "beam_step", "finalize", "beam_search", "texts", "warm", "compilations", "subset",
            "ranked_subset", "prior"} == set(VERBS)
    assert ATTRIBUTES == ["attributes", "end_token", "fingerprint", "max_length", "names",
                          "vocab_size"]
    assert str(VERBS["warm"]) == ("(batch_sizes: 'Any', *, beam_sizes: 'Any' = None, "
                                  "max_subsets: 'int' = 0, background: 'bool' = False) -> "
                                  "'Union[WarmReport, Future[WarmReport]]'")


def test_every_door_is_a_front_door_and_has_one_loader(fixed):
    for door_name, door in fixed.items():
        assert isinstance(door, contract.FrontDoor), door_name
        for name in ATTRIBUTES:
            assert not callable(getattr(door, name)), (door_name, name)
        assert isinstance(door.fingerprint, str) and door.fingerprint
        assert isinstance(door.vocab_size, int) and isinstance(door.max_length, int)
        assert door.compilations() >= 0
        loader = LOADERS[door_name]
        assert loader.__name__ == "load"
        assert list(inspect.signature(loader).parameters)[0] == "path"
    assert front_doors(fixed["CompiledConstraints"], fixed["Artifact"],
                       fixed["TorchConstraints"]) == list(fixed.values())


def test_a_door_missing_a_verb_is_not_a_front_door(fixed):
    """The run-time check can fail: a door without `warm` is refused."""
    class NoWarm:
        def __getattr__(self, name):
            if name == "warm":
                raise AttributeError(name)
            return getattr(fixed["Artifact"], name)

    assert isinstance(fixed["Artifact"], contract.FrontDoor)
    assert not isinstance(NoWarm(), contract.FrontDoor)


def test_the_type_checker_checks_the_doors_against_the_contract():
    """mypy (scripts/lint.sh) runs over the contract and tests/api/doors_conform.py."""
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"static_compiler/contract.py", "tests/api/doors_conform.py"} <= set(files)
    assert "mypy" in (REPO / "scripts" / "lint.sh").read_text()


# Each door's public names: the contract's and the door's own (each with why it is
# the door's), nothing else; door internals are private. A new public name must
# be added here, with its reason, or made private.
OWN = {
    "CompiledConstraints": {
        "accept_drafts": "speculative decoding over the set (docs/decoding.md)",
        "processor": "the step programs of one batch size (docs/decoding.md)",
        "save": "writes the artifact", "update": "a new version: removals, additions",
        "shard": "tables split across a mesh", "item_index": "the items of sequences",
        "items": "its item index", "plan": "the plan the decoders read (docs/integrations.md)",
        "ir": "the set's IR", "ir_text": "the IR printed",
        "outline": "the IR without its arrays (docs/billion-scale.md)",
        "layer_stats": "states, edges and bytes per layer (docs/compiling.md)",
        "lowered": "one record: plan, host and device tables, placement, their bytes",
        "build": "one record: pipeline, timings, frontend_stats, last_update",
        "export_options": "one record: what save exports (compile_constraints' export_...)",
    },
    "Artifact": {
        "reload": "the version now on disk", "path": "where it was loaded from",
        "manifest": "the artifact's manifest", "beam_sizes": "the exported beam sizes",
        "beam_schedules": "the exported beam schedules", "num_sequences": "the set's size",
        "items": "its item index", "placement": "the mesh it was loaded on",
    },
    "TorchConstraints": {
        "load": "the loader", "from_compiled": "from an in-memory compiled set",
        "reload": "the version now on disk", "path": "where it was loaded from",
        "device": "the torch device of its tables", "plan": "the plan its ops read",
        "processor_step": "advance and allowed_tokens fused: an engine's step (vLLM)",
    },
}


def _public(names) -> set:
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("door_name", sorted(OWN))
def test_every_public_name_of_a_door_is_the_contracts_or_its_own(fixed, door_name):
    door, own = fixed[door_name], set(OWN[door_name])
    public = _public(dir(door))
    assert not own & set(CONTRACT), door_name
    assert public - set(CONTRACT) - own == set(), \
        f"{door_name}: a new public name: add it to OWN with its reason, or make it private"
    assert own - public == set(), f"{door_name}: gone (made private?): remove it from OWN"
    assert set(CONTRACT) <= public
    assert len(public) == len(CONTRACT) + len(own)


@pytest.mark.parametrize("door_name", sorted(OWN))
def test_a_built_doors_instance_attributes_are_the_contracts_or_its_own(fixed, door_name):
    """What an instance holds (`vars`) adds no public name: its public
    attributes are the contract's or its own, the rest private."""
    door, own = fixed[door_name], set(OWN[door_name])
    held = _public(vars(door))
    assert held and held <= set(CONTRACT) | own, (door_name, held - set(CONTRACT) - own)


# The compiled set's records: their public names, pinned as the doors' are.
RECORDS = {
    "lowered": {"plan", "tables", "placement", "device_tables", "nbytes", "bytes_per_device"},
    "build": {"pipeline", "timings", "frontend_stats", "last_update"},
    "export_options": {"beam_sizes", "tokens_per_beam", "subsets", "priors"},
}


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_every_public_name_of_a_compiled_sets_record_is_listed(fixed, record):
    """The records that keep the compiled set's own names few are frozen
    and grow only by a reviewed diff here."""
    value = getattr(fixed["CompiledConstraints"], record)
    assert _public(dir(value)) == RECORDS[record], record
    field = next(iter(RECORDS[record] & {f.name for f in dataclasses.fields(value)}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, None)


def test_a_new_public_attribute_on_an_instance_is_caught(fixed):
    """The instance check can fail: an attribute set on a door after it was
    built is a public name that is neither the contract's nor the door's."""
    door = TorchConstraints.load(fixed["Artifact"].path)
    door.internal_table = ()
    held = _public(vars(door))
    assert "internal_table" in held and not held <= set(CONTRACT) | set(OWN["TorchConstraints"])


def test_every_door_returns_the_same_kinds(fixed):
    V, T = fixed["Artifact"].vocab_size, fixed["Artifact"].max_length
    B = 4  # (the shapes the other tests run: few new programs)
    for door_name, door in fixed.items():
        state = door.init_processor(B)
        assert type(state).__name__ == "ProcessorState", door_name
        logits = _in(door, np.zeros((B, V), np.float32))
        masked = _np(door.mask(logits, state, 0))
        assert masked.shape == (B, V) and masked.dtype == np.float32, door_name
        allowed = _np(door.allowed_tokens(state, 0))
        assert allowed.shape == (B, V) and allowed.dtype == bool, door_name
        assert type(door.advance(state, _in(door, np.ones(B, np.int32)), 0)) is type(state)
        assert _np(door.allowed(_in(door, np.zeros((B, 0), np.int32)))).dtype == bool
        beams = door.init_beams(1, BEAMS)
        assert type(beams).__name__ == "BeamState", door_name
        beams = door.beam_step(beams, _in(door, np.zeros((1, BEAMS, V), np.float32)), 0)
        assert type(beams).__name__ == "BeamState", door_name
        assert type(door.finalize(beams)).__name__ == "DecodeResult", door_name
        assert _np(door.finalize(beams).tokens).shape == (1, BEAMS, T), door_name
        # (beam_search's result: test_beams_agree_step_by_step_and_searched)


# --------------------------------------------------------------------------
# The doors agree


def test_masks_advances_and_allowed_agree(doors):
    d = doors
    rng = np.random.default_rng(3)
    B = 4
    subsets = {name: _subsets(d, door) for name, door in _all(d)}
    for case in range(3):
        states = {name: door.init_processor(B) for name, door in _all(d)}
        for t in range(d.T):
            logits = rng.standard_normal((B, d.V)).astype(np.float32)
            logits[rng.random((B, d.V)) < 0.1] = np.nan
            allowed = {name: door.allowed_tokens(states[name], t, **subsets[name][case])
                       for name, door in _all(d)}
            _same(allowed, (d.name, "allowed_tokens", case, t))
            masked = {name: door.mask(_in(door, logits), states[name], t,
                                      **subsets[name][case]) for name, door in _all(d)}
            _same(masked, (d.name, "mask", case, t))
            # each row takes its best allowed token (or an arbitrary one when none is)
            tokens = np.argmax(np.where(np.isnan(logits), -np.inf, _np(masked["compiled"])), 1)
            states = {name: door.advance(states[name], _in(door, tokens.astype(np.int32)), t,
                                         **subsets[name][case]) for name, door in _all(d)}
            _same(states, (d.name, "advance", case, t))
    for t in range(d.T):
        # B rows (the processor's shapes: no new program): item prefixes and an unknown one
        known = sorted({tuple(r[:t]) for r in d.rows if len(r) >= t})
        listed = [known[i % len(known)] for i in range(B - 1)] + [(d.V - 1,) * t]
        prefixes = np.array(listed, np.int32).reshape(B, t)
        got = {name: door.allowed(_in(door, prefixes)) for name, door in _all(d)}
        _same(got, (d.name, "allowed", t))


class TableModel:
    """Logits read from one float32 table (T, V, V) by step and last token,
    as each door's model takes them."""

    def __init__(self, T: int, V: int, seed: int):
        self.table = np.random.default_rng(seed).standard_normal((T, V, V)).astype(np.float32)
        self.V = V

    def jax_traced(self, last, step, carry):
        return jnp.asarray(self.table)[step, last % self.V], carry

    def numpy(self, last, step, carry):
        return self.table[step][np.asarray(last) % self.V], carry

    def torch(self, last, step, carry):
        return torch.from_numpy(self.table[step])[last % self.V], carry

    def for_door(self, name: str, stepwise: bool):
        if name == "torch":
            return self.torch
        return self.jax_traced if name == "compiled" and not stepwise else self.numpy


def test_beams_agree_step_by_step_and_searched(doors):
    d = doors
    model = TableModel(d.T, d.V, seed=len(d.rows))
    subsets = {name: _subsets(d, door) for name, door in _all(d)}
    for case in range(3):
        B = 4 if case == 2 else 1
        stepped, searched = {}, {}
        for name, door in _all(d):
            kw = subsets[name][case]
            state = door.init_beams(B, BEAMS, start_token=1)
            fn = model.for_door(name, stepwise=True)
            for t in range(d.T):
                state = door.beam_step(state, fn(state.last_tokens, t, None)[0], t, **kw)
            stepped[name] = door.finalize(state, length_penalty=0.6)
            searched[name] = door.beam_search(model.for_door(name, stepwise=False), B, BEAMS,
                                              start_token=1, length_penalty=0.6, **kw)
            assert type(searched[name]).__name__ == "DecodeResult", name
        where = (d.name, case)
        jax_doors = {k: stepped[k] for k in ("compiled", "artifact")}
        _same(jax_doors, where + ("stepped",))  # one program per step on both: bit for bit
        for results in (stepped, searched):
            _same({k: (r.tokens, r.valid, r.lengths) for k, r in results.items()}, where)
            _same({k: r.scores for k, r in results.items()}, where, exact=False)
        _same({"stepped": stepped["artifact"], "searched": searched["artifact"]}, where)
        _same({"stepped": stepped["torch"], "searched": searched["torch"]}, where)


def test_carries_follow_their_beams_through_every_search(fixed):
    """A model whose logits hash the beam's history (its carry): each door
    reorders the carry by parent (the compiled set by its carry axes, the
    others by `reorder`)."""
    art = fixed["Artifact"]
    T, V = art.max_length, art.vocab_size
    table = np.random.default_rng(5).standard_normal((T, V, V)).astype(np.float32)
    h0 = np.zeros((1, BEAMS), np.int32)

    def jax_fn(last, step, h):
        return jnp.asarray(table)[step, (h + last) % V], (h * 7 + last) % 1009

    def np_fn(last, step, h):
        last = np.asarray(last)
        return table[step][(h + last) % V], (h * 7 + last) % 1009

    def torch_fn(last, step, h):
        return torch.from_numpy(table[step])[(h + last) % V], (h * 7 + last) % 1009

    got = {
        "compiled": fixed["CompiledConstraints"].beam_search(
            jax_fn, 1, BEAMS, carry=h0, carry_axes=sc.BeamAxis(0, split=True),
            return_carry=True),
        "artifact": art.beam_search(np_fn, 1, BEAMS, carry=h0, return_carry=True,
                                    reorder=lambda h, p: np.take_along_axis(h, np.asarray(p), 1)),
        "torch": fixed["TorchConstraints"].beam_search(
            torch_fn, 1, BEAMS, carry=torch.zeros(1, BEAMS, dtype=torch.int64),
            reorder=lambda h, p: h.gather(1, p), return_carry=True),
    }
    _same({k: (r.tokens, r.valid, r.lengths) for k, (r, _) in got.items()}, "carry")
    _same({k: c for k, (_, c) in got.items()}, "final carry")


def test_finalize_before_the_last_step_gives_no_prefix_as_a_sequence(fixed):
    V = fixed["Artifact"].vocab_size
    for name, door in fixed.items():
        state = door.init_beams(1, BEAMS)
        state = door.beam_step(state, _in(door, np.zeros((1, BEAMS, V), np.float32)), 0)
        result = door.finalize(state)
        assert not _np(result.valid).any(), name
        assert (_np(result.scores) == sc.SENTINEL_SCORE).all(), name


def test_texts_on_every_door(tmp_path):
    names = ["ab", "b", "ba", "cab"]
    letters = lambda name: [ord(c) - ord("a") + 1 for c in name]
    compiled = sc.compile_constraints(names, 4, tokenizer=letters, end_token=0,
                                      export_beam_sizes=(BEAMS + 1,))
    compiled.save(tmp_path / "n.sc")
    texts = []
    for door in (compiled, serving.load(tmp_path / "n.sc"),
                 TorchConstraints.load(tmp_path / "n.sc")):
        fn = lambda last, step, carry: (_in(door, np.zeros((1, BEAMS + 1, 4), np.float32)),
                                        carry)
        texts.append(door.texts(door.beam_search(fn, 1, BEAMS + 1)))
    assert texts[0] == texts[1] == texts[2]
    assert sorted(texts[0][0][:4]) == sorted(names) and texts[0][0][4] is None


# --------------------------------------------------------------------------
# Deprecated forms and removed names


def test_torch_mask_of_state_and_step_warns_with_its_release_and_returns_allowed_tokens(fixed):
    tc = fixed["TorchConstraints"]
    state = tc.init_processor(3)
    assert re.fullmatch(r"\d+\.\d+\.\d+ \(\d{4}-\d{2}-\d{2}\)", REMOVED_IN), REMOVED_IN
    for call in (lambda: tc.mask(state, 1), lambda: tc.mask(state, step=1)):
        with pytest.warns(DeprecationWarning, match=re.escape(
                f"TorchConstraints.mask(state, step) is deprecated and will be removed in "
                f"{REMOVED_IN}: use TorchConstraints.allowed_tokens(state, step)")):
            old = call()
        assert old.dtype == torch.bool
        _same({"old": old, "new": tc.allowed_tokens(state, 1)}, "torch.mask(state, step)")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_compiled_sets_name_moved_into_a_record_warns_and_reads_the_records(fixed, old):
    """Each name `compiled.MOVED` lists still reads until REMOVED_IN: a
    DeprecationWarning naming the record's name and the release and date it
    goes (pointing at the caller's line), then the record's value."""
    compiled = fixed["CompiledConstraints"]
    record, new = MOVED[old]
    call = "()" if callable(getattr(getattr(compiled, record), new)) else ""
    with pytest.warns(DeprecationWarning, match=re.escape(
            f"CompiledConstraints.{old}{call} is deprecated and will be removed in {REMOVED_IN}: "
            f"use CompiledConstraints.{record}.{new}{call}")) as caught:
        got = getattr(compiled, old)
    assert len(caught) == 1 and caught[0].filename == __file__
    want = getattr(getattr(compiled, record), new)
    if call:
        assert got() == want()
    else:
        assert got is want or got == want
    assert old not in dir(compiled) and not hasattr(type(compiled), old)


def test_a_name_neither_public_nor_moved_is_an_attribute_error_without_a_warning(fixed):
    compiled = fixed["CompiledConstraints"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(AttributeError, match="'CompiledConstraints' object has no attribute "
                                                 "'export_beams'"):
            compiled.export_beams  # noqa: B018
        assert not hasattr(compiled, "_tables")


def test_the_moved_names_read_the_same_on_a_new_version(fixed):
    """A version `update` or `shard` made reads the old names from its own
    records: its last update, its placement (none here) and tables."""
    compiled = fixed["CompiledConstraints"]
    version = compiled.update(remove=np.arange(len(SETS["fixed"]["rows"])) == 0)
    with pytest.warns(DeprecationWarning, match="use CompiledConstraints.build.last_update"):
        assert version.last_update == version.build.last_update == \
            {"removed": 1, "already_removed": 0, "absent": 0}
    assert version.lowered is compiled.lowered  # (removal: the same tables, on the device once)
    with pytest.warns(DeprecationWarning, match="use CompiledConstraints.lowered.placement"):
        assert version.placement is None


REMOVED = {  # old spellings removed before the first release (CHANGELOG.md, 0.1.0)
    "CompiledConstraints": ("init_state",), "Artifact": ("init_state", "init_processor_state"),
    "TorchConstraints": ("init_state", "from_artifact"),
}


def test_old_spellings_of_a_verb_are_gone(fixed):
    for name, door in fixed.items():
        for old in REMOVED[name]:
            assert not hasattr(door, old) and not hasattr(type(door), old), (name, old)
    assert not hasattr(sc, "load_compiled") and "load_compiled" not in dir(sc)


# --------------------------------------------------------------------------
# Bad input


BAD = {
    "init_processor(0)": lambda door, T, V: door.init_processor(0),
    "allowed_tokens(step=T)": lambda door, T, V: door.allowed_tokens(door.init_processor(2), T),
    "allowed_tokens(state=None)": lambda door, T, V: door.allowed_tokens(None, 0),
    "mask(logits of V - 1)": lambda door, T, V: door.mask(  # (V + 1: a padded vocabulary)
        _in(door, np.zeros((2, V - 1), np.float32)), door.init_processor(2), 0),
    "mask(step=-1)": lambda door, T, V: door.mask(
        _in(door, np.zeros((2, V), np.float32)), door.init_processor(2), -1),
    "allowed(prefixes of T)": lambda door, T, V: door.allowed(_in(door, np.zeros((1, T), int))),
    "allowed(token V)": lambda door, T, V: door.allowed(_in(door, np.full((1, 1), V))),
    "init_beams(beam_size=0)": lambda door, T, V: door.init_beams(2, 0),
    "init_beams(start_token='x')": lambda door, T, V: door.init_beams(2, BEAMS, "x"),
    "beam_step(step=T)": lambda door, T, V: door.beam_step(
        door.init_beams(1, BEAMS), _in(door, np.zeros((1, BEAMS, V), np.float32)), T),
    "beam_step(int logits)": lambda door, T, V: door.beam_step(
        door.init_beams(1, BEAMS), _in(door, np.zeros((1, BEAMS, V), np.int32)), 0),
    "finalize(length_penalty=nan)": lambda door, T, V: door.finalize(
        door.init_beams(1, BEAMS), float("nan")),
    "finalize(state=None)": lambda door, T, V: door.finalize(None),
    "beam_search(logits_fn=None)": lambda door, T, V: door.beam_search(None, 1, BEAMS),
    "beam_search(batch_size=0)": lambda door, T, V: door.beam_search(lambda *a: a, 0, BEAMS),
    "load(None)": lambda door, T, V: LOADERS[type(door).__name__](None),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_to_a_verb_is_a_typed_error(fixed, case):
    T, V = fixed["Artifact"].max_length, fixed["Artifact"].vocab_size
    for name, door in fixed.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # (no old form reached)
            with pytest.raises(StaticCompilerError):
                BAD[case](door, T, V)


def test_a_beam_size_the_artifact_does_not_export_is_named(fixed):
    art = fixed["Artifact"]
    with pytest.raises(DecodeInputError, match=f"beam_size={BEAMS + 1}"):
        art.init_beams(1, BEAMS + 1)
    with pytest.raises(DecodeInputError, match=f"beam_size={BEAMS + 1}"):
        art.beam_search(lambda last, step, carry: (None, carry), 1, BEAMS + 1)
    with pytest.raises(ArtifactFormatError):
        serving.load(art.path.parent / "missing.sc")
