"""Every public entry point of the torch backend (`TorchConstraints`,
`live_bits`) and of the Hugging Face processor (`StaticLogitsProcessor`)
walked with wrong types, shapes, dtypes and out-of-range values: each must raise one of the library's typed errors
(`StaticCompilerError`), never a raw AttributeError / TypeError /
IndexError / RuntimeError from numpy or torch. Out-of-range tokens given
to `advance` are not an error: they make their row invalid, and an int64
token past 2**32 must not act as its low 32 bits.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import static_compiler as sc
from static_compiler.errors import StaticCompilerError
from static_compiler.integrations.torch import StaticLogitsProcessor
from static_compiler.torch_backend import TorchConstraints, live_bits

ROWS = [[1, 2, 3], [1, 4, 5], [2, 2, 2], [3, 1, 6]]
V, T = 8, 3
BIG = 2 ** 40


class Opaque:
    """Some object of no expected type (with a stable repr, for test ids)."""

    def __repr__(self):
        return "Opaque()"


@pytest.fixture(scope="module")
def k(tmp_path_factory):
    """The walk's objects: a compiled set with a removal, the artifact it
    saved, its TorchConstraints, a state and beams of 2 rows, subsets (of
    the artifact; v...: of the compiled set)."""
    compiled = sc.compile_constraints(ROWS, vocab_size=V, export_subsets=True)
    version = compiled.update(remove=np.array([False, False, False, True]))
    path = tmp_path_factory.mktemp("torch_inputs") / "set.sc"
    version.save(path)
    tc = TorchConstraints.load(path)
    picks = [np.array([True, True, False, False]), np.array([False, False, True, False])]
    return types.SimpleNamespace(
        version=version, path=path, tc=tc, state=tc.init_processor(2), beams=tc.init_beams(2, 2),
        one=tc.subset(picks[0]), stacked=sc.stack_subsets([tc.subset(m) for m in picks]),
        vone=version.subset(picks[0]),
        vstacked=sc.stack_subsets([version.subset(m) for m in picks]),
        logits=torch.zeros((2, 2, V)), fn=lambda last, step, carry: (torch.zeros(2, 2, V), carry),
        ids=torch.tensor([[0, 1], [0, 1]]), scores=torch.zeros((2, V)))


def _replace(state, **fields):
    return state._replace(**fields)


_state_cases = {
    "state None": lambda k: None,
    "state list": lambda k: [[0, 0], [True, True], [False, False]],
    "state of 2": lambda k: tuple(k.state)[:2],
    "float node": lambda k: _replace(k.state, node=k.state.node.float()),
    "bool node": lambda k: _replace(k.state, node=k.state.node.bool()),
    "int valid": lambda k: _replace(k.state, valid=k.state.valid.long()),
    "float finished": lambda k: _replace(k.state, finished=k.state.finished.float()),
    "2-D node": lambda k: _replace(k.state, node=k.state.node[:, None]),
    "ragged fields": lambda k: _replace(k.state, valid=k.state.valid[:1]),
}

_beam_cases = {
    "beams None": lambda k: None,
    "processor state": lambda k: k.state,
    "tokens too short": lambda k: _replace(k.beams, tokens=k.beams.tokens[:, :, :T - 1]),
    "tokens too long": lambda k: _replace(k.beams, tokens=torch.cat([k.beams.tokens] * 2, 2)),
    "float node": lambda k: _replace(k.beams, node=k.beams.node.float()),
    "int valid": lambda k: _replace(k.beams, valid=k.beams.valid.long()),
    "int scores": lambda k: _replace(k.beams, scores=k.beams.scores.long()),
    "float tokens": lambda k: _replace(k.beams, tokens=k.beams.tokens.float()),
    "float parent": lambda k: _replace(k.beams, parent=k.beams.parent.float()),
    "ragged beams": lambda k: _replace(k.beams, lengths=k.beams.lengths[:, :1]),
}

_bad_steps = [-1, T, 1.5, None, "0", 2 ** 32, np.int64(2 ** 32 + 1), True]
_bad_sizes = [None, "2", 1.5, 0, -1, BIG, True, np.int64(BIG)]
_bad_devices = ["nonsense", "cuda:7", 1.5, "cpu:x", Opaque()]
_bad_arrays = [None, "ab", 1.5, [[1], [1, 2]], {"a": 1}]

CASES = {
    # construction
    **{f"load({p!r})": (lambda k, p=p: TorchConstraints.load(p))
       for p in [None, 1.5, ["a"], Opaque()]},
    "load(missing)": lambda k: TorchConstraints.load(k.path.parent / "none"),
    **{f"load(device={d!r})": (lambda k, d=d: TorchConstraints.load(k.path, d))
       for d in _bad_devices},
    **{f"from_compiled({c})": (lambda k, c=c: TorchConstraints.from_compiled(
        {"None": None, "path": k.path, "tc": k.tc}[c])) for c in ["None", "path", "tc"]},
    **{f"from_compiled(device={d!r})": (lambda k, d=d: TorchConstraints.from_compiled(
        k.version, device=d)) for d in _bad_devices},
    **{f"live_bits(device={d!r})": (lambda k, d=d: live_bits(k.one, d)) for d in _bad_devices},
    **{f"live_bits({s!r})": (lambda k, s=s: live_bits(s)) for s in [None, "x", [1, 2]]},
    # subsets
    **{f"subset({s!r})": (lambda k, s=s: k.tc.subset(s))
       for s in _bad_arrays + [[True] * 3, np.ones(4), np.ones((2, 4), bool)]},
    # the processor pair
    **{f"init_processor({n!r})": (lambda k, n=n: k.tc.init_processor(n)) for n in _bad_sizes},
    **{f"allowed_tokens({name})": (lambda k, f=f: k.tc.allowed_tokens(f(k), 0))
       for name, f in _state_cases.items()},
    **{f"allowed_tokens(step={s!r})": (lambda k, s=s: k.tc.allowed_tokens(k.state, s))
       for s in _bad_steps},
    **{f"mask({name})": (lambda k, f=f: k.tc.mask(k.scores, f(k), 0))
       for name, f in _state_cases.items()},
    **{f"mask(step={s!r})": (lambda k, s=s: k.tc.mask(k.scores, k.state, s)) for s in _bad_steps},
    **{f"mask(logits={x!r})": (lambda k, x=x: k.tc.mask(x, k.state, 0))
       for x in [None, np.zeros((2, V), np.float32), torch.zeros(2, V - 1), torch.zeros(3, V),
                 torch.zeros(2, V, dtype=torch.int64)]},
    **{f"advance({name})": (lambda k, f=f: k.tc.advance(f(k), torch.tensor([1, 1]), 0))
       for name, f in _state_cases.items()},
    **{f"advance(step={s!r})": (lambda k, s=s: k.tc.advance(k.state, [1, 1], s))
       for s in _bad_steps},
    **{f"advance(tokens={t!r})": (lambda k, t=t: k.tc.advance(k.state, t, 0))
       for t in _bad_arrays + [[1, 1, 1], [1.0, 1.0], [True, False], np.ones((2, 1), int),
                               torch.ones(2)]},
    "allowed_tokens(subset='x')": lambda k: k.tc.allowed_tokens(k.state, 0, subset="x"),
    "allowed_tokens(stacked, no index)": lambda k: k.tc.allowed_tokens(k.state, 0, subset=k.stacked),
    "allowed_tokens(index without subset)": lambda k: k.tc.allowed_tokens(k.state, 0, subset_index=[0, 0]),
    **{f"mask(subset_index={i!r})": (lambda k, i=i: k.tc.mask(k.scores, k.state, 0,
                                                              subset=k.stacked, subset_index=i))
       for i in [[0.0, 1.0], [0], [[0, 1]], [0, 2], [-1, 0], [2 ** 32, 0], "ab",
                 torch.zeros(2), torch.zeros(3, dtype=torch.int64)]},
    "mask(live bits, numpy index)": lambda k: k.tc.mask(k.scores, k.state, 0,
                                                        subset=live_bits(k.stacked),
                                                        subset_index=np.zeros(2, np.int64)),
    # allowed
    **{f"allowed({p!r})": (lambda k, p=p: k.tc.allowed(p))
       for p in _bad_arrays + [[1, 2], np.zeros((1, T), int), np.zeros((1, 1)),
                               [[2 ** 32 + 1]], [[-1]], [[2 ** 31]], [[V]]]},
    "allowed(stacked, no index)": lambda k: k.tc.allowed([[1]], subset=k.stacked),
    # beam search
    **{f"init_beams(batch_size={n!r})": (lambda k, n=n: k.tc.init_beams(n, 2))
       for n in _bad_sizes},
    **{f"init_beams(beam_size={n!r})": (lambda k, n=n: k.tc.init_beams(2, n))
       for n in _bad_sizes},
    "init_beams(2**20 x 2**20)": lambda k: k.tc.init_beams(2 ** 20, 2 ** 20),
    **{f"init_beams(start_token={s!r})": (lambda k, s=s: k.tc.init_beams(2, 2, s))
       for s in [BIG, -BIG, 2 ** 31, "x", 1.5, [1, 2, 3], None, True]},
    **{f"beam_step({name})": (lambda k, f=f: k.tc.beam_step(f(k), k.logits, 0))
       for name, f in _beam_cases.items()},
    **{f"beam_step(step={s!r})": (lambda k, s=s: k.tc.beam_step(k.beams, k.logits, s))
       for s in _bad_steps},
    **{f"beam_step(logits={name})": (lambda k, f=f: k.tc.beam_step(k.beams, f(k), 0))
       for name, f in {"None": lambda k: None, "numpy": lambda k: np.zeros((2, 2, V)),
                       "int": lambda k: k.logits.long(), "(2, V)": lambda k: k.logits[0],
                       "V - 1": lambda k: k.logits[..., 1:]}.items()},
    **{f"beam_step({kw}={v!r})": (lambda k, kw=kw, v=v: k.tc.beam_step(
        k.beams, k.logits, 0, **{kw: v}))
       for kw in ("tokens_per_beam", "live_beams") for v in [0, -1, 1.5, "x"]},
    "beam_step(subset='x')": lambda k: k.tc.beam_step(k.beams, k.logits, 0, subset="x"),
    **{f"finalize({name})": (lambda k, f=f: k.tc.finalize(f(k)))
       for name, f in _beam_cases.items()},
    **{f"finalize(length_penalty={p!r})": (lambda k, p=p: k.tc.finalize(k.beams, p))
       for p in [float("nan"), float("inf"), "x", None]},
    **{f"beam_search({name})": (lambda k, kw=kw: k.tc.beam_search(
        **{"logits_fn": k.fn, "batch_size": 2, "beam_size": 2, **kw(k)}))
       for name, kw in {
           "logits_fn None": lambda k: dict(logits_fn=None),
           "logits alone": lambda k: dict(logits_fn=lambda last, step, carry: k.logits),
           "logits (2, V)": lambda k: dict(logits_fn=lambda last, s, c: (k.logits[0], c)),
           "logits None": lambda k: dict(logits_fn=lambda last, s, c: (None, c)),
           "batch_size 2**40": lambda k: dict(batch_size=BIG),
           "beam_size 2**40": lambda k: dict(beam_size=BIG),
           "beam_size 0": lambda k: dict(beam_size=0),
           "batch_size -1": lambda k: dict(batch_size=-1),
           "tokens_per_beam 0": lambda k: dict(tokens_per_beam=0),
           "tokens_per_beam short": lambda k: dict(tokens_per_beam=[1]),
           "start_token 2**40": lambda k: dict(start_token=BIG),
           "carry without reorder": lambda k: dict(carry=1),
           "reorder 1": lambda k: dict(reorder=1),
           "length_penalty nan": lambda k: dict(length_penalty=float("nan")),
           "subset stacked, no index": lambda k: dict(subset=k.stacked),
           "subset_index without subset": lambda k: dict(subset_index=[0, 0])}.items()},
    **{f"advance({name})": (lambda k, a=a: k.tc.advance(k.state, [1, 1], 0, subset=a(k)[0],
                                                        subset_index=a(k)[1]))
       for name, a in {"subset 'x'": lambda k: ("x", None),
                       "index float": lambda k: (k.stacked, [0.5, 1.5])}.items()},
    # warm-up
    **{f"warm(batch_sizes={b!r})": (lambda k, b=b: k.tc.warm(b))
       for b in [None, "2", 1.5, 0, -1, True, [], [2, 0], [2, "x"], Opaque()]},
    **{f"warm(beam_sizes={m!r})": (lambda k, m=m: k.tc.warm([2], beam_sizes=m))
       for m in ["2", 1.5, 0, [0], [2, -1], [1.5], Opaque()]},  # (None: the default, none)
    "warm(2**40 x 2**40)": lambda k: k.tc.warm([BIG], beam_sizes=[BIG]),
    **{f"warm(max_subsets={r!r})": (lambda k, r=r: k.tc.warm([2], max_subsets=r))
       for r in [-1, 1.5, None, "1", True]},
    # the Hugging Face processor
    **{f"processor({name})": (lambda k, a=a: StaticLogitsProcessor(*a(k)[0], **a(k)[1]))
       for name, a in {
           "None": lambda k: ((None, 0), {}),
           "path": lambda k: ((k.path, 0), {}),
           "prompt_length -1": lambda k: ((k.tc, -1), {}),
           "prompt_length 1.5": lambda k: ((k.tc, 1.5), {}),
           "prompt_length None": lambda k: ((k.tc, None), {}),
           "backend 'x'": lambda k: ((k.tc, 0), dict(backend="x")),
           "tc on jax": lambda k: ((k.tc, 0), dict(backend="jax")),
           "subset 'x'": lambda k: ((k.tc, 0), dict(subset="x")),
           "stacked, no index": lambda k: ((k.tc, 0), dict(subset=k.stacked)),
           "stacked, no index, compiled torch": lambda k: ((k.version, 0),
                                                           dict(subset=k.vstacked, backend="torch")),
           "index without subset": lambda k: ((k.tc, 0), dict(subset_index=[0])),
           "index out of range": lambda k: ((k.tc, 0), dict(subset=k.stacked,
                                                            subset_index=[0, 2])),
           "index float": lambda k: ((k.tc, 0), dict(subset=k.stacked, subset_index=[0.0])),
           "index 2-D": lambda k: ((k.tc, 0), dict(subset=k.stacked, subset_index=[[0]])),
           "index 'ab'": lambda k: ((k.tc, 0), dict(subset=k.stacked, subset_index="ab")),
       }.items()},
    **{f"processor call({name})": (lambda k, a=a: StaticLogitsProcessor(k.tc, 1)(*a(k)))
       for name, a in {
           "input_ids None": lambda k: (None, k.scores),
           "input_ids list": lambda k: ([[0, 1], [0, 1]], k.scores),
           "input_ids numpy": lambda k: (k.ids.numpy(), k.scores),
           "input_ids float": lambda k: (k.ids.float(), k.scores),
           "input_ids bool": lambda k: (k.ids.bool(), k.scores),
           "input_ids 1-D": lambda k: (k.ids[0], k.scores),
           "input_ids too long": lambda k: (torch.zeros((2, T + 1), dtype=torch.long), k.scores),
           "scores None": lambda k: (k.ids, None),
           "scores numpy": lambda k: (k.ids, k.scores.numpy()),
           "scores int": lambda k: (k.ids, k.scores.long()),
           "scores (2, V - 1)": lambda k: (k.ids, k.scores[:, 1:]),
           "scores (3, V)": lambda k: (k.ids, torch.zeros(3, V)),
       }.items()},
    "processor call(rows not a multiple)": lambda k: StaticLogitsProcessor(
        k.tc, 1, subset=k.stacked, subset_index=[0, 1])(k.ids[:1], k.scores[:1]),
    **{f"processor warm({name})": (lambda k, a=a: StaticLogitsProcessor(k.tc, 1).warm(*a[0],
                                                                                   **a[1]))
       for name, a in {"rows None": ((None,), {}), "rows 2**40": ((BIG,), {}),
                       "model_vocab_size 'x'": ((2,), dict(model_vocab_size="x"))}.items()},
}


@pytest.mark.parametrize("name", list(CASES))
def test_typed_error(k, name):
    """Each bad call raises a StaticCompilerError (a raw error from numpy
    or torch would fail here with its own type)."""
    try:
        CASES[name](k)
    except StaticCompilerError as err:
        assert str(err), name
    else:
        pytest.fail(f"{name}: no error")


def test_float_input_ids_named(k):
    """The processor names the dtype of float input_ids."""
    with pytest.raises(sc.errors.DecodeInputError, match="float32"):
        StaticLogitsProcessor(k.tc, 1)(k.ids.float(), k.scores)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_stacked_subsets_need_an_index(k, backend):
    """Stacked subsets without subset_index are refused as every other front
    door refuses them; with one they are taken per prompt."""
    stacked = "2 stacked subsets: pass subset_index"
    with pytest.raises(sc.errors.DecodeInputError, match=stacked):
        k.version.allowed(np.zeros((2, 0), np.int32), subset=k.vstacked)
    with pytest.raises(sc.errors.DecodeInputError, match=stacked):
        StaticLogitsProcessor(k.version, 1, subset=k.vstacked, backend=backend)
    proc = StaticLogitsProcessor(k.version, 1, subset=k.vstacked, subset_index=[0, 1],
                                 backend=backend)
    out = proc(torch.tensor([[0, 1], [0, 1]]), torch.zeros((2, V)))
    assert (out[0] == 0).tolist() == [t in (2, 4) for t in range(V)]  # items 0 and 1
    assert not (out[1] == 0).any()  # item 2 starts with 2, not 1
    one = StaticLogitsProcessor(k.version, 0, subset=k.vone, backend=backend)
    assert (one(torch.zeros((3, 0), dtype=torch.long), torch.zeros((3, V)))[:, 1] == 0).all()
    if backend == "torch":
        with pytest.raises(sc.errors.DecodeInputError, match=stacked):
            StaticLogitsProcessor(k.tc, 1, subset=k.stacked)


@pytest.mark.parametrize("token", [2 ** 32 + 1, -2 ** 32 + 1, 2 ** 31 + 1, 2 ** 63 - 1, -1, V])
@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
def test_out_of_range_token_invalidates_row(k, token, kind):
    """A token outside [0, V) makes its row invalid (documented; not an
    error); 2**32 + 1 must not act as token 1 (on the
    torch front door as on the others)."""
    tokens = {"tensor": torch.tensor([token, 1]), "numpy": np.array([token, 1], np.int64),
              "list": [token, 1]}[kind]
    out = k.tc.advance(k.state, tokens, 0)
    assert out.valid.tolist() == [False, True]
    mask = k.tc.allowed_tokens(out, 1)
    assert not mask[0].any() and mask[1].tolist() == [t in (2, 4) for t in range(V)]
    if kind == "tensor":  # the stateless mask and the processor agree
        got = k.tc.allowed(torch.tensor([[token], [1]]), check_values=False)
        assert torch.equal(got, mask)
        scores = StaticLogitsProcessor(k.tc, 1)(torch.tensor([[0, token], [0, 1]]),
                                                torch.zeros((2, V)))
        assert torch.equal(scores == 0, mask)
