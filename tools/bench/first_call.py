"""First-call (trace + XLA compile) and steady-state times of decoding, each
measured in a fresh process, so nothing is cached in memory:

    python -m tools.bench.first_call [--sets timezones,sids] [--repeats 3]
        [--library PATH]   # a checkout whose static_compiler to measure (default: this one)

Sets: `timezones` (the IANA time-zone names of `zoneinfo`, one token per
character, an end token: a variable-length set of ~600 names, ~33 steps),
`sids` (1e6 synthetic Semantic IDs, L = 8, V = 2048: the paper's
configuration) and `long:L` (200 random sequences of L tokens over V = 4:
first-call time against the length, the library only, no artifact). For each set it reports, at batch 2, beams 70, 30 tokens per
beam, with a trivial logits_fn (zeros, so the model costs nothing):

* beam_search first call: trace + compile + one run, in seconds;
* beam_search steady call: the median of later calls, in ms;
* artifact first beam_step: `serving.load` then the first step (XLA compiles
  the deserialized module), in seconds; and with jax's persistent compilation
  cache (`--cache`), the same in a second process that finds it warm;
* with `--cache`, beam_search's first call too in a process that finds the
  cache warm (`first_call_cached_s`).

`--library` points the child processes at another checkout (first on
PYTHONPATH), so a baseline commit is measured in the same
run: `git worktree add /tmp/base <commit>` then `--library /tmp/base`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, statistics, zoneinfo
import numpy as np, jax, jax.numpy as jnp
import static_compiler as sc
from static_compiler import serving
from static_compiler import datasets  # both layouts (a --library checkout may be older)

which, repeats, art_dir, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if cache != "-":
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
out = {"library": sc.__file__}
if which.startswith("artifact:"):
    t0 = time.perf_counter()
    art = serving.load(art_dir)
    state = art.init_beams(2, 70)
    logits = np.zeros((2, 70, art.vocab_size), np.float32)
    t1 = time.perf_counter()
    state = art.beam_step(state, logits, 0)
    jax.block_until_ready(state)
    out["artifact_first_step_s"] = time.perf_counter() - t1
    out["artifact_load_s"] = t1 - t0
    print(json.dumps(out))
    sys.exit(0)
if which == "timezones":
    names = sorted(zoneinfo.available_timezones())
    chars = sorted({c for n in names for c in n})
    ids = {c: i + 1 for i, c in enumerate(chars)}
    seqs = [[ids[c] for c in n] for n in names]
    compiled = sc.compile_constraints(seqs, len(chars) + 1, end_token=0,
                                      export_tokens_per_beam=30)
elif which.startswith("long:"):
    rows = np.random.default_rng(0).integers(0, 4, size=(200, int(which[5:])))
    compiled = sc.compile_constraints(rows, 4, export_tokens_per_beam=30)
else:
    data = datasets.synthetic_sids(1_000_000, 8, 2048, seed=0)
    compiled = sc.compile_constraints(data, 2048, export_tokens_per_beam=30)
V = compiled.plan.vocab_size

def trivial(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (V,), jnp.float32), carry

t0 = time.perf_counter()
r = sc.beam_search(compiled, trivial, batch_size=2, beam_size=70, tokens_per_beam=30)
jax.block_until_ready(r)
out["first_call_s"] = time.perf_counter() - t0
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(sc.beam_search(compiled, trivial, batch_size=2, beam_size=70,
                                         tokens_per_beam=30))
    times.append(time.perf_counter() - t0)
out["steady_call_ms"] = 1e3 * statistics.median(times)
out["steps"] = compiled.plan.max_length
if art_dir != "-":
    compiled.save(art_dir, overwrite=True)
print(json.dumps(out))
"""


def _run(library: str, args: list) -> dict:
    """CHILD in a fresh process, run from a temporary folder (with `-c` the
    working folder comes first on sys.path: run from a checkout, it would
    shadow `library`)."""
    env = dict(os.environ)
    if library:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(library), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(which: str, repeats: int, library: str, cache: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        art = "-" if which.startswith("long:") else os.path.join(tmp, "set.static")
        row = {"set": which, **_run(library, [which, repeats, art, "-"])}
        if art == "-":
            return row
        row.update(_run(library, [f"artifact:{which}", 0, art, "-"]))
        if cache:
            cache_dir = os.path.join(tmp, "jax-cache")
            _run(library, [which, 1, "-", cache_dir])  # fills the cache
            row["first_call_cached_s"] = _run(library, [which, 1, "-", cache_dir])["first_call_s"]
            _run(library, [f"artifact:{which}", 0, art, cache_dir])
            warm = _run(library, [f"artifact:{which}", 0, art, cache_dir])
            row["artifact_first_step_cached_s"] = warm["artifact_first_step_s"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.first_call",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="timezones,sids")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--library", default="", help="checkout to measure (default: this one)")
    parser.add_argument("--cache", action="store_true",
                        help="also time beam_search's first call and the artifact's first step "
                             "with a warm persistent cache")
    args = parser.parse_args(argv)
    rows = [measure(s, args.repeats, args.library, args.cache) for s in args.sets.split(",")]
    keys = ["set", "steps", "first_call_s", "first_call_cached_s", "steady_call_ms",
            "artifact_first_step_s",
            "artifact_first_step_cached_s"]
    print(f"library: {rows[0]['library']}")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        cells = [f"{row[k]:.3f}" if isinstance(row.get(k), float) else str(row.get(k, "-"))
                 for k in keys]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
