"""The PyTorch backend: `TorchConstraints` gives the JAX
backend's masks bit for bit (`allowed`, and the `mask` / `advance` pair) on
random live sets (every forced layout, capacity, removals, subsets, fixed
and variable length), loads an artifact with neither jax nor the compiler
imported, runs under torch.compile(fullgraph=True), rejects bad input as the
JAX processor does, and drives Hugging Face generate like the JAX backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given
from live_cases import CI_EXAMPLES, compile_case, fuzz_settings, live_cases, paths, updated

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints, TorchState, live_bits


def _prefixes(case, T: int, t: int, rng) -> np.ndarray:
    """Every length-t prefix of the case's paths, and random ones (some with
    tokens after the end token)."""
    found = sorted({p[:t] for p in paths(case.all_rows, case, T)} |
                   {tuple(int(x) for x in rng.integers(0, case.vocab, t)) for _ in range(4)})
    return np.asarray(found, np.int32).reshape(len(found), t)


@fuzz_settings(max(4, CI_EXAMPLES // 2))  # (each example compiles both backends: the slow profile runs 10x)
@given(live_cases())
def test_masks_match_jax(case):
    compiled = updated(compile_case(case), case)
    tc = TorchConstraints.from_compiled(compiled)
    T, V = compiled.max_length, case.vocab
    stacked = sc.stack_subsets([compiled.subset(m) for m in case.subsets])
    rng = np.random.default_rng(len(case.rows))
    for t in range(T):
        pre = _prefixes(case, T, t, rng)
        want = np.asarray(compiled.allowed(pre))
        assert np.array_equal(tc.allowed(torch.from_numpy(pre)).numpy(), want), ("live", t)
        pick = np.asarray([int(case.subset_index[i % len(case.subset_index)])
                           for i in range(pre.shape[0])], np.int32)
        want = np.asarray(compiled.allowed(pre, subset=stacked, subset_index=pick))
        got = tc.allowed(torch.from_numpy(pre), subset=stacked, subset_index=pick)
        assert np.array_equal(got.numpy(), want), ("subset", t)
    # The mask / advance pair along every path (and a few off-set tokens).
    drafts = np.asarray(paths(case.all_rows, case, T), np.int64)
    drafts[::3, -1] = rng.integers(0, V, drafts[::3].shape[0])
    n = drafts.shape[0]
    pick = np.asarray([int(case.subset_index[i % len(case.subset_index)]) for i in range(n)],
                      np.int32)
    for kwargs in ({}, dict(subset=stacked, subset_index=pick)):
        js, ts = compiled.init_processor(n), tc.init_processor(n)
        fused = cold = None  # processor_step's, with the last columns and without them
        for step in range(T):
            want = np.asarray(compiled.mask(np.zeros((n, V), np.float32), js, step, **kwargs))
            got = tc.allowed_tokens(ts, step, **kwargs).numpy()
            assert np.array_equal(got, want != sc.SENTINEL_SCORE), (step, kwargs.keys())
            last = None if step == 0 else torch.from_numpy(drafts[:, step - 1])
            fused = tc.processor_step(ts if fused is None else fused.state, step, tokens=last,
                                      columns=None if fused is None else fused.columns,
                                      **kwargs)
            cold = tc.processor_step(ts if cold is None else cold.state, step, tokens=last,
                                     **kwargs)
            for result in (fused, cold):
                assert np.array_equal(result.allowed.numpy(), got), (step, kwargs.keys())
                for a, b in zip(ts, result.state):
                    assert torch.equal(a, b), (step, kwargs.keys())
            tok = drafts[:, step]
            js = compiled.advance(js, tok.astype(np.int32), step, **kwargs)
            ts = tc.advance(ts, torch.from_numpy(tok), step, **kwargs)
            for a, b in zip(js, ts):
                assert np.array_equal(np.asarray(a), b.numpy()), (step, kwargs.keys())


def _updated_set():
    rng = np.random.default_rng(3)
    rows = [tuple(int(x) for x in rng.integers(1, 20, rng.integers(1, 5))) for _ in range(40)]
    compiled = sc.compile_constraints(rows, 20, end_token=0, export_subsets=True)
    remove = np.zeros(len(rows), bool)
    remove[::4] = True
    return rows, compiled.update(remove=remove)


def test_artifact_without_jax(tmp_path):
    """TorchConstraints.load in a fresh process: masks equal the compiled set's (its
    removals honoured), and neither jax nor the compiler got imported."""
    rows, version = _updated_set()
    version.save(tmp_path / "set.sc")
    pre = np.asarray([list(r[:2]) for r in rows if len(r) >= 2], np.int64)
    np.save(tmp_path / "pre.npy", pre)
    script = textwrap.dedent(f"""
        import sys, numpy as np, torch
        from static_compiler.torch_backend import TorchConstraints
        tc = TorchConstraints.load({str(tmp_path / 'set.sc')!r})
        pre = torch.from_numpy(np.load({str(tmp_path / 'pre.npy')!r}))
        np.save({str(tmp_path / 'got.npy')!r}, tc.allowed(pre).numpy())
        sub = tc.subset(np.arange({len(rows)}) % 2 == 0)
        np.save({str(tmp_path / 'sub.npy')!r}, tc.allowed(pre, subset=sub).numpy())
        bad = [m for m in sys.modules if m == 'jax' or m.startswith('jax.')
               or m.startswith('static_compiler.compile')
               or m.startswith('static_compiler.backend')]  # (the plan: lowered.plan)
        assert not bad, bad
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert np.array_equal(np.load(tmp_path / "got.npy"), np.asarray(version.allowed(pre)))
    want = np.asarray(version.allowed(pre, subset=version.subset(np.arange(len(rows)) % 2 == 0)))
    assert np.array_equal(np.load(tmp_path / "sub.npy"), want)


def test_torch_compile_fullgraph():
    rows, version = _updated_set()
    tc = TorchConstraints.from_compiled(version)
    bits = live_bits(version.subset(np.arange(len(rows)) % 3 == 0))

    def run(tokens, index):
        state = tc.init_processor(tokens.shape[0])
        masks = []
        for step in range(tokens.shape[1]):
            masks.append(tc.allowed_tokens(state, step))
            masks.append(tc.allowed_tokens(state, step, subset=bits, subset_index=index))
            logits = torch.zeros(tokens.shape[0], tc.vocab_size)
            masks.append(tc.mask(logits, state, step) != sc.SENTINEL_SCORE)
            state = tc.advance(state, tokens[:, step], step)
        fused = tc.processor_step(tc.init_processor(tokens.shape[0]), 0)
        for step in range(1, tokens.shape[1]):
            fused = tc.processor_step(fused.state, step, tokens=tokens[:, step - 1],
                                      columns=fused.columns)
            masks.append(fused.allowed)
        return torch.stack(masks), state

    tokens = torch.tensor([list(r[:2]) for r in rows if len(r) >= 2], dtype=torch.int64)
    index = torch.zeros(tokens.shape[0], dtype=torch.int64)
    want = run(tokens, index)
    got = torch.compile(run, fullgraph=True, backend="eager")(tokens, index)
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_bad_input():
    rows, version = _updated_set()
    tc = TorchConstraints.from_compiled(version)
    state = tc.init_processor(2)
    T = tc.max_length
    with pytest.raises(DecodeInputError, match="step"):
        tc.allowed_tokens(state, T)
    with pytest.raises(DecodeInputError, match="tokens have shape"):
        tc.advance(state, torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(DecodeInputError, match="tokens have shape"):
        tc.advance(state, torch.zeros(2), 0)
    with pytest.raises(DecodeInputError, match="prefixes have length"):
        tc.allowed(torch.zeros((1, T), dtype=torch.int64))
    with pytest.raises(DecodeInputError, match="prefixes have shape"):
        tc.allowed(torch.zeros((1, 1)))
    with pytest.raises(DecodeInputError, match=r"prefixes\[0, 0\]=20 is not a token"):
        tc.allowed(torch.full((1, 1), 20))
    with pytest.raises(DecodeInputError, match="subset_index without a subset"):
        tc.allowed_tokens(state, 0, subset_index=np.zeros(2, np.int32))
    stacked = sc.stack_subsets([version.subset(np.arange(len(rows)) % 2 == k) for k in (0, 1)])
    with pytest.raises(DecodeInputError, match="stacked subsets"):
        tc.allowed_tokens(state, 0, subset=stacked)
    with pytest.raises(DecodeInputError, match="expected a subset in"):
        tc.allowed_tokens(state, 0, subset=stacked, subset_index=np.array([0, 2], np.int32))
    with pytest.raises(DecodeInputError, match="state"):
        tc.allowed_tokens((state.node,), 0)
    assert isinstance(tc.advance(state, np.array([1, 2]), 0), TorchState)


def test_processor_step_refuses_columns_of_another_state_step_or_subset():
    rows, version = _updated_set()
    tc = TorchConstraints.from_compiled(version)
    subset = version.subset(np.arange(len(rows)) % 2 == 0)
    first = tc.processor_step(tc.init_processor(2), 0)
    token = first.allowed.float().argmax(dim=1)
    assert tc.plan.steps[0].kind == "dense_rows"  # (its allowed is the columns' valid)
    first.allowed.zero_()  # the caller's to write: the next call's advance is unchanged
    with pytest.raises(DecodeInputError, match="tokens at step 0"):
        tc.processor_step(first.state, 0, tokens=token)
    with pytest.raises(DecodeInputError, match="columns without tokens"):
        tc.processor_step(first.state, 1, columns=first.columns)
    with pytest.raises(DecodeInputError, match="columns is a tuple: expected the RowColumns"):
        tc.processor_step(first.state, 1, tokens=token, columns=tuple(first.columns)[:2])
    with pytest.raises(DecodeInputError, match="another state"):
        tc.processor_step(tc.init_processor(2), 1, tokens=token, columns=first.columns)
    with pytest.raises(DecodeInputError, match=r"at step 2 \(they are of step 1\)"):
        second = tc.processor_step(first.state, 1, tokens=token, columns=first.columns)
        tc.processor_step(second.state, 3, tokens=token, columns=second.columns)
    with pytest.raises(DecodeInputError, match="another subset"):
        tc.processor_step(first.state, 1, tokens=token, columns=first.columns, subset=subset)
    with pytest.raises(DecodeInputError, match="tokens have shape"):
        tc.processor_step(first.state, 1, tokens=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(DecodeInputError, match="step"):
        tc.processor_step(first.state, tc.max_length)
    again = tc.processor_step(first.state, 1, tokens=token, columns=first.columns)
    cold = tc.processor_step(first.state, 1, tokens=token)
    assert torch.equal(again.allowed, cold.allowed) and \
        all(torch.equal(a, b) for a, b in zip(again.state, cold.state))


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_generate_same_with_both_backends(kind):
    """HF generate on a tiny GPT-2 (beam search and greedy) gives the same
    sequences with backend="torch" as with backend="jax", on an updated set
    (removals) and with a subset per prompt; from an artifact too."""
    import transformers
    from integrations.test_integration_torch import EOS, MODEL_VOCAB, PROMPT_LENGTH, SET_VOCAB, make_set

    from static_compiler.integrations.torch import StaticLogitsProcessor

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=MODEL_VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=2, bos_token_id=EOS, eos_token_id=EOS,
                                     pad_token_id=EOS)
    model = transformers.GPT2LMHeadModel(config).eval()
    items, end_token = make_set(kind)
    compiled = sc.compile_constraints(items, SET_VOCAB, end_token=end_token,
                                      export_subsets=True)
    compiled = compiled.update(remove=np.arange(len(items)) % 5 == 0)
    prompts = torch.from_numpy(np.random.default_rng(8).integers(1, MODEL_VOCAB,
                                                                 (2, PROMPT_LENGTH)))
    stacked = sc.stack_subsets([compiled.subset(np.arange(len(items)) % 2 == k) for k in (0, 1)])
    extra = {} if end_token is not None else dict(eos_token_id=None)
    for search in (dict(num_beams=4, num_return_sequences=4), dict(do_sample=False)):
        for sub in ({}, dict(subset=stacked, subset_index=np.array([1, 0]))):
            outs = []
            for backend in ("jax", "torch"):
                proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=backend, **sub)
                assert proc.backend == backend
                outs.append(model.generate(prompts, max_new_tokens=compiled.max_length,
                                           logits_processor=[proc], attention_mask=torch.ones_like(prompts),
                                           **search, **extra))
            assert torch.equal(outs[0], outs[1]), (search, sub.keys())
    with pytest.raises(DecodeInputError, match="not a multiple"):
        proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="torch", subset=stacked,
                                     subset_index=np.array([1, 0]))
        proc(torch.zeros((3, PROMPT_LENGTH), dtype=torch.long), torch.zeros((3, MODEL_VOCAB)))
    with pytest.raises(DecodeInputError, match="max_length"):
        proc = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="torch")
        T = PROMPT_LENGTH + compiled.max_length
        proc(torch.zeros((2, T), dtype=torch.long), torch.zeros((2, MODEL_VOCAB)))
    with pytest.raises(DecodeInputError, match="scores: logits have shape"):
        proc(torch.zeros((2, PROMPT_LENGTH), dtype=torch.long), torch.zeros((2, 3)))
    with pytest.raises(DecodeInputError, match="backend"):
        StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend="tf")
