"""Every public entry point of the JAX front doors, the compiled set
(`CompiledConstraints`, its step processor, `sc.beam_search` / `greedy_decode`
/ `sample`) and the served artifact (`serving.Artifact`), walked with wrong
types, shapes, dtypes and out-of-range values:
each must answer with one of the library's typed errors
(`StaticCompilerError`), never a raw AttributeError / TypeError / IndexError
or a jax error. Where the documented answer is "the row becomes invalid"
(a token outside [0, V) given to `advance`), that behaviour is tested
instead, for int64 and uint64 tokens past 2**31 and 2**32 as well: jax
(x64 off) keeps their low 32 bits, so token 2**32 + 1 used to be read as
token 1 and the row stayed valid."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.backend.decode import StepProcessor
from static_compiler.backend.decode.prefix import prefix_mask
from static_compiler.errors import DecodeInputError, StaticCompilerError
from static_compiler.support.decode_types import SENTINEL_SCORE, BeamState, ProcessorState

ITEMS = [[1, 2, 3], [1, 4, 5], [2, 2, 2]]
V, B, M, T = 8, 2, 2, 3


@dataclasses.dataclass
class Doors:
    c: sc.CompiledConstraints
    art: serving.Artifact
    proc: object  # c.processor(B)
    path: object


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    c = sc.compile_constraints(ITEMS, vocab_size=V, export_beam_sizes=(M,), export_subsets=True)
    path = tmp_path_factory.mktemp("front_doors") / "set.static"
    c.save(path)
    return Doors(c, serving.load(path), c.processor(B), path)


def ps(node=None, valid=None, finished=None):
    """A ProcessorState of B rows at the root, fields replaced as given."""
    return ProcessorState(np.zeros(B, np.int32) if node is None else node,
                          np.ones(B, bool) if valid is None else valid,
                          np.zeros(B, bool) if finished is None else finished)


def bs(**fields):
    """A BeamState (B, M) as `init_beams` makes it, fields replaced as given."""
    good = dict(tokens=np.full((B, M, T), -1, np.int32),
                scores=np.array([[0.0, -1e30]] * B, np.float32), node=np.zeros((B, M), np.int32),
                valid=np.array([[True, False]] * B), finished=np.zeros((B, M), bool),
                lengths=np.zeros((B, M), np.int32), last_tokens=np.zeros((B, M), np.int32),
                parent=np.tile(np.arange(M, dtype=np.int32), (B, 1)))
    good.update(fields)
    return BeamState(**good)


LOGITS = np.zeros((B, V), np.float32)
BEAM_LOGITS = np.zeros((B, M, V), np.float32)
TOKENS = np.array([1, 2])


def zeros_model(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (V,), jnp.float32), carry


def with_beams(logits):
    """Bad (B, V) logits made (B, M, V) for beam_step (others as they are)."""
    if hasattr(logits, "dtype") and np.ndim(logits) == 2:
        return logits[:, None].repeat(M, axis=1)
    return logits


# --- the bad values, by kind ------------------------------------------------

BAD_STATES = {
    "None": None, "str": "state", "float": 1.5, "short tuple": (np.zeros(B, np.int32),),
    "dict": {"node": np.zeros(B, np.int32)},
    "ragged lists": ProcessorState([[0], [0, 1]], [True, True], [False, False]),
    "float node": ps(node=np.zeros(B)), "float list node": ps(node=[0.0, 0.0]),
    "bool node": ps(node=np.zeros(B, bool)), "int valid": ps(valid=np.ones(B, np.int32)),
    "int list valid": ps(valid=[1, 1]), "float finished": ps(finished=np.zeros(B)),
    "2-D node": ps(node=np.zeros((B, 1), np.int32)), "None node": ps()._replace(node=None),
    "str node": ps(node="ab"),
    "object node": ps(node=np.array([object(), object()])),
    "uneven shapes": ps(node=np.zeros(B + 1, np.int32)),
    "scalar fields": ProcessorState(0, True, False),
}
BAD_TOKENS = {
    "None": None, "str": "12", "float": 1.5, "int": 1, "float array": np.array([1.0, 2.0]),
    "bool array": np.array([True, False]), "ragged": [[1], [1, 2]], "2-D": np.ones((B, 1), int),
    "wrong length": np.array([1, 2, 3]), "past int64": [2 ** 70, 1], "complex": np.ones(B, complex),
    "float jax": jnp.ones(B, jnp.float32),
}
BAD_LOGITS = {
    "None": None, "str": "logits", "int": np.zeros((B, V), np.int32),
    "bool": np.zeros((B, V), bool), "wrong V": np.zeros((B, V - 1), np.float32),
    "1-D": np.zeros(V, np.float32), "ragged": [[0.0] * V, [0.0]], "strs": [["a"] * V] * B,
    "int jax": jnp.zeros((B, V), jnp.int32),
}
BAD_STEPS = {
    "-1": -1, "T": T, "2**31": 2 ** 31, "2**32": 2 ** 32, "np 2**40": np.int64(2 ** 40),
    "float": 1.5, "str": "0", "None": None, "bool": True, "1-D": np.array([0]), "nan": float("nan"),
}
BAD_SIZES = {"0": 0, "-1": -1, "2**40": 2 ** 40, "2**31": 2 ** 31, "float": 1.5, "None": None,
             "str": "2", "bool": True}
BAD_PREFIXES = {
    "None": None, "str": "12", "1-D": np.array([1, 2]), "float": np.zeros((B, 1)),
    "ragged": [[1], [1, 2]], "2**32": np.array([[2 ** 32 + 1]], np.int64), "negative": [[-1]],
    "too long": np.ones((1, T), int), "bool": np.zeros((1, 1), bool),
}
BAD_SELECTIONS = {
    "None": None, "str": "abc", "float": np.ones(3), "wrong length": np.ones(5, bool),
    "ragged": [[1, 2], [1]], "not in set": [[7, 7, 7]], "2**32": np.array([[2 ** 32 + 1, 2, 3]]),
}


def entries(table: dict, calls: dict) -> list:
    """pytest params: every (entry, bad value) pair."""
    return [pytest.param(call, bad, id=f"{name}-{bad_name}")
            for name, call in calls.items() for bad_name, bad in table.items()]


STATE_CALLS = {
    "c.mask": lambda d, s: d.c.mask(LOGITS, s, 0),
    "c.advance": lambda d, s: d.c.advance(s, TOKENS, 0),
    "c.advance traced step": lambda d, s: d.c.advance(s, TOKENS, jnp.int32(0)),
    "c.accept_drafts": lambda d, s: d.c.accept_drafts(s, np.ones((B, 1), int), 0),
    "proc.mask": lambda d, s: d.proc.mask(LOGITS, s, 0),
    "proc.advance": lambda d, s: d.proc.advance(s, TOKENS, 0),
    "proc.advance_and_mask": lambda d, s: d.proc.advance_and_mask(s, TOKENS, 0, LOGITS),
    "art.mask": lambda d, s: d.art.mask(LOGITS, s, 0),
    "art.advance": lambda d, s: d.art.advance(s, TOKENS, 0),
    "c.allowed_tokens": lambda d, s: d.c.allowed_tokens(s, 0),
    "art.allowed_tokens": lambda d, s: d.art.allowed_tokens(s, 0),
}
TOKEN_CALLS = {
    "c.advance": lambda d, x: d.c.advance(d.c.init_processor(B), x, 0),
    "c.advance traced step": lambda d, x: d.c.advance(d.c.init_processor(B), x, jnp.int32(0)),
    "proc.advance": lambda d, x: d.proc.advance(d.proc.init_processor(), x, 0),
    "proc.advance_and_mask": lambda d, x: d.proc.advance_and_mask(d.proc.init_processor(), x, 0,
                                                                  LOGITS),
    "art.advance": lambda d, x: d.art.advance(d.art.init_processor(B), x, 0),
}
LOGITS_CALLS = {
    "c.mask": lambda d, x: d.c.mask(x, d.c.init_processor(B), 0),
    "c.mask traced step": lambda d, x: d.c.mask(x, d.c.init_processor(B), jnp.int32(0)),
    "proc.mask": lambda d, x: d.proc.mask(x, d.proc.init_processor(), 0),
    "proc.advance_and_mask": lambda d, x: d.proc.advance_and_mask(d.proc.init_processor(), TOKENS,
                                                                  0, x),
    "art.mask": lambda d, x: d.art.mask(x, d.art.init_processor(B), 0),
    "art.beam_step": lambda d, x: d.art.beam_step(d.art.init_beams(B, M), with_beams(x), 0),
    "c.beam_step": lambda d, x: d.c.beam_step(d.c.init_beams(B, M), with_beams(x), 0),
}
STEP_CALLS = {
    "c.mask": lambda d, t: d.c.mask(LOGITS, d.c.init_processor(B), t),
    "c.advance": lambda d, t: d.c.advance(d.c.init_processor(B), TOKENS, t),
    "c.accept_drafts": lambda d, t: d.c.accept_drafts(d.c.init_processor(B), np.ones((B, 1), int), t),
    "proc.mask": lambda d, t: d.proc.mask(LOGITS, d.proc.init_processor(), t),
    "proc.advance": lambda d, t: d.proc.advance(d.proc.init_processor(), TOKENS, t),
    "proc.advance_and_mask": lambda d, t: d.proc.advance_and_mask(d.proc.init_processor(), TOKENS,
                                                                  t, LOGITS),
    "art.mask": lambda d, t: d.art.mask(LOGITS, d.art.init_processor(B), t),
    "art.advance": lambda d, t: d.art.advance(d.art.init_processor(B), TOKENS, t),
    "art.beam_step": lambda d, t: d.art.beam_step(d.art.init_beams(B, M), BEAM_LOGITS, t),
    "c.beam_step": lambda d, t: d.c.beam_step(d.c.init_beams(B, M), BEAM_LOGITS, t),
    "c.allowed_tokens": lambda d, t: d.c.allowed_tokens(d.c.init_processor(B), t),
    "art.allowed_tokens": lambda d, t: d.art.allowed_tokens(d.art.init_processor(B), t),
}
SIZE_CALLS = {
    "c.init_processor": lambda d, n: d.c.init_processor(n),
    "c.processor": lambda d, n: d.c.processor(n),
    "art.init_processor": lambda d, n: d.art.init_processor(n),
    "art.init_beams batch": lambda d, n: d.art.init_beams(n, M),
    "art.init_beams beams": lambda d, n: d.art.init_beams(B, n),
    "sc.beam_search batch": lambda d, n: sc.beam_search(d.c, zeros_model, batch_size=n,
                                                        beam_size=M),
    "sc.beam_search beams": lambda d, n: sc.beam_search(d.c, zeros_model, batch_size=B,
                                                        beam_size=n),
    "c.init_beams batch": lambda d, n: d.c.init_beams(n, M),
    "c.init_beams beams": lambda d, n: d.c.init_beams(B, n),
    "c.beam_search batch": lambda d, n: d.c.beam_search(zeros_model, n, M),
    "art.beam_search beams": lambda d, n: d.art.beam_search(zeros_model, B, n),
    "sc.greedy_decode": lambda d, n: sc.greedy_decode(d.c, zeros_model, batch_size=n),
    "sc.sample": lambda d, n: sc.sample(d.c, zeros_model, jax.random.PRNGKey(0), batch_size=n),
}
BAD_BEAM_STATES = {
    "None": None, "str": "state", "short tuple": tuple(bs())[:3],
    "ProcessorState": ps(), "float tokens": bs(tokens=np.zeros((B, M, T))),
    "int scores": bs(scores=np.zeros((B, M), np.int32)),
    "int valid": bs(valid=np.ones((B, M), int)),
    "float node": bs(node=np.zeros((B, M))), "bool node": bs(node=np.zeros((B, M), bool)),
    "None node": bs()._replace(node=None), "1-D node": bs(node=np.zeros(B, np.int32)),
    "tokens (B, M)": bs(tokens=np.zeros((B, M), np.int32)),
    "3 beams": bs(node=np.zeros((B, 3), np.int32)),
    "ragged tokens": bs(tokens=[[[0]], [[0, 1]]]),
    "node 2**32": bs(node=np.full((B, M), 2 ** 32, np.int64)),
    "str lengths": bs(lengths="ab"),
}
BEAM_STATE_CALLS = {
    "art.beam_step": lambda d, s: d.art.beam_step(s, BEAM_LOGITS, 0),
    "art.finalize": lambda d, s: d.art.finalize(s),
    "c.beam_step": lambda d, s: d.c.beam_step(s, BEAM_LOGITS, 0),
    "c.finalize": lambda d, s: d.c.finalize(s),
}


def walk_cases() -> list:
    calls = [(BAD_STATES, STATE_CALLS), (BAD_TOKENS, TOKEN_CALLS), (BAD_LOGITS, LOGITS_CALLS),
             (BAD_STEPS, STEP_CALLS), (BAD_SIZES, SIZE_CALLS),
             (BAD_BEAM_STATES, BEAM_STATE_CALLS),
             (BAD_PREFIXES, {"c.allowed": lambda d, x: d.c.allowed(x),
                             "art.allowed": lambda d, x: d.art.allowed(x)}),
             (BAD_SELECTIONS, {"c.subset": lambda d, x: d.c.subset(x),
                               "art.subset": lambda d, x: d.art.subset(x),
                               "c.ranked_subset": lambda d, x: d.c.ranked_subset(x),
                               "art.ranked_subset": lambda d, x: d.art.ranked_subset(x)})]
    return [case for table, call in calls for case in entries(table, call)]


OTHER_CASES = {  # one call each: (entry, what is wrong)
    "proc.warm str": lambda d: d.proc.warm("x"),
    "proc.warm None": lambda d: d.proc.warm(None),
    "proc.warm list of str": lambda d: d.proc.warm(["x"]),
    "c.accept_drafts None": lambda d: d.c.accept_drafts(d.c.init_processor(B), None, 0),
    "c.accept_drafts str": lambda d: d.c.accept_drafts(d.c.init_processor(B), "ab", 0),
    "c.accept_drafts float": lambda d: d.c.accept_drafts(d.c.init_processor(B), np.ones((B, 1)), 0),
    "c.accept_drafts 1-D": lambda d: d.c.accept_drafts(d.c.init_processor(B), TOKENS, 0),
    "c.accept_drafts ragged": lambda d: d.c.accept_drafts(d.c.init_processor(B), [[1], [1, 2]], 0),
    "c.accept_drafts 2**32": lambda d: d.c.accept_drafts(
        d.c.init_processor(B), np.full((B, 1), 2 ** 32 + 1, np.int64), 0),
    "c.accept_drafts uint64": lambda d: d.c.accept_drafts(
        d.c.init_processor(B), np.full((B, 1), 2 ** 32 + 1, np.uint64), 0),
    "c.texts (no names)": lambda d: d.c.texts(None),
    "art.texts (no names)": lambda d: d.art.texts(None),
    "c.layer_stats 0 devices": lambda d: d.c.layer_stats(0),
    "c.layer_stats str": lambda d: d.c.layer_stats("2"),
    "c.layer_stats float": lambda d: d.c.layer_stats(1.5),
    "c.save exists": lambda d: d.c.save(d.path),
    "c.save None": lambda d: d.c.save(None),
    "c.save int": lambda d: d.c.save(3),
    "c.item_index None": lambda d: d.c.item_index(None),
    "c.item_index str": lambda d: d.c.item_index("abc"),
    "c.item_index float": lambda d: d.c.item_index(np.full((1, 3), 1.5)),
    "c.ir_text str": lambda d: d.c.ir_text("many"),
    "c.update add str": lambda d: d.c.update(add="abc"),
    "c.update add 2**32": lambda d: d.c.update(add=np.array([[2 ** 32 + 1, 2, 3]])),
    "c.update remove float": lambda d: d.c.update(remove=1.5),
    "c.update remove 2**32": lambda d: d.c.update(remove=np.array([[2 ** 32 + 1, 2, 3]])),
    "c.shard None": lambda d: d.c.shard(None, "x"),
    "c.shard axis": lambda d: d.c.shard(jax.sharding.Mesh(np.array(jax.devices()), ("d",)), "e"),
    "proc.checked_batch str": lambda d: d.proc.checked_batch("2"),
    "c.mask subset_index without subset": lambda d: d.c.mask(LOGITS, d.c.init_processor(B), 0,
                                                             subset_index=[0, 0]),
    "c.mask subset_index 2**32": lambda d: d.c.mask(
        LOGITS, d.c.init_processor(B), 0, subset=d.c.subset(np.ones(3, bool)),
        subset_index=np.array([0, 2 ** 32])),
    "c.mask subset of str": lambda d: d.c.mask(LOGITS, d.c.init_processor(B), 0, subset="all"),
    "art.advance subset_index str": lambda d: d.art.advance(
        d.art.init_processor(B), TOKENS, 0, subset=d.art.subset(np.ones(3, bool)),
        subset_index="ab"),
    "art.beam_step subset of str": lambda d: d.art.beam_step(d.art.init_beams(B, M), BEAM_LOGITS,
                                                             0, subset="all"),
    "art.init_beams start 2**32": lambda d: d.art.init_beams(B, M, start_token=2 ** 32),
    "art.init_beams start str": lambda d: d.art.init_beams(B, M, start_token="a"),
    "art.init_beams start float": lambda d: d.art.init_beams(B, M, start_token=1.5),
    "art.init_beams start 3 rows": lambda d: d.art.init_beams(B, M, start_token=[1, 2, 3]),
    "art.init_beams beams not exported": lambda d: d.art.init_beams(B, M + 1),
    "art.warm batch 0": lambda d: d.art.warm([0]),
    "art.warm beams not exported": lambda d: d.art.warm([B], beam_sizes=[M + 1]),
    "art.beam_search beam_size str": lambda d: d.art.beam_search(zeros_model, B, "M"),
    "art.prior no column": lambda d: d.art.prior("nope"),
    "art.prior weight nan": lambda d: d.art.prior("nope", weight=float("nan")),
    "c.prior no column": lambda d: d.c.prior("nope"),
    "c.prior weight str": lambda d: d.c.prior("nope", weight="1"),
    "c.beam_step prior str": lambda d: d.c.beam_step(d.c.init_beams(B, M), BEAM_LOGITS, 0,
                                                      prior="a prior"),
    "art.beam_search schedule not exported": lambda d: d.art.beam_search(
        zeros_model, B, (M,) * (d.art.max_length - 1) + (M + 1,)),
    "serving.load None": lambda d: serving.load(None),
    "serving.load missing": lambda d: serving.load(d.path.parent / "missing.static"),
    "sc.beam_search None set": lambda d: sc.beam_search(None, zeros_model, batch_size=B,
                                                        beam_size=M),
    "sc.greedy_decode str set": lambda d: sc.greedy_decode("set", zeros_model, batch_size=B),
    "sc.sample None set": lambda d: sc.sample(None, zeros_model, jax.random.PRNGKey(0),
                                              batch_size=B),
    "sc.beam_search model None": lambda d: sc.beam_search(d.c, None, batch_size=B, beam_size=M),
    "sc.beam_search start 2**32": lambda d: sc.beam_search(d.c, zeros_model, batch_size=B,
                                                           beam_size=M, start_token=2 ** 32),
    "sc.beam_search tokens_per_beam 0": lambda d: sc.beam_search(
        d.c, zeros_model, batch_size=B, beam_size=M, tokens_per_beam=0),
    "sc.beam_search unknown option": lambda d: sc.beam_search(d.c, zeros_model, batch_size=B,
                                                              beam_size=M, beams=3),
    "sc.sample temperature nan": lambda d: sc.sample(d.c, zeros_model, jax.random.PRNGKey(0),
                                                     batch_size=B, temperature=float("nan")),
    "sc.sample key str": lambda d: sc.sample(d.c, zeros_model, "key", batch_size=B),
    "c.warm batch 0": lambda d: d.c.warm([0]),
    "c.warm greedy without model": lambda d: d.c.warm([B], greedy=True),
    "c.warm beams not a size": lambda d: d.c.warm([B], beam_sizes=["4"]),
}


NOT_WALKED = {  # public methods with no argument to get wrong, or internal to sc.*
    "CompiledConstraints": {"compilations"},
    "Artifact": {"reload", "compilations"},  # (only a bool flag, read as truthy; no argument)
    "StepProcessor": {"init_processor"},
}


@pytest.mark.parametrize("cls, prefix", [(sc.CompiledConstraints, "c."),
                                         (serving.Artifact, "art."),
                                         (StepProcessor, "proc.")])
def test_the_walk_covers_every_public_method(cls, prefix):
    """A new public method fails this until the walk (or NOT_WALKED) has it."""
    public = {name for name, value in inspect.getmembers(cls) if not name.startswith("_")
              and callable(value) and not isinstance(inspect.getattr_static(cls, name), property)}
    walked = {key.split()[0].split("-")[0][len(prefix):]
              for table in (STATE_CALLS, TOKEN_CALLS, LOGITS_CALLS, STEP_CALLS, SIZE_CALLS,
                            BEAM_STATE_CALLS, OTHER_CASES,
                            {"c.allowed": 0, "art.allowed": 0, "c.subset": 0, "art.subset": 0,
                             "c.ranked_subset": 0, "art.ranked_subset": 0})
              for key in table if key.startswith(prefix)}
    assert public - walked - NOT_WALKED[cls.__name__] == set()


def raises_typed(call, *args):
    """Runs call(*args); it must raise a StaticCompilerError (a raw error fails
    the test with its type and message)."""
    try:
        call(*args)
    except StaticCompilerError as err:
        return err
    except Exception as err:  # noqa: BLE001 - what the test is about
        pytest.fail(f"raw {type(err).__name__}: {err}")
    pytest.fail("no error")


@pytest.mark.parametrize("call, bad", walk_cases())
def test_every_entry_point_answers_bad_arguments_with_a_typed_error(doors, call, bad):
    raises_typed(call, doors, bad)


@pytest.mark.parametrize("call", OTHER_CASES.values(), ids=OTHER_CASES.keys())
def test_every_other_bad_argument_gets_a_typed_error(doors, call):
    raises_typed(call, doors)


def test_a_bad_state_field_is_named_with_its_dtype_and_what_was_expected(doors):
    err = raises_typed(lambda: doors.c.mask(LOGITS, ps(node=np.zeros(B)), 0))
    assert isinstance(err, DecodeInputError)
    assert "node" in str(err) and "float64" in str(err) and "int" in str(err)
    err = raises_typed(lambda: doors.proc.advance(ps(valid=np.ones(B, np.int32)), TOKENS, 0))
    assert "valid" in str(err) and "int32" in str(err) and "bool" in str(err)
    err = raises_typed(lambda: doors.art.beam_step(bs(scores=np.zeros((B, M), int)),
                                                   BEAM_LOGITS, 0))
    assert "scores" in str(err) and "float" in str(err)


# --- concrete lists are states too ------------------------------

LIST_STATE = ProcessorState([0, 0], [True, True], [False, False])

LIST_STATE_CALLS = {
    "c.mask": lambda d: d.c.mask(LOGITS, LIST_STATE, 0),
    "c.advance": lambda d: d.c.advance(LIST_STATE, [1, 2], 0).valid,
    "proc.mask": lambda d: d.proc.mask(LOGITS, LIST_STATE, 0),
    "proc.advance": lambda d: d.proc.advance(LIST_STATE, [1, 2], 0).valid,
    "proc.advance_and_mask": lambda d: d.proc.advance_and_mask(LIST_STATE, [1, 2], 0, LOGITS)[0]
    .valid,
    "art.mask": lambda d: d.art.mask(LOGITS, LIST_STATE, 0),
    "art.advance": lambda d: d.art.advance(LIST_STATE, [1, 2], 0).valid,
    "c.accept_drafts": lambda d: d.c.accept_drafts(LIST_STATE, [[1], [2]], 0)[0],
}


@pytest.mark.parametrize("call", LIST_STATE_CALLS.values(), ids=LIST_STATE_CALLS.keys())
def test_a_processor_state_of_python_lists_is_read_as_arrays(doors, call):
    """Finding 3: a ProcessorState of lists used to raise AttributeError
    ('list' object has no attribute 'shape'); it decodes as its arrays."""
    out = np.asarray(call(doors))
    if out.shape == (B, V):  # a mask at the root: tokens 1 and 2 start items
        assert ((out != SENTINEL_SCORE) == np.isin(np.arange(V), [1, 2])).all()
    else:  # both rows took an allowed token
        assert out.tolist() in ([True, True], [1, 1])


def test_a_beam_state_of_python_lists_is_read_as_arrays(doors):
    state = doors.art.init_beams(B, M)
    as_lists = BeamState(*(np.asarray(f).tolist() for f in state))
    want = doors.art.beam_step(state, BEAM_LOGITS, 0)
    got = doors.art.beam_step(as_lists, BEAM_LOGITS, 0)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(doors.art.finalize(as_lists).valid),
                                  np.asarray(doors.art.finalize(state).valid))


# --- a token outside [0, V) makes its row invalid, whatever its width

OUT_OF_RANGE = [
    pytest.param(np.int64, 2 ** 32 + 1, id="int64 2**32+1"),
    pytest.param(np.int64, -2 ** 32 + 1, id="int64 -2**32+1"),
    pytest.param(np.int64, 2 ** 32 + 2, id="int64 2**32+2"),
    pytest.param(np.int64, 2 ** 31, id="int64 2**31"),
    pytest.param(np.int64, 2 ** 63 - 1, id="int64 2**63-1"),
    pytest.param(np.int64, 2 ** 63 - 2 ** 32 + 1, id="int64 2**63-2**32+1"),
    pytest.param(np.int64, -2 ** 63 + 1, id="int64 -2**63+1"),
    pytest.param(np.int64, V, id="int64 V"),
    pytest.param(np.int64, -1, id="int64 -1"),
    pytest.param(np.uint64, 2 ** 32 + 1, id="uint64 2**32+1"),
    pytest.param(np.uint64, 2 ** 64 - 2 ** 32 + 2, id="uint64 2**64-2**32+2"),
    pytest.param(np.uint32, 2 ** 32 - 1, id="uint32 2**32-1"),
    pytest.param(np.uint32, 2 ** 31 + 1, id="uint32 2**31+1"),
]

ADVANCE_DOORS = {
    "c.advance": lambda d, tok: d.c.advance(d.c.init_processor(B), tok, 0),
    "c.advance traced step": lambda d, tok: d.c.advance(d.c.init_processor(B), tok, jnp.int32(0)),
    "c.advance subset": lambda d, tok: d.c.advance(d.c.init_processor(B), tok, 0,
                                                   subset=d.c.subset(np.ones(3, bool))),
    "proc.advance": lambda d, tok: d.proc.advance(d.proc.init_processor(), tok, 0),
    "proc.advance_and_mask": lambda d, tok: d.proc.advance_and_mask(d.proc.init_processor(), tok, 0,
                                                                    LOGITS)[0],
    "art.advance": lambda d, tok: d.art.advance(d.art.init_processor(B), tok, 0),
    "art.advance subset": lambda d, tok: d.art.advance(d.art.init_processor(B), tok, 0,
                                                       subset=d.art.subset(np.ones(3, bool))),
}


@pytest.mark.parametrize("door", ADVANCE_DOORS.values(), ids=ADVANCE_DOORS.keys())
@pytest.mark.parametrize("dtype, value", OUT_OF_RANGE)
def test_a_token_outside_the_vocabulary_makes_its_row_invalid(doors, door, dtype, value):
    """Row 0 takes `value`, row 1 token 1: row 0 becomes invalid (and its
    mask at step 1 allows nothing), row 1 stays valid at token 1's child.
    Before the fix, int64 2**32 + 1 was read as token 1 and row 0 stayed
    valid, allowing [2, 4] at step 1."""
    tokens = np.array([value, 1], dtype)
    state = door(doors, tokens)
    assert np.asarray(state.valid).tolist() == [False, True]
    allowed = np.asarray(doors.c.mask(LOGITS, state, 1)) != SENTINEL_SCORE
    assert not allowed[0].any()
    assert np.flatnonzero(allowed[1]).tolist() == [2, 4]


def test_a_token_past_uint32_after_the_root_on_the_compiled_set():
    """Token 2**32 + 1 after the root (it must not act as token 1)."""
    c = sc.compile_constraints(ITEMS, vocab_size=V)
    for value in (2 ** 32 + 1, -2 ** 32 + 1):
        s = c.advance(c.init_processor(1), np.array([value], np.int64), 0)
        assert not bool(s.valid[0])
        assert (np.asarray(c.mask(np.zeros((1, V), np.float32), s, 1)) == SENTINEL_SCORE).all()


def test_a_wide_token_under_jax_x64_makes_its_row_invalid(doors):
    """A jax int64 array (x64 enabled) is narrowed on the device, row by row."""
    with jax.enable_x64(True):
        tokens = jnp.asarray([2 ** 32 + 1, 1], jnp.int64)
        for door in (ADVANCE_DOORS["c.advance"], ADVANCE_DOORS["c.advance traced step"],
                     ADVANCE_DOORS["proc.advance"], ADVANCE_DOORS["art.advance"]):
            assert np.asarray(door(doors, tokens).valid).tolist() == [False, True]


def test_a_jitted_advance_narrows_wide_tokens_on_the_device(doors):
    """Under jit (x64 on) the check is jnp code: no host read of the tokens."""
    with jax.enable_x64(True):
        fn = jax.jit(lambda s, tok: doors.c.advance(s, tok, 0))
        state = fn(doors.c.init_processor(B), jnp.asarray([2 ** 32 + 1, 1], jnp.int64))
        assert np.asarray(state.valid).tolist() == [False, True]


def test_prefix_mask_reads_a_wide_token_as_outside_the_vocabulary(doors):
    """`prefix_mask` (no checks: a token outside [0, V) allows nothing)."""
    prefixes = np.array([[2 ** 32 + 1], [1]], np.int64)
    ok = np.asarray(prefix_mask(doors.c.plan, doors.c.lowered.device_tables, prefixes))
    assert not ok[0].any() and np.flatnonzero(ok[1]).tolist() == [2, 4]


def test_a_state_node_past_int32_makes_its_row_invalid(doors):
    """A concrete node id past int32 is not a state: the row is invalid
    (as for any id that is not a state at that depth), never the state its
    low 32 bits name."""
    state = ps(node=np.array([2 ** 32, 0], np.int64))
    for door in (lambda s: doors.c.advance(s, np.array([1, 1]), 0),
                 lambda s: doors.proc.advance(s, np.array([1, 1]), 0),
                 lambda s: doors.art.advance(s, np.array([1, 1]), 0)):
        assert np.asarray(door(state).valid).tolist() == [False, True]


def test_item_index_reads_a_wide_token_as_no_item(doors):
    """item_index: a sequence not in the set is -1, one holding 2**32 + 1
    (low bits: token 1) included."""
    got = doors.c.item_index(np.array([[1, 2, 3], [2 ** 32 + 1, 2, 3], [7, 7, 7]], np.int64))
    assert got.tolist() == [0, -1, -1]


def test_nan_logits_are_not_allowed_tokens(doors):
    """NaN logits: documented as never allowed (masked to the sentinel), on
    every mask door, at the root where tokens 1 and 2 are allowed."""
    logits = np.full((B, V), np.nan, np.float32)
    logits[1, 2] = 0.5
    for out in (doors.c.mask(logits, doors.c.init_processor(B), 0),
                doors.proc.mask(logits, doors.proc.init_processor(), 0),
                doors.art.mask(logits, doors.art.init_processor(B), 0)):
        out = np.asarray(out)
        assert (out[0] == SENTINEL_SCORE).all()
        assert np.flatnonzero(out[1] != SENTINEL_SCORE).tolist() == [2]
