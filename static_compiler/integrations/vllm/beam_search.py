"""Exact constrained beam search on a `vllm.LLM`: each request with its own
set, the engine running the model, our torch door ranking the beams.

    from static_compiler.integrations.vllm.beam_search import beam_search
    llm = vllm.LLM(model)   # logprobs_mode "raw_logprobs", prefix caching on: vLLM's defaults
    outs = beam_search(llm, ["Time zone: ", "City: "], beam_size=4,
                       options=[{"sc_set": "/srv/sets/tz"},
                                {"sc_set": "cities", "sc_where": "country == 'FR'"}])
    outs[0].beams[0].text, outs[0].beams[0].score

Each step is one ``llm.generate`` over the live beams of every request
(``max_tokens=1``, prompt = the request's prompt tokens + the beam's tokens,
the shared prefixes served from vLLM's prefix cache), then one
`TorchConstraints.beam_step(..., log_probs=True)` per set and filter (the
requests that share both are the rows of one search): the search is
`TorchConstraints.beam_search`'s, step for step, on the engine's
log-probabilities. Exact: the engine returns, for each live beam, the
log-probabilities over the FULL vocabulary (log_softmax of the raw logits,
as our search takes them) of exactly the tokens the beam may take (the
door's `allowed` of its prefix, computed on the host), through
``SamplingParams.logprob_token_ids`` (at most
`vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS` = 128 ids a request: a beam
with more candidates is sent as several requests of the same prompt, each
scoring a slice of them, which the prefix cache makes a few more tokens of
work). No V floats per beam cross into Python and no top-k cut can drop a
candidate (vLLM's own `LLM.beam_search` keeps 2 x beam_width tokens by
log-probs before any constraint). The beams, their tokens and scores, are
those of `TorchConstraints.beam_search` on the same model's logits, up to
the float noise between vLLM's and another engine's forward pass.

Settings it needs (checked first; `DecodeInputError` names the one that
is off): ``logprobs_mode="raw_logprobs"`` (vLLM's default, ``--logprobs-mode
raw_logprobs``: the log-probabilities of the raw logits, before logits
processors, temperature or penalties, so a logits processor loaded in the
same engine, ours included, changes nothing here; the processed modes
renormalize over what a processor allowed and the logits modes are no
log-probabilities) and ``enable_prefix_caching=True`` (vLLM's default: each
step re-sends every beam's whole prefix).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence

import torch

from static_compiler.errors import DecodeInputError
from static_compiler.integrations.vllm.options import parse_options
from static_compiler.integrations.vllm.sets import SetCache, set_path
from static_compiler.support.arguments import check_finite, check_int
from static_compiler.support.decode_types import DecodeResult
from static_compiler.torch_backend import TorchConstraints

_SETS = SetCache()
"""The driver's loaded sets (this process's): each artifact loaded once per
version, reloaded for the next call when it changed on disk."""


class Beam(NamedTuple):
    """One beam of a request: token_ids, the item's tokens (no end token);
    score, its log-probability (with a length penalty, the normalized score
    the beams are ranked by); text, its name when the set has names, else
    None."""

    token_ids: list
    score: float
    text: Optional[str]


class BeamOutput(NamedTuple):
    """A request's result: beams, its complete beams best first (fewer than
    beam_size when the set has fewer items, none when it has none it may
    take); result, the `DecodeResult` (1, beam_size, T) of
    `TorchConstraints.finalize`, as our own beam search returns it."""

    beams: list
    result: DecodeResult


class _Request(NamedTuple):
    prompt: list
    constraints: TorchConstraints
    subset: Any


class _Group(NamedTuple):
    """The requests (`rows`, their indices) over one set and subset: one
    search of len(rows) batch rows."""

    constraints: TorchConstraints
    subset: Any
    rows: list


def check_engine(llm) -> None:
    """Raises DecodeInputError unless `llm` (a `vllm.LLM`) runs with the
    settings the driver needs: logprobs_mode "raw_logprobs" and prefix
    caching on."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if config is None:
        raise DecodeInputError(f"vllm beam_search: llm is a {type(llm).__name__}, expected a "
                               "vllm.LLM")
    mode = config.model_config.logprobs_mode
    if mode != "raw_logprobs":
        raise DecodeInputError(
            f"vllm beam_search: the engine runs with logprobs_mode={mode!r}, expected "
            "'raw_logprobs' (vLLM's default; LLM(..., logprobs_mode='raw_logprobs'), vllm serve "
            "--logprobs-mode raw_logprobs): the beams are ranked by log_softmax over the full "
            "vocabulary of the raw logits, which the other modes do not return")
    if not config.cache_config.enable_prefix_caching:
        raise DecodeInputError(
            "vllm beam_search: the engine runs with enable_prefix_caching=False, expected True "
            "(vLLM's default; LLM(..., enable_prefix_caching=True)): each step re-sends every "
            "beam's whole prefix, which without the prefix cache is recomputed at every step")


def _prompt_ids(llm, prompt) -> list:
    if isinstance(prompt, str):
        return list(llm.get_tokenizer().encode(prompt))
    if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
        prompt = prompt["prompt_token_ids"]
    if isinstance(prompt, (list, tuple)) and prompt and \
            all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    raise DecodeInputError(f"prompt {prompt!r:.80}: expected a str, a non-empty list of "
                           "token ids or {'prompt_token_ids': [...]}")


def _request(llm, prompt, extra, vocab_size: int, resolved: dict, where: str) -> _Request:
    """The request of `prompt` with its ``sc_`` options (`options.parse_options`,
    resolved by `sets.SetCache` as the processor resolves them, once a call
    for each set and filter (`resolved`): requests with the same set and
    filter share one `Subset`, so one search)."""
    try:
        options = parse_options(extra)
        if options is None:
            raise DecodeInputError(f"options {extra!r:.80}: no sc_set: every request names its "
                                   "set (an artifact path or a registered name)")
        if options.prefix:
            raise DecodeInputError(f"sc_prefix={list(options.prefix)!r}: the beam driver "
                                   "starts every request at the set's root (expected none)")
        key = (options.set, options.where, options.subset)
        if key not in resolved:
            tc = _SETS.current(set_path(options.set))
            if tc.vocab_size > vocab_size:
                raise DecodeInputError(f"sc_set={options.set!r}: the set has vocab_size "
                                       f"{tc.vocab_size}, more than the model's {vocab_size}")
            resolved[key] = (tc, _SETS.subset(tc, options))
        return _Request(_prompt_ids(llm, prompt), *resolved[key])
    except DecodeInputError as err:
        raise DecodeInputError(f"{where}: {err}") from None


def beam_search(llm, prompts: Sequence, *, beam_size: int, options,
                length_penalty: float = 0.0) -> list:
    """Constrained beam search of each prompt over its own set on the engine
    `llm` (a `vllm.LLM`; `check_engine`'s settings). Returns one `BeamOutput`
    per prompt.

    prompts: str (encoded with the engine's tokenizer), token ids, or
    ``{"prompt_token_ids": [...]}``. options: one dict of request options per
    prompt (or one dict for all), the processor's ``sc_`` keys
    (`options`): ``sc_set`` (an artifact path or a registered name,
    `sets.register_set` / ``STATIC_COMPILER_VLLM_SETS``), optionally
    ``sc_where`` (a filter over the items' attributes) or ``sc_subset`` (a
    bool attribute column); not ``sc_prefix`` (every search starts at the
    root). A set updated on disk is read by the next call. beam_size,
    length_penalty: as `TorchConstraints.beam_search`. Each request runs at
    most its set's max_length steps; requests over the same set and filter
    are one search of several rows.

    Raises DecodeInputError, before any step, for an engine without the
    settings, a beam_size that is not an int >= 1, a length_penalty that is
    not finite, a bad prompt, and options the processor would refuse
    (naming the request and the key)."""
    from vllm import SamplingParams
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

    check_engine(llm)
    M = check_int("beam_size", beam_size, low=1)
    penalty = check_finite("length_penalty", length_penalty)
    if isinstance(prompts, (str, Mapping)) or not isinstance(prompts, Sequence):
        raise DecodeInputError(f"vllm beam_search: prompts is a {type(prompts).__name__}, "
                               "expected a list of prompts")
    if isinstance(options, Mapping):
        options = [options] * len(prompts)
    if not isinstance(options, Sequence) or len(options) != len(prompts):
        raise DecodeInputError(f"vllm beam_search: options must be one dict, or one dict per "
                               f"prompt ({len(prompts)})")
    vocab_size = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    resolved: dict = {}
    requests = [_request(llm, p, o, vocab_size, resolved, f"vllm beam_search (request {i})")
                for i, (p, o) in enumerate(zip(prompts, options))]
    if not requests:
        return []
    groups: dict = {}
    for i, r in enumerate(requests):
        groups.setdefault((id(r.constraints), id(r.subset)), _Group(r.constraints, r.subset, []))\
            .rows.append(i)
    groups = list(groups.values())
    states = [g.constraints.init_beams(len(g.rows), M) for g in groups]
    for step in range(max(g.constraints.max_length for g in groups)):
        active = [k for k, (g, s) in enumerate(zip(groups, states))
                  if step < g.constraints.max_length
                  and (step == 0 or bool((s.valid & ~s.finished).any()))]
        if not active:
            break
        jobs, contexts, params, masks = [], [], [], {}  # jobs: (group, row, beam) per input
        for k in active:
            g, s = groups[k], states[k]
            live = (s.valid & ~s.finished).nonzero().tolist()  # (row, beam) pairs
            at = torch.tensor(live, dtype=torch.int64).reshape(-1, 2)
            prefixes = s.tokens[at[:, 0], at[:, 1], :step]
            allowed = g.constraints.allowed(prefixes, subset=g.subset, check_values=False)
            masks[k] = (at, allowed)
            for (row, beam), prefix, ok in zip(live, prefixes.tolist(), allowed):
                ids = ok.nonzero().flatten().tolist()
                context = {"prompt_token_ids": requests[g.rows[row]].prompt + prefix}
                for start in range(0, len(ids), MAX_LOGPROB_TOKEN_IDS):
                    jobs.append((k, row, beam))
                    contexts.append(context)
                    params.append(SamplingParams(
                        max_tokens=1, temperature=0.0, detokenize=False, flat_logprobs=True,
                        logprob_token_ids=ids[start:start + MAX_LOGPROB_TOKEN_IDS]))
        outputs = llm.generate(contexts, params, use_tqdm=False) if jobs else []
        scores = {k: torch.full(tuple(states[k].node.shape) + (groups[k].constraints.vocab_size,),
                                -float("inf")) for k in active}
        for (k, row, beam), out in zip(jobs, outputs):
            ids, values = _scored(out.outputs[0].logprobs)
            V = scores[k].shape[-1]
            keep = [n for n, t in enumerate(ids) if t < V]
            scores[k][row, beam, [ids[n] for n in keep]] = torch.tensor(
                [values[n] for n in keep], dtype=torch.float32)
        for k in active:
            at, allowed = masks[k]
            wanted = torch.zeros(scores[k].shape, dtype=torch.bool)
            wanted[at[:, 0], at[:, 1]] = allowed  # (the sampled token, when not allowed, drops)
            g = groups[k]
            states[k] = g.constraints.beam_step(
                states[k], torch.where(wanted, scores[k], -float("inf")), step, subset=g.subset,
                log_probs=True)
    outputs = [None] * len(requests)
    for g, s in zip(groups, states):
        result = g.constraints.finalize(s, penalty)
        texts = g.constraints.texts(result) if g.constraints.names is not None else None
        for row, i in enumerate(g.rows):
            outputs[i] = _output(DecodeResult(*(x[row:row + 1] for x in result)),
                                 None if texts is None else texts[row])
    return outputs


def _scored(logprobs) -> tuple:
    """(token ids, log-probabilities) of an output's first position (vLLM's
    FlatLogprobs, or its list of dicts)."""
    if hasattr(logprobs, "token_ids"):
        end = logprobs.end_indices[0]
        return logprobs.token_ids[:end], logprobs.logprobs[:end]
    first = logprobs[0]
    return list(first), [lp.logprob for lp in first.values()]


def _output(result: DecodeResult, texts: Optional[list]) -> BeamOutput:
    """A request's `BeamOutput` from its row of the result (1, M, T) and the
    row's texts."""
    beams = []
    for m in range(result.valid.shape[1]):
        if bool(result.valid[0, m]):
            length = int(result.lengths[0, m])
            beams.append(Beam(result.tokens[0, m, :length].tolist(), float(result.scores[0, m]),
                              None if texts is None else texts[m]))
    return BeamOutput(beams, result)
