"""The Hugging Face logits processor's per-step mask against
``prefix_allowed_tokens_fn`` over a Python dict trie (HF's own
`PrefixConstrainedLogitsProcessor`), on the same inputs in the same run.

The set is N random Semantic IDs (L tokens over V); each step t of a decode
hands both processors the same input_ids (a prompt, then t tokens of random
members of the set: what a beam search holds) and scores; their outputs must
be equal (the run exits 1 otherwise). Per step: the median over repeats of
the mean of `calls` back-to-back calls, the repeats interleaving the two
processors so machine load hits them alike; "mean" is a decode's average
step. The garbage collector is off while timing (as in `timeit`): the dict
trie holds ~L x N dicts, and a full collection that happens to fall into a
timed call would cost ~10 ms, to whichever processor triggered it. Torch
runs on one thread (``--torch-threads``): on this shared 2-core machine its
intra-op pool made one small ``amax`` of HF's processor take 15 ms, which
would credit the static processor with the pool's waits.

    python -m tools.bench.torch_mask                      # 1e5 items, L=8, V=2048, 16 and 140 rows
    python -m tools.bench.torch_mask --items 1e6 --rows 16 --repeats 50
    python -m tools.bench.torch_mask --backend jax torch --rows 140 128   # both backends

``--backend`` picks the static processor's backends (`StaticLogitsProcessor`
backend=, one column each; default jax).
"""

from __future__ import annotations

import gc
import time

import numpy as np
import torch
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

import static_compiler as sc
from static_compiler.integrations.torch import StaticLogitsProcessor
from tools.bench.cli import exit_without_teardown, sid_set_parser
from tools.bench.output import machine_line

PROMPT_LENGTH = 4


def dict_trie(items: np.ndarray) -> dict:
    root: dict = {}
    for item in items.tolist():
        node = root
        for tok in item:
            node = node.setdefault(tok, {})
    return root


def trie_fn(trie: dict, prompt_length: int):
    """The usual ``prefix_allowed_tokens_fn``: walk the trie along the
    generated tokens, return the children's tokens."""
    def fn(batch_id, input_ids):
        node = trie
        for tok in input_ids[prompt_length:].tolist():
            node = node.get(tok, {})
        return list(node)
    return fn


def _mean_seconds(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls


def measure(items: int, length: int, vocab: int, rows: int, repeats: int, calls: int,
            seed: int = 0, backends=("jax",)) -> list:
    """Rows [t, trie ms, static ms per backend...] for t in 0..length-1
    (medians over repeats)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(0, vocab, size=(items, length)), axis=0)
    compiled = sc.compile_constraints(ids, vocab_size=vocab)
    statics = {b: StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=b) for b in backends}
    hf = PrefixConstrainedLogitsProcessor(trie_fn(dict_trie(ids), PROMPT_LENGTH), num_beams=rows)
    out = []
    for t in range(length):
        picks = ids[rng.integers(len(ids), size=rows), :t]
        prompt = rng.integers(0, vocab, size=(rows, PROMPT_LENGTH))
        input_ids = torch.from_numpy(np.concatenate([prompt, picks], axis=1).astype(np.int64))
        scores = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32))
        want = hf(input_ids, scores)
        for b, static in statics.items():
            if not torch.equal(static(input_ids, scores), want):
                raise SystemExit(f"step {t}: the processors disagree (backend {b})")
            for _ in range(3):  # warm-up: compiles static's program for this t
                static(input_ids, scores)
        times = {"trie": [], **{b: [] for b in statics}}
        gc.collect()
        gc.disable()
        try:
            for _ in range(repeats):
                times["trie"].append(_mean_seconds(hf, (input_ids, scores), calls))
                for b, static in statics.items():
                    times[b].append(_mean_seconds(static, (input_ids, scores), calls))
        finally:
            gc.enable()
        out.append([t] + [1e3 * float(np.median(times[k])) for k in times])
    return out


def table(rows: list, backends=("jax",)) -> str:
    """Markdown: per step the trie's ms, then per backend its ms and the
    trie's time over it."""
    head = "| step t | dict trie ms | " + " | ".join(f"static {b} ms | ratio" for b in backends)
    lines = [head + " |", "|--:" * (2 + 2 * len(backends)) + "|"]
    mean = ["mean"] + [float(np.mean([r[i] for r in rows])) for i in range(1, 2 + len(backends))]
    for row in rows + [mean]:
        trie, cells = row[1], [f"{row[1]:.3f}"]
        for ms in row[2:]:
            cells += [f"{ms:.3f}", f"{trie / ms:.1f}x"]
        lines.append(f"| {row[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = sid_set_parser("torch_mask", __doc__, 1e5)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 140],
                        help="rows per call (batch x beams); one table each")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10, help="back-to-back calls per repeat")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--backend", nargs="+", choices=["jax", "torch"], default=["jax"],
                        help="the static processor's backends, a column each")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    print(f"# HF logits processor mask: {int(args.items)} random items (duplicates dropped), "
          f"L = {args.length}, V = {args.vocab}, torch threads {args.torch_threads}")
    print(f"# {machine_line()}; torch {torch.__version__}")
    print("# static: StaticLogitsProcessor; dict trie: PrefixConstrainedLogitsProcessor over "
          "prefix_allowed_tokens_fn; outputs equal at every step")
    for n in args.rows:
        rows = measure(int(args.items), args.length, args.vocab, n, args.repeats, args.calls,
                       backends=tuple(args.backend))
        print(f"\n{n} rows per call\n")
        print(table(rows, tuple(args.backend)))
    print(f"# {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
