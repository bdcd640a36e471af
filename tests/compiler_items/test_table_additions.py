"""Additions written straight into the tables (`compiler_items.table_additions`):
what `update(add=...)` does when the merged trie fits the compiled plan.

- the merged summary (counts, branch histograms, accepting counts, widest
  branch, exceptions) equals the summary of the merged automaton, and the
  written tables equal lowering it, array for array and dtype for dtype,
  for every layout, fixed and variable length, with and without room
  (hypothesis);
- `update(add=...)` of a set that fits never builds the IR, and the new
  tables are aligned for a copy-free device put;
- the helpers against brute force: `count_at_most`, `inserted` (whole and
  by ranges, as an artifact's update streams it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import oracle
import pytest
from helpers import ir_unread
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.compiler_items import additions, table_additions
from static_compiler.format.normalize import current_tables
from static_compiler.ir import AutomatonSummary
from static_compiler.support import arrays
from static_compiler.support.arrays import TABLE_ALIGNMENT, table_array
from static_compiler.target.lowering import lower

LAYOUTS = ("dense_rows", "csr", "near_unary", "unary", "mixed_csr", "default")


def _sets(draw, vocab, length, ragged):
    size = draw(st.integers(1, 40))
    if ragged:  # token vocab - 1 ends a sequence
        return [tuple(draw(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=length)))
                for _ in range(size)]
    return [tuple(draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length)))
            for _ in range(size)]


def merged_both_ways(compiled, add):
    """(summary, tables) of `compiled` with `add`, by the table merge and by
    lowering the merged automaton, or None where the merge does not fit."""
    trie, items = compiled._set_view.trie(), compiled.items
    placed = additions.place_additions(trie, add)
    if placed.depth != trie.depth:
        return None
    new_items, _ = additions.items_after(trie, items, placed)
    merged = table_additions.merged_summary(compiled.outline, placed, new_items.num_unique)
    automaton = additions.merge_placed(trie, placed, new_items.num_unique)
    assert merged.summary == AutomatonSummary.of(automaton.ir)
    assert (merged.widest, merged.exceptions) == (automaton.widest, automaton.exceptions)
    if additions.fit_problems(merged.summary, merged.widest, merged.exceptions, compiled.outline):
        return None
    got = table_additions.merged_tables(compiled.lowered.tables, compiled.outline, merged, placed)
    lazy = table_additions.merged_tables(compiled.lowered.tables, compiled.outline, merged, placed,
                                         lazy=True)
    for tabs, pieces in zip(got, lazy):  # streamed 3 rows at a time: the same tables
        for name, arr in pieces.items():
            rows = [np.asarray(arr[i:i + 3]) for i in range(0, arr.shape[0], 3)]
            np.testing.assert_array_equal(np.concatenate(rows) if rows else tabs[name][:0],
                                          tabs[name])
    return got, lower(automaton.ir)[1]


def assert_same_tables(got, want):
    for t, (a, b) in enumerate(zip(got, want)):
        assert sorted(a) == sorted(b), f"layer {t}"
        for name in a:
            assert a[name].dtype == b[name].dtype, f"layer {t} {name}"
            np.testing.assert_array_equal(a[name], b[name], f"layer {t} {name}")


@settings(max_examples=80, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUTS), ragged=st.booleans(),
       vocab=st.integers(3, 9), length=st.integers(1, 4),
       growth=st.sampled_from([1.0, 1.5, 4.0]), chunk=st.sampled_from([1, 2, 1 << 22]))
def test_written_tables_equal_lowering_the_merged_automaton(data, layout, ragged, vocab, length,
                                                            growth, chunk):
    base = _sets(data.draw, vocab, length, ragged)
    add = _sets(data.draw, vocab, length, ragged)
    pipeline = oracle.pipeline_for(layout)
    pipeline = (pipeline or sc.DEFAULT_PIPELINE) + f",reserve-capacity{{growth={growth}}}"
    try:
        compiled = sc.compile_constraints(base, vocab, end_token=vocab - 1 if ragged else None,
                                          pipeline=pipeline)
    except sc.errors.PipelineError:  # a forced layout that cannot hold this set
        return
    was = table_additions.EXCEPTION_CHUNK  # near_unary exceptions read `chunk` at a time
    table_additions.EXCEPTION_CHUNK = chunk
    try:
        both = merged_both_ways(compiled, add)
    finally:
        table_additions.EXCEPTION_CHUNK = was
    if both is not None:
        assert_same_tables(*both)


@pytest.mark.parametrize("layout", ["near_unary", "csr", "dense_rows"])
def test_an_addition_that_fits_is_written_into_the_tables_without_the_ir(layout):
    rng = np.random.default_rng(4)
    base = oracle.random_set(rng, 60, 4, 6)
    extra = oracle.random_set(rng, 20, 4, 6)
    pipeline = oracle.pipeline_for(layout) + ",reserve-capacity{growth=3.0}"
    compiled = sc.compile_constraints(base, 6, pipeline=pipeline)
    version = compiled.update(add=extra)
    assert version.build.last_update["grew"] == [] and version.plan == compiled.plan
    assert ir_unread(version)  # held in its tables
    for tabs in version.lowered.tables:
        for arr in tabs.values():
            assert not arr.flags.writeable
    fresh = sc.compile_constraints(base + extra, 6, pipeline=pipeline)
    assert version.ir.num_sequences == len({tuple(r) for r in base + extra})
    np.testing.assert_array_equal(  # the same trie as compiling everything
        [layer.num_edges for layer in version.ir.layers],
        [layer.num_edges for layer in fresh.ir.layers])
    again = version.update(add=oracle.random_set(rng, 5, 4, 6))  # a version of a version
    assert ir_unread(again) and again.build.last_update["grew"] == []


def test_old_near_unary_exception_tables_are_read_and_rewritten_in_the_current_form():
    """A format-5 artifact holds ex_bounds (X, 2) instead
    of ex_starts / ex_branch; the merge reads it and writes today's tables."""
    rows = [(a, b, c) for a in range(1, 4) for b in range(1, 6) for c in (1, 2)][::3]
    pipeline = "verify,choose-layout{force=near_unary},reserve-capacity{growth=2.0},pack-dtypes"
    compiled = sc.compile_constraints(rows, 7, pipeline=pipeline)
    old = []
    for tabs in compiled.lowered.tables:
        tabs = dict(tabs)
        if "ex_starts" in tabs:
            starts, branch = tabs.pop("ex_starts"), tabs.pop("ex_branch")
            tabs["ex_bounds"] = np.stack([starts, starts + branch], axis=1).astype(np.int64)
        old.append(tabs)
    legacy = dataclasses.replace(compiled, lowered=dataclasses.replace(  # as the reader reads it
        compiled.lowered, tables=current_tables(old)))
    got, want = merged_both_ways(legacy, [(1, 2, 2), (6, 6, 6), (2, 1, 1)])
    assert_same_tables(got, want)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 40), max_size=12).map(sorted),
       lo=st.integers(-1, 20), width=st.integers(0, 25))
def test_count_at_most_counts_the_values_at_or_below_each_id(values, lo, width):
    hi = lo + width
    got = additions.count_at_most(np.asarray(values, np.int64), lo, hi, np.int32)
    want = [sum(v <= s for v in values) for s in range(lo, hi + 1)]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(old=st.lists(st.integers(0, 200), max_size=20), data=st.data(),
       pad=st.integers(0, 5))
def test_inserted_equals_numpy_insert_then_padding(old, data, pad):
    count = data.draw(st.integers(0, len(old)))
    at = sorted(data.draw(st.lists(st.integers(0, count), max_size=6)))
    values = data.draw(st.lists(st.integers(0, 200), min_size=len(at), max_size=len(at)))
    arr = np.asarray(old, np.uint16)
    piece = additions.inserted(arr, count, np.asarray(at, np.int64),
                                     np.asarray(values, np.uint16), count + len(at) + pad, 7)
    want = np.concatenate([np.insert(arr[:count], at, values), np.full(pad, 7)])
    got = piece.materialize()
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, want)
    step = data.draw(st.integers(1, 4), label="rows at a time")
    pieces = [piece[i:i + step] for i in range(0, len(want), step)]
    np.testing.assert_array_equal(np.concatenate(pieces) if pieces else got, want)


@pytest.mark.parametrize("shape, dtype", [(0, np.int32), (5, np.uint16), ((3, 7), np.int64)])
def test_table_arrays_are_aligned(shape, dtype):
    arr = table_array(shape, dtype, fill=3)
    assert arr.size == 0 or arr.ctypes.data % TABLE_ALIGNMENT == 0  # (an empty one has no data)
    assert arr.dtype == dtype
    assert arr.shape == (shape if isinstance(shape, tuple) else (shape,)) and (arr == 3).all()


@pytest.mark.parametrize("shape, dtype", [(5, np.uint16), ((300, 1000), np.int32)])
def test_recycled_tables_reuse_a_dead_tables_memory_only(shape, dtype):
    """`table_array(recycle=True)` of 1 MiB or more: the memory of a dead
    table of its size class comes back; one that any view (or a jax array
    made from it) still holds does not, and a dropped pool keeps nothing."""
    import gc

    import jax.numpy as jnp
    pool = arrays.BufferPool()
    take = lambda: pool.take(int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype)
    first = take()
    first[...] = 7
    address = first.ctypes.data
    assert address % TABLE_ALIGNMENT == 0
    view = first[1:]
    held = jnp.asarray(first)
    del first
    second = take()
    assert second.ctypes.data != address  # a view and a jax array still hold the first
    second[...] = 9
    assert (np.asarray(held) == 7).all() and (view == 7).all()
    del view, held
    gc.collect()  # (jax may hold the array it read in a reference cycle)
    third = take()
    assert third.ctypes.data == address
    size = arrays.size_class(third.nbytes)
    del second, third
    assert pool.free_bytes == 2 * size
    grown = pool.take(third_bytes := size - 8)  # a little larger, the same size class
    assert pool.free_bytes == size and arrays.size_class(third_bytes) == size
    pool.max_free_bytes = 0
    del grown
    assert pool.free_bytes == 0
    big = table_array((1 << 18,), np.int32, fill=1, recycle=True)  # 1 MiB: from TABLE_BUFFERS
    assert big.ctypes.data % 4096 == 0 and (big == 1).all()


def test_size_classes_round_up_by_at_most_a_thirty_second():
    for n in (1, 4095, 4096, 4097, 1 << 20, (1 << 20) + 1, 10 ** 9, 3 * 10 ** 7 + 17):
        size = arrays.size_class(n)
        assert n <= size <= max(-(-n // 4096) * 4096, n * 33 // 32 + 1) and size % 4096 == 0
    assert arrays.size_class(40_000_000) == arrays.size_class(40_040_000)  # an index grown by 1e4


def test_pieces_are_filled_a_few_rows_at_a_time(monkeypatch):
    """`PieceArray.rows` calls its fill on ranges of about FILL_BYTES; the
    result is the same as one call."""
    old = np.arange(1000, dtype=np.int32)
    at = np.array([0, 10, 10, 999, 1000])
    monkeypatch.setattr(arrays, "FILL_BYTES", 64)
    calls = []
    piece = additions.inserted(old, 1000, at, -1, 1010, 0)
    fill = piece.fill_rows
    piece.fill_rows = lambda out, lo, hi: (calls.append((lo, hi)), fill(out, lo, hi))
    np.testing.assert_array_equal(piece.materialize(), np.append(np.insert(old, at, -1), [0] * 5))
    assert calls[0] == (0, 16) and calls[-1] == (1008, 1010) and len(calls) == 64


@pytest.mark.parametrize("layout, ragged", [("default", False), ("near_unary", False),
                                            ("csr", True), ("dense_rows", True)])
def test_an_artifact_update_streams_the_same_tables_and_items_as_the_library(
        tmp_path, monkeypatch, layout, ragged):
    """`update_artifact(add=)` writes the new tables and item arrays a few
    bytes at a time (PieceArrays into NpyFile), equal to `update(add=)` in
    memory, and the new version decodes the same."""
    from static_compiler.artifact.writer import NpyFile

    rng = np.random.default_rng(7)
    vocab = 7
    make = (lambda n: [tuple(rng.integers(0, vocab - 1, rng.integers(1, 5)).tolist())
                       for _ in range(n)]) if ragged else \
        (lambda n: oracle.random_set(rng, n, 4, vocab))
    base, extra = make(80), make(15)
    pipeline = (oracle.pipeline_for(layout) or sc.DEFAULT_PIPELINE) + \
        ",reserve-capacity{growth=3.0}"
    compiled = sc.compile_constraints(base, vocab, end_token=vocab - 1 if ragged else None,
                                      pipeline=pipeline, export_subsets=True,
                                      export_beam_sizes=(4,))
    compiled.save(tmp_path / "set.static")
    if ragged:  # removals first: the removed array grows too, re-added items come back
        gone = rng.random(len(base)) < 0.3
        sc.update_artifact(tmp_path / "set.static", remove=gone)
        compiled = compiled.update(remove=gone)
        extra = extra + [base[i] for i in np.flatnonzero(gone)[:3]]
    monkeypatch.setattr(NpyFile, "CHUNK_BYTES", 24)
    report = sc.update_artifact(tmp_path / "set.static", add=extra)
    want = compiled.update(add=extra)
    assert report["modules"] == "reused" and report["grew"] == []
    assert {k: report[k] for k in want.build.last_update} == want.build.last_update
    got = sc.load(tmp_path / "set.static")
    assert got.plan == want.plan and got._summary == want.outline
    assert_same_tables(got.lowered.tables, want.lowered.tables)
    for key in ("row_item", "item_depth", "item_state", "removed"):
        a, b = getattr(got.items, key), getattr(want.items, key)
        assert (a is None) == (b is None), key
        if a is not None:
            np.testing.assert_array_equal(a, b, key)
    mask = rng.random(len(base) + len(extra)) < 0.5
    for a, b in zip(got.subset(mask).live, want.subset(mask).live):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("chunk", [1, 5, 64, 128, 1 << 24])
@pytest.mark.parametrize("count", [1, 29, 64, 200])
def test_the_item_mask_is_put_in_final_state_order_as_bits(monkeypatch, chunk, count):
    """`final_item_live` gathers the items' mask through state_item into
    packed bits, a range at a time (in order, or on threads for ranges of
    whole words), and leaves the mask as it was."""
    from static_compiler.item_bits import item_masks, layer_walk, liveness

    monkeypatch.setattr(item_masks, "ITEM_CHUNK", chunk)
    rng = np.random.default_rng(chunk + count)
    state_item = rng.permutation(count).astype(np.int32)
    item_live = rng.random(count) < 0.5
    before = item_live.copy()
    got = liveness.final_item_live(state_item, item_live)
    assert isinstance(got, layer_walk.PackedBits) and got.shape == (count,)
    np.testing.assert_array_equal(got.bools(), before[state_item])
    np.testing.assert_array_equal(item_live, before)


def test_bad_additions_to_an_artifact_are_refused_and_leave_it_as_it_was(tmp_path):
    rng = np.random.default_rng(3)
    base = oracle.random_set(rng, 40, 4, 6)
    compiled = sc.compile_constraints(base, 6, capacity=2.0, export_subsets=True,
                                      export_beam_sizes=(4,))
    path = compiled.save(tmp_path / "set.static")
    before = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    for add, match in (([(0, 1, 2, 6)], "token 6|out of range|\\[0, 6\\)"),
                       ([(0, 1, 2)], "length 3"),
                       ([(0, -1, 2, 3)], "-1|out of range|negative")):
        with pytest.raises(sc.errors.ConstraintSetError, match=match):
            sc.update_artifact(path, add=add)
    after = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    assert after == before


def _reseal(path, rel_files: dict, item_files: dict, version=None) -> None:
    """Writes `rel_files` {rel: array} into the artifact at `path`, sets its
    manifest's item_files (and format_version) and recomputes the checksums:
    an edit that passes the checksum check."""
    import json

    from static_compiler.format import spec as fmt
    manifest = json.loads((path / fmt.MANIFEST_FILE).read_text())
    for rel in set(manifest["item_files"].values()) - set(item_files.values()):
        (path / rel).unlink()
        del manifest["files"][rel]
    for rel, arr in rel_files.items():
        np.save(path / rel, arr)
        manifest["files"][rel] = {"size": (path / rel).stat().st_size,
                                  "sha256": fmt.sha256_file(path / rel)}
    manifest["item_files"] = item_files
    if version is not None:
        manifest["format_version"] = version
    (path / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(manifest))


def _set_with_additions(tmp_path):
    from static_compiler.format import spec as fmt
    rng = np.random.default_rng(5)
    items = oracle.random_set(rng, 30, 3, 5)
    compiled = sc.compile_constraints(items, 5, capacity=2.0, export_subsets=True,
                                      export_beam_sizes=(4,))
    path = compiled.save(tmp_path / "set.static")
    added = oracle.random_set(rng, 5, 3, 5)
    sc.update_artifact(path, add=added)
    files = {key: fmt.item_file(key) for key in ("state_inserted_at", "state_inserted_item")}
    assert all((path / rel).is_file() for rel in files.values())
    assert not (path / fmt.item_file("state_item")).exists()
    return path, list(items) + list(added), files


def test_insertions_that_disagree_with_the_set_are_refused_at_load(tmp_path):
    """Final states not ascending, or ids not the largest, under recomputed
    checksums."""
    from static_compiler.format import spec as fmt
    path, _, files = _set_with_additions(tmp_path)
    sc.load(path)  # intact: loads
    at, item = (np.load(path / files[k]) for k in ("state_inserted_at", "state_inserted_item"))
    assert at.shape[0] >= 2
    item_files = {"row_item": fmt.item_file("row_item"), **files}
    for bad_at, bad_item in ((at[::-1], item), (at, item - 1), (at, item[:-1])):
        _reseal(path, {files["state_inserted_at"]: bad_at, files["state_inserted_item"]: bad_item},
                item_files)
        with pytest.raises(sc.errors.ArtifactFormatError, match="state_inserted_at"):
            sc.load(path)


def test_a_version_8_state_item_loads_and_an_update_writes_insertions(tmp_path):
    """Format version 8 held every final state's item (state_item): such an
    artifact still loads and takes subsets alike, and its next update writes
    the insertions instead (`InsertedOrder.of_array`)."""
    from static_compiler import serving
    from static_compiler.format import spec as fmt
    from static_compiler.item_bits.state_order import InsertedOrder
    path, seqs, files = _set_with_additions(tmp_path)
    mask = np.random.default_rng(0).random(len(seqs)) < 0.5
    want = serving.load(path).subset(mask)
    order = InsertedOrder(*(np.load(path / files[k]) for k in ("state_inserted_at",
                                                               "state_inserted_item")),
                          len(np.unique(np.asarray(seqs), axis=0)))
    dense = order[np.arange(order.count)].astype(np.int32)
    rel = fmt.item_file("state_item")
    _reseal(path, {rel: dense}, {"row_item": fmt.item_file("row_item"), "state_item": rel},
            version=8)
    old = serving.load(path)
    assert old.manifest.format_version == 8
    for a, b in zip(old.subset(mask).live, want.live):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert InsertedOrder.of_array(dense)[np.arange(order.count)].tolist() == dense.tolist()
    sc.update_artifact(path, add=[[4, 4, 4]])
    assert not (path / rel).exists() and all((path / r).is_file() for r in files.values())
    assert serving.load(path).manifest.format_version == fmt.FORMAT_VERSION
    compiled, rows = sc.load(path), [list(r) for r in seqs] + [[4, 4, 4]]
    flat = lambda last, step, carry: (np.zeros(last.shape + (5,), np.float32), carry)
    for r in range(0, len(rows), 3):  # each row's subset decodes to exactly its sequence
        one = np.zeros(len(rows), bool)
        one[r] = True
        result = sc.beam_search(compiled, flat, batch_size=1, beam_size=2,
                                subset=compiled.subset(one))
        valid = np.asarray(result.valid)[0]
        assert valid.sum() == 1 and np.asarray(result.tokens)[0, 0].tolist() == rows[r]
