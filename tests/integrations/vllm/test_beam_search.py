"""`static_compiler.integrations.vllm.beam_search` on a real `vllm.LLM`
(the tiny random Llama of tools/tiny_llama, one engine for the module)
against `TorchConstraints.beam_search` run with the same weights through
transformers on the CPU: the same beams (tokens), scores within float
noise, every beam a member, for a name catalogue (time-zone names, compiled
with the model's tokenizer, an end token) and a Semantic-ID-like set
(fixed length, over 128 candidates at a step: several requests a beam),
two requests with different sets in one call, a filter and a named subset,
and the arguments it refuses. Skipped without vllm (scripts/test-vllm.sh
runs it)."""

from __future__ import annotations

import subprocess
import sys
import types
import zoneinfo

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from helpers import REPO  # noqa: E402

import static_compiler as sc  # noqa: E402
from static_compiler.errors import DecodeInputError  # noqa: E402
from static_compiler.integrations.vllm.beam_search import beam_search, check_engine  # noqa: E402
from static_compiler.torch_backend import TorchConstraints  # noqa: E402

SCORE_TOLERANCE = 2e-4  # vLLM's CPU forward vs transformers', float32, a few steps summed
PROMPTS = ("Time zone: ", "Code 7: ")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model, built as users build it (python -m tools.tiny_llama)."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([sys.executable, "-m", "tools.tiny_llama", str(out)], cwd=REPO, check=True,
                   timeout=300)
    return out


@pytest.fixture(scope="module")
def llm(model_dir):
    from vllm import LLM
    engine = LLM(str(model_dir), dtype="float32", gpu_memory_utilization=0.05, max_model_len=256,
                 enforce_eager=True, enable_prefix_caching=True)
    yield engine
    del engine


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def sets(model_dir, tmp_path_factory):
    """Artifacts in a temporary folder: "tz" the time-zone names (with their
    region as an attribute, subsets exported), "sid" 3-token codes over
    tokens [3, 203) (no end token)."""
    out = tmp_path_factory.mktemp("sets")
    names = sorted(zoneinfo.available_timezones())  # (tools.tiny_llama.timezone_names())
    tz = sc.compile_constraints(names, tokenizer=str(model_dir / "tokenizer.json"),
                                export_subsets=True,
                                attributes={"region": [n.split("/")[0] for n in names]})
    tz.save(str(out / "tz.sc"))
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(3, 203, (3000, 3)), axis=0)
    sid = sc.compile_constraints(codes, vocab_size=512)
    sid.save(str(out / "sid.sc"))
    return {"tz": str(out / "tz.sc"), "sid": str(out / "sid.sc"), "names": names,
            "codes": {tuple(int(t) for t in row) for row in codes}}


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


def test_name_catalogue_and_codes_in_one_call(llm, reference, sets):
    """Two requests over different sets in one call: the time-zone names
    (with an end token; every beam a name, its text the name) and the codes
    (fixed length, up to 200 candidates a beam: split over several engine
    requests), each the beams of our own search on the same weights."""
    tokenizer = llm.get_tokenizer()
    outs = beam_search(llm, list(PROMPTS), beam_size=4,
                       options=[{"sc_set": "tz"}, {"sc_set": sets["sid"]}],
                       sets={"tz": sets["tz"]})
    tz, sid = TorchConstraints.load(sets["tz"]), TorchConstraints.load(sets["sid"])
    assert_same(outs[0], expected(reference, tokenizer, PROMPTS[0], tz, 4))
    assert_same(outs[1], expected(reference, tokenizer, PROMPTS[1], sid, 4))
    assert len(outs[0].beams) == len(outs[1].beams) == 4
    for beam in outs[0].beams:
        assert beam.text in sets["names"]
        assert tokenizer.decode(beam.token_ids) == beam.text
    for beam in outs[1].beams:
        assert tuple(beam.token_ids) in sets["codes"] and beam.text is None


def test_filter_named_subset_and_length_penalty(llm, reference, sets):
    """sc_where (a filter over the items' attributes) and sc_subset (a
    registered Subset) hold each request to its items (two requests with
    the same filter and other prompts: one search of two rows); with a
    length penalty the beams are re-ranked as our search ranks them."""
    tokenizer = llm.get_tokenizer()
    tz = TorchConstraints.load(sets["tz"])
    asia = tz.subset(np.array([n.startswith("Asia/") for n in sets["names"]]))
    europe = {"sc_set": "tz", "sc_where": "region == 'Europe'"}
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    outs = beam_search(llm, prompts, beam_size=3, length_penalty=0.6,
                       options=[europe, {"sc_set": "tz", "sc_subset": "asia"}, europe],
                       sets={"tz": tz}, subsets={"asia": asia})
    subsets = [tz.subset(where="region == 'Europe'"), asia, tz.subset(where="region == 'Europe'")]
    for out, prompt, subset, region in zip(outs, prompts, subsets, ("Europe", "Asia", "Europe")):
        assert_same(out, expected(reference, tokenizer, prompt, tz, 3, subset, 0.6))
        assert all(b.text.startswith(f"{region}/") for b in out.beams)
    assert outs[0].beams != outs[2].beams


def test_bad_arguments(llm, sets):
    """Refused before any step, naming the value: beam_size, the length
    penalty, a missing or unknown set, an unknown option or subset, a bad
    prompt; an engine without the settings the driver needs."""
    tz = {"sc_set": sets["tz"]}
    cases = [
        (dict(beam_size=0, options=tz), "beam_size=0: expected an int >= 1"),
        (dict(beam_size=2.0, options=tz), "beam_size=2.0"),
        (dict(beam_size=2, options=tz, length_penalty=float("nan")), "length_penalty=nan"),
        (dict(beam_size=2, options={}), r"request 0\): no sc_set"),
        (dict(beam_size=2, options={"sc_set": "nope"}), "sc_set='nope': neither a registered"),
        (dict(beam_size=2, options={**tz, "sc_wher": "x"}), r"unknown option\(s\) \['sc_wher'\]"),
        (dict(beam_size=2, options={**tz, "sc_subset": "x"}), "sc_subset='x': not a registered"),
        (dict(beam_size=2, options=[tz, tz]), "one dict per prompt"),
    ]
    for kwargs, message in cases:
        with pytest.raises(DecodeInputError, match=message):
            beam_search(llm, [PROMPTS[0]], **kwargs)
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
