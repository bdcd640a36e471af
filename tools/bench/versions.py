"""What kept versions cost on disk: an artifact of N random Semantic IDs
(L = 4 over V = 256, export_subsets, beam size 8, capacity 1.5) takes
``--updates`` removals (one item each), or as many additions within the
capacity (three items each), through `sc.update_artifact`; after each run
the disk the artifact and its `.NAME.versions/` hold together is measured
(allocated blocks, every hard-linked file counted once, as `du` counts),
against the artifact's own, with the default keep (5) and with
``keep_versions=1``.

A removal writes only items/removed.npy and the manifest, hard-linking the
rest; an addition within the capacity writes the tables, the item index,
the IR dump and the manifest anew and hard-links the modules; the modules
dominate a small artifact, the tables a large one.

    python -m tools.bench versions                  # 1e4 items, 6 updates
    python -m tools.bench versions --items 1e5 --updates 6
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import numpy as np

from tools.bench.cli import _items_parser
from tools.bench.output import machine_line

L, V = 4, 256


def disk_bytes(*roots) -> int:
    """Allocated bytes of every file under `roots`, each inode once."""
    seen, total = set(), 0
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                st = os.stat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def run(n: int, updates: int, seed: int = 0) -> list[dict]:
    """One row per (kind, keep): the artifact's MiB and the ratio of
    artifact plus kept versions to the artifact after `updates` updates."""
    import static_compiler as sc
    from static_compiler.artifact import history

    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, V, (n, L), dtype=np.int32), axis=0)
    compiled = sc.compile_constraints(rows, V, export_subsets=True, export_beam_sizes=(8,),
                                      capacity=1.5)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("removals", "additions"):
            for keep in (None, 1):
                path = compiled.save(pathlib.Path(tmp) / f"{kind}-{keep}.static")
                modules = disk_bytes(path / "modules")
                reports = []
                for i in range(updates):
                    if kind == "removals":
                        mask = np.zeros(len(rows), bool)
                        mask[i] = True
                        reports.append(sc.update_artifact(path, remove=mask, keep_versions=keep))
                    else:
                        add = rng.integers(0, V, (3, L), dtype=np.int32)
                        reports.append(sc.update_artifact(path, add=add, keep_versions=keep))
                if kind == "additions" and any(r["modules"] != "reused" for r in reports):
                    raise SystemExit("versions bench: an addition outgrew the capacity (its "
                                     "modules were exported anew): fewer --updates")
                own = disk_bytes(path)
                out.append({"kind": kind, "keep": 5 if keep is None else keep,
                            "artifact_mib": own / 2**20, "modules_share": modules / own,
                            "ratio": disk_bytes(path, history.versions_dir(path)) / own,
                            "kept": len(sc.list_versions(path)) - 1})
    return out


def main(argv=None) -> int:
    parser = _items_parser("python -m tools.bench versions", __doc__, 1e4)
    parser.add_argument("--updates", type=int, default=6)
    args = parser.parse_args(argv)
    rows = run(int(args.items), args.updates)
    print(machine_line())
    print(f"\n{int(args.items):.0e} items, {args.updates} updates\n")
    print("| updates | keep | kept versions | artifact | modules' share | artifact + kept |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {args.updates} {r['kind']} | {r['keep']} | {r['kept']} | "
              f"{r['artifact_mib']:.2f} MiB | {r['modules_share']:.0%} | {r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
