"""A filter per request, as the vLLM processor serves one (``sc_where``):
the subset made twice (vLLM's front end admits the request, the engine
starts it: `integrations.vllm.sets.SetCache.subset` runs in each process),
then one row decoded by the torch door's `processor_step` at every step
(a request whose filter is its own decodes in a group of its own). The
forms: no filter, `subset(where=)` (a `Subset`: a walk up the trie) and
`ranked_subset(where=)` (item bits in trie order, read by rank per step),
on the same rows and tokens, every step's allowed tokens compared between
the two forms (the run exits 1 where they differ).

The set: N random Semantic IDs (L levels of V = 2048) with a float32
``price`` column in [0, 100); request r's filter is ``price < x_r`` with a
distinct x_r near 10 (about 10 % of the items), so no request reuses
another's subset. Per size and form: the median over ``--requests`` of one
request's make (twice) and decode, in ms. What it decides:
`integrations.vllm.sets.RANKED_FROM_ROWS`, the set size from which a
filter is made ranked.

    python -m tools.bench.request_filters                     # 1e5 and 1e6 items, L = 4
    python -m tools.bench.request_filters --sizes 1e7 --length 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tools.bench.cli import _count, exit_without_teardown
from tools.bench.output import machine_line


def build(n: int, length: int, seed: int):
    """A `TorchConstraints` of n random Semantic IDs with a price column."""
    import static_compiler as sc
    from static_compiler.torch_backend import TorchConstraints

    rng = np.random.default_rng(seed)
    price = (rng.random(n, dtype=np.float32) * 100).astype(np.float32)
    compiled = sc.compile_constraints(rng.integers(0, 2048, (n, length)), vocab_size=2048,
                                      attributes={"price": price})
    tc = TorchConstraints.from_compiled(compiled)
    tc.warm((1,))
    return tc


def one_request(tc, form: str, where: str, gen: torch.Generator) -> tuple:
    """(make ms (both processes), decode ms, allowed tokens per step) of one
    request over `form`'s subset of filter `where`."""
    start = time.perf_counter()
    subset = None
    if form != "none":
        make = tc.subset if form == "subset" else tc.ranked_subset
        for _ in range(2):  # (admission, then the engine's start)
            subset = make(where=where)
    made = time.perf_counter() - start
    start = time.perf_counter()
    result = tc.processor_step(tc.init_processor(1), 0, subset=subset)
    seen = [result.allowed.clone()]
    for t in range(1, tc.max_length):
        token = torch.multinomial(result.allowed.float() + 1e-9, 1, generator=gen)[:, 0]
        result = tc.processor_step(result.state, t, tokens=token, columns=result.columns,
                                   subset=subset)
        seen.append(result.allowed.clone())
    return 1e3 * made, 1e3 * (time.perf_counter() - start), seen


def run(sizes, length: int, requests: int, seed: int) -> int:
    print(machine_line())
    print(f"\none request with its own filter: made twice, then decoded ({length} steps, one "
          "row); median ms over the requests\n")
    print("| items | form | make x2 | decode | request | vs subset() |")
    print("|---|---|--:|--:|--:|--:|")
    ok = True
    for n in sizes:
        tc = build(n, length, seed)
        rows: dict = {form: [] for form in ("none", "subset", "ranked")}
        for r in range(requests + 1):  # (request 0 warms each form's path)
            where = f"price < {10.0 + 0.001 * r:.3f}"
            steps = {}
            for form in rows:  # interleaved, the same tokens for each
                make, decode, seen = one_request(tc, form, where,
                                                 torch.Generator().manual_seed(seed + r))
                steps[form] = seen
                if r:
                    rows[form].append((make, decode))
            ok = ok and all(torch.equal(a, b) for a, b in zip(steps["subset"], steps["ranked"]))
        totals = {form: statistics.median(m + d for m, d in got) for form, got in rows.items()}
        for form, got in rows.items():
            make = statistics.median(m for m, _ in got)
            decode = statistics.median(d for _, d in got)
            ratio = "" if form == "none" else f"{totals[form] / totals['subset']:.2f}x"
            print(f"| {n:.0e} | {form} | {make:.2f} | {decode:.2f} | {totals[form]:.2f} | "
                  f"{ratio} |")
    print("\nallowed tokens of ranked = subset() at every step: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.request_filters",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=_count, default=[10 ** 5, 10 ** 6])
    parser.add_argument("--length", type=int, default=4, help="Semantic ID length L")
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run(args.sizes, args.length, args.requests, args.seed)


if __name__ == "__main__":
    exit_without_teardown(main())
