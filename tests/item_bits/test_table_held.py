"""Sets whose automaton lives in their tables: a `Shards` build
and `sc.load` of an artifact hold no IR; subsets, removals (masks and
sequences), additions, `item_index`, `show-ir` and a new save read the
tables and the manifest's summary, and the IR is never rebuilt. Exact
against brute force; a summary that disagrees with the tables is refused at
load."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ir_unread

import static_compiler as sc
from static_compiler.errors import ArtifactFormatError
from static_compiler.format import spec as fmt
from static_compiler.frontend import datasets

V, L = 24, 4


def model(last, step, carry):
    return jnp.sin(jnp.arange(V, dtype=jnp.float32) * (step + 1.0) + last[..., None] * 0.3
                   ) * jnp.ones(last.shape + (V,)), carry


def decoded(compiled, **kw) -> set:
    """The valid sequences of an exhaustive beam search."""
    n = compiled.items.num_unique if compiled.items is not None else 64
    res = sc.beam_search(compiled, model, batch_size=1, beam_size=max(2, n), **kw)
    tokens, valid, lengths = (np.asarray(x)[0] for x in (res.tokens, res.valid, res.lengths))
    return {tuple(int(t) for t in tokens[m, :lengths[m]]) for m in np.flatnonzero(valid)}


@pytest.fixture(scope="module", params=["fixed", "ragged"])
def compiled_case(request, tmp_path_factory):
    """(kind, rows, end token, compiled set, saved path), compiled and saved
    once per module: tests take a copy of the artifact (`case`)."""
    rng = np.random.default_rng(5)
    if request.param == "fixed":
        rows = rng.integers(0, V, size=(60, L))
        end, matrix = None, rows
    else:
        lengths = rng.integers(2, L + 1, size=60)
        rows = [list(rng.integers(1, V, size=n)) for n in lengths]
        end = 0
        matrix = np.asarray([r + [-1] * (L - len(r)) for r in rows])
    compiled = sc.compile_constraints(rows, V, end_token=end, capacity=1.5, export_subsets=True)
    path = tmp_path_factory.mktemp("held") / "set.static"
    compiled.save(path)
    return request.param, [tuple(int(t) for t in r if t >= 0) for r in matrix], end, compiled, path


@pytest.fixture
def case(compiled_case, tmp_path):
    """The module's compiled set with a copy of its artifact the test may edit."""
    import shutil

    name, rows, end, compiled, saved = compiled_case
    path = tmp_path / "set.static"
    shutil.copytree(saved, path)
    return name, rows, end, compiled, path


def test_a_loaded_set_takes_its_fingerprint_from_the_manifest(case, monkeypatch):
    """A set read back fingerprints its tables by the checksums its manifest
    records for their files (no table read: 15 GB at 1e9), and gets the
    fingerprint of the set that was saved, so subsets pass between them;
    its next version, with other tables, hashes those."""
    from static_compiler.compiler_items import subsets as subsets_lib

    _, rows, _, compiled, path = case
    want = compiled.fingerprint
    real_digest = subsets_lib.table_digest
    read = []
    monkeypatch.setattr(subsets_lib, "table_digest", lambda arr: read.append(arr) or
                        real_digest(arr))
    loaded = sc.load(path)
    assert loaded.fingerprint == want and read == []
    mask = np.arange(len(rows)) % 2 == 0
    sub = compiled.subset(mask)
    assert decoded(loaded, subset=sub) == {rows[i] for i in np.flatnonzero(mask)}
    added = loaded.update(add=[(1, 2, 3, 4)[:L]])
    assert added.fingerprint != want and read  # (its tables differ: hashed)


def test_a_loaded_set_keeps_its_ir_in_its_tables_through_live_operations(case):
    name, rows, end, compiled, path = case
    loaded = sc.load(path)
    assert ir_unread(loaded)
    assert loaded.fingerprint == compiled.fingerprint and loaded.plan == compiled.plan
    assert loaded.ir_text() == compiled.ir.to_text()
    mask = np.arange(len(rows)) % 3 == 0
    assert decoded(loaded, subset=loaded.subset(mask)) == {rows[i] for i in np.flatnonzero(mask)}
    picked = rows[:5]
    np.testing.assert_array_equal(loaded.item_index(picked), compiled.item_index(picked))
    gone = loaded.update(remove=picked)
    assert gone.build.last_update["removed"] == len(set(picked))
    assert decoded(gone) == set(rows) - set(picked)
    added = gone.update(add=[(1, 2, 3, 4)[:L], (2, 3, 4, 5)[:L]])
    assert added.build.last_update["grew"] == [] and ir_unread(added)
    assert decoded(added) == set(rows) - set(picked) | {(1, 2, 3, 4), (2, 3, 4, 5)}
    assert ir_unread(loaded) and ir_unread(gone)
    # the IR, read back when asked, is the compiled one
    assert loaded.ir == compiled.ir


def test_a_loaded_set_saves_and_shows_without_its_ir(case, tmp_path, capsys):
    from static_compiler.cli import main

    _, _, _, compiled, path = case
    loaded = sc.load(path)
    again = tmp_path / "again.static"
    loaded.save(again)
    assert ir_unread(loaded)
    assert (again / fmt.IR_FILE).read_text() == (path / fmt.IR_FILE).read_text()
    assert json.loads((again / fmt.MANIFEST_FILE).read_text())["layers"] == \
        json.loads((path / fmt.MANIFEST_FILE).read_text())["layers"]
    assert main(["show-ir", str(path)]) == 0
    assert capsys.readouterr().out.startswith(compiled.ir.to_text())
    assert main(["show-ir", str(path), "--layer", "1"]) == 0
    assert "layer 1 " in capsys.readouterr().out


def test_check_automaton_checks_the_tables_and_keeps_the_ir_lazy(case):
    """check_automaton runs the table check (`table_check.check_artifact`),
    not a rebuild: the IR is still read back only when asked."""
    _, _, _, compiled, path = case
    checked = sc.load(path, check_automaton=True)
    assert checked._held_ir is None and checked._computed.ir is None
    assert checked.ir == compiled.ir


def edit_layers(path, change):
    m = json.loads((path / fmt.MANIFEST_FILE).read_text())
    change(m["layers"])
    (path / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(m))


@pytest.mark.parametrize("change, match", [
    (lambda layers: layers[-1]["branch_counts"].append(1), "branch histogram"),
    (lambda layers: layers[-1].update(edges=layers[-1]["edges"] + 1), "records"),
    (lambda layers: layers[-1].update(states="many"), "expected ints"),
    (lambda layers: layers[1]["branch_counts"].__setitem__(1, layers[1]["branch_counts"][1] + 1),
     "branch histogram"),
])
def test_a_summary_that_disagrees_with_the_tables_is_refused(case, change, match):
    _, _, _, _, path = case
    edit_layers(path, change)
    with pytest.raises(ArtifactFormatError, match=match):
        sc.load(path)


def test_a_manifest_without_histograms_reads_them_from_the_tables(case):
    _, _, _, compiled, path = case
    edit_layers(path, lambda layers: [layer.pop("branch_counts") for layer in layers])
    loaded = sc.load(path)
    assert loaded._summary == sc.ir.AutomatonSummary.of(compiled.ir)


def test_removals_by_sequence_of_a_saved_set_read_its_tables(case, monkeypatch):
    """update_artifact(remove=sequences) finds them in the tables: rebuilding
    the automaton would fail here."""
    from static_compiler.target import raising

    _, rows, _, _, path = case

    def refuse(*a, **k):
        raise AssertionError("the automaton was rebuilt")

    monkeypatch.setattr(raising, "automaton_from_tables", refuse)
    report = sc.update_artifact(path, remove=rows[:3] + [(V - 1,) * L])
    assert report["removed"] == len(set(rows[:3])) and report["absent"] == 1
    loaded = sc.load(path)
    assert decoded(loaded) == set(rows) - set(rows[:3])


def test_a_shards_build_takes_sequences_and_reports_like_the_array_build(tmp_path):
    rows = datasets.synthetic_sids(5_000, L, V, seed=4)
    shards = sc.compile_constraints(sc.Shards(rows, partitions=3), V, capacity=1.25,
                                    export_subsets=True)
    whole = sc.compile_constraints(rows, V, capacity=1.25, export_subsets=True)
    assert ir_unread(shards) and shards.fingerprint == whole.fingerprint
    seqs = rows[::7]
    np.testing.assert_array_equal(shards.item_index(seqs), whole.item_index(seqs))
    a, b = shards.update(remove=seqs), whole.update(remove=seqs)
    assert a.build.last_update == b.build.last_update and a.fingerprint == b.fingerprint
    mask = np.arange(len(rows)) % 4 == 1
    sa, sb = a.subset(mask), b.subset(mask)
    for x, y in zip(sa.live + sa.ends, sb.live + sb.ends):
        assert (x is None and y is None) or np.array_equal(x, y)
    more = np.random.default_rng(9).integers(0, V, size=(50, L))
    a2, b2 = a.update(add=more), b.update(add=more)
    assert a2.build.last_update == b2.build.last_update and a2.fingerprint == b2.fingerprint
    assert ir_unread(a2)


def test_subsets_of_an_artifact_with_room_in_near_unary_layers_agree_everywhere(tmp_path):
    """Near-unary layers keep their form with room (padding past the trie's
    states): the serving loader, the torch backend and the library read the
    trie's own state counts and give the same bits."""
    pytest.importorskip("torch")
    from static_compiler import serving
    from static_compiler.torch_backend import TorchConstraints

    rows = datasets.synthetic_sids(3_000, 5, 16, seed=2)
    pipeline = "verify,choose-layout{force=near_unary},reserve-capacity{growth=1.5},pack-dtypes"
    compiled = sc.compile_constraints(rows, 16, pipeline=pipeline, export_subsets=True)
    assert sum(s.kind == "near_unary" for s in compiled.plan.steps) >= 2
    path = tmp_path / "nu.static"
    compiled.save(path)
    mask = np.arange(len(rows)) % 5 == 2
    want = compiled.subset(mask)
    for got in (serving.load(path).subset(mask), TorchConstraints.load(path).subset(mask),
                sc.load(path).subset(mask)):
        for x, y in zip(got.live + got.ends, want.live + want.ends):
            assert (x is None and y is None) or np.array_equal(np.asarray(x), np.asarray(y))


def test_subsets_walked_a_few_states_at_a_time_are_the_same_bits(tmp_path, monkeypatch):
    """How a 1e9 set is walked (`WALK_CHUNK` states or children, `ITEM_CHUNK`
    input rows at a time, ranges on threads, a
    memory-mapped item index) gives the bits of the walk at once, for the library and the serving loader, on csr,
    near-unary (with room) and unary layers of a loaded set."""
    from static_compiler import serving
    from static_compiler.item_bits import item_masks, layer_walk

    rows = datasets.synthetic_sids(3_000, 5, 16, seed=4)
    for pipeline in ("verify,choose-layout{force=near_unary},reserve-capacity{growth=1.5},"
                     "pack-dtypes", None):
        compiled = sc.compile_constraints(rows, 16, pipeline=pipeline, export_subsets=True)
        path = tmp_path / f"{pipeline is None}.static"
        compiled.save(path)
        masks = [np.arange(len(rows)) % 5 == 2, np.zeros(len(rows), bool),
                 np.random.default_rng(1).random(len(rows)) < 0.01]
        wants = [compiled.subset(m) for m in masks]
        for chunk, item_chunk, threads in ((1, 7, 1), (5, 1, 2), (64, 1000, 3), (128, 9, 2),
                                           (1 << 22, 1 << 24, 2)):  # (split per thread)
            monkeypatch.setattr(layer_walk, "SPLIT_MIN", 64)
            monkeypatch.setattr(layer_walk, "WALK_CHUNK", chunk)
            monkeypatch.setattr(item_masks, "ITEM_CHUNK", item_chunk)
            monkeypatch.setattr(layer_walk, "WALK_THREADS", threads)
            held, art = sc.load(path), serving.load(path)
            for mask, want in zip(masks, wants):
                for got in (held.subset(mask), art.subset(mask)):
                    for x, y in zip(got.live + got.ends, want.live + want.ends):
                        assert (x is None and y is None) or np.array_equal(x, y), (chunk, pipeline)
            assert ir_unread(held)


@pytest.mark.parametrize("chunk", [1, 4, 1 << 16])
def test_lookups_a_few_sequences_at_a_time_in_sorted_order_agree(case, chunk, monkeypatch):
    """`unique_ids` walks LOOKUP_CHUNK sequences at a time in sorted order
    (pages of mapped tables dropped after each chunk): the same ids, the
    same removal reports, also on top of earlier removals."""
    from static_compiler.compiler_items import subsets
    from static_compiler.item_bits import item_masks

    name, rows, end, compiled, path = case
    loaded = sc.load(path)
    rng = np.random.default_rng(chunk)
    picked = [rows[i] for i in rng.choice(len(rows), 25)] + [(V - 1,) * L, (1,) * (L + 3)]
    want = compiled.item_index(picked)
    monkeypatch.setattr(subsets, "LOOKUP_CHUNK", chunk)
    monkeypatch.setattr(item_masks, "ITEM_CHUNK", chunk)  # (a ragged set's terminal lookups)
    np.testing.assert_array_equal(loaded.item_index(picked), want)
    first = loaded.update(remove=picked[:10])
    # (a fixed-length set refuses to remove a row of another length: not its last one)
    again = first.update(remove=picked if end is not None else picked[:-1])
    again_mask = first.update(remove=np.isin(np.arange(len(rows)), want[want >= 0]))
    distinct = len({rows[i] for i in want[want >= 0]})
    done = len(set(picked[:10]))
    assert first.build.last_update["removed"] == done
    for report in (again.build.last_update, again_mask.build.last_update):
        assert (report["removed"], report["already_removed"]) == (distinct - done, done), name
    assert again.build.last_update["absent"] == (2 if end is not None else 1)
    assert decoded(again) == set(rows) - set(picked)


def test_the_kernels_warmed_at_load_are_those_a_subset_runs(tmp_path):
    """`bit_kernels.warm` (run in the background by a load with an item
    index) loads every signature a subset then calls: near-unary, csr and
    dense layers, the selected rows' item bits and their final-state order
    (a set that took additions), through the library and the serving
    loader."""
    from static_compiler import serving
    from static_compiler.item_bits import bit_kernels

    rows = datasets.synthetic_sids(2_000, 5, 16, seed=8)
    pipeline = "verify,choose-layout{force=near_unary},reserve-capacity{growth=1.5},pack-dtypes"
    path = tmp_path / "set.static"
    sc.compile_constraints(rows, 16, pipeline=pipeline, export_subsets=True).save(path)
    sc.update_artifact(path, add=datasets.synthetic_sids(50, 5, 16, seed=9))
    kernels = (bit_kernels.near_table_rows_any, bit_kernels.rows_any,
               bit_kernels.inserted_words, bit_kernels.mark_selected_words)
    bit_kernels.warm()
    warmed = [set(k.signatures) for k in kernels]
    for held in (sc.load(path), serving.load(path)):
        held.subset(np.arange(held.items.num_items) % 4 == 1)
    assert [set(k.signatures) for k in kernels] == warmed
    assert all(warmed)


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 65, 4096 + 17, 1 << 20])
def test_aligned_zeros_start_on_the_boundary(nbytes):
    """`layer_walk.aligned_zeros`: nbytes zero uint8 whose data starts on an
    ALIGN-byte boundary (numpy's own large arrays start 16 bytes into a
    page; an empty one has no data to align), writable, and each call its
    own memory."""
    from static_compiler.item_bits.layer_walk import ALIGN, aligned_zeros

    first, second = aligned_zeros(nbytes), aligned_zeros(nbytes)
    for data in (first, second):
        assert data.shape == (nbytes,) and data.dtype == np.uint8 and not data.any()
        assert nbytes == 0 or data.ctypes.data % ALIGN == 0
    first[:] = 1
    assert not second.any()


def test_a_served_subset_is_placed_on_the_cpu_without_a_copy(tmp_path):
    """A subset's bits start on the 64-byte boundary XLA's CPU buffers keep,
    so the serving loader's placement (`jax.device_put`, once per subset)
    aliases them instead of copying them (a 1e9 subset: 470 MB and 0.25-1 s
    at its first decode), and a decode over the subset gives the beams of
    the library's over the same items."""
    import jax

    from static_compiler import serving

    rows = datasets.synthetic_sids(3_000, 5, 16, seed=4)
    path = tmp_path / "set.static"
    compiled = sc.compile_constraints(rows, 16, export_subsets=True, export_beam_sizes=(4,))
    compiled.save(path)
    art = serving.load(path)
    mask = np.arange(rows.shape[0]) % 7 == 2
    subset = art.subset(mask)
    arrays = subset.arrays()
    assert arrays and all(w.ctypes.data % 64 == 0 for w in arrays)
    live, ends = subset.placed(jax.device_put)
    placed = [w for w in live + ends if w is not None]
    assert [p.unsafe_buffer_pointer() for p in placed] == [w.ctypes.data for w in arrays]
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, art.max_length, 16)
                                                                  ).astype(np.float32))
    fn = lambda tokens, step, carry: (logits[:, :, step], carry)  # noqa: ARG005
    served = art.beam_search(fn, 2, 4, subset=subset)
    library = compiled.beam_search(fn, 2, 4, subset=compiled.subset(mask))
    np.testing.assert_array_equal(np.asarray(served.tokens), np.asarray(library.tokens))
    assert np.asarray(served.valid).any()
