"""Item subsets at scale: the cost of making a subset and of decoding over
one, against decoding the whole set in the same run.

N random Semantic IDs (L = 8, V = 2048 by default, the paper's synthetic
set) are compiled once; then, in one process:

* subset: `compiled.subset(mask)` for a random 10 % mask over the N rows
  (mask -> bit-packed liveness per depth), median of `--repeats`; and the
  same through the serving loader (`serving.load(...).subset`, the set
  saved with its subset modules);
* memory: the subset's bytes and bits per state;
* decode: `beam_search` (batch 2, beams 70, 30 tokens per beam) over the
  whole set, over one subset, and (batch 3) over three per-row subsets
  against batch 3 without; whole-search medians over `--repeats`
  interleaved calls, per step = search / L, ratios against the no-subset
  search of the same batch. Two stand-in models, so the constraint work is
  all there is: "random", a fixed table of random logits per step and beam
  (read by one slice: a model's scores differ between candidates), and
  "zeros" (every score ties: the top-k comparisons then follow the valid
  pattern alone, which makes the search without a subset unusually cheap);
* compiles: XLA compilations of `beam_search` while new subsets of the same
  set are decoded (0 expected: subsets are arguments);
* capacity: the same items compiled again with `capacity=--capacity`
  (tables padded for growth, as a set that expects updates is): its memory
  and decode time against the set without;
* removal: on that set, warmed up by one decode, `update(remove=...)` of 1e4
  random items, then the next decode (which leaves them out), timed from
  the call to the decode's result: the first (and the XLA compilations it
  caused: 0 expected, the warm-up compiled its program) and the median of
  `--repeats` more;
* addition: `update(add=...)` of 1e4 new random items and the next
  decode, timed the same way, median over `--add-repeats` additions, and
  the XLA compilations they caused (0 expected while they fit).

XLA compilations are counted from jax's backend-compile events.

    python -m tools.bench.live                    # 1e7 items
    python -m tools.bench.live --items 1e5 --repeats 5
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import static_compiler as sc
from static_compiler.frontend import datasets
from static_compiler.jax_support.compile_events import xla_compilations
from tools.bench.cli import sid_set_parser
from tools.bench.output import machine_line
from tools.bench.timing import median_ms


def main(argv=None) -> int:
    parser = sid_set_parser("live", __doc__, 1e7)
    parser.add_argument("--fraction", type=float, default=0.1, help="share of rows in a subset")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--capacity", type=float, default=1.25,
                        help="growth factor reserved for additions")
    parser.add_argument("--add-repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n, L, V = int(args.items), args.length, args.vocab
    print(f"# item subsets: {n} random items, L = {L}, V = {V}, subsets of {args.fraction:.0%}")
    print(f"# {machine_line()}")
    start = time.perf_counter()
    compiled = sc.compile_constraints(datasets.synthetic_sids(n, L, V, seed=0), V)
    print(f"# compiled in {time.perf_counter() - start:.1f} s, {compiled.lowered.nbytes / 2**20:.1f} MiB "
          f"of tables, {compiled.ir.num_states} states")
    rng = np.random.default_rng(1)
    masks = [rng.random(n) < args.fraction for _ in range(args.repeats)]
    compiled.subset(masks[0])  # the fingerprint is hashed once, on first use
    times = []
    for mask in masks:
        t0 = time.perf_counter()
        sub = compiled.subset(mask)
        times.append(time.perf_counter() - t0)
    subset_ms = 1e3 * statistics.median(times)
    serving_ms = _serving_subset_ms(compiled, masks)
    bits = sub.bits_per_state(compiled.ir.num_states)

    def logits_fn(last_tokens, step, carry):
        return jnp.zeros(last_tokens.shape + (V,), jnp.float32), carry

    table = jnp.asarray(rng.standard_normal((L + 1, 70, V)).astype(np.float32))

    def table_fn(last_tokens, step, carry):
        B, M = last_tokens.shape
        rows = lax.dynamic_index_in_dim(table, step, keepdims=False)[:M]
        return jnp.broadcast_to(rows, (B, M, V)), carry

    def run(batch, model=logits_fn, **kw):
        return lambda: jax.block_until_ready(sc.beam_search(
            compiled, model, batch_size=batch, beam_size=70, tokens_per_beam=30, **kw))

    three = sc.stack_subsets([compiled.subset(m) for m in masks[:3]])
    calls = {}
    for label, model in (("random", table_fn), ("zeros", logits_fn)):
        calls.update({(label, "none, B=2"): run(2, model), (label, "one subset, B=2"):
                      run(2, model, subset=sub), (label, "none, B=3"): run(3, model),
                      (label, "3 per-row subsets, B=3"):
                      run(3, model, subset=three, subset_index=np.arange(3))})
    for fn in calls.values():
        fn()  # compile
    compiles = xla_compilations()
    for mask in masks[3:6]:  # new subsets of the same set: no new programs
        run(2, subset=compiled.subset(mask))()
    new_compiles = xla_compilations() - compiles
    ms = {name: [] for name in calls}
    for _ in range(args.repeats):  # interleaved, so load hits every variant alike
        for name, fn in calls.items():
            ms[name].append(median_ms(fn, 1))
    med = {name: statistics.median(v) for name, v in ms.items()}
    # Removals and additions: the same items compiled again with room to
    # grow, as a set that expects updates is; its first decode (warm-up)
    # also compiles the program that decodes over the items a removal leaves.
    t0 = time.perf_counter()
    roomy = sc.compile_constraints(datasets.synthetic_sids(n, L, V, seed=0), V,
                                   capacity=args.capacity)
    roomy_s = time.perf_counter() - t0
    grow = lambda v: jax.block_until_ready(sc.beam_search(
        v, logits_fn, batch_size=2, beam_size=70, tokens_per_beam=30))
    grow(roomy)  # warm-up
    roomy_ms, plain_ms = [], []
    for _ in range(max(args.repeats, 100)):  # pairs of ~2 ms decodes: 9 of them were noise
        roomy_ms.append(median_ms(lambda: grow(roomy), 1))
        plain_ms.append(median_ms(calls["zeros", "none, B=2"], 1))

    def removed(version):
        gone = np.zeros(n, bool)
        gone[rng.choice(n, min(n, 10_000), replace=False)] = True
        t0 = time.perf_counter()
        version = version.update(remove=gone)
        grow(version)
        return version, time.perf_counter() - t0

    before = xla_compilations()
    version, first_removal = removed(roomy)  # the first of the process: nothing to compile
    first_compiles = xla_compilations() - before
    removal = []
    for _ in range(args.repeats):
        version, seconds = removed(version)
        removal.append(seconds)
    del version
    programs = xla_compilations()
    adding, grew = [], []
    version = roomy
    # 1e4 per addition, fewer where that would outgrow the capacity of a small set
    per_add = max(1, min(10_000, int(n * (args.capacity - 1) / (2 * args.add_repeats))))
    for _ in range(args.add_repeats):
        new = rng.integers(0, V, size=(per_add, L))
        t0 = time.perf_counter()
        version = version.update(add=new)
        grow(version)
        adding.append(time.perf_counter() - t0)
        grew += version.build.last_update["grew"]
    add_compiles = xla_compilations() - programs
    print("\n| measure | value | target |\n|---|---|---|")
    print(f"| subset: mask -> liveness, {args.fraction:.0%} of {n} rows | {subset_ms:.1f} ms "
          f"| <= 50 ms |")
    print(f"| the same through a saved artifact (`serving.load(...).subset`) | {serving_ms:.1f} ms "
          f"| <= 50 ms |")
    print(f"| subset memory | {sub.nbytes / 2**20:.2f} MiB, {bits:.3f} bits per state | "
          f"<= 1 bit per state |")
    print(f"| new XLA compilations for 3 new subsets | {new_compiles} | 0 |")
    print(f"| first removal after warm-up (capacity {args.capacity}): XLA compilations, "
          f"time to the next decode's result | {first_compiles}, {1e3 * first_removal:.1f} ms "
          f"| 0 |")
    print(f"| remove 1e4 items, then the next decode | {1e3 * statistics.median(removal):.1f} ms "
          f"| <= 100 ms |")
    print(f"| add {per_add} items, then the next decode | {1e3 * statistics.median(adding):.0f} ms "
          f"(in order: {', '.join(f'{1e3 * a:.0f}' for a in adding)}) | <= 300 ms |")
    print(f"| new XLA compilations for {args.add_repeats} additions | {add_compiles}"
          f"{' (grew: ' + '; '.join(grew) + ')' if grew else ''} | 0 |")
    print(f"| capacity {args.capacity}: tables | {roomy.lowered.nbytes / 2**20:.1f} MiB against "
          f"{compiled.lowered.nbytes / 2**20:.1f} MiB "
          f"({roomy.lowered.nbytes / compiled.lowered.nbytes:.2f}x), compiled "
          f"in {roomy_s:.1f} s | <= 1.30x |")
    print(f"| capacity {args.capacity}: decode | {statistics.median(roomy_ms):.3f} ms against "
          f"{statistics.median(plain_ms):.3f} ms "
          f"({statistics.median(roomy_ms) / statistics.median(plain_ms):.2f}x) | <= 1.05x |")
    print("\n| decode (beams 70, 30 tokens per beam) | model | search ms | per step ms | ratio |")
    print("|---|---|---|---|---|")
    for (label, name), value in med.items():
        base = med[label, "none, B=2" if "B=2" in name else "none, B=3"]
        print(f"| {name} | {label} | {value:.3f} | {value / L:.3f} | {value / base:.2f}x |")
    print(f"# {time.perf_counter() - start:.1f} s")
    return 1 if new_compiles or add_compiles or first_compiles else 0


def _serving_subset_ms(compiled, masks) -> float:
    """Median ms of `Artifact.subset` over `masks` (after a first call), on
    the set saved with its subset modules and loaded by the serving loader;
    its bits are checked equal to the library's."""
    import dataclasses
    import tempfile

    from static_compiler import serving

    with tempfile.TemporaryDirectory() as tmp:
        exports = dataclasses.replace(compiled.export_options, subsets=True, beam_sizes=(70,))
        dataclasses.replace(compiled, export_options=exports).save(f"{tmp}/set.static")
        art = serving.load(f"{tmp}/set.static")
        first = art.subset(masks[0])
        want = compiled.subset(masks[0])
        assert all(np.array_equal(a, b) for a, b in zip(first.live, want.live)), "bits differ"
        times = []
        for mask in masks:
            t0 = time.perf_counter()
            art.subset(mask)
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
