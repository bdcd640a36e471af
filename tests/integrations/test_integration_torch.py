"""`StaticLogitsProcessor` in Hugging Face ``generate``, against HF's own
``prefix_allowed_tokens_fn`` over a Python dict trie.

The model is a randomly initialised tiny GPT-2 (nothing downloaded). On a
fixed-length and a variable-length set (end token = eos) of ~50 random
sequences, beam search (8 beams, 8 returned sequences) and greedy search must
return only members of the set, and exactly the sequences (and beam scores)
that the dict-trie reference gives with the same model.
"""

from __future__ import annotations

import functools

import numpy as np
import oracle
import pytest
import torch
import transformers

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import DecodeInputError
from static_compiler.integrations.torch import StaticLogitsProcessor
from static_compiler.torch_backend import TorchConstraints

MODEL_VOCAB = 64
SET_VOCAB = 60  # the model's vocabulary is larger: tokens 60..63 are never allowed
EOS = 0
PROMPT_LENGTH = 3


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=MODEL_VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=2, bos_token_id=EOS, eos_token_id=EOS,
                                     pad_token_id=EOS)
    return transformers.GPT2LMHeadModel(config).eval()


def make_set(kind: str):
    """(items, end_token): ~50 random sequences over tokens 1..SET_VOCAB-1."""
    rng = np.random.default_rng({"fixed": 21, "ragged": 22}[kind])
    if kind == "fixed":
        items = [tuple(int(t) for t in row) for row in rng.integers(1, SET_VOCAB, size=(50, 5))]
        return items, None
    return oracle.random_ragged_set(rng, 40, 5, SET_VOCAB, end_token=EOS), EOS


def dict_trie(items, end_token):
    """Nested dicts token -> subtrie; an item's end is the key end_token -> {}."""
    root = {}
    for item in items:
        node = root
        for tok in item:
            node = node.setdefault(tok, {})
        if end_token is not None:
            node.setdefault(end_token, {})
    return root


def reference_fn(items, end_token):
    """``prefix_allowed_tokens_fn`` walking a dict trie. A finished row (after
    eos, generate pads with eos) allows eos; an unknown prefix allows eos too
    (HF rejects an empty list; such a beam already scores -inf, so what it
    allows changes nothing)."""
    trie = dict_trie(items, end_token)

    def fn(batch_id, input_ids):
        node = trie
        for tok in input_ids.tolist()[PROMPT_LENGTH:]:
            if end_token is not None and tok == end_token:
                return [end_token]
            node = node.get(tok)
            if node is None:
                return [EOS]
        return list(node) or [EOS]
    return fn


def generate(model, prompts, max_new_tokens, **kwargs):
    torch.manual_seed(1)
    with torch.no_grad():
        return model.generate(prompts, attention_mask=torch.ones_like(prompts),
                              max_new_tokens=max_new_tokens, do_sample=False,
                              return_dict_in_generate=True, output_scores=True, **kwargs)


def members(sequences, end_token):
    """Generated parts as tuples, the end token and what follows cut off."""
    out = []
    for row in sequences[:, PROMPT_LENGTH:].tolist():
        if end_token is not None:
            assert end_token in row, row
            row = row[:row.index(end_token)]
        out.append(tuple(row))
    return out


ROWS = 16  # every call has 16 rows (2 prompts x 8 beams, or 16 prompts): one program per t


@functools.lru_cache(maxsize=None)
def compiled_set(kind: str):
    items, end_token = make_set(kind)
    return items, end_token, sc.compile_constraints(items, SET_VOCAB, end_token=end_token)


@pytest.mark.parametrize("kind, num_beams", [("fixed", 8), ("ragged", 8), ("ragged", 1)])
def test_generate_matches_prefix_allowed_tokens_fn(model, kind, num_beams):
    """Beam search, and greedy search (rows finish early, generate pads them)."""
    items, end_token, compiled = compiled_set(kind)
    prompts = torch.from_numpy(np.random.default_rng(5).integers(
        1, MODEL_VOCAB, (ROWS // num_beams, PROMPT_LENGTH)))
    kwargs = dict(num_beams=num_beams, num_return_sequences=num_beams)
    if end_token is None:  # eos is never allowed: every row runs the set's length
        kwargs["eos_token_id"] = None
    got = generate(model, prompts, compiled.max_length,
                   logits_processor=[StaticLogitsProcessor(compiled, PROMPT_LENGTH)], **kwargs)
    want = generate(model, prompts, compiled.max_length,
                    prefix_allowed_tokens_fn=reference_fn(items, end_token), **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    if num_beams > 1:
        assert torch.equal(got.sequences_scores, want.sequences_scores)
    found = members(got.sequences, end_token)
    assert set(found) <= set(items)
    for row in range(len(prompts)):  # each prompt's returned sequences are distinct
        assert len(set(found[row * num_beams:(row + 1) * num_beams])) == num_beams
    if num_beams == 1:  # some rows finished before the last step and were padded
        assert min(len(f) for f in found) < compiled.max_length - 1


def test_processor_masks_like_allowed():
    """Rows at the last step against the oracle: a prefix of the set, a finished item padded with
    a token that is not eos, a token beyond the set's vocabulary, a negative
    one; the model's extra vocabulary is never allowed."""
    items, end_token, compiled = compiled_set("ragged")
    processor = StaticLogitsProcessor(compiled, PROMPT_LENGTH)
    t = compiled.max_length - 1
    longest = max(items, key=len)
    shortest = min(items, key=len)
    prompt = [7] * PROMPT_LENGTH
    rows = [prompt + list(longest[:t]),
            prompt + list(shortest) + [EOS] + [MODEL_VOCAB - 1] * (t - len(shortest) - 1),
            prompt + list(longest[:t - 1]) + [SET_VOCAB + 1],
            prompt + list(longest[:t - 1]) + [-5]] * (ROWS // 4)
    scores = torch.randn(ROWS, MODEL_VOCAB)
    out = processor(torch.tensor(rows), scores)
    allowed = torch.zeros(SET_VOCAB, dtype=torch.bool)
    allowed[list(oracle.ConstraintSet(items, SET_VOCAB, end_token).allowed(longest[:t]))] = True
    assert allowed.any()
    assert torch.equal(out[0, :SET_VOCAB].isfinite(), allowed)
    assert torch.equal(out[0, :SET_VOCAB][allowed], scores[0, :SET_VOCAB][allowed])
    assert out[1].isfinite().nonzero().flatten().tolist() == [EOS]
    assert out[:, SET_VOCAB:].isneginf().all() and out[2:4].isneginf().all()


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_ranked_subset_masks_as_its_subset_on_both_backends(backend):
    """Per-row ranked subsets (`ranked_subset`) mask every step's rows as
    `subset()`'s of the same selections do, bit for bit."""
    items, _, compiled = compiled_set("ragged")
    rng = np.random.default_rng(11)
    masks = rng.random((2, len(items))) < 0.5
    index = np.array([1, 0])
    procs = [StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=subset, subset_index=index,
                                   backend=backend)
             for subset in (sc.stack_subsets([compiled.subset(m) for m in masks]),
                            compiled.ranked_subset(masks))]
    for t in range(compiled.max_length):
        rows = [[7] * PROMPT_LENGTH + list(items[i][:t]) + [EOS] * (t - len(items[i][:t]))
                for i in rng.integers(0, len(items), ROWS)]
        scores = torch.randn(ROWS, MODEL_VOCAB)
        want, got = (p(torch.tensor(rows), scores) for p in procs)
        assert torch.equal(got, want), t


def test_processor_rejects_bad_calls():
    compiled = sc.compile_constraints([(1, 2), (3, 1)], 4)
    processor = StaticLogitsProcessor(compiled, 1)
    with pytest.raises(DecodeInputError, match=r"3 after the prompt of 1: expected 0 to 1 .*"
                                               r"max_new_tokens=2"):
        processor(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4))
    with pytest.raises(DecodeInputError, match=r"scores: logits have shape \(2, 3\), expected "
                                               r"\(2, 4\) .*or more columns"):
        processor(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 3))
    with pytest.raises(DecodeInputError, match=r"prompt_length=-1: expected an int >= 0"):
        StaticLogitsProcessor(compiled, -1)


@pytest.mark.parametrize("form", ["subset", "ranked"])
@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_generate_with_a_subset_per_prompt(model, kind, form):
    """Each prompt decodes over its own item subset (`subset`'s or the
    torch door's `ranked_subset`'s): generate equals HF's
    prefix_allowed_tokens_fn over a dict trie of that prompt's items."""
    items, end_token, compiled = compiled_set(kind)
    rng = np.random.default_rng(6)
    masks = [rng.random(len(items)) < 0.4, rng.random(len(items)) < 0.4]
    chosen = [[items[i] for i in np.flatnonzero(m)] for m in masks]
    make = compiled.subset if form == "subset" else compiled.ranked_subset
    stacked = sc.stack_subsets([make(m) for m in masks])
    num_beams = 8
    prompts = torch.from_numpy(rng.integers(1, MODEL_VOCAB, (2, PROMPT_LENGTH)))
    kwargs = dict(num_beams=num_beams, num_return_sequences=num_beams)
    if end_token is None:
        kwargs["eos_token_id"] = None
    processor = StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=stacked,
                                      subset_index=np.array([1, 0]))
    got = generate(model, prompts, compiled.max_length, logits_processor=[processor], **kwargs)
    refs = [reference_fn(chosen[1], end_token), reference_fn(chosen[0], end_token)]
    want = generate(model, prompts, compiled.max_length,
                    prefix_allowed_tokens_fn=lambda b, ids: refs[b](b, ids), **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    found = members(got.sequences, end_token)
    for row, seq in enumerate(found):
        assert seq in set(chosen[1 - row // num_beams])


def test_processor_rejects_bad_subsets():
    items, _, compiled = compiled_set("fixed")
    one = compiled.subset(np.ones(len(items), bool))
    with pytest.raises(DecodeInputError, match="subset_index without a subset"):
        StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset_index=np.array([0]))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 1: expected a subset in \[0, 1\)"):
        StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=one, subset_index=np.array([0, 1]))
    processor = StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=sc.stack_subsets([one, one]),
                                      subset_index=np.array([0, 1, 0]))
    with pytest.raises(DecodeInputError, match="4 rows are not a multiple of the 3 prompts"):
        processor(torch.zeros((4, PROMPT_LENGTH), dtype=torch.long), torch.zeros((4, MODEL_VOCAB)))
    ranked = compiled.ranked_subset(np.ones(len(items), bool))
    with pytest.raises(DecodeInputError, match=r"subset_index\[1\] = 1: expected a subset in \[0, 1\)"):
        StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=ranked, subset_index=np.array([0, 1]))
    with pytest.raises(DecodeInputError, match="2 stacked subsets: pass subset_index"):
        StaticLogitsProcessor(compiled, PROMPT_LENGTH, subset=sc.stack_subsets([ranked, ranked]))
    _, _, other = compiled_set("ragged")
    with pytest.raises(DecodeInputError, match="the ranked subset was made from another set"):
        StaticLogitsProcessor(other, PROMPT_LENGTH, subset=ranked)


NAMES = ["Lima", "Lyon", "Lille", "Linz", "Lagos", "Leeds", "Luanda", "Lhasa", "Riga", "Rome"]


def name_ids(name: str) -> list:
    """A stand-in tokenizer: one id per letter, in 1..SET_VOCAB-1 (0 is eos)."""
    return [ord(c) % (SET_VOCAB - 1) + 1 for c in name]


@pytest.mark.parametrize("kind, door", [
    ("beams", "compiled"), ("greedy", "compiled"), ("fixed", "compiled"), ("beams", "torch"),
    ("greedy", "torch"), ("fixed", "torch"), ("greedy", "served")])  # (served: exports, slow)
def test_generate_output_back_to_names(model, tmp_path, kind, door):
    """`texts(generate's sequences, prompt_length=...)`: each row's
    prompt in front and its padding (eos) after are dropped, on every door;
    the names are what the generated tokens spell."""
    names = NAMES if kind != "fixed" else [n for n in NAMES if len(n) == 4]
    compiled = sc.compile_constraints(names, SET_VOCAB, tokenizer=name_ids,
                                      end_token=None if kind == "fixed" else EOS,
                                      export_beam_sizes=(4,))
    beams = 1 if kind == "greedy" else 4
    prompts = torch.from_numpy(np.random.default_rng(7).integers(1, MODEL_VOCAB,
                                                                 (3, PROMPT_LENGTH)))
    out = generate(model, prompts, compiled.max_length, num_beams=beams,
                   num_return_sequences=beams,
                   logits_processor=[StaticLogitsProcessor(compiled, PROMPT_LENGTH)],
                   **({"eos_token_id": None} if kind == "fixed" else {}))
    decoder = {"compiled": lambda: compiled,
               "torch": lambda: TorchConstraints.from_compiled(compiled),
               "served": lambda: serving.load(compiled.save(tmp_path / "names.sc"))}[door]()
    got = decoder.texts(out.sequences, prompt_length=PROMPT_LENGTH)
    by_ids = {tuple(name_ids(n)): n for n in names}
    want = [by_ids[item] for item in members(out.sequences, compiled.end_token)]
    assert got == want and len(got) == 3 * beams
    if kind == "greedy":  # rows that ended early were padded with eos after it
        assert min(len(n) for n in got) < compiled.max_length - 1
    assert decoder.texts(out, prompt_length=PROMPT_LENGTH) == want  # the dict too
