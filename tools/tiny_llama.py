"""A tiny random Llama with its own byte-level BPE tokenizer, built from a
config with no download: the model the vLLM tests and `tools.bench vllm` run
on this CPU, and the same weights run through transformers to check them.

    python -m tools.tiny_llama DIR [--vocab 512] [--seed 0] [--hidden 256] [--layers 2]

writes DIR/config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and generation_config.json (everything `vllm.LLM(DIR)`
and `transformers.AutoModelForCausalLM.from_pretrained(DIR)` read). The
model: 2 layers, hidden 256, 4 heads of 64 (vLLM's CPU attention refuses a
head_dim under 64; ``--hidden`` / ``--layers`` make a larger one, heads of 64
throughout, for measures against a model step of more realistic cost), float32, `initializer_range` 0.2 so that a random model's
next-token distributions are far from uniform (beam scores then differ by
more than the float noise between two engines). Token 0 is ``<s>``, 1 is
``</s>`` (the end token), 2 ``<pad>``; the rest are learned by BPE on
`corpus()` (IANA time-zone names and `synthetic_names`), with every byte in
the alphabet so any string encodes. Deterministic for a seed.

Needs torch, transformers and tokenizers (the vLLM venv has them).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import zoneinfo

SPECIAL = ("<s>", "</s>", "<pad>")
BOS, EOS, PAD = 0, 1, 2
SYLLABLES = ("ka", "ri", "to", "ne", "sa", "lo", "mi", "du", "ve", "an", "or", "el", "is", "um",
             "ta", "po", "qu", "ix", "ze", "ba", "co", "fi", "gu", "ho", "ja", "ly", "we", "ny")


def timezone_names() -> list:
    """The IANA time-zone names of this Python, sorted (about 600)."""
    return sorted(zoneinfo.available_timezones())


def synthetic_names(n: int, seed: int = 0) -> list:
    """`n` distinct made-up entity names ("Karito Nesalo 12"), deterministic
    for a seed: a catalogue of any size for the benches."""
    rng = random.Random(seed)
    names, seen = [], set()
    while len(names) < n:
        words = [("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))).capitalize()
                 for _ in range(rng.randint(1, 3))]
        name = " ".join(words) + (f" {rng.randint(1, 999)}" if rng.random() < 0.5 else "")
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def corpus() -> list:
    """The texts the tokenizer is trained on."""
    return timezone_names() + synthetic_names(5000, seed=1)


def build_tokenizer(vocab_size: int = 512):
    """A byte-level BPE `tokenizers.Tokenizer` of `vocab_size` entries
    (SPECIAL first), trained on `corpus()`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def build(directory, vocab_size: int = 512, seed: int = 0, hidden: int = 256,
          layers: int = 2) -> pathlib.Path:
    """Writes the tiny model and its tokenizer to `directory` (created; the
    files are written to a temporary folder beside it first, then renamed,
    so an interrupted build leaves nothing half written) and returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory = pathlib.Path(directory)
    if directory.exists() and (directory / "model.safetensors").exists():
        return directory
    tokenizer = build_tokenizer(vocab_size)
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"tiny_llama: the tokenizer learned {tokenizer.get_vocab_size()} "
                         f"entries, expected vocab_size={vocab_size} (a larger corpus is needed)")
    if hidden < 64 or hidden % 64 or layers < 1:
        raise ValueError(f"tiny_llama: hidden={hidden}, layers={layers}: expected a multiple of "
                         "64 (heads of 64) and at least one layer")
    heads = hidden // 64
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=512, bos_token_id=BOS, eos_token_id=EOS,
                         pad_token_id=PAD, tie_word_embeddings=False, initializer_range=0.2,
                         torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    staging.mkdir(parents=True, exist_ok=False)
    model.save_pretrained(staging, safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=SPECIAL[BOS],
                            eos_token=SPECIAL[EOS], pad_token=SPECIAL[PAD]
                            ).save_pretrained(staging)
    # vLLM reads the chat-free tokenizer as is; generation defaults: none.
    (staging / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}))
    if directory.exists():  # an empty or partial folder from before: replaced
        import shutil
        shutil.rmtree(directory)
    os.replace(staging, directory)
    return directory


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (heads of 64)")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    print(build(args.directory, args.vocab, args.seed, args.hidden, args.layers))


if __name__ == "__main__":
    main()
