"""The time a constrained-decoding logits processor adds per step of Hugging
Face ``model.generate`` (beam search, on CPU), end to end: generate with no
processor, with ``prefix_allowed_tokens_fn`` over a Python dict trie (HF's
`PrefixConstrainedLogitsProcessor`), and with `StaticLogitsProcessor`
(backend="jax" and backend="torch"), in the same run.

The set is N random Semantic IDs (L tokens over V, duplicates dropped, no end
token); the model a randomly initialised tiny GPT-2 built from a config
(nothing downloaded; vocabulary V, eos_token_id None so every call runs L
steps), small so that generate itself takes a few ms per step and the
processor's share shows. Per shape "BxM" (B prompts of PROMPT_LENGTH random
tokens, M beams, M returned sequences, max_new_tokens=L, greedy beam search):
one warm-up call per processor (it also compiles the jax backend's one
program for the shape's row count), then ``--repeats`` repeats, each timing one generate call of every
processor, the processors interleaved (their order rotating) so machine load
hits them alike. Reported: the median ms per call, per step (call / L), and
added per step over "none" (the same generate with no processor). The
garbage collector is off while timing (the dict trie holds ~L x N dicts; see
`tools.bench.torch_mask`), torch runs on one thread (``--torch-threads``,
see `tools.bench.torch_mask` for why). The constrained processors must
return identical sequences (trie = jax = torch, on every call) and every
returned sequence's generated part must be a member of the set; the run
exits 1 otherwise.

    python -m tools.bench.torch_generate                  # 1e4 items, L=8, V=2048, 2x70 and 32x4
    python -m tools.bench.torch_generate --items 1e5 --shapes 2x70 --repeats 9
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np
import torch
import transformers

import static_compiler as sc
from static_compiler.integrations.torch import StaticLogitsProcessor
from tools.bench.cli import exit_without_teardown, sid_set_parser
from tools.bench.output import machine_line
from tools.bench.torch_mask import PROMPT_LENGTH, dict_trie, trie_fn

PROCESSORS = ("none", "trie", "jax", "torch")
CONSTRAINED = ("trie", "jax", "torch")
MODEL = dict(n_embd=64, n_layer=2, n_head=2)


def shape(text: str) -> tuple:
    """"BxM" -> (batch B, beams M)."""
    try:
        batch, beams = (int(x) for x in text.lower().split("x"))
    except ValueError:
        batch = beams = 0
    if batch < 1 or beams < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxBEAMS, e.g. 2x70")
    return batch, beams


def make_model(vocab: int, length: int, seed: int = 0):
    """A random tiny GPT-2 over `vocab` tokens with no eos (generate runs
    max_new_tokens steps)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=max(32, PROMPT_LENGTH + length),
                                     bos_token_id=0, eos_token_id=None, pad_token_id=0, **MODEL)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def processor_kwargs(ids: np.ndarray, compiled) -> dict:
    """processor name -> generate's extra keyword arguments."""
    return {"none": {},
            "trie": {"prefix_allowed_tokens_fn": trie_fn(dict_trie(ids), PROMPT_LENGTH)},
            **{b: {"logits_processor": transformers.LogitsProcessorList(
                [StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=b)])}
               for b in ("jax", "torch")}}


def generate(model, prompts, beams: int, length: int, kwargs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), num_beams=beams,
                              num_return_sequences=beams, max_new_tokens=length, do_sample=False,
                              eos_token_id=None, pad_token_id=0, **kwargs)


def check(outputs: dict, members: set, where: str) -> str | None:
    """None if the constrained processors' sequences are identical and
    members of the set, else what is wrong."""
    want = outputs["trie"]
    for name in CONSTRAINED[1:]:
        if not torch.equal(outputs[name], want):
            return f"{where}: {name}'s sequences differ from the trie's"
    for row in want[:, PROMPT_LENGTH:].tolist():
        if tuple(row) not in members:
            return f"{where}: generated {row}, not a member of the set"
    return None


def measure(model, ids: np.ndarray, compiled, length: int, batch: int, beams: int, repeats: int,
            seed: int = 0):
    """({processor: [seconds per call]}, error or None) for one shape."""
    rng = np.random.default_rng(seed + 1)
    prompts = torch.from_numpy(rng.integers(0, compiled.vocab_size, (batch, PROMPT_LENGTH)))
    kwargs = processor_kwargs(ids, compiled)
    members = set(map(tuple, ids.tolist()))
    where = f"{batch}x{beams}"
    outputs = {name: generate(model, prompts, beams, length, kwargs[name]) for name in PROCESSORS}
    error = check(outputs, members, f"{where} warm-up")
    if error:
        return None, error
    if outputs["trie"].shape != (batch * beams, PROMPT_LENGTH + length):
        return None, f"{where}: sequences of shape {tuple(outputs['trie'].shape)}"
    times = {name: [] for name in PROCESSORS}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            order = PROCESSORS[r % len(PROCESSORS):] + PROCESSORS[:r % len(PROCESSORS)]
            for name in order:
                start = time.perf_counter()
                out = generate(model, prompts, beams, length, kwargs[name])
                times[name].append(time.perf_counter() - start)
                if not torch.equal(out, outputs[name]):
                    return None, f"{where} repeat {r}: {name}'s sequences changed"
    finally:
        gc.enable()
    return times, None


def table(results: list, length: int) -> str:
    """results: [(shape label, {processor: [seconds]})] -> markdown."""
    lines = ["| batch x beams | processor | ms per call | ms per step | added ms per step |",
             "|--|--|--:|--:|--:|"]
    for label, times in results:
        ms = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
        for name in PROCESSORS:
            added = "-" if name == "none" else f"{(ms[name] - ms['none']) / length:+.2f}"
            lines.append(f"| {label} | {name} | {ms[name]:.1f} | {ms[name] / length:.2f} | "
                         f"{added} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sid_set_parser("torch_generate", __doc__, 1e4)
    parser.add_argument("--shapes", type=shape, nargs="+", default=[(2, 70), (32, 4)],
                        help="BATCHxBEAMS per generate call (one row group each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    ids = np.unique(rng.integers(0, args.vocab, size=(int(args.items), args.length)), axis=0)
    compiled = sc.compile_constraints(ids, vocab_size=args.vocab)
    model = make_model(args.vocab, args.length, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"# HF generate, time added per step by a logits processor: {len(ids)} random items "
          f"(of {int(args.items)}, duplicates dropped), L = {args.length}, V = {args.vocab}, "
          f"prompt {PROMPT_LENGTH} tokens, max_new_tokens = L, greedy beam search, "
          f"torch threads {args.torch_threads}, median of {args.repeats}")
    print(f"# {machine_line()}; torch {torch.__version__}; transformers {transformers.__version__}")
    print(f"# model: random GPT-2, n_embd {MODEL['n_embd']}, {MODEL['n_layer']} layers, "
          f"{MODEL['n_head']} heads, vocab {args.vocab}: {params / 1e6:.2f} M parameters")
    print("# none: no processor; trie: prefix_allowed_tokens_fn over a dict trie; jax, torch: "
          "StaticLogitsProcessor(backend=...); trie = jax = torch sequences, all members of the set")
    results = []
    for batch, beams in args.shapes:
        times, error = measure(model, ids, compiled, args.length, batch, beams, args.repeats,
                               args.seed)
        if error:
            print(f"FAIL {error}", file=sys.stderr)
            return 1
        results.append((f"{batch}x{beams}", times))
    print()
    print(table(results, args.length))
    print(f"# {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
