"""The Hugging Face processor compiles at most once per generate shape:
the jax backend runs one XLA program per (row count, model
vocabulary) for every prefix length, so a generate of 8 new tokens compiles
what one of 2 compiles, a second generate of the same shape compiles
nothing, and after `warm` the first generate compiles nothing either. The
masks stay bit for bit those of `allowed` (per-length programs) and generate
returns the same sequences on both backends and HF's dict-trie reference.
Compilations are counted from jax's own compile events
(`static_compiler.jax_support.compile_events`).
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
import torch
import transformers
from test_integration_torch import PROMPT_LENGTH, SET_VOCAB, make_set, reference_fn

import static_compiler as sc
from static_compiler.backend.decode import engine
from static_compiler.backend.decode.live import subset_live_mask
from static_compiler.backend.decode.prefix import allowed, padded_prefix_mask
from static_compiler.errors import DecodeInputError
from static_compiler.integrations.torch import StaticLogitsProcessor, default_backend
from static_compiler.jax_support.compile_events import CompileCounter
from static_compiler.support.decode_types import WarmReport
from static_compiler.torch_backend import TorchConstraints

MODEL_VOCAB = 64
LENGTH = 5  # the fixed-length set's items: generate runs all 5 steps (no eos)


@pytest.fixture(scope="module")
def model():
    """A tiny random GPT-2 with no eos (generate runs max_new_tokens steps)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=MODEL_VOCAB, n_positions=32, n_embd=32,
                                     n_layer=2, n_head=2, bos_token_id=0, eos_token_id=None,
                                     pad_token_id=0)
    m = transformers.GPT2LMHeadModel(config).eval()
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return m


@pytest.fixture(scope="module")
def fixed():
    """(items, compiled): 60 random items of LENGTH tokens over 1..SET_VOCAB-1."""
    rng = np.random.default_rng(40)
    rows = rng.integers(1, SET_VOCAB, (60, LENGTH))
    items = sorted({tuple(int(t) for t in row) for row in rows})
    return items, sc.compile_constraints(items, SET_VOCAB)


@pytest.fixture
def cold():
    """A new jitted program for the jax backend: its first call compiles."""
    engine._padded_allowed.cache_clear()  # (what the compiled set's `allowed` runs)
    yield
    engine._padded_allowed.cache_clear()


def run(model, processor, prompts, beams, new_tokens):
    """(sequences, XLA compilations of the call)."""
    counter = CompileCounter()
    with torch.no_grad(), counter.counting():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), num_beams=beams,
                             num_return_sequences=beams, max_new_tokens=new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0,
                             logits_processor=[processor])
    return out, counter.count


def prompts(batch, seed=1):
    return torch.from_numpy(np.random.default_rng(seed).integers(1, MODEL_VOCAB,
                                                                 (batch, PROMPT_LENGTH)))


@pytest.mark.parametrize("beams", [4, 1])
def test_compilations_do_not_grow_with_steps(model, fixed, cold, beams):
    """jax backend: a generate of LENGTH new tokens compiles as many programs as
    one of 2 (one: a new row count), and a second generate of either length
    and the same shape compiles nothing."""
    items, compiled = fixed
    counts = {}
    for new_tokens, batch in ((2, 2), (LENGTH, 3)):  # a new row count each: a cold program
        proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="jax")
        out, counts[new_tokens] = run(model, proc, prompts(batch), beams, new_tokens)
        assert out.shape == (batch * beams, PROMPT_LENGTH + new_tokens)
        assert proc.compilations() == counts[new_tokens]
        again, n = run(model, proc, prompts(batch, seed=2), beams, new_tokens)
        assert n == 0 and proc.compilations() == counts[new_tokens]
    assert counts[LENGTH] == counts[2] == 1
    assert set(map(tuple, out[:, PROMPT_LENGTH:].tolist())) <= set(items)


def test_warm_then_generate_compiles_nothing(model, fixed, cold):
    """`warm` for generate's row counts (greedy: batch, beams: batch x beams)
    compiles their programs; generate then compiles nothing, and returns what
    the torch backend and HF's dict trie return."""
    items, compiled = fixed
    proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="jax")
    assert proc.compilations() == 0
    report = proc.warm([8, 2, 8], model_vocab_size=MODEL_VOCAB)
    assert isinstance(report, WarmReport) and report.batch_sizes == (2, 8)
    assert report.compilations == 2 == proc.compilations() and report.calls == 2
    assert proc.warm(8, model_vocab_size=MODEL_VOCAB).compilations == 0  # already there
    torch_proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="torch")
    report = torch_proc.warm([2, 8], model_vocab_size=MODEL_VOCAB)
    assert report.compilations == 0 and report.calls == 2 * compiled.max_length
    for beams in (4, 1):
        got, n = run(model, proc, prompts(2), beams, LENGTH)
        assert n == 0
        want, n = run(model, torch_proc, prompts(2), beams, LENGTH)
        assert n == 0 and torch.equal(got, want)
        with torch.no_grad():
            trie = model.generate(prompts(2), attention_mask=torch.ones_like(prompts(2)),
                                  num_beams=beams, num_return_sequences=beams,
                                  max_new_tokens=LENGTH, do_sample=False, eos_token_id=None,
                                  pad_token_id=0,
                                  prefix_allowed_tokens_fn=reference_fn(items, None))
        assert torch.equal(got, trie)
    assert proc.compilations() == 2 and torch_proc.compilations() == 0


def test_default_backend_is_torch(fixed):
    """Chosen by measurement (docs/integrations.md): no compile on the first call."""
    _, compiled = fixed
    assert default_backend(compiled) == "torch"
    assert StaticLogitsProcessor(compiled, PROMPT_LENGTH).backend == "torch"


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_padded_prefix_mask_is_allowed_bit_for_bit(kind):
    """One program for every length gives, at each length t, exactly the
    per-t program's mask, on random prefixes (members' prefixes, finished
    items padded with the end token, unknown and out-of-range tokens), with
    and without a subset per row."""
    import jax

    items, end_token = make_set(kind)
    compiled = sc.compile_constraints(items, SET_VOCAB, end_token=end_token, export_subsets=True)
    plan, tables, M = compiled.plan, compiled.lowered.device_tables, compiled.max_length
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(24):
        item = list(items[rng.integers(len(items))]) + ([end_token] if end_token is not None
                                                        else [])
        rows.append((item + [end_token if end_token is not None else 1] * M)[:M])
    rows = np.asarray(rows, np.int64)
    rows[2::5, 1] = rng.integers(1, SET_VOCAB, len(rows[2::5]))  # mostly unknown prefixes
    rows[::6, 0] = -2  # out of range (clipped for `allowed`, which raises on them)
    rows[3::6, 0] = SET_VOCAB + 1
    stacked = sc.stack_subsets([compiled.subset(rng.random(len(items)) < p) for p in (0.3, 0.7)])
    index = np.arange(len(rows)) % 2
    one = jax.jit(padded_prefix_mask, static_argnums=0)
    tc = TorchConstraints.from_compiled(compiled)  # eager torch: no program per t to compile
    clipped = np.clip(rows, 0, SET_VOCAB - 1)
    for sub in (None, stacked):
        live = None if sub is None else subset_live_mask(sub, compiled.fingerprint, index,
                                                                   len(rows), "test")
        for t in range(M):
            got = np.asarray(one(plan, tables, clipped.astype(np.int32), np.int32(t), live))
            want = tc.allowed(clipped[:, :t], subset=sub, subset_index=None if sub is None
                              else index).numpy()
            assert np.array_equal(got, want), (sub is None, t)
        # and the per-length jax program at the deepest step
        assert np.array_equal(got, np.asarray(allowed(plan, tables, clipped[:, :M - 1], live)))
        if sub is None and end_token is None:  # a member's prefix: what the oracle allows
            want = oracle.ConstraintSet(items, SET_VOCAB, end_token).allowed(
                tuple(clipped[1, :M - 1]))
            assert np.flatnonzero(got[1]).tolist() == sorted(want)
    with_bad = rows.astype(np.int32)  # out-of-range tokens: the row allows nothing
    got = np.asarray(one(plan, tables, with_bad, np.int32(M - 1), None))
    bad = (rows[:, 0] < 0) | (rows[:, 0] >= SET_VOCAB)
    assert bad.sum() == 8 and not got[bad].any() and got[~bad].any()


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("args, match", [
    (dict(batch_rows=0), r"batch_rows=0, expected a positive int"),
    (dict(batch_rows=[]), r"batch_rows=\[\], expected a positive int"),
    (dict(batch_rows="4"), r"batch_rows='4'"),
    (dict(batch_rows=[2, 1.5]), r"batch_rows=\[2, 1.5\]"),
    (dict(batch_rows=2, model_vocab_size=SET_VOCAB - 1),
     rf"model_vocab_size={SET_VOCAB - 1}, expected an int >= the set's vocab_size {SET_VOCAB}"),
    (dict(batch_rows=2, model_vocab_size=64.0), r"model_vocab_size=64.0"),
])
def test_warm_rejects_bad_arguments(fixed, backend, args, match):
    _, compiled = fixed
    proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=backend)
    with pytest.raises(DecodeInputError, match=r"StaticLogitsProcessor.warm: " + match):
        proc.warm(**args)


def test_warm_checks_rows_against_the_subset_index(fixed):
    items, compiled = fixed
    stacked = sc.stack_subsets([compiled.subset(np.arange(len(items)) % 2 == k) for k in (0, 1)])
    for backend in ("jax", "torch"):
        proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=stacked,
                                     subset_index=[1, 0], backend=backend)
        with pytest.raises(DecodeInputError, match="3 rows are not a multiple of the 2 prompts"):
            proc.warm(3)
        proc.warm(4)
