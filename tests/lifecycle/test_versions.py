"""Catalogue versions: every writer that replaces an
artifact keeps the version it replaced in `.NAME.versions/`
(`artifact.history`), `list_versions` lists them with what made them,
`rollback_artifact` swaps one back in under the writers' lock, and a serving
`reload()` follows while the object serving before keeps its version."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from helpers import one_error_line, run_cli

import static_compiler as sc
from static_compiler import artifact, serving
from static_compiler.artifact import history
from static_compiler.errors import (
    ArtifactBusyError,
    ArtifactChecksumError,
    ArtifactFormatError,
    ArtifactVersionError,
    DecodeInputError,
)

V, BEAMS = 6, 2
ROWS = np.array([[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]], np.int32)


@pytest.fixture(scope="module")
def compiled():
    return sc.compile_constraints(ROWS, V, export_beam_sizes=(BEAMS,), export_subsets=True)


@pytest.fixture
def path(tmp_path, compiled):
    return compiled.save(tmp_path / "set.static")


def seal(path) -> str:
    return hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()


def remove_row(path, row: int, **kw) -> dict:
    mask = np.zeros(len(ROWS), bool)
    mask[row] = True
    return sc.update_artifact(path, remove=mask, **kw)


def allowed_after(path, prefix) -> np.ndarray:
    """bool (V,): the tokens the artifact at `path` allows after `prefix`."""
    return np.asarray(serving.load(path).allowed(np.array([prefix], np.int32)))[0]


# ----- normal -----

def test_a_first_save_has_no_previous_version(path):
    (row,) = sc.list_versions(path)
    assert row["current"] and row["operation"] == "save" and row["id"] == 1
    assert row["sha256"] == seal(path) and row["num_sequences"] == len(ROWS)
    assert [p.name for p in history.versions_dir(path).iterdir()] == ["current.json"]


def test_updates_keep_the_versions_they_replace_with_their_reports(path):
    first = seal(path)
    report = remove_row(path, 0)
    rows = sc.list_versions(path)
    assert [(r["id"], r["operation"], r["current"]) for r in rows] == [
        (2, "update", True), (1, "save", False)]
    assert rows[0]["report"] == report == {"removed": 1, "already_removed": 0, "absent": 0}
    assert rows[0]["sha256"] == seal(path) and rows[1]["sha256"] == first
    kept = history.versions_dir(path) / "000001"
    assert sorted(p.name for p in kept.iterdir()) == ["artifact", "version.json"]
    assert hashlib.sha256((kept / "artifact" / "manifest.json").read_bytes()).hexdigest() == first
    sc.load(kept / "artifact")  # a kept version is an artifact as it was


def test_ids_grow_and_the_oldest_versions_are_pruned(path, monkeypatch):
    monkeypatch.setenv(history.KEEP_ENV, "2")
    for row in range(4):
        remove_row(path, row)
    rows = sc.list_versions(path)
    assert [r["id"] for r in rows] == [5, 4, 3]  # the current one and the last 2 kept
    assert not (history.versions_dir(path) / "000001").exists()
    remove_row(path, 0, keep_versions=1)  # a call's count wins over the environment
    assert [r["id"] for r in sc.list_versions(path)] == [6, 5]


def test_an_overwriting_save_is_kept_too(path, compiled):
    compiled.save(path, overwrite=True)
    assert [(r["id"], r["operation"]) for r in sc.list_versions(path)] == [(2, "save"),
                                                                           (1, "save")]


def test_a_re_export_is_recorded(path):
    sc.reexport_artifact(path)
    assert [(r["id"], r["operation"]) for r in sc.list_versions(path)] == [(2, "re-export"),
                                                                           (1, "save")]


def test_rollback_restores_the_previous_version_byte_for_byte(path):
    before = seal(path)
    assert allowed_after(path, [0, 1])[2]
    remove_row(path, 0)
    assert not allowed_after(path, [0, 1])[2]
    record = sc.rollback_artifact(path)
    assert seal(path) == before and allowed_after(path, [0, 1])[2]
    assert record["operation"] == "rollback" and record["report"]["to"] == 1
    assert record["report"]["restored"]["operation"] == "save"
    rows = sc.list_versions(path)
    assert [(r["id"], r["operation"]) for r in rows] == [(3, "rollback"), (2, "update")]
    # a rollback of the rollback: the update again
    sc.rollback_artifact(path)
    assert not allowed_after(path, [0, 1])[2]
    assert [(r["id"], r["operation"]) for r in sc.list_versions(path)] == [(4, "rollback"),
                                                                           (3, "rollback")]


def test_rollback_to_a_named_version(path):
    first = seal(path)
    remove_row(path, 0)
    remove_row(path, 1)
    sc.rollback_artifact(path, to="000001")
    assert seal(path) == first
    assert sc.load(path).items.removed is None or not np.any(sc.load(path).items.removed)
    assert [r["id"] for r in sc.list_versions(path)] == [4, 3, 2]


def test_serving_reload_follows_a_rollback_and_the_old_object_keeps_its_version(path):
    served = serving.load(path)
    remove_row(path, 0)
    after_removal = served.reload()
    assert served.allowed(np.array([[0, 1]], np.int32))[0, 2]  # the old object: its version
    assert not after_removal.allowed(np.array([[0, 1]], np.int32))[0, 2]
    # a decode starts on the version without row 0 ...
    state = after_removal.init_beams(1, BEAMS)
    state = after_removal.beam_step(state, np.zeros((1, BEAMS, V), np.float32), 0)
    sc.rollback_artifact(path)
    rolled_back = after_removal.reload()
    assert rolled_back.allowed(np.array([[0, 1]], np.int32))[0, 2]
    # ... and finishes on it (its files stay open though the directory moved)
    for step in (1, 2):
        logits = np.zeros((1, BEAMS, V), np.float32)
        logits[..., 1] = logits[..., 2] = 5.0  # would pick 0 1 2 if it were allowed
        state = after_removal.beam_step(state, logits, step)
    result = after_removal.finalize(state)
    tokens, valid = np.asarray(result.tokens), np.asarray(result.valid)
    beams = {tuple(map(int, tokens[0, m, :3])) for m in range(BEAMS) if valid[0, m]}
    assert beams and (0, 1, 2) not in beams and beams <= {tuple(r) for r in ROWS.tolist()}


def test_cli_versions_and_rollback(path, capsys):
    remove_row(path, 0)
    code, out, err = run_cli(capsys, "versions", path)
    assert code == 0 and not err
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("000002 current") and "update" in lines[0]
    assert "removed=1" in lines[0] and lines[1].startswith("000001 ") and "save" in lines[1]
    code, out, err = run_cli(capsys, "rollback", path, "--to", "1")
    assert code == 0 and "to version 000001" in out and "now version 000003" in out
    code, out, _ = run_cli(capsys, "versions", path)
    assert out.splitlines()[0].startswith("000003 current") and "(to=000001)" in out


def test_versions_of_one_artifact_across_overwrites_and_updates_stay(path, compiled):
    remove_row(path, 0)
    compiled.save(path, overwrite=True)
    remove_row(path, 1)
    assert [(r["id"], r["operation"]) for r in sc.list_versions(path)] == [
        (4, "update"), (3, "save"), (2, "update"), (1, "save")]
    sc.rollback_artifact(path, to=1)
    assert allowed_after(path, [0, 1])[2]


# ----- edge -----

def _served_then_replaced_by_tables_only(path, compiled, how):
    """(the artifact served before, the rows it allows after [0, 1]) once
    the version at `path` is tables-only: rolled back to one, or overwritten
    by a save with modules=False."""
    if how == "rollback":
        compiled.save(path, overwrite=True, modules=False)
        compiled.save(path, overwrite=True)  # with modules again: served
        served = serving.load(path)
        sc.rollback_artifact(path)  # to the tables-only version
    else:
        served = serving.load(path)
        compiled.save(path, overwrite=True, modules=False)
    assert serving.read_manifest(path).tables_only
    return served


@pytest.mark.parametrize("how", ["rollback", "overwrite"])
def test_reload_refuses_a_tables_only_version_as_load_does_and_keeps_serving(path, compiled,
                                                                            how):
    """A tables-only version (rolled back to, or saved over the served one
    with modules=False) is refused by reload with load's typed error naming
    re-export; the object keeps serving its own version, warm included."""
    served = _served_then_replaced_by_tables_only(path, compiled, how)
    with pytest.raises(ArtifactVersionError, match="tables only.*re-export") as loaded:
        serving.load(path)
    with pytest.raises(ArtifactVersionError, match="tables only.*re-export") as reloaded:
        served.reload()
    assert str(reloaded.value) == str(loaded.value)
    state = served.init_processor(1)
    masked = np.asarray(served.mask(np.zeros((1, V), np.float32), state, 0))
    assert (masked > -1e29).tolist() == [[True, True, True, True, False, False]]
    state = served.advance(state, np.array([0], np.int32), 0)
    assert served.allowed(np.array([[0, 1]], np.int32))[0, 2]
    served.warm(1)  # warms its own modules: a decode after it compiles nothing
    before = served.compilations()
    beams = served.beam_step(served.init_beams(1, BEAMS), np.zeros((1, BEAMS, V), np.float32), 0)
    served.mask(np.zeros((1, V), np.float32), served.advance(state, np.array([1], np.int32), 1),
                2)
    assert served.compilations() == before and np.asarray(beams.valid).any()
    # re-exported, the version serves again and reload takes it
    sc.reexport_artifact(path, beam_sizes=(BEAMS,))
    assert served.reload().allowed(np.array([[0, 1]], np.int32))[0, 2]



def test_keep_one_keeps_only_the_last_replaced_version(path):
    for row in range(3):
        remove_row(path, row, keep_versions=1)
    assert [r["id"] for r in sc.list_versions(path)] == [4, 3]
    sc.rollback_artifact(path, keep_versions=1)
    assert [r["id"] for r in sc.list_versions(path)] == [5, 4]


def test_the_cli_keeps_as_many_versions_as_asked(path, tmp_path, capsys):
    mask = np.zeros(len(ROWS), bool)
    for row in range(3):
        mask[:] = False
        mask[row] = True
        np.save(tmp_path / "gone.npy", mask)
        code, _, err = run_cli(capsys, "update", path, "--remove", tmp_path / "gone.npy",
                               "--keep-versions", 1)
        assert code == 0, err
    assert [r["id"] for r in sc.list_versions(path)] == [4, 3]
    code, _, err = run_cli(capsys, "rollback", path, "--keep-versions", 0)
    assert code == 0, err
    assert [r["id"] for r in sc.list_versions(path)] == [5]  # the version it replaced: not kept
    code, _, err = run_cli(capsys, "update", path, "--remove", tmp_path / "gone.npy",
                           "--keep-versions", -1)
    assert code == 2 and "keep_versions=-1: expected an int >= 0" in one_error_line(err)
    assert [r["id"] for r in sc.list_versions(path)] == [5]


def test_keep_zero_keeps_none(path):
    remove_row(path, 0, keep_versions=0)
    assert [r["id"] for r in sc.list_versions(path)] == [2]


# ----- bad -----

def test_rollback_with_nothing_to_roll_back_to(path, capsys):
    before = seal(path)
    with pytest.raises(DecodeInputError, match="no previous version"):
        sc.rollback_artifact(path)
    code, _, err = run_cli(capsys, "rollback", path)
    assert code == 2 and "no previous version" in one_error_line(err)
    assert seal(path) == before


def test_rollback_to_an_unknown_id_names_the_kept_ones(path, capsys):
    remove_row(path, 0)
    before = seal(path)
    with pytest.raises(DecodeInputError, match="no kept version 7.*000001"):
        sc.rollback_artifact(path, to=7)
    code, _, err = run_cli(capsys, "rollback", path, "--to", "x")
    assert code == 2 and "expected a version id" in one_error_line(err)
    assert seal(path) == before


@pytest.mark.parametrize("keep", [-1, 1.5, True])
def test_bad_keep_counts(path, keep, monkeypatch):
    with pytest.raises(DecodeInputError, match="keep_versions"):
        remove_row(path, 0, keep_versions=keep)
    monkeypatch.setenv(history.KEEP_ENV, "many")
    with pytest.raises(DecodeInputError, match=history.KEEP_ENV):
        remove_row(path, 0)


def test_rollback_while_another_writer_holds_the_lock(path, capsys):
    remove_row(path, 0)
    before = seal(path)
    with artifact.update_lock(path):
        with pytest.raises(ArtifactBusyError):
            sc.rollback_artifact(path)
        code, _, err = run_cli(capsys, "rollback", path)
        assert code == 2 and "being updated" in one_error_line(err)
    assert seal(path) == before and len(sc.list_versions(path)) == 2


def _damage(path, version: int, how: str) -> None:
    """Damages kept `version` of the artifact at `path`: its manifest
    unreadable (not JSON), a table's bytes flipped (same size), or a
    module file gone."""
    kept = history.versions_dir(path) / f"{version:06d}" / "artifact"
    if how == "manifest":
        (kept / "manifest.json").write_text("{not json")
    elif how == "table":
        table = sorted((kept / "tables").iterdir())[0]
        data = bytearray(table.read_bytes())
        data[-1] ^= 0xFF
        table.unlink()  # (its own file: the versions hard-link unchanged tables)
        table.write_bytes(bytes(data))
    else:
        sorted((kept / "modules").iterdir())[0].unlink()


@pytest.mark.parametrize("how, error, problem", [
    ("manifest", ArtifactFormatError, "not valid UTF-8 JSON"),
    ("table", ArtifactChecksumError, "has sha256"),
    ("module", ArtifactFormatError, "missing file")])
def test_rollback_refuses_a_damaged_kept_version_and_keeps_the_current(path, capsys, how, error,
                                                                        problem):
    remove_row(path, 0)
    remove_row(path, 1)
    _damage(path, 2, how)
    before, listed = seal(path), [r["id"] for r in sc.list_versions(path)]
    with pytest.raises(error, match=rf"kept version 000002 .* damaged .*{problem}.*current "
                                    "version stays"):
        sc.rollback_artifact(path)
    code, _, err = run_cli(capsys, "rollback", path)
    assert code == 2 and "000002" in one_error_line(err) and problem in err
    assert seal(path) == before and [r["id"] for r in sc.list_versions(path)] == listed
    assert not allowed_after(path, [1, 2])[3]  # still the current version (rows 0, 1 out)
    sc.rollback_artifact(path, to=1)  # another kept version still rolls back
    assert allowed_after(path, [1, 2])[3]


def test_one_unreadable_kept_manifest_is_listed_as_damaged(path, capsys):
    remove_row(path, 0)
    remove_row(path, 1)
    _damage(path, 1, "manifest")
    rows = sc.list_versions(path)
    assert [(r["id"], r["damaged"] is None) for r in rows] == [(3, True), (2, True), (1, False)]
    assert rows[1]["num_sequences"] == len(ROWS) and rows[2]["num_sequences"] is None
    assert "not valid UTF-8 JSON" in rows[2]["damaged"] and rows[2]["operation"] == "save"
    code, out, err = run_cli(capsys, "versions", path)
    lines = out.splitlines()
    assert code == 0 and not err and len(lines) == 3
    assert "DAMAGED" in lines[2] and "not valid UTF-8 JSON" in lines[2]
    assert "DAMAGED" not in lines[0] + lines[1]
    # a kept version without even its record or manifest file
    (history.versions_dir(path) / "000001" / "version.json").unlink()
    (history.versions_dir(path) / "000001" / "artifact" / "manifest.json").unlink()
    rows = sc.list_versions(path)
    assert rows[2]["id"] == 1 and "missing file 'manifest.json'" in rows[2]["damaged"]
    assert run_cli(capsys, "versions", path)[0] == 0


def test_a_new_set_saved_where_one_was_deleted_has_no_versions_of_it(path, tmp_path):
    """`.NAME.versions/` outlives a deleted artifact; a set saved anew at
    the path starts its own history: no rollback to the deleted set."""
    import shutil

    remove_row(path, 0)
    remove_row(path, 1)
    shutil.rmtree(path)
    assert (history.versions_dir(path) / "000001").is_dir()  # left until a new save
    other = sc.compile_constraints(np.array([[5, 5, 5]], np.int32), V, export_beam_sizes=(BEAMS,),
                                   export_subsets=True)
    other.save(path)
    (row,) = sc.list_versions(path)
    assert row["id"] == 1 and row["operation"] == "save" and row["num_sequences"] == 1
    assert sorted(p.name for p in history.versions_dir(path).iterdir()) == ["current.json"]
    with pytest.raises(DecodeInputError, match="no previous version"):
        sc.rollback_artifact(path)
    # its own versions work as before
    other.save(path, overwrite=True)
    sc.rollback_artifact(path)
    assert [r["num_sequences"] for r in sc.list_versions(path)] == [1, 1]


def test_versions_of_a_missing_artifact(tmp_path, capsys):
    code, _, err = run_cli(capsys, "versions", tmp_path / "none")
    assert code == 2 and "no artifact" in one_error_line(err)
