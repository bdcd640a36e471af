"""Artifact writer: exported modules (platforms, symbolic batch, no host
callbacks, tables as arguments), the manifest, deterministic bytes, atomic
save and overwrite, and reading the set back from the tables alone."""

import json
import os
import re

import helpers
import jax
import numpy as np
import oracle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import fixed_length_sets, ragged_sets, unique_sorted

from static_compiler import artifact, compile_constraints, errors, serving
from static_compiler.artifact import writer
from static_compiler.errors import (
    ArtifactExistsError,
    DecodeInputError,
    IRVerificationError,
    StaticCompilerError,
)
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import FileEntry
from static_compiler.ir import enumerate_sequences
from static_compiler.support.decode_state import BeamState, ProcessorState

SMALL = np.array([[1, 2, 3], [1, 2, 4], [1, 5, 0], [2, 0, 0], [7, 7, 7], [7, 6, 1]])
RAGGED = [[1, 2, 3], [1, 2], [4], [4, 5, 6, 2], [6, 6]]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    compiled = compile_constraints(SMALL, 8, export_beam_sizes=(3, 4), export_tokens_per_beam=2)
    path = artifact.save(compiled, tmp_path_factory.mktemp("art") / "small.static")
    return compiled, path


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    compiled = compile_constraints(RAGGED, 9, end_token=8, export_beam_sizes=(5,))
    path = artifact.save(compiled, tmp_path_factory.mktemp("art") / "ragged.static")
    return compiled, path


@pytest.fixture(scope="module", params=["small", "ragged"])
def saved(request):
    return request.getfixturevalue(request.param)


def manifest_of(path) -> dict:
    return json.loads((path / fmt.MANIFEST_FILE).read_text())


def files_of(path) -> dict:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


# ----- modules -----

def test_modules_are_multi_platform_batch_polymorphic_and_callback_free(saved):
    compiled, path = saved
    manifest = manifest_of(path)
    num_tables = len(manifest["tables"])
    names = set(manifest["modules"])
    sizes = compiled.export_options.beam_sizes
    assert names == {"mask", "advance"} | {f"{k}_m{m}" for m in sizes for k in ("init", "beam_step")}
    for name, conv in manifest["modules"].items():
        exported = jax.export.deserialize(bytearray((path / conv["file"]).read_bytes()))
        assert exported.platforms == ("cpu", "cuda", "tpu")
        assert conv["platforms"] == ["cpu", "cuda", "tpu"]
        first = 0 if name.startswith("init") else num_tables
        tables = exported.in_avals[:first]
        for aval, entry in zip(tables, manifest["tables"]):  # tables: concrete shapes
            assert tuple(aval.shape) == tuple(entry["shape"]) and str(aval.dtype) == entry["dtype"]
        for aval, spec in zip(exported.in_avals[first:], conv["args"][first:]):
            if spec["name"] == "step":
                assert aval.shape == () and str(aval.dtype) == "int32"
                continue
            assert jax.export.is_symbolic_dim(aval.shape[0]), (name, spec)
            assert str(aval.shape[0]) == "b" and spec["shape"][0] == "b"
            assert not any(jax.export.is_symbolic_dim(d) for d in aval.shape[1:])
        for aval in exported.out_avals:
            assert str(aval.shape[0]) == "b"
        text = exported.mlir_module()
        targets = set(re.findall(r"custom_call\s*@([\w.]+)", text))
        assert targets <= {"shape_assertion"}, (name, targets)  # jax's batch-size check only
        assert "callback" not in text.lower()


def test_tables_are_arguments_not_constants(tmp_path):
    """Two sets with the same trie shape but different tokens: identical
    module bytes, different table bytes."""
    rng = np.random.default_rng(3)
    first = compile_constraints(oracle.random_set(rng, 40, 3, 12), 12, export_beam_sizes=(4,))
    other = oracle.relabel(first.ir, rng)
    second = compile_constraints(other, 12, export_beam_sizes=(4,))
    assert first.plan == second.plan
    a = artifact.build_files(first)
    b = artifact.build_files(second)
    modules = [rel for rel in a if rel.startswith("modules/")]
    assert modules and all(a[rel] == b[rel] for rel in modules)
    assert any(a[rel] != b[rel] for rel in a if rel.startswith("tables/"))


def test_conventions_give_names_and_order_of_arguments(small):
    compiled, path = small
    m = manifest_of(path)
    table_names = [f"table:layer{e['layer']}.{e['name']}" for e in m["tables"]]
    state = [f"state.{f}" for f in BeamState._fields]
    proc = [f"state.{f}" for f in ProcessorState._fields]
    names = lambda mod, key="args": [a["name"] for a in m["modules"][mod][key]]
    assert names("beam_step_m3") == table_names + state + ["logits", "step"]
    assert names("beam_step_m3", "results") == state
    assert names("init_m4") == ["start_tokens"]
    assert names("mask") == table_names + ["logits"] + proc + ["step"]
    assert names("advance") == table_names + proc + ["tokens", "step"]
    logits = m["modules"]["beam_step_m4"]["args"][len(table_names) + 8]
    assert logits == {"name": "logits", "shape": ["b", 4, 8], "dtype": "float32"}
    assert m["modules"]["beam_step_m4"]["tokens_per_beam"] == [None, 2, 2]  # caps per step
    assert m["modules"]["beam_step_m4"]["beam_size"] == 4


# ----- manifest and files -----

def test_manifest_records_the_set_versions_and_every_file(saved):
    compiled, path = saved
    m = manifest_of(path)
    assert m["format"] == fmt.FORMAT_NAME and m["format_version"] == fmt.FORMAT_VERSION
    assert m["jax_version"] == jax.__version__ and m["jaxlib_version"]
    lo = jax.export.minimum_supported_calling_convention_version
    hi = jax.export.maximum_supported_calling_convention_version
    assert lo <= m["calling_convention_version"] <= hi
    assert m["platforms"] == ["cpu", "cuda", "tpu"]
    assert (m["vocab_size"], m["max_length"], m["end_token"]) == (
        compiled.vocab_size, compiled.max_length, compiled.plan.end_token)
    assert m["num_sequences"] == compiled.ir.num_sequences
    assert m["pipeline"] == compiled.build.pipeline
    assert [layer["layout_text"] for layer in m["layers"]] == [
        layer.layout.to_text() for layer in compiled.ir.layers]
    on_disk = files_of(path)
    assert set(m["files"]) == set(on_disk) - {fmt.MANIFEST_FILE}
    for rel, entry in m["files"].items():
        assert entry["size"] == len(on_disk[rel])
        assert entry["sha256"] == fmt.sha256_file(path / rel)
    assert on_disk[fmt.IR_FILE].decode() == compiled.ir.to_text()
    assert on_disk[fmt.MANIFEST_FILE] == fmt.seal_manifest(m)


def test_tables_load_memory_mapped_and_equal_the_compiled_ones(saved):
    compiled, path = saved
    for entry in manifest_of(path)["tables"]:
        arr = np.load(path / entry["file"], mmap_mode="r")
        assert isinstance(arr, np.memmap)
        want = compiled.lowered.tables[entry["layer"]][entry["name"]]
        assert arr.dtype == want.dtype and np.array_equal(arr, want)


def test_same_input_gives_the_same_bytes(small):
    again = compile_constraints(SMALL, 8, export_beam_sizes=(3, 4), export_tokens_per_beam=2)
    assert artifact.build_files(again) == files_of(small[1])


@pytest.mark.parametrize("sizes, tpb", [((), None), ((0,), None), ((3, True), None),
                                        ((2.5,), None), ((3,), 0), ((3,), 1.5)])
def test_bad_export_options_are_rejected(tmp_path, sizes, tpb):
    compiled = compile_constraints(SMALL, 8, export_beam_sizes=(3,))
    import dataclasses
    bad = dataclasses.replace(compiled, export_options=dataclasses.replace(
        compiled.export_options, beam_sizes=sizes, tokens_per_beam=tpb))
    with pytest.raises(DecodeInputError, match="export_"):
        artifact.save(bad, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


# ----- atomic save and overwrite -----

KEPT = [".set.static.versions", "set.static"]
"""What a save leaves beside it: the artifact and its versions directory
(`artifact.history`: the replaced versions and the records)."""

@pytest.fixture(scope="module")
def built_sets():
    """Two compiled sets and their artifact files, exported once."""
    sets = (compile_constraints(SMALL, 8, export_beam_sizes=(2,)),
            compile_constraints(SMALL[:3], 8, export_beam_sizes=(2,)))
    return sets, {id(c): artifact.build_files(c) for c in sets}


@pytest.fixture
def two_sets(built_sets, monkeypatch):
    """The two sets, with `build_files` answered from the module's cache:
    these tests exercise writing, renaming and failure handling, not export."""
    sets, files = built_sets
    monkeypatch.setattr(writer, "build_files", lambda compiled, reuse=None, modules=True: files[id(compiled)])
    return sets


def test_saving_over_an_artifact_needs_overwrite(tmp_path, two_sets):
    first, second = two_sets
    path = artifact.save(first, tmp_path / "set.static")
    before = files_of(path)
    with pytest.raises(ArtifactExistsError, match="already exists.*overwrite=True"):
        artifact.save(second, path)
    assert files_of(path) == before
    artifact.save(second, path, overwrite=True)
    assert manifest_of(path)["num_sequences"] == 3
    assert serving.load(path).num_sequences == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT  # no temp dirs left


def test_overwrite_refuses_to_replace_something_that_is_not_an_artifact(tmp_path, two_sets):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    with pytest.raises(ArtifactExistsError, match="not an artifact"):
        artifact.save(two_sets[0], tmp_path / "data", overwrite=True)
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"


def test_a_failure_while_writing_leaves_the_old_artifact_intact(tmp_path, two_sets, monkeypatch):
    first, second = two_sets
    path = artifact.save(first, tmp_path / "set.static")
    before = files_of(path)
    written = []
    real_write = writer._write_file

    def failing_write(root, rel, data):
        if len(written) == 3:
            raise OSError("disk full (simulated)")
        written.append(rel)
        real_write(root, rel, data)

    monkeypatch.setattr(writer, "_write_file", failing_write)
    with pytest.raises(OSError, match="simulated"):
        artifact.save(second, path, overwrite=True)
    assert files_of(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT
    serving.load(path)


@pytest.mark.parametrize("exchange", [True, False])
def test_a_failure_during_the_swap_restores_the_old_artifact(tmp_path, two_sets, monkeypatch,
                                                              exchange):
    """Whether the swap is one exchange or (fallback) two renames."""
    first, second = two_sets
    path = artifact.save(first, tmp_path / "set.static")
    before = files_of(path)
    real_rename = os.rename

    def failing_rename(src, dst):
        if ".tmp-" in os.path.basename(str(src)):
            raise OSError("rename failed (simulated)")
        real_rename(src, dst)

    def failing_exchange(a, b):
        raise OSError("exchange failed (simulated)")

    monkeypatch.setattr(writer, "_rename_exchange",
                        failing_exchange if exchange else lambda a, b: False)
    monkeypatch.setattr(writer.os, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        artifact.save(second, path, overwrite=True)
    assert files_of(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT


def test_a_failure_on_first_save_leaves_nothing(tmp_path, two_sets, monkeypatch):
    def failing_write(root, rel, data):
        raise OSError("simulated")
    monkeypatch.setattr(writer, "_write_file", failing_write)
    with pytest.raises(OSError):
        artifact.save(two_sets[0], tmp_path / "new.static")
    assert list(tmp_path.iterdir()) == []


# ----- reading the set back from the tables -----

def test_read_automaton_rebuilds_the_compiled_ir(saved):
    compiled, path = saved
    assert artifact.read_automaton(path) == compiled.ir


def _roundtrip(sequences, vocab_size, end_token=None, pipeline=None):
    compiled = compile_constraints(sequences, vocab_size, end_token=end_token, pipeline=pipeline)
    meta = json.loads(json.dumps(artifact.set_metadata(compiled)))  # as in the manifest
    ir = artifact.automaton_from_metadata(meta, compiled.lowered.tables)
    assert ir == compiled.ir
    tokens, lengths = enumerate_sequences(ir)
    got = sorted(tuple(int(t) for t in row[:n]) for row, n in zip(tokens, lengths))
    assert got == unique_sorted(sequences)
    assert np.all(tokens[np.arange(tokens.shape[1])[None, :] >= lengths[:, None]] == -1)
    return ir


LAYOUTS = ["", "{force=dense_rows}", "{force=csr}", "{force=unary}", "{force=near_unary}",
           "{force=csr},split-heavy{light-k=1}", "{force=near_unary},split-heavy{light-k=2}"]


@settings(max_examples=25, deadline=None)
@given(data=fixed_length_sets(max_vocab=40, max_length=5, max_items=40),
       layout=st.sampled_from(LAYOUTS), minimize=st.booleans())
def test_tables_decode_back_to_the_set_fixed_length(data, layout, minimize):
    rows, vocab_size = data
    pipeline = f"verify,{'minimize{force=true},' if minimize else ''}choose-layout{layout}," \
               "pad-branches,pack-dtypes"
    _roundtrip(rows, vocab_size, pipeline=pipeline)


@settings(max_examples=25, deadline=None)
@given(data=ragged_sets(max_vocab=40, max_length=5, max_items=40),
       layout=st.sampled_from(LAYOUTS), minimize=st.booleans())
def test_tables_decode_back_to_the_set_ragged(data, layout, minimize):
    rows, vocab_size, end_token = data
    pipeline = f"verify,{'minimize{force=true},' if minimize else ''}choose-layout{layout}," \
               "pad-branches,pack-dtypes"
    _roundtrip(rows, vocab_size, end_token=end_token, pipeline=pipeline)


def test_corrupt_tables_with_valid_checksums_fail_verification():
    compiled = compile_constraints(SMALL, 8, pipeline="verify,choose-layout{force=csr},pack-dtypes")
    tables = [dict(layer) for layer in compiled.lowered.tables]
    indptr = tables[1]["indptr"].copy()
    indptr[-1] += 5  # row pointers past the end of the token array
    tables[1]["indptr"] = indptr
    with pytest.raises(IRVerificationError):
        artifact.automaton_from_metadata(artifact.set_metadata(compiled), tables)


def test_errors_share_one_hierarchy():
    for name in ("ArtifactError", "ArtifactFormatError", "ArtifactChecksumError",
                 "ArtifactVersionError", "ArtifactExistsError", "DecodeInputError",
                 "ConstraintSetError", "ReportInputError", "CliInputError", "MainJobError"):
        assert issubclass(getattr(errors, name), StaticCompilerError)
    assert issubclass(errors.ArtifactChecksumError, StaticCompilerError)
    assert issubclass(errors.ArtifactExistsError, FileExistsError)


def test_two_writers_racing_for_a_new_path_never_delete_each_others_artifact(tmp_path,
                                                                            two_sets,
                                                                            monkeypatch):
    """save(overwrite=False) checked the path, then renamed: a writer that
    landed in between had its artifact replaced (deleted). Now the rename
    onto the path is the check: the second writer gets ArtifactExistsError
    and the first's artifact stays whole."""
    first, second = two_sets
    path = tmp_path / "set.static"
    build = writer.build_files

    def other_writer_lands_first(compiled, reuse=None, modules=True):
        files = build(compiled, reuse, modules)
        if not path.exists():
            monkeypatch.setattr(writer, "build_files", build)
            artifact.save(first, path)  # the other process, between our check and our rename
        return files

    monkeypatch.setattr(writer, "build_files", other_writer_lands_first)
    with pytest.raises(ArtifactExistsError, match="already exists"):
        artifact.save(second, path)
    assert serving.load(path).num_sequences == first.ir.num_sequences
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT  # no temp dirs left


@pytest.mark.parametrize("manifest", ['{"name": "my notes"}', "not json", None])
def test_overwrite_only_replaces_a_verifiable_artifact_of_ours(tmp_path, two_sets, manifest):
    """overwrite=True used to delete any directory holding a manifest.json,
    with whatever else was in it."""
    first, _ = two_sets
    path = tmp_path / "data"
    if manifest is None:  # one of ours, with a file added beside it
        artifact.save(first, path)
        (path / "my_results.csv").write_text("precious")
    else:
        path.mkdir()
        (path / "manifest.json").write_text(manifest)
        (path / "my_results.csv").write_text("precious")
    with pytest.raises(ArtifactExistsError, match="not an artifact of ours"):
        artifact.save(first, path, overwrite=True)
    assert (path / "my_results.csv").read_text() == "precious"


def _dead_pid() -> int:
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_writers_that_died_leave_nothing_behind_and_no_missing_artifact(tmp_path, two_sets):
    """A kill -9 during a save left hidden temporary directories that nothing
    removed, and one between the swap's two renames left no artifact at the
    path (the old one only in a hidden .old-* directory)."""
    first, second = two_sets
    path = tmp_path / "set.static"
    dead, live = _dead_pid(), os.getpid()
    for name in (f".set.static.tmp-{dead}-ab", f".set.static.tmp-{live}-cd", ".set.static.tmp-ef"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "junk").write_text("x")
    artifact.save(first, path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([".set.static.tmp-ef", f".set.static.tmp-{live}-cd", *KEPT])
    # Killed between `rename(path, old)` and `rename(tmp, path)`:
    os.rename(path, tmp_path / f".set.static.old-{dead}-gh")
    (tmp_path / f".set.static.tmp-{dead}-ij").mkdir()
    assert not path.exists()
    done = artifact.recover_stale(path)
    assert done == [f"restored .set.static.old-{dead}-gh to set.static",
                    f"removed .set.static.tmp-{dead}-ij"]
    assert serving.load(path).num_sequences == first.ir.num_sequences
    artifact.save(second, path, overwrite=True)  # and saving runs the same recovery first
    assert serving.load(path).num_sequences == second.ir.num_sequences


KILLED_AFTER_EXCHANGE = """
import os, sys
sys.path.insert(0, sys.argv[3])
import test_artifact as t
from static_compiler import artifact, compile_constraints
from static_compiler.artifact import writer
second = compile_constraints(t.SMALL[:3], 8, export_beam_sizes=(2,))
real = writer._rename_exchange

def exchange_then_die(a, b):
    ok = real(a, b)
    print("exchanged" if ok else "unsupported", flush=True)
    os._exit(9)  # kill -9 right after the swap: nothing cleans up

writer._rename_exchange = exchange_then_die
artifact.save(second, sys.argv[1], overwrite=True)
"""


def test_an_overwrite_swaps_in_one_step_so_the_path_always_holds_an_artifact(tmp_path, two_sets):
    """The swap used to be two renames with no artifact at the path between
    them; it is now one atomic exchange (renameat2 RENAME_EXCHANGE). A writer
    killed right after it leaves the new artifact at the path and the old one
    in a temporary directory that the next save removes."""
    import subprocess
    import sys
    first, second = two_sets
    path = tmp_path / "set.static"
    artifact.save(first, path)
    out = subprocess.run([sys.executable, "-c", KILLED_AFTER_EXCHANGE, str(path), "",
                          os.path.dirname(__file__)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(helpers.REPO / "tests")})
    if out.stdout.strip() == "unsupported":
        pytest.skip("this filesystem has no atomic exchange (the two-rename fallback is tested)")
    assert out.returncode == 9 and out.stdout.strip() == "exchanged", out.stderr
    assert serving.load(path).num_sequences == second.ir.num_sequences
    # The killed writer also leaves its lock file (the kernel released the
    # lock; the next writer takes the file over and removes it).
    stale = [p.name for p in tmp_path.iterdir() if p.name not in (*KEPT, ".set.static.lock")]
    assert len(stale) == 1 and stale[0].startswith(".set.static.tmp-")
    assert serving.load(tmp_path / stale[0]).num_sequences == first.ir.num_sequences
    artifact.save(first, path, overwrite=True)  # recovers first: the dead writer's dir goes
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT
    assert serving.load(path).num_sequences == first.ir.num_sequences


def test_without_an_atomic_exchange_an_overwrite_falls_back_to_two_renames(tmp_path, two_sets,
                                                                         monkeypatch):
    first, second = two_sets
    path = tmp_path / "set.static"
    artifact.save(first, path)
    monkeypatch.setattr(writer, "_rename_exchange", lambda a, b: False)
    artifact.save(second, path, overwrite=True)
    assert serving.load(path).num_sequences == second.ir.num_sequences
    assert sorted(p.name for p in tmp_path.iterdir()) == KEPT


@pytest.mark.parametrize("arr", [
    np.arange(10, dtype=np.int32), np.zeros((0,), np.uint16), np.array([True, False, True]),
    np.arange(24, dtype=np.int64).reshape(6, 4), np.arange(40, dtype=np.int16)[::2],
    np.full((3, 5), -1, np.int8),
])
def test_table_files_are_np_save_bytes_written_in_chunks(arr, tmp_path, monkeypatch):
    """A table is hashed and written a chunk at a time (no bytes copy of it),
    byte for byte what np.save writes; here with 8-byte chunks."""
    monkeypatch.setattr(writer.NpyFile, "CHUNK_BYTES", 8)
    npy = writer.NpyFile(arr)
    want = writer._npy_bytes(arr)
    assert bytes(npy) == want and npy == want and npy.size == len(want)
    assert npy.entry() == FileEntry.of_bytes(want)
    writer._write_file(tmp_path, "t/x.npy", npy)
    assert (tmp_path / "t" / "x.npy").read_bytes() == want
    assert np.array_equal(np.load(tmp_path / "t" / "x.npy"), arr)


@pytest.mark.parametrize("old, new", [("serving", "static_compiler.serving"),
                                      ("format", "static_compiler.format.spec"),
                                      ("snapshot", "static_compiler.format.snapshot"),
                                      ("runtime", "static_compiler.serving.runtime")])
def test_the_modules_that_left_the_package_warn_and_are_the_modules_at_their_place(old, new):
    """0.1.0's `from static_compiler.artifact import serving` (and the format's
    modules) keep working until 0.2.0, warning with the path to use; the new
    module itself, not a copy (`artifact.serving.load is serving.load`)."""
    import importlib

    with pytest.warns(DeprecationWarning, match=rf"static_compiler\.artifact\.{old} is deprecated and "
                                                rf"will be removed in 0\.2\.0 .*: use {re.escape(new)}$"):
        module = getattr(artifact, old)
    assert module is importlib.import_module(new)
    assert old not in dir(artifact)  # deprecated: not listed
    with pytest.warns(DeprecationWarning, match="static_compiler.serving$"):
        from static_compiler.artifact import serving as old_serving
    assert old_serving.load is serving.load
    with pytest.raises(AttributeError, match="has no attribute 'servng'"):
        artifact.servng  # noqa: B018
