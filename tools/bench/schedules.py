"""Business rules, the beam-schedule section: what a per-step beam width
saves at the paper's config (batch B = 2, final width M = 70, L = 8,
V = 2048) against the fixed width of the same final size.

A set of N uniform Semantic IDs (`datasets.synthetic_sids`) and a model
whose cost grows with the beams it sees (an MLP over each beam's last token
and the step: (B * M, 64) -> 256 -> V, a stand-in for a decoder step with
a KV cache of one row per beam). Each search is the whole jitted
`beam_search` (model and constraint), timed as the median of ``--repeats``
after a compile, the searches called in turn each repeat (so all meet the
same machine). Reported per schedule: the model rows it runs (sum over
steps of B x the beams the step sees), the decode time and its ratio to the
fixed width measured in the same run, and how much of the fixed width's
result it finds (recall@10 and @70 of the fixed width's beams, averaged
over the batch rows: a narrower early step can prune what the fixed width
keeps).

    python -m tools.bench rules --section schedules           # 1e5 items
    python -m tools.bench.schedules --items 1e6 --repeats 9
"""

from __future__ import annotations

import time

import numpy as np

from tools.bench.cli import exit_without_teardown, sized_parser
from tools.bench.output import machine_line

B, M, L, V = 2, 70, 8, 2048
DEFAULT_ITEMS = 1e5
SCHEDULES = {
    "fixed 70 (beam_size=70)": M,
    "70 every step, from the start beam": (M,) * L,
    "10, 20, 35, 70, 70, 70, 70, 70": (10, 20, 35, 70, 70, 70, 70, 70),
    "20, 35, 70, 70, 70, 70, 70, 70": (20, 35, 70, 70, 70, 70, 70, 70),
    "35, 70, 70, 70, 70, 70, 70, 70": (35, 70, 70, 70, 70, 70, 70, 70),
}
"""The searches compared, by name; the first is the baseline."""


def mlp_model(seed: int, width: int = 64, hidden: int = 256):
    """logits_fn (last_tokens int32 (B, M), step, carry) -> (float32 (B, M,
    V), carry): a fixed random MLP of each beam's last token and the step."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    emb = jnp.asarray(rng.standard_normal((V, width), dtype=np.float32))
    pos = jnp.asarray(rng.standard_normal((L + 1, width), dtype=np.float32))
    w1 = jnp.asarray(rng.standard_normal((width, hidden), dtype=np.float32) / np.sqrt(width))
    w2 = jnp.asarray(rng.standard_normal((hidden, V), dtype=np.float32) * 3 / np.sqrt(hidden))

    def logits_fn(last, step, carry):
        x = emb[jnp.clip(last, 0, V - 1)] + pos[step]
        return jax.nn.gelu(x @ w1) @ w2, carry

    return logits_fn


def model_rows(schedule) -> int:
    """Rows the model runs over a search: B x the beams each step sees."""
    if isinstance(schedule, int):
        return B * schedule * L
    return B * (1 + sum(schedule[:-1]))


def recall(got, want, top: int) -> float:
    """Mean over batch rows of the share of want's first `top` valid beams
    that got holds anywhere (tokens compared whole)."""
    shares = []
    for b in range(B):
        have = {tuple(t) for t, v in zip(np.asarray(got.tokens)[b], np.asarray(got.valid)[b])
                if v}
        ref = [tuple(t) for t, v in zip(np.asarray(want.tokens)[b], np.asarray(want.valid)[b])
               if v][:top]
        shares.append(sum(r in have for r in ref) / max(1, len(ref)))
    return float(np.mean(shares))


def run(items: int, repeats: int, seed: int) -> int:

    import static_compiler as sc
    from static_compiler.frontend.datasets import synthetic_sids

    start = time.perf_counter()
    compiled = sc.compile_constraints(synthetic_sids(items, L, V, seed), vocab_size=V)
    print(f"# beam schedules: {items:.0e} uniform SIDs (L = {L}, V = {V}) compiled in "
          f"{time.perf_counter() - start:.1f} s; B = {B}; {machine_line()}; median of "
          f"{repeats}\n")
    print("| search | model rows | decode ms | vs fixed 70 | recall@10 of fixed | "
          "recall@70 of fixed |")
    print("|--|--:|--:|--:|--:|--:|")
    from tools.bench.timing import alternating_ms

    model = mlp_model(seed)
    searches = [lambda s=schedule: sc.beam_search(compiled, model, batch_size=B, beam_size=s,
                                                  start_token=np.arange(B))
                for schedule in SCHEDULES.values()]
    ms, outs = alternating_ms(searches, repeats)
    times, results = dict(zip(SCHEDULES, ms)), dict(zip(SCHEDULES, outs))
    base = next(iter(SCHEDULES))
    for name, schedule in SCHEDULES.items():
        print(f"| {name} | {model_rows(schedule)} | {times[name]:.2f} | "
              f"{times[name] / times[base]:.2f}x | {recall(results[name], results[base], 10):.2f}"
              f" | {recall(results[name], results[base], 70):.2f} |")
    same = np.array_equal(np.asarray(results[base].tokens),
                          np.asarray(results["70 every step, from the start beam"].tokens))
    print(f"\n# 70 every step from the start beam gives the fixed width's beams: "
          f"{'yes' if same else 'NO'}")
    return 0 if same else 1


def main(argv=None) -> int:
    args = sized_parser("python -m tools.bench.schedules", __doc__, DEFAULT_ITEMS).parse_args(argv)
    return run(int(args.items), args.repeats, args.seed)


if __name__ == "__main__":
    exit_without_teardown(main())
