"""Business rules, the item-prior section: what ranking with a prior (the
look-ahead of `rules.priors`) costs a beam search, against the same search
without one, at the paper's config (B = 2, M = 70, L = 8, V = 2048).

A set of N uniform Semantic IDs with a float attribute ``popularity``
(standard normal); each search is the whole jitted `beam_search`, timed as
the median of ``--repeats`` after a compile (the two searches alternate,
repeat by repeat, so both meet the same machine), with two models: the MLP of
`tools.bench.schedules` (a cost that grows with the beams) and a table
lookup (logits = a fixed (V, V) table's row of the last token: next to no
model cost, so the ratio is the constraint's own). Also timed: making the
prior on the host (`compiled.prior("popularity", weight=0.5)`), and what
the prior changes: the mean popularity of the beams found, without and
with it.

    python -m tools.bench rules --section priors              # 1e5 items
    python -m tools.bench.priors --items 1e6 --repeats 9
"""

from __future__ import annotations

import time

import numpy as np

from tools.bench.cli import exit_without_teardown, sized_parser
from tools.bench.output import machine_line
from tools.bench.schedules import B, L, M, V, mlp_model
from tools.bench.timing import alternating_ms

DEFAULT_ITEMS = 1e5
WEIGHT = 0.5


def table_model(seed: int):
    """logits_fn: a fixed random (V, V) table's row of each beam's last token."""
    import jax.numpy as jnp

    table = jnp.asarray(np.random.default_rng(seed).standard_normal((V, V), dtype=np.float32))
    return lambda last, step, carry: (table[last], carry)


def mean_popularity(result, sids: np.ndarray, popularity: np.ndarray) -> float:
    """The mean popularity of the valid beams' items."""
    row = {tuple(r): i for i, r in enumerate(sids)}
    tokens, valid = np.asarray(result.tokens), np.asarray(result.valid)
    return float(np.mean([popularity[row[tuple(t)]] for t in tokens[valid]]))


def run(items: int, repeats: int, seed: int) -> int:
    import static_compiler as sc
    from static_compiler.frontend.datasets import synthetic_sids

    sids = synthetic_sids(items, L, V, seed)
    popularity = np.random.default_rng(seed + 1).standard_normal(items).astype(np.float32)
    start = time.perf_counter()
    compiled = sc.compile_constraints(sids, vocab_size=V, export_subsets=True,
                                      attributes={"popularity": popularity})
    print(f"# item priors: {items:.0e} uniform SIDs (L = {L}, V = {V}) with a popularity "
          f"column, compiled in {time.perf_counter() - start:.1f} s; B = {B}, M = {M}, weight "
          f"{WEIGHT}; {machine_line()}; median of {repeats}\n")
    t0 = time.perf_counter()
    prior = compiled.prior("popularity", weight=WEIGHT)
    make_ms = (time.perf_counter() - t0) * 1e3
    print("| model | search without a prior, ms | with the prior, ms | ratio | mean popularity "
          "of the beams, without / with |")
    print("|--|--:|--:|--:|--|")
    ok = True
    for name, model in (("MLP (cost grows with the beams)", mlp_model(seed)),
                        ("table lookup (next to no model cost)", table_model(seed))):
        run_one = lambda p: sc.beam_search(compiled, model, batch_size=B, beam_size=M,
                                           start_token=np.arange(B), prior=p)
        (plain_ms, prior_ms), (plain, with_prior) = alternating_ms(
            [lambda: run_one(None), lambda: run_one(prior)], repeats)
        ok &= bool(np.asarray(with_prior.valid).all())
        print(f"| {name} | {plain_ms:.2f} | {prior_ms:.2f} | {prior_ms / plain_ms:.2f}x | "
              f"{mean_popularity(plain, sids, popularity):+.2f} / "
              f"{mean_popularity(with_prior, sids, popularity):+.2f} |")
    print(f"\n# making the prior on the host: {make_ms:.1f} ms ({items:.0e} items)")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = sized_parser("python -m tools.bench.priors", __doc__, DEFAULT_ITEMS).parse_args(argv)
    return run(int(args.items), args.repeats, args.seed)


if __name__ == "__main__":
    exit_without_teardown(main())
