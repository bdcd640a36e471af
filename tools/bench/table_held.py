"""Live operations on a saved set that stays in its tables, against reading
its automaton back: N random Semantic IDs are compiled from `sc.Shards`
(capacity 1.25, with subsets) and saved; then each operation runs in a fresh
child process, timed, with its peak RSS above the child's RSS before it
(`VmHWM` against `VmRSS` once jax and the package are imported):

* load: `sc.load_compiled(path)`, the manifest's summary checked against the
  tables (format version 7), no automaton;
* load + IR (the baseline, what every load did before): `load_compiled(path,
  check_automaton=True)`, the automaton rebuilt from the tables and verified;
* subset: load, then `compiled.subset(mask)` of a random 10 % mask (the mask
  itself, N bytes, counts);
* serving subset: `serving.load(path).subset(mask)`;
* show-ir --stats: the CLI on the artifact;
* remove: `sc.update_artifact(path, remove=...)` of 1e4 items (N / 10 if
  fewer) given as token sequences (found in the tables);
* add: `sc.update_artifact(path, add=...)` of as many new random items within
  the capacity (the merged layers are built while the new tables are lowered).

    python -m tools.bench.table_held                 # 1e7 items
    python -m tools.bench.table_held --items 1e5
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from tools.bench.build import proc_status_bytes
from tools.bench.cli import ROOT, sid_set_parser

MODES = ("load + IR", "load", "subset", "serving subset", "show-ir --stats", "remove", "add")
CHANGED = 10_000


def _child(mode: str, path: str, n: int, length: int, vocab: int) -> dict:
    import numpy as np

    import static_compiler as sc
    from static_compiler.artifact import serving
    from static_compiler.cli import main as cli_main

    rng = np.random.default_rng(7)
    base = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    if mode == "load + IR":
        assert "ir" in sc.load_compiled(path, check_automaton=True).__dict__
    elif mode == "load":
        assert "ir" not in sc.load_compiled(path).__dict__
    elif mode == "subset":
        compiled = sc.load_compiled(path)
        compiled.subset(rng.random(n) < 0.1)
        assert "ir" not in compiled.__dict__
    elif mode == "serving subset":
        serving.load(path).subset(rng.random(n) < 0.1)
    elif mode == "show-ir --stats":
        with open(os.devnull, "w") as sink:
            stdout, sys.stdout = sys.stdout, sink
            try:
                assert cli_main(["show-ir", path, "--stats"]) == 0
            finally:
                sys.stdout = stdout
    elif mode == "remove":
        report = sc.update_artifact(path, remove=np.load(path + ".remove.npy"))
        assert report["removed"] > 0, report
    else:  # add
        report = sc.update_artifact(path, add=np.load(path + ".add.npy"))
        assert report["modules"] == "reused", report
    seconds = time.perf_counter() - start
    return {"mode": mode, "seconds": seconds, "peak": proc_status_bytes("VmHWM") - base}


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, path, n, length, vocab = sys.argv[2:7]
        print(json.dumps(_child(mode, path, int(n), int(length), int(vocab))))
        return 0
    parser = sid_set_parser("table_held", __doc__, 1e7)
    parser.add_argument("--partitions", type=int, default=16)
    args = parser.parse_args(argv)
    import numpy as np

    import static_compiler as sc
    from static_compiler.frontend import datasets
    from tools.bench.output import machine_line

    n, L, V = int(args.items), args.length, args.vocab
    print(f"# a saved set held in its tables: {n} random items, L = {L}, V = {V}")
    print(f"# {machine_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rows = datasets.synthetic_sids(n, L, V, seed=0)
        compiled = sc.compile_constraints(sc.Shards(rows, partitions=args.partitions), V,
                                          capacity=1.25, export_subsets=True)
        path = os.path.join(tmp, "set.static")
        compiled.save(path)
        # what the children remove and add (written here: generating 1e7 rows
        # in a child would count in its peak)
        rng, changed = np.random.default_rng(7), min(CHANGED, n // 10)  # fits a small set too
        np.save(path + ".remove.npy", rows[rng.choice(n, changed, replace=False)])
        np.save(path + ".add.npy", rng.integers(0, V, size=(changed, L)))
        del rows
        print(f"# compiled from Shards and saved in {time.perf_counter() - start:.1f} s: "
              f"{compiled.nbytes / 2**20:.1f} MiB of tables", flush=True)
        del compiled
        rows = []
        for mode in MODES:
            out = subprocess.run([sys.executable, "-m", "tools.bench.table_held", "--child", mode,
                                  path, str(n), str(L), str(V)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
            if out.returncode:
                return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    print("\n| operation | seconds | peak RSS above the start (MiB) | vs load + IR |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds']:.2f} | {r['peak'] / 2**20:.0f} | "
              f"{r['peak'] / max(1, base['peak']):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
