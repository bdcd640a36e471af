"""`StaticLogitsProcessor` over a set's live items, and the scores it is given.

Issue 27 (red-team report): after ``compiled.update(remove=...)`` the
processor still allowed every removed item, and ``generate(num_beams=4)`` on a
tiny GPT-2 returned removed items; float64 scores came back float32, and
scores that require grad raised a raw BufferError. Here a version with items
removed is checked against brute force (the oracle over the remaining items),
row by row and through ``generate``, alone and with per-prompt subsets, and
the scores keep their dtype and autograd graph.
"""

from __future__ import annotations

import functools

import numpy as np
import oracle
import pytest
import torch
from test_integration_torch import (
    MODEL_VOCAB,
    PROMPT_LENGTH,
    SET_VOCAB,
    generate,
    make_set,
    members,
    model,  # noqa: F401 (the tiny GPT-2 fixture)
    reference_fn,
)

import static_compiler as sc
from static_compiler.errors import DecodeInputError
from static_compiler.integrations.torch import StaticLogitsProcessor

NUM_BEAMS = 4


@functools.lru_cache(maxsize=None)
def updated_set(kind: str, model):
    """(items, removed, end_token, compiled, version): the set, the 13
    unique items taken out, and the version without them. The removed items
    are the ones generate returns from the full set first (found with
    prefix_allowed_tokens_fn, which test_integration_torch shows the
    processor matches), so a processor that ignored the removal would
    return them again."""
    items, end_token = make_set(kind)
    compiled = sc.compile_constraints(items, SET_VOCAB, end_token=end_token)
    got = generate(model, _prompts(), compiled.max_length,
                   prefix_allowed_tokens_fn=reference_fn(items, end_token), **_kwargs(end_token))
    first = list(dict.fromkeys(members(got.sequences, end_token)))
    rest = [item for item in dict.fromkeys(items) if item not in set(first)]
    removed = (first + rest)[:13]
    version = compiled.update(remove=[list(item) for item in removed])
    assert version.build.last_update["removed"] == 13
    return items, removed, end_token, compiled, version


def _prompts():
    return torch.from_numpy(np.random.default_rng(8).integers(1, MODEL_VOCAB, (2, PROMPT_LENGTH)))


def _kwargs(end_token):
    kwargs = dict(num_beams=NUM_BEAMS, num_return_sequences=NUM_BEAMS)
    if end_token is None:  # eos is never allowed: every row runs the set's length
        kwargs["eos_token_id"] = None
    return kwargs


def brute_force_rows(live, end_token, prefixes):
    """bool (N, MODEL_VOCAB): the oracle's allowed tokens after each prefix
    (a tuple of generated tokens) over the items `live`."""
    oracle_set = oracle.ConstraintSet(live, SET_VOCAB, end_token)
    out = torch.zeros(len(prefixes), MODEL_VOCAB, dtype=torch.bool)
    for row, prefix in enumerate(prefixes):
        out[row, list(oracle_set.allowed(prefix))] = True
    return out


ROWS = 2 * NUM_BEAMS  # every call has generate's row count: one program per t, shared


def in_calls(processor, prefixes, scores):
    """processor's output for `prefixes` (tuples of generated tokens) and
    scores (len(prefixes), MODEL_VOCAB), in calls of ROWS rows (the last
    padded with its first row), so the programs generate compiled serve."""
    out = []
    for at in range(0, len(prefixes), ROWS):
        chunk = prefixes[at:at + ROWS]
        rows = [[7] * PROMPT_LENGTH + list(p) for p in chunk + [chunk[0]] * (ROWS - len(chunk))]
        part = scores[at:at + ROWS]
        part = torch.cat([part, part[:1].expand(ROWS - len(chunk), -1)])
        out.append(processor(torch.tensor(rows, dtype=torch.long), part)[:len(chunk)])
    return torch.cat(out)


def all_prefixes(items, t):
    """The distinct length-t prefixes of `items` (shorter items skipped)."""
    return sorted({tuple(item[:t]) for item in items if len(item) >= t})


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_removed_items_are_never_generated(model, kind):
    """generate(num_beams=4) with the version's processor returns only live
    items, exactly what prefix_allowed_tokens_fn over them returns (over the
    full set it returns removed ones: `updated_set`)."""
    items, removed, end_token, _, version = updated_set(kind, model)
    live = [item for item in items if item not in set(removed)]
    got = generate(model, _prompts(), version.max_length,
                   logits_processor=[StaticLogitsProcessor(version, PROMPT_LENGTH)],
                   **_kwargs(end_token))
    found = members(got.sequences, end_token)
    assert not set(found) & set(removed)
    assert set(found) <= set(live)
    want = generate(model, _prompts(), version.max_length,
                    prefix_allowed_tokens_fn=reference_fn(live, end_token), **_kwargs(end_token))
    assert torch.equal(got.sequences, want.sequences)


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_scores_are_neg_inf_exactly_where_brute_force_disallows(model, kind):
    """Every prefix of every item (live or removed) at every step: -inf
    exactly off the oracle's allowed tokens over the remaining items, and
    the score itself where allowed."""
    items, removed, end_token, _, version = updated_set(kind, model)
    live = [item for item in items if item not in set(removed)]
    processor = StaticLogitsProcessor(version, PROMPT_LENGTH)
    gen = torch.Generator().manual_seed(3)
    for t in range(version.max_length):
        prefixes = all_prefixes(items, t)
        scores = torch.randn(len(prefixes), MODEL_VOCAB, generator=gen)
        out = in_calls(processor, prefixes, scores)
        want = brute_force_rows(live, end_token, prefixes)
        assert torch.equal(out.isfinite(), want), t
        assert torch.equal(out[want], scores[want])
    only_removed = [p for p in all_prefixes(removed, 2) if not any(i[:2] == p for i in live)]
    assert only_removed  # a prefix of removed items alone allows nothing
    out = in_calls(processor, only_removed[:1], torch.zeros(1, MODEL_VOCAB))
    assert out.isneginf().all()


def test_a_subset_of_the_version_restricts_each_prompt(model):
    """subset= with subset_index per prompt (rows = prompts x beams): each
    prompt's rows allow the oracle's tokens over its subset less the removed
    items, row by row and through generate."""
    items, removed, end_token, _, version = updated_set("ragged", model)
    rng = np.random.default_rng(9)
    masks = [rng.random(len(items)) < 0.5, rng.random(len(items)) < 0.5]
    chosen = [[item for item, keep in zip(items, m) if keep and item not in set(removed)]
              for m in masks]
    stacked = sc.stack_subsets([version.subset(m) for m in masks])
    processor = StaticLogitsProcessor(version, PROMPT_LENGTH, subset=stacked,
                                      subset_index=np.array([1, 0]))
    for t in range(version.max_length):
        prefixes = all_prefixes(items, t)
        for at in range(0, len(prefixes), NUM_BEAMS):  # the same NUM_BEAMS rows for each prompt
            chunk = prefixes[at:at + NUM_BEAMS]
            chunk = chunk + [chunk[0]] * (NUM_BEAMS - len(chunk))
            out = in_calls(processor, chunk + chunk, torch.zeros(ROWS, MODEL_VOCAB)).isfinite()
            assert torch.equal(out[:NUM_BEAMS], brute_force_rows(chosen[1], end_token, chunk))
            assert torch.equal(out[NUM_BEAMS:], brute_force_rows(chosen[0], end_token, chunk))
    got = generate(model, _prompts(), version.max_length, logits_processor=[processor],
                   **_kwargs(end_token))
    found = members(got.sequences, end_token)
    for row, seq in enumerate(found):
        assert seq in set(chosen[1 - row // NUM_BEAMS]), (row, seq)
    old = updated_set("ragged", model)[3]  # a subset of the set before the update is refused
    with pytest.raises(DecodeInputError, match="made from another compiled set"):
        StaticLogitsProcessor(version, PROMPT_LENGTH, subset=old.subset(masks[0]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_scores_keep_their_dtype(model, dtype):
    items, removed, end_token, _, version = updated_set("fixed", model)
    live = [item for item in items if item not in set(removed)]
    prefixes = all_prefixes(items, 2)
    scores = torch.randn(len(prefixes), MODEL_VOCAB, generator=torch.Generator().manual_seed(4),
                         dtype=torch.float64).to(dtype)
    out = in_calls(StaticLogitsProcessor(version, PROMPT_LENGTH), prefixes, scores)
    assert out.dtype == dtype and out.shape == scores.shape
    want = brute_force_rows(live, end_token, prefixes)
    assert torch.equal(out.isfinite(), want)
    assert torch.equal(out[want], scores[want])  # bit for bit: never cast
    assert out[~want].isneginf().all()


def test_scores_that_require_grad_stay_differentiable(model):
    """The mask comes from the token ids alone and is applied in torch: the
    gradient of an allowed score is 1, of a masked one 0."""
    items, removed, end_token, _, version = updated_set("fixed", model)
    live = [item for item in items if item not in set(removed)]
    prefixes = all_prefixes(items, 1)
    scores = torch.randn(len(prefixes), MODEL_VOCAB, dtype=torch.float64, requires_grad=True)
    processor = StaticLogitsProcessor(version, PROMPT_LENGTH)
    rows = torch.tensor([[7] * PROMPT_LENGTH + list(prefixes[0])] * ROWS)
    alone = processor(rows, scores[:1].expand(ROWS, -1))  # the processor's own output
    assert alone.requires_grad and alone.grad_fn is not None
    out = in_calls(processor, prefixes, scores)
    assert out.requires_grad and out.dtype == torch.float64
    want = brute_force_rows(live, end_token, prefixes)
    out[want].sum().backward()
    assert torch.equal(scores.grad, want.to(torch.float64))
