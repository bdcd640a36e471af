"""What the first Hugging Face ``generate`` call with `StaticLogitsProcessor`
costs over the second, per backend and search, each in a fresh process.

The set is --names Unicode character names drawn at random (``unicodedata``),
encoded by a byte-level BPE (the ``tokenizers`` package, vocabulary --vocab,
trained here on the names: nothing downloaded), end token ``</s>``; the model
a randomly initialised tiny GPT-2 over the same vocabulary with that end
token as its eos. One child process per (backend, search, repeat) builds the
set and the model, then times generate calls 1 and 2 on the same prompts
(max_new_tokens = the set's max_length) and counts the XLA compilations of
each (`static_compiler.jax_support.compile_events`). With --warm the child calls
`StaticLogitsProcessor.warm` for generate's row count first (timed apart).
Reported per cell: the median over --repeats of the processor's construction
(the torch backend's puts the tables in torch), the first call, the second,
their difference and the compilations of each.

    python -m tools.bench.hf_first_call                       # jax and torch, greedy and 4 beams
    python -m tools.bench.hf_first_call --backends jax --searches beam4 --repeats 3 --warm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import unicodedata

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEARCHES = {"greedy": 1, "beam4": 4}
PROMPT_LENGTH = 4
BATCH = 2


def names(count: int, seed: int = 0) -> list:
    """`count` Unicode character names drawn at random (`seed`), in code point
    order."""
    every = [n for n in (unicodedata.name(chr(cp), None) for cp in range(0x110000)) if n]
    pick = np.sort(np.random.default_rng(seed).choice(len(every), min(count, len(every)),
                                                      replace=False))
    return [every[i] for i in pick.tolist()]


def train_bpe(catalogue: list, vocab_size: int):
    """A byte-level BPE over `catalogue`, special tokens <pad>=0, </s>=1."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(catalogue, trainer)
    return tok


def child(args) -> dict:
    """One fresh process's cell: build, then time generate calls 1 and 2."""
    import torch
    import transformers

    import static_compiler as sc
    from static_compiler.integrations.torch import StaticLogitsProcessor
    from static_compiler.jax_support.compile_events import CompileCounter

    torch.set_num_threads(1)
    catalogue = names(args.names)
    tok = train_bpe(catalogue, args.vocab)
    vocab = tok.get_vocab_size()
    compiled = sc.compile_constraints(catalogue, vocab_size=vocab, tokenizer=tok, end_token=1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2,
                                     n_head=2, bos_token_id=1, eos_token_id=1, pad_token_id=1)
    model = transformers.GPT2LMHeadModel(config).eval()
    beams = SEARCHES[args.search]
    prompts = torch.from_numpy(np.random.default_rng(0).integers(2, vocab, (BATCH, PROMPT_LENGTH)))
    start = time.perf_counter()
    processor = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=args.backend)
    init_s = time.perf_counter() - start
    out = {"backend": args.backend, "search": args.search, "max_length": compiled.max_length,
           "init_s": init_s}
    if args.warm:
        start = time.perf_counter()
        out["warm_compilations"] = processor.warm(BATCH * beams,
                                                  model_vocab_size=vocab).compilations
        out["warm_s"] = time.perf_counter() - start
    results = []
    for call in (1, 2):
        counter = CompileCounter()
        start = time.perf_counter()
        with torch.no_grad(), counter.counting():
            seqs = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                  num_beams=beams, do_sample=False,
                                  max_new_tokens=compiled.max_length,
                                  logits_processor=[processor], eos_token_id=1, pad_token_id=1)
        out[f"call{call}_s"] = time.perf_counter() - start
        out[f"call{call}_compilations"] = counter.count
        results.append(seqs)
        out[f"call{call}_steps"] = seqs.shape[1] - PROMPT_LENGTH
    out["same"] = bool(torch.equal(*results))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.hf_first_call",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=3000)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"])
    parser.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--search", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        sys.stdout.flush()
        os._exit(0)  # see tools.bench.cli.exit_without_teardown
    print(f"# HF generate first call vs second, {args.names} Unicode names, BPE V={args.vocab}, "
          f"tiny GPT-2, batch {BATCH}, fresh process per cell, median of {args.repeats}"
          f"{', after warm()' if args.warm else ''}")
    print("| backend | search | processor init s | first s | second s | first - second s | "
          "compilations 1st / 2nd |" + (" warm s |" if args.warm else ""))
    print("|--|--|--:|--:|--:|--:|--:|" + ("--:|" if args.warm else ""))
    for backend in args.backends:
        for search in args.searches:
            runs = []
            for _ in range(args.repeats):
                cmd = [sys.executable, "-m", "tools.bench.hf_first_call", "--child",
                       "--backend", backend, "--search", search, "--names", str(args.names),
                       "--vocab", str(args.vocab)] + (["--warm"] if args.warm else [])
                done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            med = {k: float(np.median([r[k] for r in runs]))
                   for k in ("init_s", "call1_s", "call2_s", "call1_compilations",
                             "call2_compilations") + (("warm_s",) if args.warm else ())}
            diff = float(np.median([r["call1_s"] - r["call2_s"] for r in runs]))
            line = (f"| {backend} | {search} | {med['init_s']:.2f} | {med['call1_s']:.2f} | "
                    f"{med['call2_s']:.3f} | {diff:+.2f} | {med['call1_compilations']:.0f} / "
                    f"{med['call2_compilations']:.0f} |")
            if args.warm:
                line += f" {med['warm_s']:.2f} |"
            print(line + ("" if all(r["same"] for r in runs) else " SEQUENCES DIFFER"),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
