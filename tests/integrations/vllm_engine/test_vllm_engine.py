"""`StaticLogitsProcessor` in a real vLLM engine (`vllm.LLM` on the tiny
Llama, CPU, the V1 model runner): requests that opt in and requests that do
not share batches; greedy and sampled outputs are members of each request's
set, subset or filter; a prefix continues inside the set; an artifact
updated while requests run is seen by new requests only; bad extra_args
are refused at admission naming the key. One engine for the module."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil

import numpy as np
import pytest
from vllm_cases import EOS

pytest.importorskip("vllm")
import vllm  # noqa: E402

import static_compiler as sc  # noqa: E402
from static_compiler.integrations.vllm import StaticLogitsProcessor  # noqa: E402
from static_compiler.integrations.vllm import processor as processor_lib  # noqa: E402
from static_compiler.integrations.vllm.sets import RANKED_ENV  # noqa: E402

REFUSED = vllm.exceptions.VLLMValidationError  # (HTTP 400 when served)

PROMPTS = ["Zone:", "Where", "x", "Hello there"]


@pytest.fixture(scope="module")
def llm(tiny_model):
    """The engine, its filters ranked on sets of 250 rows or more (in both
    processes): synth's (300) are ranked subsets, tz's (200) `Subset`s."""
    before = os.environ.get(RANKED_ENV)
    os.environ[RANKED_ENV] = "250"
    engine = vllm.LLM(str(tiny_model), dtype="float32", gpu_memory_utilization=0.05,
                      max_model_len=256, enforce_eager=True, seed=0,
                      logits_processors=[StaticLogitsProcessor])
    yield engine
    del engine
    if before is None:
        del os.environ[RANKED_ENV]
    else:
        os.environ[RANKED_ENV] = before


def params(catalogue=None, n=1, temperature=0.0, max_tokens=32, seed=None, **keys):
    extra = {f"sc_{k}": v for k, v in keys.items()}
    if catalogue is not None:
        extra["sc_set"] = str(catalogue.path)
    return vllm.SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed,
                               extra_args=extra or None, logprobs=1)


def assert_members(output, items, prefix=()):
    """Every completion of `output` is an item of `items` (token tuples)
    followed by the end of sequence."""
    for completion in output.outputs:
        ids = list(completion.token_ids)
        assert completion.finish_reason == "stop" and ids[-1] == EOS, (completion, ids)
        assert tuple(prefix) + tuple(ids[:-1]) in items, (completion.text, ids)


def test_opted_in_and_untouched_requests_share_a_batch(llm, catalogues):
    tz = catalogues["tz"]
    alone = llm.generate(PROMPTS[1:2], params(max_tokens=12))[0].outputs[0]
    mixed = llm.generate(PROMPTS, [params(tz), params(max_tokens=12), params(tz, where="america"),
                                   params(max_tokens=12)])
    assert_members(mixed[0], tz.items())
    assert_members(mixed[2], tz.items([n.startswith("America/") for n in tz.names]))
    untouched = mixed[1].outputs[0]
    # the same tokens and log-probabilities as alone (the processor never touches its row)
    assert list(untouched.token_ids) == list(alone.token_ids)
    assert [list(p.values())[0].logprob for p in untouched.logprobs] == \
        [list(p.values())[0].logprob for p in alone.logprobs]
    assert tuple(alone.token_ids[:-1]) not in tz.items()  # (unconstrained: not a member)


def test_sampled_outputs_are_members_of_each_requests_set_subset_or_filter(llm, catalogues):
    tz, synth = catalogues["tz"], catalogues["synth"]
    idx = np.arange(len(tz.names))
    requests = [
        (params(tz, n=4, temperature=1.0, seed=1), tz.items()),
        (params(synth, n=4, temperature=1.0, seed=2), synth.items()),
        (params(tz, n=4, temperature=1.0, seed=3, subset="america"),
         tz.items([n.startswith("America/") for n in tz.names])),
        (params(tz, n=4, temperature=1.0, seed=4, where="idx >= 30 and not america"),
         tz.items((idx >= 30) & ~np.array([n.startswith("America/") for n in tz.names]))),
        (params(synth, where="idx < 10"), synth.items(np.arange(300) < 10)),
    ]
    outputs = llm.generate(PROMPTS + PROMPTS[:1], [p for p, _ in requests])
    distinct = set()
    for output, (_, items) in zip(outputs, requests):
        assert_members(output, items)
        distinct |= {tuple(c.token_ids) for c in output.outputs}
    assert len(distinct) > 5  # (sampling: not one answer for all)
    # admission (this process) made synth's filter a ranked subset, tz's a Subset
    forms = {(key[2], type(subset).__name__)
             for key, (_, subset) in processor_lib._FRONT._subsets.items()}
    assert {("idx < 10", "RankedSubset"), ("idx >= 30 and not america", "Subset")} <= forms


def test_a_prefix_continues_inside_the_set(llm, catalogues):
    tz = catalogues["tz"]
    item = tz.ids[tz.names.index("Africa/Nairobi")]
    prefix = item[:2]
    out = llm.generate(PROMPTS[:1], params(tz, prefix=prefix, n=3, temperature=1.0, seed=5))[0]
    assert_members(out, tz.items(), prefix)
    bad = prefix + [EOS]
    with pytest.raises(REFUSED, match=re.escape(f"sc_prefix={bad}: not a prefix")):
        llm.generate(PROMPTS[:1], params(tz, prefix=bad))


def test_a_set_without_end_token_and_a_set_with_another_end(llm, catalogues):
    fixed, other = catalogues["fixed"], catalogues["other_end"]
    out = llm.generate(PROMPTS[:2], [params(fixed, n=2, temperature=1.0, seed=6), params(other)])
    for completion in out[0].outputs:  # an item, then only the model's end of sequence
        ids = list(completion.token_ids)
        assert tuple(ids[:3]) in fixed.items() and ids[3:] == [EOS], ids
    # a set whose end token is not the model's: the request ends at once (logged)
    assert list(out[1].outputs[0].token_ids) == [EOS]


@pytest.mark.parametrize("extra, names", [
    ({"sc_sett": "x"}, ["sc_sett='x'", "expected one of"]),
    ({"sc_set": "/no/such/set"}, ["sc_set='/no/such/set'", "registered set name"]),
    ({"sc_where": "america"}, ["sc_where='america'", "without sc_set"]),
    ({"sc_set": "TZ", "sc_where": "colour > 1"}, ["sc_where='colour > 1'", "unknown attribute"]),
    ({"sc_set": "TZ", "sc_subset": "idx"}, ["sc_subset='idx'", "no named subset"]),
    ({"sc_set": "TZ", "sc_where": "idx > 1000"}, ["sc_where='idx > 1000'", "selects no item"]),
    ({"sc_set": "TZ", "sc_prefix": [511, 511]}, ["sc_prefix=[511, 511]", "not a prefix"]),
    ({"sc_set": "TZ", "sc_prefix": "1"}, ["sc_prefix='1'", "list of token ids"]),
])
def test_bad_extra_args_are_refused_at_admission(llm, catalogues, extra, names):
    extra = {k: (str(catalogues["tz"].path) if v == "TZ" else v) for k, v in extra.items()}
    with pytest.raises(REFUSED) as err:
        llm.generate(PROMPTS[:1], vllm.SamplingParams(max_tokens=8, extra_args=extra))
    for name in names:
        assert name in str(err.value)


def test_options_that_could_forbid_every_allowed_token_are_refused(llm, catalogues):
    with pytest.raises(REFUSED, match=r"sc_set=.* with min_tokens=2: expected no min_tokens"):
        llm.generate(PROMPTS[:1], vllm.SamplingParams(
            max_tokens=8, min_tokens=2, extra_args={"sc_set": str(catalogues["tz"].path)}))


def test_an_update_on_disk_reaches_new_requests_not_running_ones(llm, catalogues, tmp_path):
    tz = dataclasses.replace(catalogues["tz"], path=shutil.copytree(catalogues["tz"].path,
                                                                     tmp_path / "tz"))
    path = tz.path
    first = np.arange(len(tz.names)) < 100
    engine = llm.llm_engine
    engine.add_request("running", PROMPTS[0],
                       params(tz, where="idx < 100", temperature=1.0, seed=8))
    steps = [engine.step() for _ in range(2)]  # prefill and a first token
    assert not any(o.finished for batch in steps for o in batch)
    sc.update_artifact(path, remove=first)  # a new version: the first 100 names removed
    engine.add_request("new", PROMPTS[1], params(tz, temperature=1.0, seed=9))
    with pytest.raises(REFUSED, match="sc_where='idx < 100': selects no item"):
        engine.add_request("refused", PROMPTS[2], params(tz, where="idx < 100"))
    done = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output
    assert_members(done["running"], tz.items(first))  # kept its version
    assert_members(done["new"], tz.items(~first))
