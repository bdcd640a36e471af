"""The partitioned build equals the monolithic one,
array for array: layers (values and dtypes), counts and the item index,
for fixed and variable-length sets, any number of partitions, arrays and
.npy shard files, inline and on a process pool; bad input names the shard
and row; a dying worker fails the build naming the partition and leaves no
spill files; a memory budget too small stops the build at the first
partition that proves it, naming the option and a value to try."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
import weakref
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ir_unread
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.errors import BuildError, ConstraintSetError, MemoryBudgetError
from static_compiler.frontend import array_files, build_trie, datasets, partition_layers, partitioned, spill
from static_compiler.frontend.partitioned import Shards, build_trie_partitioned
from static_compiler.ir import AutomatonSummary
from static_compiler.ir.cost_model import candidate_layouts
from static_compiler.passes.pipeline import parse_pipeline, partial_budget_check


def assert_same_build(got, want):
    (ir, items), (ir_want, items_want) = got, want
    assert (ir.depth, ir.num_final_states, ir.num_sequences, ir.end_token) == \
        (ir_want.depth, ir_want.num_final_states, ir_want.num_sequences, ir_want.end_token)
    for t, (a, b) in enumerate(zip(ir.layers, ir_want.layers)):
        for name in ("indptr", "tokens", "accepting", "targets"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), (t, name)
            if x is not None:
                assert x.dtype == y.dtype and np.array_equal(x, y), (t, name)
    for name in ("row_item", "item_depth", "item_state"):
        x, y = getattr(items, name), getattr(items_want, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)
    assert items.num_unique == items_want.num_unique


def ragged_rows(rng, n, width, vocab, end):
    lengths = rng.integers(1, width + 1, size=n)
    tokens = rng.integers(0, vocab, size=(n, width))
    tokens[tokens == end] = (end + 1) % vocab
    padded = np.where(np.arange(width)[None, :] < lengths[:, None], tokens, -1)
    return padded, [row[row >= 0].tolist() for row in padded]


def random_rows(rng, n, width, vocab, ragged):
    """(rows (n, width), the sequences they hold, end token or None): -1
    padded rows of lengths 1..width with end token 0, or full rows."""
    if ragged:
        return (*ragged_rows(rng, n, width, vocab, 0), 0)
    rows = rng.integers(0, vocab, size=(n, width))
    return rows, rows, None


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), partitions=st.integers(1, 40),
       vocab=st.sampled_from([2, 5, 37]), width=st.integers(1, 5), ragged=st.booleans(),
       splits=st.lists(st.integers(0, 400), max_size=3), chunk=st.integers(1, 300),
       skewed=st.booleans(), window=st.sampled_from([1, 7, 1 << 24]))
def test_equals_the_monolithic_build(seed, partitions, vocab, width, ragged, splits, chunk,
                                     skewed, window):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    rows, _, end = random_rows(rng, n, width, vocab, ragged)
    if skewed:  # first tokens far from uniform: partition bounds move
        first = (rng.geometric(0.4, size=n) - 1) % vocab
        rows[:, 0] = np.where(first == end, (first + 1) % vocab, first) if ragged else first
    seqs = [row[row >= 0].tolist() for row in rows] if ragged else rows
    cuts = sorted(min(c, n) for c in splits)
    sources = [rows[a:b] for a, b in zip([0] + cuts, cuts + [n]) if b > a]
    want = build_trie(seqs, vocab, end_token=end)
    with mock.patch.object(partition_layers.BuiltPartitions, "ITEM_WINDOW_ROWS", window):
        got = partitioned.build_partitioned(Shards(sources, partitions=partitions,
                                                   chunk_rows=chunk), vocab, end_token=end)
    assert_same_build((got.ir, got.items), want)
    assert got.summary == AutomatonSummary.of(want[0])  # summed from the parts alone


def test_partitions_hold_about_equal_rows_on_skewed_first_tokens():
    """Equal ranges of the first token would put 57 % of these rows in one
    of 8 partitions; bounds from the sampled first tokens keep every
    partition near the mean (token 0 alone holds 10 %: never split)."""
    rng = np.random.default_rng(0)
    V, P, n = 64, 8, 100_000
    rows = rng.integers(0, V, size=(n, 4))
    rows[:, 0] = np.minimum(rng.geometric(0.1, size=n) - 1, V - 1)
    parts = spill.partition_of_token([rows[:50_000], rows[50_000:]], V, P)
    assert parts.shape == (V,) and parts[0] == 0 and parts[-1] == P - 1
    assert np.all(np.diff(parts) >= 0) and np.all(np.diff(parts) <= 1)  # sorted order kept
    sizes = np.bincount(parts[rows[:, 0]], minlength=P)
    equal = np.bincount(rows[:, 0] * P // V, minlength=P)
    assert equal.max() > 4 * n / P and sizes.max() < 1.6 * n / P, (sizes, equal)
    lines = []
    build_trie_partitioned(Shards([rows], partitions=P, progress=lines.append), V)
    largest = re.search(r"largest (\d+) rows, (\d+\.\d+)x the mean", lines[1])
    assert int(largest.group(1)) == sizes.max() and float(largest.group(2)) < 1.6, lines


def test_uniform_first_tokens_give_equal_ranges():
    rows = np.repeat(np.arange(16)[:, None], 100, axis=0).reshape(-1, 1)
    assert spill.partition_of_token([rows], 16, 4).tolist() == [p // 4 for p in range(16)]


@pytest.mark.parametrize("ragged", [False, True])
def test_shard_files_on_a_process_pool_at_1e5(tmp_path, ragged):
    rng = np.random.default_rng(1)
    if ragged:
        rows, seqs = ragged_rows(rng, 100_000, 6, 300, 299)
        paths = []
        for i, part in enumerate(np.array_split(rows, 3)):
            paths.append(tmp_path / f"s{i}.npy")
            np.save(paths[-1], part.astype(np.int32))
        want = build_trie(seqs, 300, end_token=299)
    else:
        paths = datasets.write_synthetic_shards(tmp_path, 100_000, 3, 6, 300, seed=4)
        want = build_trie(np.concatenate([np.load(p) for p in paths]), 300)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for partitions in (1, 7, 64):
            got = build_trie_partitioned(Shards(paths, partitions=partitions, executor=pool,
                                                chunk_rows=30_000, workdir=tmp_path / "work"),
                                         300, end_token=299 if ragged else None)
            assert_same_build(got, want)
    assert list((tmp_path / "work").iterdir()) == []  # spill files removed


def test_synthetic_shards_are_deterministic_and_written_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "SHARD_CHUNK_ROWS", 1000)
    a = datasets.write_synthetic_shards(tmp_path / "a", 5_001, 3, 4, 50, seed=9)
    b = datasets.write_synthetic_shards(tmp_path / "b", 5_001, 3, 4, 50, seed=9)
    arrays = [np.load(p) for p in a]
    assert [x.shape for x in arrays] == [(1667, 4), (1667, 4), (1667, 4)]
    assert all(np.array_equal(x, np.load(q)) for x, q in zip(arrays, b))
    assert all(x.dtype == np.int32 and x.min() >= 0 and x.max() < 50 for x in arrays)
    assert len({x.tobytes() for x in arrays}) == 3


@pytest.mark.parametrize("num_items,length,vocab", [(5_001, 4, 50), (2_400, 2, 50),
                                                     (2_500, 2, 50), (3_000, 9, 2048)])
def test_synthetic_shards_in_trie_order_are_the_compiled_sets_items(tmp_path, monkeypatch,
                                                                   num_items, length, vocab):
    """in_trie_order: distinct rows, sorted across shards and chunks (dense
    key ranges too: 2,400 and all 2,500 of 50^2), deterministic; compiled,
    row i is item i. Too few distinct rows is a ValueError."""
    monkeypatch.setattr(datasets, "SHARD_CHUNK_ROWS", 700)
    a, b = (datasets.write_synthetic_shards(tmp_path / d, num_items, 3, length, vocab, seed=9,
                                            dtype="uint16", in_trie_order=True) for d in "ab")
    rows = np.concatenate([np.load(p) for p in a]).astype(np.int64)
    assert rows.shape == (num_items, length) and rows.min() >= 0 and rows.max() < vocab
    assert np.array_equal(rows, np.unique(rows, axis=0))  # (sorted, no repeats)
    assert np.array_equal(rows, np.concatenate([np.load(p) for p in b]))
    compiled = sc.compile_constraints(Shards(a, partitions=4), vocab, export_subsets=True)
    assert np.array_equal(compiled.items.row_item, np.arange(num_items))
    with pytest.raises(ValueError, match="V\\^L = 2500 < 2501"):
        datasets.write_synthetic_shards(tmp_path / "c", 2_501, 2, 2, 50, in_trie_order=True)


def test_compile_constraints_takes_shards_and_decodes_like_the_array(tmp_path):
    paths = datasets.write_synthetic_shards(tmp_path, 3_000, 2, 3, 16, seed=2)
    rows = np.concatenate([np.load(p) for p in paths])
    lines = []
    from_shards = sc.compile_constraints(Shards(paths, partitions=5, progress=lines.append), 16,
                                         export_subsets=True)
    from_array = sc.compile_constraints(rows, 16)
    assert from_shards.plan == from_array.plan
    assert from_shards.fingerprint == from_array.fingerprint
    zeros = lambda t, s, c: (jnp.sin(jnp.arange(16, dtype=jnp.float32) * (s + 1))
                             * jnp.ones(t.shape + (16,)), c)
    a = sc.beam_search(from_shards, zeros, batch_size=1, beam_size=5)
    b = sc.beam_search(from_array, zeros, batch_size=1, beam_size=5)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    mask = np.arange(rows.shape[0]) % 3 == 0  # item subsets: the item index is the array's
    c = sc.beam_search(from_shards, zeros, batch_size=1, beam_size=5,
                       subset=from_shards.subset(mask))
    picked = {tuple(r) for r in rows[mask].tolist()}
    assert all(tuple(t) in picked for t, v in zip(np.asarray(c.tokens)[0].tolist(),
                                                     np.asarray(c.valid)[0]) if v)
    assert [any(word in line for line in lines) for word in ("spilled", "merged", "lowered")] \
        == [True] * 3


@pytest.mark.parametrize("ragged", [False, True])
def test_an_iterable_of_arrays_is_consumed_one_at_a_time(ragged):
    """A generator of (n, L) arrays: each is spilled and dropped before the
    next is drawn, and the trie equals the monolithic build of all rows."""
    rng = np.random.default_rng(7)
    V, end = 40, (0 if ragged else None)
    pieces = [ragged_rows(rng, 3000, 5, V, end)[0] if ragged else rng.integers(0, V, (3000, 5))
              for _ in range(6)]
    alive = []  # weak references to the arrays handed out

    def generate():
        for piece in pieces:
            out = piece.copy()  # a fresh array the build alone holds
            assert sum(ref() is not None for ref in alive) == 0, "previous sources still held"
            alive.append(weakref.ref(out))
            yield out
            del out

    lines = []
    got = build_trie_partitioned(Shards(generate(), partitions=7, progress=lines.append), V,
                                 end_token=end)
    rows = np.concatenate(pieces)
    want = build_trie([r[r >= 0].tolist() for r in rows] if ragged else rows, V, end_token=end)
    assert_same_build(got, want)
    assert "[partitioned build] spilled source 6 (18000 rows so far)" in lines


def test_bad_iterables_of_sources():
    with pytest.raises(ConstraintSetError, match=r"sources is a int: expected .npy paths"):
        Shards(3)
    with pytest.raises(ConstraintSetError, match="empty constraint set"):
        build_trie_partitioned(Shards(iter([])), 8)
    bad = (a for a in [np.ones((2, 3), np.int32), np.full((2, 3), 9, np.int32)])
    with pytest.raises(ConstraintSetError, match=r"shard 1 \(an array\), sequence 0, position 0: "
                                                 r"token 9 is outside the vocabulary \[0, 8\)"):
        build_trie_partitioned(Shards(bad), 8)
    wide = (a for a in [np.ones((2, 3), np.int32), np.ones((2, 4), np.int32)])
    with pytest.raises(ConstraintSetError, match=r"shard 1 \(an array\): rows of length 4"):
        build_trie_partitioned(Shards(wide), 8)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("pipeline, capacity", [
    (None, None), (None, 1.25),
    ("verify,choose-layout{force=csr},split-heavy{light-k=2,wide-slots=2},pad-branches,"
     "pack-dtypes", None),
    ("choose-layout{force=near_unary},pack-dtypes", 1.5),
    ("verify,minimize{force=true},choose-layout,pack-dtypes", None),  # runs on the merged trie
])
def test_compiling_shards_plans_the_layouts_the_array_compile_runs(ragged, pipeline, capacity):
    """compile_constraints(Shards) plans layouts from the partitions'
    summaries (the passes never read the merged layers); plan, layouts and
    tables equal the in-memory compile's, array for array."""
    rng = np.random.default_rng(5)
    V = 50
    rows = ragged_rows(rng, 6000, 6, V, 0)[0] if ragged else rng.integers(0, V, (6000, 6))
    end = 0 if ragged else None
    seqs = [r[r >= 0].tolist() for r in rows] if ragged else rows
    kw = dict(end_token=end, pipeline=pipeline, capacity=capacity)
    want = sc.compile_constraints(seqs, V, **kw)
    got = sc.compile_constraints(Shards([rows[:2500], rows[2500:]], partitions=6), V, **kw)
    assert got.plan == want.plan and got.build.pipeline == want.build.pipeline
    planned = pipeline is None or "minimize" not in pipeline
    if planned:  # lowered from the pieces: the IR is printed and counted unread
        assert got.ir_text() == want.ir.to_text() and got.layer_stats() == want.layer_stats()
        assert ir_unread(got) and got.outline == AutomatonSummary.of(want.ir)
    assert got.ir == want.ir  # (read back from the tables)
    assert [layer.layout for layer in got.ir.layers] == [layer.layout for layer in want.ir.layers]
    for t, (a, b) in enumerate(zip(got.lowered.tables, want.lowered.tables)):
        assert a.keys() == b.keys(), t
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"layer {t} {name}")
            assert a[name].dtype == b[name].dtype
    assert ("verify" in [stage for stage, _ in got.build.timings]) != planned  # summaries skip it


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), partitions=st.integers(1, 12),
       vocab=st.sampled_from([3, 7, 300]), width=st.integers(1, 5), ragged=st.booleans(),
       force=st.sampled_from([None, "csr", "dense_rows", "unary", "near_unary"]),
       capacity=st.sampled_from([None, 1.5]))
def test_tables_lowered_from_pieces_equal_the_merged_tries(seed, partitions, vocab, width,
                                                           ragged, force, capacity):
    """Every layout kind, padded or not, fixed and variable length: the
    tables lowered piece by piece from the partitions equal `lower` of the
    whole trie, and the IR read back from them equals the trie's."""
    rng = np.random.default_rng(seed)
    rows, seqs, end = random_rows(rng, int(rng.integers(1, 300)), width, vocab, ragged)
    pipeline = None if force is None else \
        f"verify,choose-layout{{force={force}}},pad-branches,pack-dtypes"
    kw = dict(end_token=end, pipeline=pipeline, capacity=capacity)
    try:
        want = sc.compile_constraints(seqs, vocab, **kw)
    except sc.PipelineError:  # a forced kind this set cannot take
        with pytest.raises(sc.PipelineError):
            sc.compile_constraints(Shards([rows], partitions=partitions), vocab, **kw)
        return
    got = sc.compile_constraints(Shards([rows], partitions=partitions), vocab, **kw)
    assert got.plan == want.plan
    for t, (a, b) in enumerate(zip(got.lowered.tables, want.lowered.tables)):
        assert a.keys() == b.keys(), t
        for name in a:
            assert a[name].dtype == b[name].dtype, (t, name)
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"layer {t} {name}")
    assert got.ir_text() == want.ir.to_text()
    assert got.ir == want.ir


def test_a_set_lowered_from_pieces_saves_the_same_artifact_unread(tmp_path):
    """save of a set compiled from shards writes the bytes the in-memory
    compile's save writes (IR text, manifest, tables, modules), and neither
    it nor decoding reads the IR back from the tables."""
    rows = np.random.default_rng(4).integers(0, 40, size=(3_000, 4))
    kw = dict(export_beam_sizes=(4,))
    got = sc.compile_constraints(Shards([rows], partitions=3), 40, **kw)
    want = sc.compile_constraints(rows, 40, **kw)
    got.save(tmp_path / "got")
    want.save(tmp_path / "want")
    files = sorted(p.relative_to(tmp_path / "want") for p in (tmp_path / "want").rglob("*")
                   if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "got") for p in (tmp_path / "got").rglob("*")
                           if p.is_file())
    for rel in files:
        assert (tmp_path / "got" / rel).read_bytes() == (tmp_path / "want" / rel).read_bytes(), rel
    logits = lambda t, s, c: (jnp.cos(jnp.arange(40, dtype=jnp.float32) * (s + 1))
                              * jnp.ones(t.shape + (40,)), c)
    out = sc.beam_search(got, logits, batch_size=2, beam_size=4)
    np.testing.assert_array_equal(out.tokens, sc.beam_search(want, logits, batch_size=2,
                                                             beam_size=4).tokens)
    assert ir_unread(got)
    assert "CompiledConstraints(lowered=Lowered(plan=" in repr(got) and ir_unread(got)


def test_array_files_refuse_rows_past_the_shape(tmp_path):
    files = array_files.ArrayFiles(tmp_path / "files")
    writer = files.writer("a", np.int32, (3, 2))
    writer.append(np.ones((2, 2), np.int64))
    with pytest.raises(BuildError, match=r"a.npy: rows of shape \(2, 2\) after 2, for an array "
                                         r"\(3, 2\)"):
        writer.append(np.ones((2, 2)))
    with pytest.raises(BuildError, match=r"rows of shape \(1, 3\)"):
        writer.append(np.ones((1, 3)))
    arr = writer.close(fill=-1)
    np.testing.assert_array_equal(arr, [[1, 1], [1, 1], [-1, -1]])
    assert not arr.flags.writeable and files.bytes_written == 24
    assert files.writer("empty", bool, (0,)).close().shape == (0,)


def test_bad_shards_name_the_shard_and_row(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.array([[1, 2, 3], [2, 3, 4]], np.int32))
    cases = {
        "wide.npy": (np.zeros((2, 4), np.int32), r"shard '.*wide.npy': rows of length 4, the "
                                                 r"shards before hold 3"),
        "float.npy": (np.zeros((2, 3), np.float32), r"shard '.*float.npy': holds "
                                                    r"float32\[2, 3\]: expected a 2-D int array"),
        "big.npy": (np.array([[1, 2, 3], [1, 9, 2]], np.int32),
                    r"shard '.*big.npy', sequence 1, position 1: token 9 is outside the "
                    r"vocabulary \[0, 8\)"),
        "gap.npy": (np.array([[1, -1, 3]], np.int32), r"shard '.*gap.npy', sequence 0: has a "
                                                      r"token after -1 padding"),
    }
    for name, (arr, message) in cases.items():
        np.save(tmp_path / name, arr)
        with pytest.raises(ConstraintSetError, match=message):
            build_trie_partitioned(Shards([good, tmp_path / name]), 8, end_token=7)
    np.save(tmp_path / "short.npy", np.array([[1, 2, -1]], np.int32))
    with pytest.raises(ConstraintSetError, match="pass end_token"):
        build_trie_partitioned(Shards([good, tmp_path / "short.npy"]), 8)
    with pytest.raises(ConstraintSetError, match="holds the end token 3"):
        build_trie_partitioned(Shards([good]), 8, end_token=3)
    with pytest.raises(ConstraintSetError, match="no rows"):
        build_trie_partitioned(Shards([np.zeros((0, 3), np.int32)]), 8)
    with pytest.raises(ConstraintSetError, match="not a readable .npy"):
        build_trie_partitioned(Shards([tmp_path / "missing.npy"]), 8)
    with pytest.raises(ConstraintSetError, match=r"partitions=0: expected an int >= 1"):
        Shards([good], partitions=0)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def _dying_task(work, p, *args):
    if p == 2:
        os._exit(3)  # the worker process dies (kill -9 alike)
    return _real_task(work, p, *args)


_real_task = partition_layers.build_partition


def test_a_dying_worker_fails_the_build_naming_the_partition(tmp_path, monkeypatch):
    rows = np.random.default_rng(0).integers(0, 40, size=(2_000, 3))
    monkeypatch.setattr(partitioned, "build_partition", _dying_task)  # (partitions_built's)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(BuildError, match=r"partition \d+ of 4 failed"):
            build_trie_partitioned(Shards([rows], partitions=4, executor=pool,
                                          workdir=tmp_path), 40)
    assert list(tmp_path.iterdir()) == []


def test_a_dask_cluster_builds_the_same_trie(tmp_path):
    """The same build on a real dask.distributed LocalCluster (two worker
    processes), through the cluster's concurrent.futures Executor."""
    distributed = pytest.importorskip("distributed")
    paths = datasets.write_synthetic_shards(tmp_path / "shards", 20_000, 4, 5, 100, seed=3)
    want = build_trie(np.concatenate([np.load(p) for p in paths]), 100)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        got = build_trie_partitioned(Shards(paths, partitions=6, executor=client.get_executor(),
                                            workdir=tmp_path / "work"), 100)
    assert_same_build(got, want)


def test_the_cli_compiles_a_directory_of_shards(tmp_path, capsys):
    from static_compiler import artifact
    from static_compiler.cli import main

    paths = datasets.write_synthetic_shards(tmp_path / "shards", 4_000, 3, 4, 32, seed=5)
    code = main(["compile", str(tmp_path / "shards"), "--vocab-size", "32", "--partitions", "4",
                 "--beam-sizes", "3", "-o", str(tmp_path / "art")])
    assert code == 0
    assert "[partitioned build] merged" in capsys.readouterr().err
    got = artifact.read_automaton(tmp_path / "art")
    want = sc.compile_constraints(np.concatenate([np.load(p) for p in paths]), 32).ir
    assert got == want
    (tmp_path / "set.txt").write_text("1 2\n")
    assert main(["compile", str(tmp_path / "set.txt"), "--vocab-size", "32", "--partitions", "4",
                 "-o", str(tmp_path / "b")]) == 2
    assert "expected a .npy file or a directory of them" in capsys.readouterr().err


def _resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_released_pages_leave_the_resident_set_and_keep_the_data(tmp_path):
    from static_compiler.support.mapped import release_pages
    path = tmp_path / "a.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(1 << 24,))
    arr[:] = np.arange(1 << 24)  # 128 MiB of written pages, resident
    before = _resident_kib()
    release_pages(arr[1 << 22:], 0, 8 << 22)  # a view: its own first 32 MiB
    middle = _resident_kib()
    release_pages(arr)
    after = _resident_kib()
    assert before - middle > 24 << 10 and middle - after > 64 << 10, (before, middle, after)
    assert int(arr[(1 << 24) - 1]) == (1 << 24) - 1 and int(arr[5 << 20]) == 5 << 20
    del arr
    np.testing.assert_array_equal(np.load(path, mmap_mode="r")[::4097],
                                  np.arange(1 << 24)[::4097])
    release_pages(np.arange(4))  # not mapped: nothing to do


class _CountingExecutor(concurrent.futures.Executor):
    """Runs each task when it is submitted, in this process, counting them."""

    def __init__(self):
        self.submitted = 0

    def submit(self, fn, *args, **kwargs):
        self.submitted += 1
        future = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


SMALL_BUDGET = "verify,choose-layout{memory-budget=48KiB},split-heavy,pad-branches,pack-dtypes"


@pytest.mark.parametrize("ragged", [False, True])
def test_a_budget_too_small_stops_the_build_after_its_first_partition(tmp_path, ragged):
    """1e5 rows, 8 partitions and a 48 KiB budget: the first partition,
    built alone, already needs more, so the build stops there (the other 7
    never handed to the executor, the work directory removed), naming the
    CLI flag, the pipeline option and a value that compiles."""
    rows, _, end = random_rows(np.random.default_rng(3), 100_000, 4, 256, ragged)
    pool, lines = _CountingExecutor(), []
    shards = Shards([rows], partitions=8, executor=pool, workdir=tmp_path / "work",
                    progress=lines.append)
    with pytest.raises(MemoryBudgetError) as info:
        sc.compile_constraints(shards, 256, end_token=end, pipeline=SMALL_BUDGET)
    message = str(info.value)
    assert pool.submitted == 1
    assert [line for line in lines if "built partition" in line] == \
        ["[partitioned build] built partition 1/8"]
    assert list((tmp_path / "work").iterdir()) == []
    assert "memory-budget=48KiB (49152 bytes) is too small" in message
    assert "the 1 of 8 partitions built so far" in message
    size = re.search(r"--memory-budget (\d+[KMG]iB)`", message).group(1)
    pipeline = re.search(r'pipeline="([^"]+)"', message).group(1)
    assert f"choose-layout{{memory-budget={size}}} in --pipeline" in message
    assert pipeline == SMALL_BUDGET.replace("48KiB", size)
    sc.compile_constraints(Shards([rows], partitions=8), 256, end_token=end, pipeline=pipeline)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), partitions=st.integers(1, 12),
       vocab=st.sampled_from([2, 5, 40, 300]), width=st.integers(1, 5), ragged=st.booleans(),
       n=st.integers(1, 400), capacity=st.sampled_from([None, 1.5]))
def test_the_budget_checked_while_building_never_refuses_what_the_whole_set_fits(
        seed, partitions, vocab, width, ragged, n, capacity):
    """The bound checked after each partition is at most the bytes
    choose-layout's smallest layouts need for the merged trie: a budget
    of exactly those bytes compiles, partitioned as whole."""
    rows, _, end = random_rows(np.random.default_rng(seed), n, width, vocab, ragged)
    bounds = []
    with partitioned.partitions_built(Shards([rows], partitions=partitions), vocab, end,
                                      check_tables=lambda **k: bounds.append(k)) as built:
        summary = built.summary
    smallest = sum(min(o.estimated_bytes for o in candidate_layouts(
        layer, vocab, summary.num_states_at(t + 1))) for t, layer in enumerate(summary.layers))
    assert [b["built"] for b in bounds] == list(range(1, partitions + 1))
    assert all(b["partitions"] == partitions and b["rows"] == n for b in bounds)
    assert bounds[-1]["rows_built"] == n
    assert [b["bound"] for b in bounds] == sorted(b["bound"] for b in bounds)
    assert bounds[-1]["bound"] <= smallest
    spec = f"verify,choose-layout{{memory-budget={max(smallest, 1)}}},pack-dtypes"
    sc.compile_constraints(Shards([rows], partitions=partitions), vocab, end_token=end,
                           pipeline=spec, capacity=capacity)


@pytest.mark.parametrize("spec, checked", [
    ("verify,choose-layout,split-heavy,pad-branches,pack-dtypes", True),
    ("choose-layout{memory-budget=1MiB}", True),
    ("verify,minimize,choose-layout", False),  # (minimize shrinks the layers first)
    ("verify,pack-dtypes", False),
])
def test_the_budget_is_checked_while_building_only_where_the_layers_stay(spec, checked):
    assert (partial_budget_check(parse_pipeline(spec)) is not None) == checked


def test_the_cli_refuses_a_small_budget_before_building_the_partitions(tmp_path, capsys):
    from static_compiler.cli import main

    datasets.write_synthetic_shards(tmp_path / "shards", 100_000, 2, 4, 256, seed=5)
    code = main(["compile", str(tmp_path / "shards"), "--vocab-size", "256", "--partitions", "8",
                 "--memory-budget", "64KiB", "--beam-sizes", "3", "-o", str(tmp_path / "art")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "built partition 1/8" in err and "built partition 2/8" not in err
    assert re.search(r"raise the budget, e.g. to \d+[KMG]iB: `static-compiler compile \.\.\. "
                     r"--memory-budget \d+[KMG]iB`", err)
    assert not (tmp_path / "art").exists()
