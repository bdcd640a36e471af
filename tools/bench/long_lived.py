"""Memory of a long-lived process, each measurement in a fresh child:

* library: compiles and decodes (beam search, 4 beams) `--sets` sets of
  distinct shapes one after another, with the program bound at `--bound`
  (`sc.set_max_programs`); prints the process's memory maps and RSS every
  `--every` sets. With `--bound 0` the bound is lifted (every set's programs
  kept, as before the bound existed).
* serving: loads and decodes `--artifacts` artifacts saved beforehand, over
  and over (`--rounds`), with the serving loader only.

    python -m tools.bench.long_lived                      # bound 8, then lifted
    python -m tools.bench.long_lived --sets 60 --every 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from tools.bench.build import ROOT, proc_status_bytes

V = 16


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _line(label: str, count: int) -> str:
    return f"| {label} | {count} | {_maps()} | {proc_status_bytes('VmRSS') / 2**20:.0f} |"


def _sets(n: int):
    import numpy as np
    rng = np.random.default_rng(0)
    for i in range(n):  # 20 + i random rows: a new shape, so a new plan, each time
        yield np.unique(rng.integers(0, V, size=(20 + i, 3)), axis=0)


def _library(sets: int, every: int, bound: int) -> None:
    import gc

    import jax
    import jax.numpy as jnp

    import static_compiler as sc

    sc.set_max_programs(bound if bound else 10 ** 9)
    zeros = lambda t, s, c: (jnp.zeros(t.shape + (V,), jnp.float32), c)
    label = f"library, bound {bound or 'lifted'}"
    for i, items in enumerate(_sets(sets)):
        compiled = sc.compile_constraints(items, V, export_beam_sizes=(4,))
        jax.block_until_ready(sc.beam_search(compiled, zeros, batch_size=1, beam_size=4))
        del compiled
        if (i + 1) % every == 0:
            gc.collect()
            print(_line(label, i + 1), flush=True)


def _serving(root: str, rounds: int, every: int) -> None:
    import gc

    import jax
    import numpy as np

    from static_compiler import serving

    paths = sorted(os.path.join(root, p) for p in os.listdir(root)
                   if not p.startswith("."))  # (an artifact's kept versions: .NAME.versions)
    done = 0
    for _ in range(rounds):
        for path in paths:
            art = serving.load(path)
            state = art.init_beams(1, 4)
            for step in range(art.max_length):
                state = art.beam_step(state, np.zeros((1, 4, V), np.float32), step)
            jax.block_until_ready(state.tokens)
            del art, state
            done += 1
            if done % every == 0:
                gc.collect()
                print(_line("serving loader", done), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.long_lived",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=150)
    parser.add_argument("--every", type=int, default=30)
    parser.add_argument("--bound", type=int, nargs="+", default=[8, 0],
                        help="program bounds to run the library child with (0: lifted)")
    parser.add_argument("--artifacts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, a, b, c = args.child
        if mode == "library":
            _library(int(a), int(b), int(c))
        else:
            _serving(a, int(b), int(c))
        return 0
    print("| process | sets decoded | memory maps | RSS MiB |")
    print("|---|---|---|---|")
    children = [["library", str(args.sets), str(args.every), str(b)] for b in args.bound]
    with tempfile.TemporaryDirectory(prefix="long-lived-") as root:
        import static_compiler as sc
        for i, items in enumerate(_sets(args.artifacts)):
            sc.compile_constraints(items, V, export_beam_sizes=(4,)).save(
                os.path.join(root, f"a{i:03d}"))
        children.append(["serving", root, str(args.rounds), str(args.every)])
        for child in children:
            run = subprocess.run([sys.executable, "-m", "tools.bench.long_lived", "--child",
                                  *child], cwd=ROOT)
            if run.returncode:
                return run.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
