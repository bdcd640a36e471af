"""`static_compiler.integrations.vllm.beam_search` on a real `vllm.LLM`
(the tiny random Llama of tools/tiny_llama, one engine for the module)
against `TorchConstraints.beam_search` run with the same weights through
transformers on the CPU: the same beams (tokens), scores within float
noise, every beam a member, for a name catalogue (time-zone names, compiled
with the model's tokenizer, an end token) and a Semantic-ID-like set
(fixed length, up to 200 candidates a step: several engine requests a
beam), two requests with different sets in one call, a filter and a named
subset, and the arguments it refuses. Skipped without vllm
(scripts/test-vllm.sh runs it)."""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("vllm")


import torch  # noqa: E402

import static_compiler as sc  # noqa: E402
from static_compiler.errors import DecodeInputError  # noqa: E402
from static_compiler.integrations.vllm import sets  # noqa: E402
from static_compiler.integrations.vllm.beam_search import beam_search, check_engine  # noqa: E402
from static_compiler.integrations.vllm.sets import register_set  # noqa: E402
from static_compiler.torch_backend import TorchConstraints  # noqa: E402

SCORE_TOLERANCE = 2e-4  # vLLM's CPU forward vs transformers', float32, a few steps summed
PROMPTS = ("Time zone: ", "Code 7: ")


@pytest.fixture(scope="module")
def llm(tiny_model):
    from vllm import LLM
    engine = LLM(str(tiny_model), dtype="float32", gpu_memory_utilization=0.05,
                 max_model_len=256, enforce_eager=True, enable_prefix_caching=True)
    yield engine
    del engine


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def codes(tmp_path_factory):
    """A Semantic-ID-like set: 3-token codes over tokens [3, 203), no end
    token, registered as "beam-codes"; its items."""
    rng = np.random.default_rng(0)
    rows = np.unique(rng.integers(3, 203, (3000, 3)), axis=0)
    path = tmp_path_factory.mktemp("codes") / "codes"
    sc.compile_constraints(rows, vocab_size=512).save(path, modules=False)
    register_set("beam-codes", path)
    yield path, {tuple(int(t) for t in row) for row in rows}
    # (registered for this module only: a processor built later in the same
    # process checks every registered set against its own model)
    sets._REGISTERED.pop("beam-codes", None)


def expected(reference, tokenizer, prompt: str, tc: TorchConstraints, beam_size: int,
             subset=None, length_penalty: float = 0.0):
    """TorchConstraints.beam_search with the transformers model's logits (the
    whole context re-run each step: a carry of token ids per beam)."""
    ids = torch.tensor(tokenizer.encode(prompt))

    def logits_fn(last, step, carry):
        if step:
            carry = torch.cat([carry, last[..., None]], dim=-1)
        B, M, L = carry.shape
        with torch.no_grad():
            logits = reference(carry.reshape(B * M, L)).logits[:, -1].float()
        return logits.reshape(B, M, -1), carry

    carry = ids.expand(1, beam_size, len(ids)).clone()
    reorder = lambda c, parent: c.gather(1, parent[..., None].expand(c.shape))
    return tc.beam_search(logits_fn, 1, beam_size, carry=carry, reorder=reorder, subset=subset,
                          length_penalty=length_penalty)


def assert_same(out, want):
    valid = want.valid[0]
    assert bool(valid.any())
    assert torch.equal(out.result.valid[0], valid)
    assert torch.equal(out.result.tokens[0][valid], want.tokens[0][valid])
    assert torch.equal(out.result.lengths[0][valid], want.lengths[0][valid])
    assert torch.allclose(out.result.scores[0][valid], want.scores[0][valid], rtol=0,
                          atol=SCORE_TOLERANCE)
    assert [b.score for b in out.beams] == out.result.scores[0][valid].tolist()


def test_name_catalogue_and_codes_in_one_call(llm, reference, catalogues, codes):
    """Two requests over different sets in one call: time-zone names (with
    an end token; every beam a name, its text the name) and the codes
    (fixed length, up to 200 candidates a beam: split over several engine
    requests), each the beams of our own search on the same weights."""
    tokenizer = llm.get_tokenizer()
    tz = catalogues["tz"]
    outs = beam_search(llm, list(PROMPTS), beam_size=4,
                       options=[{"sc_set": str(tz.path)}, {"sc_set": "beam-codes"}])
    assert_same(outs[0], expected(reference, tokenizer, PROMPTS[0],
                                  TorchConstraints.load(tz.path), 4))
    assert_same(outs[1], expected(reference, tokenizer, PROMPTS[1],
                                  TorchConstraints.load(codes[0]), 4))
    assert len(outs[0].beams) == len(outs[1].beams) == 4
    for beam in outs[0].beams:
        assert beam.text in tz.names and tuple(beam.token_ids) in tz.items()
    for beam in outs[1].beams:
        assert tuple(beam.token_ids) in codes[1] and beam.text is None


def test_filter_named_subset_and_length_penalty(llm, reference, catalogues):
    """sc_where (a filter over the items' attributes) and sc_subset (a bool
    attribute column) hold each request to its items (two requests with the
    same filter and other prompts: one search of two rows); with a length
    penalty the beams are re-ranked as our search ranks them."""
    tokenizer = llm.get_tokenizer()
    tz = catalogues["tz"]
    ref = TorchConstraints.load(tz.path)
    later = {"sc_set": str(tz.path), "sc_where": "idx >= 20 and not america"}
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    outs = beam_search(llm, prompts, beam_size=3, length_penalty=0.6,
                       options=[later, {"sc_set": str(tz.path), "sc_subset": "america"}, later])
    idx, america = np.arange(len(tz.names)), np.array([n.startswith("America/")
                                                        for n in tz.names])
    keeps = [(idx >= 20) & ~america, america, (idx >= 20) & ~america]
    for out, prompt, keep in zip(outs, prompts, keeps):
        assert_same(out, expected(reference, tokenizer, prompt, ref, 3, ref.subset(keep), 0.6))
        assert all(tuple(b.token_ids) in tz.items(keep) for b in out.beams)
    assert outs[0].beams != outs[2].beams


def test_bad_arguments(llm, catalogues):
    """Refused before any step, naming the value: beam_size, the length
    penalty, a missing or unknown set, an unknown option or subset, a
    prefix, a bad prompt; an engine without the settings the driver needs."""
    tz = {"sc_set": str(catalogues["tz"].path)}
    cases = [
        (dict(beam_size=0, options=tz), "beam_size=0: expected an int >= 1"),
        (dict(beam_size=2.0, options=tz), "beam_size=2.0"),
        (dict(beam_size=2, options=tz, length_penalty=float("nan")), "length_penalty=nan"),
        (dict(beam_size=2, options={}), r"request 0\): options \{\}: no sc_set"),
        (dict(beam_size=2, options={"sc_set": "nope"}), "sc_set='nope': expected the path"),
        (dict(beam_size=2, options={**tz, "sc_wher": "x"}), "sc_wher='x': not a key"),
        (dict(beam_size=2, options={**tz, "sc_subset": "x"}), "no named subset 'x'"),
        (dict(beam_size=2, options={**tz, "sc_prefix": [5]}), r"sc_prefix=\[5\]: the beam"),
        (dict(beam_size=2, options=[tz, tz]), "one dict per prompt"),
    ]
    for kwargs, message in cases:
        with pytest.raises(DecodeInputError, match=message):
            beam_search(llm, [PROMPTS[0]], **kwargs)
    assert beam_search(llm, [], beam_size=2, options=[]) == []
    with pytest.raises(DecodeInputError, match=r"prompt \[\]: expected"):
        beam_search(llm, [[]], beam_size=2, options=tz)
    config = llm.llm_engine.vllm_config

    def engine(mode, caching):
        return types.SimpleNamespace(llm_engine=types.SimpleNamespace(
            vllm_config=types.SimpleNamespace(
                model_config=types.SimpleNamespace(logprobs_mode=mode),
                cache_config=types.SimpleNamespace(enable_prefix_caching=caching))))

    check_engine(engine(config.model_config.logprobs_mode,
                        config.cache_config.enable_prefix_caching))
    for mode in ("processed_logprobs", "raw_logits", "processed_logits"):
        with pytest.raises(DecodeInputError, match=f"logprobs_mode='{mode}', expected "
                                                   "'raw_logprobs'"):
            check_engine(engine(mode, True))
    with pytest.raises(DecodeInputError, match="enable_prefix_caching=False, expected True"):
        check_engine(engine("raw_logprobs", False))
    with pytest.raises(DecodeInputError, match="expected a vllm.LLM"):
        beam_search(object(), [PROMPTS[0]], beam_size=2, options=tz)
