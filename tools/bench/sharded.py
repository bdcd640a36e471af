"""Tables split across D devices (`CompiledConstraints.shard`) against the
replicated index: N random Semantic IDs compiled once without capacity and
once with capacity 1.25 (room to grow), then, for each and D = 1, 2, 4, 8
host CPU devices: the table bytes each device holds (the largest share; split
tables are padded to a multiple of D, no capacity needed), that beam search
(batch 2, 70 beams, 30 tokens per beam, a model of zeros) gives the same bits
as on one device, and its median time beside the replicated search of the
same run. Host devices share this machine's cores:
the times show the cost of the collectives here, not a real mesh's speed.

    python -m tools.bench.sharded                 # 1e7 items
    python -m tools.bench.sharded --items 1e5 --repeats 3
"""

from __future__ import annotations

import os
import subprocess
import sys

from tools.bench.cli import sid_set_parser
from tools.bench.timing import median_ms

DEVICES = 8


def _measure(n: int, length: int, vocab: int, repeats: int, min_bytes: int) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    import static_compiler as sc
    from static_compiler.frontend import datasets
    from tools.bench.output import machine_line

    print(f"# tables across devices: {n} random items, L = {length}, V = {vocab}, "
          f"{len(jax.devices())} host devices")
    print(f"# {machine_line()}")
    items = datasets.synthetic_sids(n, length, vocab, seed=0)
    plain = sc.compile_constraints(items, vocab)
    roomy = sc.compile_constraints(items, vocab, capacity=1.25)
    zeros = lambda t, s, c: (jnp.zeros(t.shape + (vocab,), jnp.float32), c)

    def search(compiled):
        return lambda: jax.block_until_ready(sc.beam_search(
            compiled, zeros, batch_size=2, beam_size=70, tokens_per_beam=30))

    replicated = plain.lowered.bytes_per_device()
    search(plain)()  # compile
    base_ms = median_ms(search(plain), repeats)
    print("\n| tables | bytes per device | vs replicated | search ms | vs replicated | same bits |")
    print("|---|---|---|---|---|---|")
    print(f"| replicated (no capacity), 1 device | {replicated / 2**20:.1f} MiB | 1.00x | "
          f"{base_ms:.2f} | 1.00x | |")
    same_everywhere = True
    for label, compiled in (("no capacity", plain), ("capacity 1.25", roomy)):
        want = search(compiled)()
        for D in (1, 2, 4, 8):
            split = compiled.shard(Mesh(np.array(jax.devices()[:D]), ("d",)), "d",
                                   min_bytes=min_bytes)
            got = search(split)()
            same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want))
            same_everywhere &= same
            per = split.lowered.bytes_per_device()
            ms = median_ms(search(split), repeats)  # compiled by the check above
            print(f"| {label}, split over D = {D} | {per / 2**20:.1f} MiB | "
                  f"{per / replicated:.3f}x | {ms:.2f} | {ms / base_ms:.2f}x | "
                  f"{'yes' if same else 'NO'} |")
    return 0 if same_everywhere else 1


def main(argv=None) -> int:
    parser = sid_set_parser("sharded", __doc__, 1e7)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-bytes", type=int, default=1 << 20,
                        help="tables smaller than this stay whole on every device")
    args = parser.parse_args(argv)
    if os.environ.get("_STATIC_COMPILER_SHARDED_CHILD") != "1":
        # Host devices are set before jax starts: run again in a child.
        env = {**os.environ, "_STATIC_COMPILER_SHARDED_CHILD": "1", "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={DEVICES}").strip()}
        command = [sys.executable, "-m", "tools.bench.sharded", *(argv or sys.argv[1:])]
        return subprocess.run(command, env=env).returncode
    return _measure(int(args.items), args.length, args.vocab, args.repeats, args.min_bytes)


if __name__ == "__main__":
    sys.exit(main())
