"""The artifact format's dated window (`format.spec`: FORMAT_HISTORY,
MIN_FORMAT_VERSION, COMPAT) and `static-compiler upgrade`
(`static_compiler.upgrade_artifact`): every version in the window loads
and decodes as the set compiled today; a version outside it is an
ArtifactVersionError naming the window and the fix; an upgrade rewrites each
older version into the current one atomically, decoding the same beams.

Older artifacts are the frozen version 4 artifact of tests/data (versions 3
to 5: modules that take ex_bounds and per-state subset bits) or today's
artifacts with their manifest rewritten into an older shape (`as_version`).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil

import numpy as np
import oracle
import pytest
from helpers import DATA, edit_manifest, serve

import static_compiler as sc
from static_compiler import errors, serving, upgrade_artifact
from static_compiler.artifact import writer
from static_compiler.cli.dispatch import main as cli_main
from static_compiler.format import normalize, snapshot, snapshot_items
from static_compiler.format import spec as fmt

V4_ARTIFACT = DATA / "artifact_v4_subsets"
V4_SIDS = np.load(DATA / "artifact_v4_subsets_sids.npy")
VOCAB = 8


def reseal_items(path: pathlib.Path, arrays: dict, version: int) -> None:
    """Replaces the artifact's item arrays but row_item (and removed) with
    `arrays` {name: array}, at format `version`, checksums recomputed."""
    manifest = json.loads((path / fmt.MANIFEST_FILE).read_text())
    keep = {k: v for k, v in manifest["item_files"].items() if k in ("row_item", "removed")}
    for rel in set(manifest["item_files"].values()) - set(keep.values()):
        (path / rel).unlink()
        del manifest["files"][rel]
    for key, arr in arrays.items():
        rel = keep[key] = fmt.item_file(key)
        np.save(path / rel, arr)
        manifest["files"][rel] = {"size": (path / rel).stat().st_size,
                                  "sha256": fmt.sha256_file(path / rel)}
    manifest.update(item_files=keep, format_version=version)
    (path / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(manifest))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Today's artifacts of the frozen artifact's items: without subsets,
    with subsets, and with subsets after additions (insertions)."""
    root = tmp_path_factory.mktemp("window")
    plain = sc.compile_constraints(V4_SIDS, VOCAB, export_beam_sizes=(4,)).save(root / "plain")
    subsets = sc.compile_constraints(V4_SIDS, VOCAB, export_beam_sizes=(4,), export_subsets=True,
                                     capacity=2.0).save(root / "subsets")
    added = root / "added"
    shutil.copytree(subsets, added)
    extra = np.array([[7, 7, 7, 7], [0, 0, 0, 1], [7, 0, 7, 0]])
    assert sc.update_artifact(added, add=extra)["modules"] == "reused"
    return {"plain": plain, "subsets": subsets, "added": added,
            "added_rows": np.concatenate([V4_SIDS, extra])}


def as_version(built, version: int, dest: pathlib.Path) -> pathlib.Path:
    """An artifact of format `version` (1 to FORMAT_VERSION) at `dest`,
    holding the frozen artifact's items (with three added for version 8)."""
    if version in (3, 4, 5):  # modules that take ex_bounds and per-state bits
        shutil.copytree(V4_ARTIFACT, dest)
        if version == 3:
            edit_manifest(dest, lambda m: (m.update(format_version=3), m.pop("mesh")))
        if version == 5:
            edit_manifest(dest, lambda m: m.update(format_version=5, subset_bits="per_state"))
        return dest
    source = {1: "plain", 2: "plain", 8: "added"}.get(version, "subsets")
    shutil.copytree(built[source], dest)
    if version == 8:  # every final state's item, as version 8 held them
        with snapshot.open_snapshot(dest) as snap:
            items = snapshot_items.read_item_arrays(snap)
        from static_compiler.item_bits.state_order import InsertedOrder
        order = InsertedOrder(items["state_inserted_at"], items["state_inserted_item"],
                              int(items["row_item"].max()) + 1)
        reseal_items(dest, {"state_item": order[np.arange(order.count)].astype(np.int32)}, 8)
        edit_manifest(dest, lambda m: (m.pop("exported_at"), m.pop("attributes"),
                                       m.pop("beam_schedules"), m.pop("export_plan"),
                                       m.pop("rows_in_item_order")))
        return dest
    popped = {1: ("names_file", "item_files", "mesh", "subset_bits"),
              2: ("item_files", "mesh", "subset_bits"),
              fmt.FORMAT_VERSION: ()}.get(version, ()) + ("exported_at",) * (version < 10) + \
        ("attributes",) * (version < 12) + ("beam_schedules",) * (version < 13) + \
        ("export_plan",) * (version < 15) + ("rows_in_item_order",) * (version < 17)

    def older(m):
        m["format_version"] = version
        for key in popped:
            m.pop(key)
        if version <= 6:
            for layer in m["layers"]:
                layer.pop("branch_counts")
        if version < fmt.RANKED_MODULES_VERSION:  # (no ranked modules before 16)
            for name in [n for n in m["modules"] if fmt.is_ranked_module(n)]:
                rel = m["modules"].pop(name)["file"]
                m["files"].pop(rel)
                (dest / rel).unlink()
    edit_manifest(dest, older)
    return dest


OLD_SUBSETS = ["per_state", "ex_bounds", "branch_counts"]  # the frozen version 4 artifact's
NEEDED = {1: ["names_file", "item_files", "mesh", "subset_bits", "exported_at", "attributes",
              "beam_schedules", "export_plan", "rows_in_item_order", "branch_counts"],
          2: ["item_files", "mesh", "subset_bits", "exported_at", "attributes", "beam_schedules",
              "export_plan", "rows_in_item_order", "branch_counts"],
          3: ["mesh", "subset_bits", "exported_at", "attributes", "beam_schedules",
              "export_plan", "rows_in_item_order"] + OLD_SUBSETS,
          4: ["subset_bits", "exported_at", "attributes", "beam_schedules", "export_plan",
              "rows_in_item_order"] + OLD_SUBSETS,
          5: ["exported_at", "attributes", "beam_schedules", "export_plan",
              "rows_in_item_order"] + OLD_SUBSETS,
          6: ["exported_at", "attributes", "beam_schedules", "export_plan", "rows_in_item_order",
              "branch_counts"],
          7: ["exported_at", "attributes", "beam_schedules", "export_plan", "rows_in_item_order"],
          8: ["exported_at", "attributes", "beam_schedules", "export_plan", "rows_in_item_order",
              "state_item"],
          9: ["exported_at", "attributes", "beam_schedules", "export_plan", "rows_in_item_order"],
          10: ["attributes", "beam_schedules", "export_plan", "rows_in_item_order"],
          11: ["attributes", "beam_schedules", "export_plan", "rows_in_item_order"],
          12: ["beam_schedules", "export_plan", "rows_in_item_order"],
          13: ["export_plan", "rows_in_item_order"], 14: ["export_plan", "rows_in_item_order"],
          15: ["rows_in_item_order"], 16: ["rows_in_item_order"], 17: []}
"""The COMPAT rows each `as_version` artifact needs (versions 7 and 9 of a
set without additions are today's shape but for the export date, the
attributes and the beam_schedules keys, 10 and 11 but for those two keys,
12 but for the beam_schedules key; 13 differs from 14 only in the
dtype of category codes, which this set has none of; 14 from 15 only in
the export_plan key; 15 from 16 only in the ranked modules, which are
optional; 16 from 17 only in the rows_in_item_order key)."""


def rows_of(version: int, built) -> np.ndarray:
    return built["added_rows"] if version == 8 else V4_SIDS


def decode(path, subset_rows=None):
    """(library beams, serving beams) of the artifact at `path`: the
    library's through `sc.load`, with the subset of `subset_rows`
    (bool over the rows) when given; serving's through its modules."""
    model = oracle.HashModel(VOCAB, dup=40)
    seeds = [3, 4]
    compiled = sc.load(path)
    subset = None if subset_rows is None else compiled.subset(subset_rows)
    lib = sc.beam_search(compiled, model, batch_size=2, beam_size=4,
                         carry=model.init_carry(seeds, 4), carry_axes=model.carry_axes,
                         subset=subset, subset_index=None if subset is None else np.zeros(2, int))
    served = serve(serving.load(path), model, seeds, 4)
    return [np.asarray(x) for x in (lib.tokens, lib.scores)], \
        [np.asarray(x) for x in (served.tokens, served.scores)]


def assert_same(got, want):
    """Bit-identical beams (tokens, scores) of `decode`, library and serving."""
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def subset_rows(version: int, built):
    if version < 3:
        return None
    return np.random.default_rng(version).random(len(rows_of(version, built))) < 0.5


# ----- the dated history and the window -----

def test_the_history_is_dated_and_every_branch_names_the_date_it_goes():
    versions = [v.version for v in fmt.FORMAT_HISTORY]
    assert versions == list(range(1, fmt.FORMAT_VERSION + 1))
    dates = [datetime.date.fromisoformat(v.introduced) for v in fmt.FORMAT_HISTORY]
    assert dates == sorted(dates)
    assert 1 <= fmt.MIN_FORMAT_VERSION <= fmt.FORMAT_VERSION == fmt.MAX_FORMAT_VERSION
    assert fmt.supported_until(fmt.FORMAT_VERSION) is None
    for v in range(1, fmt.FORMAT_VERSION):
        ends = datetime.date.fromisoformat(fmt.supported_until(v))
        assert ends - dates[v] == datetime.timedelta(days=fmt.SUPPORT_DAYS)  # after v + 1 came
    for name, branch in fmt.COMPAT.items():
        assert branch.name == name and 1 <= branch.last_version < fmt.FORMAT_VERSION
        assert branch.removed_after == fmt.supported_until(branch.last_version)


@pytest.mark.parametrize("version", range(fmt.MIN_FORMAT_VERSION, fmt.MAX_FORMAT_VERSION + 1))
def test_every_version_in_the_window_loads_and_decodes_as_today(built, version, tmp_path):
    path = as_version(built, version, tmp_path / f"v{version}")
    with snapshot.open_snapshot(path) as snap:
        assert snap.manifest.format_version == version
        assert snap.compat == NEEDED[version]  # as written; the manifest as read has counts:
        assert normalize.needed_branches(snap.manifest) == [
            name for name in NEEDED[version] if name != "branch_counts"]
        assert all("branch_counts" in layer for layer in snap.manifest.layers)
        tables = snapshot.read_tables(snap)
    assert not any("ex_bounds" in tabs for tabs in tables)  # the readers read one shape
    today = built["added" if version == 8 else "subsets"]
    assert_same(decode(path, subset_rows(version, built)),
                decode(today, subset_rows(version, built)))


@pytest.mark.parametrize("version", [1, 4, 6, 8])
def test_the_torch_backend_reads_older_versions_as_today(built, version, tmp_path):
    """The torch backend reads the tables and items through the same
    readers: an older artifact's allowed tokens, with a subset, are today's."""
    pytest.importorskip("torch")
    from static_compiler.torch_backend import TorchConstraints

    path = as_version(built, version, tmp_path / f"v{version}")
    today = TorchConstraints.load(built["added" if version == 8 else "subsets"])
    older = TorchConstraints.load(path)
    rows = subset_rows(version, built)
    for depth in range(4):
        prefixes = rows_of(version, built)[:40, :depth]
        want = today.allowed(prefixes, subset=None if rows is None else today.subset(rows),
                             subset_index=None if rows is None else np.zeros(40, int))
        got = older.allowed(prefixes, subset=None if rows is None else older.subset(rows),
                            subset_index=None if rows is None else np.zeros(40, int))
        assert got.numpy().tolist() == want.numpy().tolist()


@pytest.mark.parametrize("version", [fmt.MIN_FORMAT_VERSION - 1, fmt.MAX_FORMAT_VERSION + 1])
def test_a_version_outside_the_window_names_the_window_and_the_fix(built, version, tmp_path):
    path = shutil.copytree(built["plain"], tmp_path / "a")
    edit_manifest(path, lambda m: m.update(format_version=version))
    window = rf"\[{fmt.MIN_FORMAT_VERSION}, {fmt.MAX_FORMAT_VERSION}\]"
    fix = "static-compiler upgrade" if version < fmt.MIN_FORMAT_VERSION else "newer static_compiler"
    for read in (serving.load, sc.load, upgrade_artifact):
        with pytest.raises(errors.ArtifactVersionError,
                           match=rf"format version {version} is outside the window .*{window}"
                                 rf".*{fix}"):
            read(path)


def test_once_the_window_passes_a_shape_an_update_kept_it_is_refused(tmp_path, monkeypatch):
    """A removal keeps a version 4 artifact's ex_bounds tables in a current
    version; once MIN_FORMAT_VERSION passes 5, the shape is refused too."""
    path = shutil.copytree(V4_ARTIFACT, tmp_path / "v4")
    sc.update_artifact(path, remove=np.arange(len(V4_SIDS)) < 3)
    assert serving.read_manifest(path).format_version == fmt.FORMAT_VERSION
    for module in (normalize, snapshot, fmt):
        monkeypatch.setattr(module, "MIN_FORMAT_VERSION", 6)
    with pytest.raises(errors.ArtifactVersionError,
                       match=rf"format version {fmt.FORMAT_VERSION} \(it holds .* of format "
                             rf"version 5 and before\) is outside the window .*\[6, "
                             rf"{fmt.MAX_FORMAT_VERSION}\].*"
                             r"static-compiler upgrade"):
        serving.load(path)


# ----- upgrade -----

@pytest.mark.parametrize("version", range(fmt.MIN_FORMAT_VERSION, fmt.FORMAT_VERSION))
def test_upgrade_turns_each_older_version_into_the_current_one(built, version, tmp_path):
    path = as_version(built, version, tmp_path / f"v{version}")
    rows = subset_rows(version, built)
    before = decode(path, rows)
    old = serving.read_manifest(path)
    report = upgrade_artifact(path)
    assert report["upgraded"] and (report["from_version"], report["to_version"]) == \
        (version, fmt.FORMAT_VERSION)
    assert report["modules"] == ("exported" if 3 <= version <= 5 else "kept")
    with snapshot.open_snapshot(path) as snap:
        new = snap.manifest
        assert new.format_version == fmt.FORMAT_VERSION
        assert snap.compat == normalize.needed_branches(new) == []
    if report["modules"] == "kept":  # tables and modules as they were, byte for byte
        for rel, entry in old.files.items():
            if rel.startswith((fmt.TABLES_DIR, fmt.MODULES_DIR)) or rel == fmt.IR_FILE:
                assert new.files[rel] == entry
    if version >= 6:  # the manifest is today's writer's
        today = serving.read_manifest(built["added" if version == 8 else "subsets"])
        assert new.layers == today.layers and new.item_files == today.item_files
    assert_same(decode(path, rows), before)
    assert upgrade_artifact(path)["upgraded"] is False


def test_a_current_artifact_is_a_no_op(built, tmp_path):
    path = shutil.copytree(built["subsets"], tmp_path / "a")
    files = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    report = upgrade_artifact(path)
    assert report == {"path": str(path), "from_version": fmt.FORMAT_VERSION,
                      "to_version": fmt.FORMAT_VERSION, "branches": [], "upgraded": False,
                      "modules": "kept"}
    assert sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*")
                  if p.is_file()) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no lock file, no temporary


@pytest.mark.parametrize("version", [4, 6])  # modules exported anew / kept
def test_an_upgrade_that_fails_midway_leaves_the_original_intact(built, version, tmp_path,
                                                                 monkeypatch):
    path = as_version(built, version, tmp_path / "a")
    files = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())

    def fail(*args, **kwargs):
        raise OSError("injected: the disk filled up before the swap")
    monkeypatch.setattr(writer, "_swap_in", fail)
    with pytest.raises(OSError, match="injected"):
        upgrade_artifact(path)
    assert sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*")
                  if p.is_file()) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert serving.read_manifest(path).format_version == version


def test_a_serving_reload_picks_up_an_upgrade_that_keeps_the_modules(built, tmp_path):
    path = as_version(built, 6, tmp_path / "v6")
    art = serving.load(path)
    assert upgrade_artifact(path)["modules"] == "kept"
    new = art.reload()
    assert new is not art and new.manifest.format_version == fmt.FORMAT_VERSION
    assert new._modules is art._modules  # the same deserialized modules


def test_upgrade_while_another_writer_holds_the_lock_fails_at_once(built, tmp_path):
    from static_compiler.artifact.lock import update_lock

    path = as_version(built, 6, tmp_path / "a")
    with update_lock(path):
        with pytest.raises(errors.ArtifactBusyError, match="nothing was written"):
            upgrade_artifact(path)
    assert serving.read_manifest(path).format_version == 6


def test_upgrade_of_a_damaged_or_missing_artifact_is_a_typed_error(built, tmp_path):
    path = as_version(built, 6, tmp_path / "a")
    table = next((path / fmt.TABLES_DIR).iterdir())
    data = bytearray(table.read_bytes())
    data[-1] ^= 1
    table.write_bytes(bytes(data))
    with pytest.raises(errors.ArtifactChecksumError, match="corrupted"):
        upgrade_artifact(path)
    assert serving.read_manifest(path, verify_checksums=False).format_version == 6
    with pytest.raises(errors.ArtifactFormatError, match="found nothing"):
        upgrade_artifact(tmp_path / "missing")
    with pytest.raises(errors.ArtifactFormatError, match=r"upgrade: path=3: expected the path"):
        upgrade_artifact(3)


# ----- the CLI -----

def test_the_upgrade_command(built, tmp_path, capsys):
    path = as_version(built, 6, tmp_path / "a")
    assert cli_main(["upgrade", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == (f"upgraded {path}: format version 6 -> {fmt.FORMAT_VERSION} (older shapes: "
                   "exported_at, attributes, beam_schedules, export_plan, rows_in_item_order, "
                   "branch_counts); tables and modules kept\n")
    assert cli_main(["upgrade", str(path)]) == 0
    assert capsys.readouterr().out == (f"{path}: already format version {fmt.FORMAT_VERSION}, "
                                       "nothing to do\n")
    edit_manifest(path, lambda m: m.update(format_version=99))
    assert cli_main(["upgrade", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("static-compiler upgrade: error: artifact ") and \
        "format version 99 is outside the window" in err and err.count("\n") == 1
    assert cli_main(["upgrade", str(tmp_path / "missing")]) == 2
    assert "found nothing" in capsys.readouterr().err
