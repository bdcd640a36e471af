"""Live operations on a saved set that stays in its tables, against reading
its automaton back: N random Semantic IDs are compiled from `sc.Shards`
(capacity 1.25, with subsets) and saved; then each operation runs in a fresh
child process, timed, with its peak RSS above the child's RSS before it
(`VmHWM` against `VmRSS` once jax and the package are imported):

* load: `sc.load(path)`, the manifest's summary checked against the
  tables (format version 7), no automaton;
* load + IR (the baseline, what every load did before): `sc.load(path).ir`,
  the automaton rebuilt from the tables and verified;
* subset: load (checksums unverified, as below), then `compiled.subset(mask)`
  of a random 10 % mask (the mask itself, N bytes, counts);
* serving subset: `serving.load(path, verify_checksums=False).subset(mask)`
  (the load row verifies the checksums);
* show-ir --stats: the CLI on the artifact;
* remove: `sc.update_artifact(path, remove=...)` of 1e4 items (N / 10 if
  fewer) given as token sequences (found in the tables);
* add: `sc.update_artifact(path, add=...)` of as many new random items within
  the capacity (the merged layers are built while the new tables are lowered);
* verify: `static-compiler verify` of the artifact;
* serving loop (and serving loop, ranked: `ranked_subset` and the
  ``_ranked`` modules): a catalogue's interactive loop, each stage timed in one
  run: `serving.load(path, verify_checksums=False)`, two random 10 % item
  masks, a subset of each, then the first constrained decode (`init_beams`
  and one `beam_step` over the second subset, its modules compiled then);
  before it the page cache is made warm for the tables and the item index
  (each file read once) and cold for the modules (`posix_fadvise
  DONTNEED` on modules/*), the state issue 54's target names. With
  `--profile N` the child runs it under cProfile and prints the N
  costliest functions (cumulative and own time); with `--compile-cache
  DIR` the child turns on jax's persistent compilation cache there
  (`sc.enable_compilation_cache`) and the loop runs twice, each in a fresh
  child: the first fills the cache, the second (the row) reads it.

For the subsets each row also gives the operation alone: its seconds and
peak above the RSS once the set is loaded (VmHWM reset through
/proc/self/clear_refs after the load), then the seconds of a second subset
(another random 10 % mask: what each later filter of a loaded set costs, the
per-set work done once). At 1e9 the load reads the 4 GB item index once (its
ids are checked), from disk where the page cache has dropped it (~8 s at
the ~490 MiB/s this machine's disk reads), so the subsets find it cached.

Past memory (1e9), `--shards K` writes the rows as K shard files under
`--workdir` and compiles from them on a pool of `--workers` processes (no
row is held whole; `--pipeline` as `tools.bench.partitioned`'s), `--keep`
leaves the artifact there and `--artifact PATH` reuses one, and `--modes`
picks operations (the automaton rebuild of "load + IR" needs ~36 GB then).

    python -m tools.bench.table_held                 # 1e7 items
    python -m tools.bench.table_held --items 1e5
    python -m tools.bench.table_held --items 1e9 --shards 50 --partitions 256 \
        --workdir /data --keep --modes load,subset,serving-subset,show-ir,remove,verify \
        --pipeline "verify,choose-layout{memory-budget=16GiB},split-heavy,pad-branches,pack-dtypes"
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from tools.bench.build import proc_status_bytes
from tools.bench.cli import ROOT, sid_set_parser

CHANGED = 10_000
LOOP = "serving loop"
LOOP_RANKED = "serving loop, ranked"
LOOP_WHERE = "serving loop, ranked filter"
LOOPS = (LOOP, LOOP_RANKED, LOOP_WHERE)
MODES = ("load + IR", "load", "subset", "serving subset", "show-ir --stats", "remove", "add",
         "verify", LOOP, LOOP_RANKED, LOOP_WHERE)
KEYS = dict(zip(("load+ir", "load", "subset", "serving-subset", "show-ir", "remove", "add",
                 "verify", "serving-loop", "serving-loop-ranked", "serving-loop-where"), MODES))
FILTERS = ("uploaded_day >= 358 and region in (1, 7, 13) and price < 50.0",
           "uploaded_day < 36 and region in (2, 3) and price >= 90.0")
"""The serving loop's filters (`--attributes`): a 3-clause filter each, the
first `tools.bench.rules`' (with an int region code for its category: a
category column is built from strings, 12 GB of them at 1e9)."""
STAGES = ("load", "masks", "first subset", "second subset", "first decode")
LOADED = ("subset", "serving subset")
"""Modes whose own peak is also taken above the loaded set."""


def _quiet_cli(args: list) -> int:
    from static_compiler.cli import main as cli_main

    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            return cli_main(args)
        finally:
            sys.stdout = stdout


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _page_cache(path: str) -> None:
    """The serving loop's start: the tables and the item index in the page
    cache (each file read once), the modules out of it (`posix_fadvise
    DONTNEED`: clean pages are dropped; no root needed)."""
    for sub, keep in (("tables", True), ("items", True), ("modules", False)):
        folder = os.path.join(path, sub)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            with open(os.path.join(folder, name), "rb") as f:
                if keep:
                    while f.read(1 << 24):
                        pass
                else:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _serving_loop(path: str, rng, mode: str = LOOP) -> dict:
    """Seconds per stage (`STAGES`) of load -> masks -> two subsets -> the
    first constrained decode, in this (fresh) process; LOOP_RANKED: the
    subsets are `ranked_subset`'s, decoded by the ``_ranked`` modules;
    LOOP_WHERE: `ranked_subset(where=...)` of `FILTERS` (no masks), each
    checked against numpy's count of the rows it picks (rows in trie
    order: one item each) after the loop."""
    import numpy as np

    from static_compiler import serving

    seconds, last = {}, time.perf_counter()

    def lap(stage):
        nonlocal last
        now = time.perf_counter()
        seconds[stage], last = now - last, now

    art = serving.load(path, verify_checksums=False)
    lap("load")
    rows = art.items.row_item.shape[0]
    if mode == LOOP_WHERE:
        picks = [{"where": text} for text in FILTERS]
    else:
        picks = [{"selection": _random_mask(rng, rows)} for _ in range(2)]
    lap("masks")
    make = art.subset if mode == LOOP else art.ranked_subset
    first = make(**picks[0])
    lap("first subset")
    chosen = make(**picks[1])
    lap("second subset")
    M = min(art.beam_sizes)
    state = art.init_beams(1, M)
    logits = rng.standard_normal((1, M, art.vocab_size)).astype(np.float32)
    state = art.beam_step(state, logits, 0, subset=chosen)
    np.asarray(state.tokens)  # (the step done)
    lap("first decode")
    if mode == LOOP_WHERE:
        _check_filters(art, (first, chosen))
    return seconds


def _check_filters(art, subsets) -> None:
    """Each of `FILTERS`' ranked subsets holds as many items as numpy's
    evaluation of its filter picks rows (the set's rows in trie order, one
    item each; no item removed), a chunk at a time."""
    import numpy as np

    cols = {name: art.attributes[name].values for name in ("uploaded_day", "region", "price")}
    n = cols["price"].shape[0]
    for text, subset in zip(FILTERS, subsets):
        day, regions, price = ((358, None), (1, 7, 13), (None, 50.0)) if text == FILTERS[0] \
            else ((None, 36), (2, 3), (90.0, None))
        count = 0
        for a in range(0, n, 1 << 24):
            d, r, p = (c[a:a + (1 << 24)] for c in (cols["uploaded_day"], cols["region"],
                                                     cols["price"]))
            ok = (d >= day[0]) if day[0] is not None else (d < day[1])
            ok &= np.logical_or.reduce([r == code for code in regions])  # (np.isin: 10x slower)
            ok &= (p < np.float32(price[1])) if price[1] is not None else \
                (p >= np.float32(price[0]))
            count += int(np.count_nonzero(ok))
        got = int(subset.sizes[0])
        assert got == count, f"{text}: {got} items in the ranked subset, numpy picks {count} rows"


def _child(mode: str, path: str, n: int) -> dict:
    import numpy as np

    import static_compiler as sc
    from static_compiler import serving

    rng = np.random.default_rng(7)
    base = proc_status_bytes("VmRSS")
    start = time.perf_counter()
    loaded = op_peak = again = stages = None
    if mode == "load + IR":
        assert sc.load(path).ir.num_sequences  # (read back when asked)
    elif mode == "load":
        assert sc.load(path)._computed.ir is None  # (held in its tables, not read back)
    elif mode in LOADED:
        # (checksums unverified: the load row verifies them, and hashing 19 GB
        # at 1e9 would evict from the page cache the item index the subset reads)
        held = sc.load(path, verify_checksums=False) if mode == "subset" else \
            serving.load(path, verify_checksums=False)
        rows = np.load(os.path.join(path, "items", "row_item.npy"), mmap_mode="r").shape[0]
        mask, other = (_random_mask(rng, rows) for _ in range(2))  # (n, or more after an add)
        loaded, rss = time.perf_counter(), proc_status_bytes("VmRSS")
        _reset_peak()
        held.subset(mask)
        op_peak = proc_status_bytes("VmHWM") - rss
        assert mode != "subset" or held._computed.ir is None
        again = time.perf_counter()  # the next filter of the day: per-set work done once
        held.subset(other)
        again = time.perf_counter() - again
    elif mode in LOOPS:
        top = int(os.environ.get("TABLE_HELD_PROFILE", "0"))
        if os.environ.get("TABLE_HELD_COMPILE_CACHE"):
            sc.enable_compilation_cache(os.environ["TABLE_HELD_COMPILE_CACHE"])
        if top:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            stages = profile.runcall(_serving_loop, path, rng, mode)
            for key in ("cumulative", "tottime"):
                pstats.Stats(profile, stream=sys.stderr).sort_stats(key).print_stats(top)
        else:
            stages = _serving_loop(path, rng, mode)
    elif mode == "show-ir --stats":
        assert _quiet_cli(["show-ir", path, "--stats"]) == 0
    elif mode == "verify":
        assert _quiet_cli(["verify", path]) == 0
    elif mode == "remove":
        report = sc.update_artifact(path, remove=np.load(path + ".remove.npy"))
        assert report["removed"] + report["already_removed"] > 0, report  # (a reused artifact)
    else:  # add
        report = sc.update_artifact(path, add=np.load(path + ".add.npy"))
        assert report["modules"] == "reused", report
    seconds = time.perf_counter() - start
    return {"mode": mode, "seconds": seconds, "peak": proc_status_bytes("VmHWM") - base,
            "op_seconds": None if loaded is None else time.perf_counter() - loaded - again,
            "op_peak": op_peak, "again": again, "stages": stages}


def _random_mask(rng, rows: int):
    """bool (rows,), 10 % True (a 16-bit draw below 6554: 10.0006 %), drawn a
    chunk at a time (no 8 GB of floats at 1e9 to push the item index out of
    the page cache) from the generator's raw 64-bit words, four rows each:
    0.8 s at 1e9 where `rng.random` floats took 5 s (the caller's work, not
    the library's, so kept out of the way of what is measured)."""
    import numpy as np

    mask, chunk = np.empty(rows, dtype=bool), 1 << 24
    for a in range(0, rows, chunk):
        k = min(chunk, rows - a)
        draws = rng.bit_generator.random_raw(-(-k // 4)).view(np.uint16)[:k]
        np.less(draws, 6554, out=mask[a:a + k])
    return mask


def _write_attributes(folder: str, n: int) -> dict:
    """`FILTERS`' columns for n rows, written as .npy files a chunk at a time
    and memory-mapped back (the build copies them into the artifact):
    uploaded_day int32 in [0, 365), price float32 in [0, 100), region uint8
    in [0, 20) (`tools.bench.rules`' columns, its category codes as ints)."""
    import numpy as np

    from tools.bench.rules import write_columns

    os.makedirs(folder, exist_ok=True)
    cols = write_columns(folder, n, seed=3)
    os.replace(os.path.join(folder, "category.npy"), os.path.join(folder, "region.npy"))
    return {"uploaded_day": cols["uploaded_day"], "price": cols["price"],
            "region": np.load(os.path.join(folder, "region.npy"), mmap_mode="r")}


def _build(args, n: int, workdir: str, path: str) -> None:
    """Compiles n random items (in memory, or from shard files with
    --shards) and saves them at `path`, with the rows to remove and add."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import numpy as np

    import static_compiler as sc
    from static_compiler.frontend import datasets

    L, V = args.length, args.vocab
    rng, changed = np.random.default_rng(7), min(int(args.changed), n // 10)  # fits a small set
    capacity = args.capacity or None
    start = time.perf_counter()
    attributes = _write_attributes(os.path.join(workdir, "columns"), n) if args.attributes \
        else None
    if not args.shards:
        rows = np.load(datasets.write_synthetic_shards(
            os.path.join(workdir, "shards"), n, 1, L, V, in_trie_order=True)[0]) \
            if args.in_trie_order else datasets.synthetic_sids(n, L, V, seed=0)
        compiled = sc.compile_constraints(sc.Shards(rows, partitions=args.partitions), V,
                                          capacity=capacity, export_subsets=True,
                                          pipeline=args.pipeline or None, attributes=attributes)
        removed = rows[rng.choice(n, changed, replace=False)]
        del rows
    else:
        paths = datasets.write_synthetic_shards(os.path.join(workdir, "shards"), n, args.shards,
                                                L, V, dtype="uint16",
                                                in_trie_order=args.in_trie_order)
        print(f"# {args.shards} shards written in {time.perf_counter() - start:.1f} s",
              flush=True)
        with ProcessPoolExecutor(args.workers,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            compiled = sc.compile_constraints(
                sc.Shards(paths, partitions=args.partitions, executor=pool, workdir=workdir), V,
                capacity=capacity, export_subsets=True, pipeline=args.pipeline or None,
                attributes=attributes)
        first = np.load(paths[0], mmap_mode="r")
        removed = np.asarray(first[np.sort(rng.choice(first.shape[0], changed, replace=False))],
                             dtype=np.int64)
    compiled.save(path)
    if attributes is not None:  # (the artifact holds its own copy)
        del attributes, compiled
        shutil.rmtree(os.path.join(workdir, "columns"))
    # what the children remove and add (written here: generating them in a
    # child would count in its peak)
    np.save(path + ".remove.npy", removed)
    np.save(path + ".add.npy", rng.integers(0, V, size=(changed, L)))
    print(f"# compiled from Shards and saved in {time.perf_counter() - start:.1f} s, "
          f"capacity {capacity}", flush=True)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, path, n = sys.argv[2:5]
        print(json.dumps(_child(mode, path, int(n))))
        return 0
    parser = sid_set_parser("table_held", __doc__, 1e7)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--capacity", type=float, default=1.25,
                        help="reserved capacity (0: none; the add needs one)")
    parser.add_argument("--changed", type=float, default=CHANGED,
                        help="items removed and added (at most a tenth of the set)")
    parser.add_argument("--shards", type=int, default=0,
                        help="build from this many shard files on disk (past memory)")
    parser.add_argument("--workers", type=int, default=2, help="the build's pool, with --shards")
    parser.add_argument("--in-trie-order", action="store_true",
                        help="distinct rows sorted as the trie's items (row i is item i)")
    parser.add_argument("--attributes", action="store_true",
                        help="item attributes for the filters of serving-loop-where")
    parser.add_argument("--pipeline", default="", help="the build's pass pipeline")
    parser.add_argument("--workdir", default=None, help="where shards and the artifact go")
    parser.add_argument("--keep", action="store_true", help="leave the artifact in --workdir")
    parser.add_argument("--artifact", default=None,
                        help="reuse an artifact this bench saved (with its .remove/.add.npy)")
    parser.add_argument("--compile-cache", default=None,
                        help="the serving loop with jax's persistent compilation cache in DIR")
    parser.add_argument("--profile", type=int, default=0,
                        help="the serving loop under cProfile: print its N costliest functions")
    parser.add_argument("--modes", default=",".join(k for k in KEYS if k != "serving-loop-where"),
                        help=f"comma-separated operations, of {', '.join(KEYS)}")
    args = parser.parse_args(argv)
    # the children run in the checkout (cwd=ROOT): relative paths mean the caller's
    args.workdir = os.path.abspath(args.workdir) if args.workdir else args.workdir
    args.artifact = os.path.abspath(args.artifact) if args.artifact else args.artifact
    bad = [m for m in args.modes.split(",") if m not in KEYS]
    if bad:
        parser.error(f"--modes: unknown {bad}: expected some of {', '.join(KEYS)}")
    modes = [KEYS[m] for m in args.modes.split(",")]
    if LOOP_WHERE in modes and not (args.attributes or args.artifact):
        parser.error("--modes serving-loop-where: the set needs --attributes (its filters' "
                     "columns)")
    from tools.bench.output import machine_line

    n, L, V = int(args.items), args.length, args.vocab
    print(f"# a saved set held in its tables: {n} random items, L = {L}, V = {V}")
    print(f"# {machine_line()}")
    keep = args.keep or args.artifact
    tmp = None if keep else tempfile.TemporaryDirectory(dir=args.workdir)
    workdir = args.workdir if keep else tmp.name
    try:
        path = args.artifact or os.path.join(workdir, "set.static")
        if args.artifact is None:
            _build(args, n, workdir, path)
        rows = []
        env = dict(os.environ, TABLE_HELD_PROFILE=str(args.profile))
        if args.compile_cache:
            env["TABLE_HELD_COMPILE_CACHE"] = os.path.abspath(args.compile_cache)
        for mode in modes:
            for _ in range(2 if mode in LOOPS and args.compile_cache else 1):
                if mode in LOOPS:
                    _page_cache(path)
                out = subprocess.run([sys.executable, "-m", "tools.bench.table_held", "--child",
                                      mode, path, str(n)], cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True, env=env)
                if out.returncode:
                    return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"# {mode}: {rows[-1]['seconds']:.2f} s, peak {rows[-1]['peak'] / 2**20:.0f} MiB",
                  flush=True)  # (each as it lands: a 1e9 run takes minutes per mode)
    finally:
        if tmp is not None:
            tmp.cleanup()
    base = rows[0]
    print(f"\n| operation | seconds | peak RSS above the start (MiB) | vs {base['mode']} | "
          "the operation alone once loaded: seconds, peak (MiB); a second subset |")
    print("|---|---|---|---|---|")
    for r in rows:
        alone = "" if r["op_peak"] is None else \
            f"{r['op_seconds']:.2f} s, {r['op_peak'] / 2**20:.0f}; {r['again']:.2f} s"
        print(f"| {r['mode']} | {r['seconds']:.2f} | {r['peak'] / 2**20:.0f} | "
              f"{r['peak'] / max(1, base['peak']):.2f}x | {alone} |")
    loops = [r for r in rows if r["stages"]]
    if loops:
        cache = f", jax's compilation cache warm ({args.compile_cache})" if args.compile_cache \
            else ""
        print(f"\nthe serving loop: page cache warm for the tables and items, cold for the "
              f"modules{cache}")
        print("| subsets | " + " | ".join(STAGES) + " | end to end | less the masks (the "
              "caller's; target <= 5 s) |")
        print("|" + "---|" * (len(STAGES) + 3))
        for r in loops:
            stages, total = r["stages"], sum(r["stages"].values())
            label = {LOOP: "`subset()` of masks", LOOP_RANKED: "`ranked_subset()` of masks",
                     LOOP_WHERE: "`ranked_subset(where=)`"}[r["mode"]]
            print(f"| {label} | " +
                  " | ".join(f"{stages[s]:.2f}" for s in STAGES) +
                  f" | {total:.2f} | {total - stages['masks']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
