"""Partitioned, out-of-core trie build: catalogues larger than memory, built
in parts on any `concurrent.futures.Executor`.

    shards = sc.Shards(["part-000.npy", "part-001.npy"], partitions=16,
                       executor=ProcessPoolExecutor(2))
    compiled = sc.compile_constraints(shards, vocab_size=V)

`partitions_built` runs the build's three steps:

1. Spill (`frontend.spill`): the input is streamed once in chunks, checked,
   and every row appended to a spill file for its partition: P contiguous
   ranges of the first token, of about equal rows, so partitions follow
   the sorted order.
2. Build (`frontend.partition_layers.build_partition`): each partition is
   sorted, deduplicated and turned into layers by one executor task that
   writes them back to disk in a compact form, so tasks need only a shared
   directory. Each task returns its layers' summaries; their sums describe
   the merged trie (`merged_summary`), so the layout passes plan it unread.
3. Merge (`partitions_built` yields the built partitions,
   `partition_layers.BuiltPartitions`): `compile_constraints` lowers their
   pieces straight into the tables (`target.lowering.lower_pieces`), so the merged
   trie (some 36 bytes per item at L = 8, against 12 in the tables) never
   exists; `build_trie_partitioned` merges them into the trie
   (`BuiltPartitions.trie`), equal to `frontend.build_trie` of the same
   rows, array for array (tested), as are the tables to `lower` of it.

Peak memory is one chunk per worker while spilling and one partition per
worker while building; the merged tables (or layers) are written with file
writes and reopened read-only as memory maps (`array_files.ArrayFiles`),
and the item index is gathered a window of rows at a time, so none of them
is ever all in memory. Every file one task writes and another reads is
checked when read against the size and CRC-32 its writer recorded
(`frontend.array_files`): a damaged file fails the build with BuildError
naming it. The work directory records its owner: a build removes those of
builds that died (SIGKILL) in the same parent directory
(`frontend.build_dirs`). The tasks run on the executor through
`frontend.build_tasks`.
With a process pool, use the "spawn" start method (jax is threaded; forking
it can deadlock) and an ``if __name__ == "__main__":`` guard in the script:
each worker re-imports the main module (without the guard the pool breaks,
and the BuildError says so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import shutil
import tempfile
import time
from typing import Callable, Iterator, Optional

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import check_end_token, check_vocab_size
from static_compiler.frontend.array_files import ArrayFiles
from static_compiler.frontend.build_dirs import OWNER_FILE, WORK_PREFIX, current_owner, remove_stale_builds
from static_compiler.frontend.build_tasks import run_tasks, say
from static_compiler.frontend.partition_layers import BuiltPartitions, build_partition
from static_compiler.frontend.shards import Shards
from static_compiler.frontend.spill import spill_sources
from static_compiler.ir import Automaton, AutomatonSummary, LayerSummary
from static_compiler.ir.cost_model import tables_lower_bound
from static_compiler.items.index import ItemIndex


def merged_summary(parts: list[dict], vocab_size: int, end_token: Optional[int]
                   ) -> AutomatonSummary:
    """The `ir.AutomatonSummary` of the trie `BuiltPartitions.trie` merges of `parts` (the
    partition tasks' results), from their layer summaries alone: one root
    with every partition's first edges; at depth t, each partition's layer t,
    and the final states of partitions whose rows all end at t (childless
    accepting states there)."""
    parts = [part for part in parts if part["unique"]]
    depth = max(part["depth"] for part in parts)
    roots = sum(part["layers"][0].num_edges for part in parts)
    layers = [LayerSummary(1, roots, np.bincount([roots]))]
    for t in range(1, depth):
        states = edges = accepting = 0
        counts = np.zeros(1, dtype=np.int64)
        has = False
        for part in parts:
            if t < part["depth"]:
                layer = part["layers"][t]
                c = layer.branch_counts()
                counts = np.pad(counts, (0, max(0, c.size - counts.size)))
                counts[:c.size] += c
                states, edges = states + layer.num_states, edges + layer.num_edges
                accepting += layer.num_accepting
                has |= layer.has_accepting
            elif t == part["depth"]:
                states += part["final"]
                counts[0] += part["final"]
                accepting += part["final"]
                has = True
        layers.append(LayerSummary(states, edges, counts, accepting, has))
    return AutomatonSummary(vocab_size, tuple(layers),
                            sum(part["final"] for part in parts if part["depth"] == depth),
                            sum(part["unique"] for part in parts), end_token)


@dataclasses.dataclass(frozen=True)
class PartitionedBuild:
    """What `build_partitioned` returns: the merged trie (`ir`, memory-mapped
    arrays), its item index, and its `summary`, summed from the partitions'
    (`merged_summary`), from which `pipeline.plan_layouts` plans the
    layouts without reading the merged layers."""

    ir: Automaton
    items: ItemIndex
    summary: AutomatonSummary


def build_trie_partitioned(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                           ) -> tuple[Automaton, ItemIndex]:
    """`frontend.build_trie` of the rows `shards` holds, built in partitions
    (see module doc); equal to the monolithic build, array for array.

    Raises ConstraintSetError for bad input (naming the shard and row) and
    BuildError when a partition's task fails (naming the partition); spill
    files are removed either way."""
    built = build_partitioned(shards, vocab_size, end_token)
    return built.ir, built.items


def build_partitioned(shards: Shards, vocab_size: int, end_token: Optional[int] = None
                      ) -> PartitionedBuild:
    """`build_trie_partitioned`, with the merged trie's summary."""
    with partitions_built(shards, vocab_size, end_token) as built:
        files = ArrayFiles(built.work / "merged")
        ir, items = built.trie(files), built.items(files)
        say(shards, f"[partitioned build] merged: {ir.num_sequences} sequences, "
                     f"{ir.num_states} states, {files.bytes_written / 2**20:.1f} MiB written")
        return PartitionedBuild(ir, items, built.summary)


def _tables_check(check_tables: Callable[..., None], vocab_size: int, rows: np.ndarray
                  ) -> Callable[[int, dict], None]:
    """`run_tasks`' check: after partition `number` (the partitions come in
    order), the lower bound of the tables' bytes the partitions built so far
    prove (each part's bound adds up), handed to `check_tables`; rows: the
    input rows per partition."""
    bound, rows_built = [0], [0]

    def check(number: int, part: dict) -> None:
        if part["unique"]:
            bound[0] += tables_lower_bound(part["layers"], vocab_size)
        rows_built[0] += int(rows[number])
        check_tables(bound=bound[0], built=number + 1, partitions=len(rows),
                     rows_built=rows_built[0], rows=int(rows.sum()))
    return check


@contextlib.contextmanager
def partitions_built(shards: Shards, vocab_size: int, end_token: Optional[int] = None,
                     check_tables: Optional[Callable[..., None]] = None
                     ) -> Iterator[BuiltPartitions]:
    """Spills `shards` and builds every partition (see module doc), then
    yields the partitions (`BuiltPartitions`) for the caller to merge: into
    a trie (`BuiltPartitions.trie`) or straight into tables
    (`target.lowering.lower_pieces` of `BuiltPartitions.pieces`). The work
    directory (under `Shards.workdir`, or the system's temp directory) is
    removed on exit, whatever happens, and those of builds there that died
    first (`remove_stale_builds`).

    check_tables, when given (`passes.pipeline.partial_budget_check`: the
    memory budget), is called after the first partition is built, alone,
    and after each later one, with ``bound=`` a lower bound of the merged
    tables' bytes that the partitions built so far prove
    (`cost_model.tables_lower_bound`), ``built=`` / ``partitions=`` their
    count and P, ``rows_built=`` / ``rows=`` their input rows and all; its
    error stops the build there. No bound exists before a partition is
    built: rows may repeat (1e9 copies of one row are 8 states).

    Raises ConstraintSetError for bad input (naming the shard and row) and
    BuildError when a partition's task fails (naming the partition), or
    a file passed between tasks is missing or altered (naming the file)."""
    if not isinstance(shards, Shards):
        raise ConstraintSetError(f"build_trie_partitioned: expected Shards, got "
                                 f"{type(shards).__name__}")
    vocab_size = check_vocab_size(vocab_size)
    end_token = check_end_token(end_token, vocab_size)
    if shards.workdir is not None:
        root = pathlib.Path(shards.workdir)
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = pathlib.Path(tempfile.gettempdir())
    for name in remove_stale_builds(root):
        say(shards, f"[partitioned build] removed {root / name}: the work directory of a "
                     "build that died")
    work = pathlib.Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=root))
    start = time.perf_counter()
    try:
        (work / OWNER_FILE).write_text(current_owner())
        width, total, ragged, spilled, row_dtype = spill_sources(shards, vocab_size,
                                                                 end_token, work)
        size = sum(f.stat().st_size for f in work.iterdir())
        largest = int(sum(r["counts"] for r in spilled).max())
        say(shards, f"[partitioned build] {total} rows in {shards.partitions} partitions "
                     f"(largest {largest} rows, {largest * shards.partitions / total:.2f}x the "
                     f"mean), {size / 2**20:.1f} MiB spilled, {time.perf_counter() - start:.1f} s")
        sources = {p: [r["index"] for r in spilled if p in r["partitions"]]
                   for p in range(int(shards.partitions))}
        spill_records = {name: record for r in spilled for name, record in r["files"].items()}
        tasks = [(str(work), p, sources[p], width, vocab_size, end_token, ragged,
                  {f"s{i}.p{p}.{kind}": spill_records[f"s{i}.p{p}.{kind}"]
                   for i in sources[p] for kind in ("codes", "lengths")})
                 for p in range(int(shards.partitions))]
        check = None if check_tables is None else _tables_check(
            check_tables, vocab_size,
            sum((r["counts"] for r in spilled), np.zeros(len(tasks), np.int64)))
        parts = run_tasks(shards, build_partition, tasks, [True] * len(tasks), "built partition",
                          check)
        say(shards, f"[partitioned build] built, {time.perf_counter() - start:.1f} s")
        records = {name: record for name, record in spill_records.items()
                   if name.endswith(".rows")}
        for part in parts:
            records.update(part["files"])
        yield BuiltPartitions(work, tuple(part for part in parts if part["unique"]), vocab_size,
                              end_token, total, ragged, row_dtype,
                              merged_summary(parts, vocab_size, end_token),
                              tuple(r["rows"] for r in spilled),
                              np.stack([r["counts"] for r in spilled]), records,
                              shards.progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
