"""Tables-only artifacts (format version 11): what a process without jax
saves, or `save(path, modules=False)` anywhere. Read back by `sc.load` and
the torch backend as the set it was; refused by `serving.load` naming
`re-export`; kept tables-only by updates (removals, additions within and
past the capacity); given modules by `reexport_artifact`, after which the
served artifact decodes as the compiled set does; a manifest whose module
fields disagree is a format error. The end-to-end torch path without jax:
tests/torch_backend/test_torch_without_jax.py.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import edit_manifest, one_error_line, run_cli

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ArtifactFormatError, ArtifactVersionError, DecodeInputError
from static_compiler.format import spec as fmt
from static_compiler.support.arguments import check_beam_schedule

V = 16


def _rows(seed: int, n: int = 40) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(1, V, (n, 3)), axis=0)


@pytest.fixture(scope="module")
def compiled():
    return sc.compile_constraints(_rows(0), V, export_subsets=True, capacity=1.5,
                                  export_beam_sizes=(4,))


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_saved_tables_read_back_as_the_set(compiled, tmp_path, capsys):
    path = compiled.save(tmp_path / "t.sc", modules=False)
    manifest = _manifest(path)
    assert manifest["format_version"] == fmt.FORMAT_VERSION and manifest["modules"] == {}
    assert manifest["platforms"] == [] and manifest["exported_at"] is None
    assert not (path / "modules").exists()
    back = sc.load(path, check_automaton=True)
    assert back.export_options.beam_sizes == (4,)  # the export plan the manifest records
    prefixes = _rows(0)[:, :2]
    assert np.array_equal(np.asarray(back.allowed(prefixes)), np.asarray(compiled.allowed(prefixes)))
    with pytest.raises(ArtifactVersionError, match=r"holds tables only.*static-compiler re-export"):
        serving.load(path)
    code, out, err = run_cli(capsys, "show-ir", path, "--stats")
    assert code == 0, err


def test_updates_keep_it_tables_only(compiled, tmp_path):
    path = compiled.save(tmp_path / "t.sc", modules=False)
    assert sc.update_artifact(path, remove=_rows(0)[:3])["removed"] == 3  # (links the files)
    assert _manifest(path)["modules"] == {}
    report = sc.update_artifact(path, add=_rows(1, 4))  # within the capacity
    assert report["modules"] == "none" and not report["grew"]
    report = sc.update_artifact(path, add=_rows(2, 200))  # past it
    assert report["modules"] == "none" and report["grew"]
    assert _manifest(path)["modules"] == {}
    want = compiled.update(remove=_rows(0)[:3]).update(add=_rows(1, 4)).update(add=_rows(2, 200))
    back = sc.load(path)
    every = np.concatenate([_rows(0), _rows(1, 4), _rows(2, 200)])
    assert np.array_equal(np.asarray(back.allowed(every[:, :2])),
                          np.asarray(want.allowed(every[:, :2])))


def test_re_export_adds_the_modules(compiled, tmp_path, capsys):
    path = compiled.save(tmp_path / "t.sc", modules=False)
    with pytest.raises(DecodeInputError, match=r"beam_sizes=\(0,\)"):
        sc.reexport_artifact(path, beam_sizes=(0,))
    assert _manifest(path)["modules"] == {}  # a failed re-export leaves it as it was
    report = sc.reexport_artifact(path, beam_sizes=(4, 6))
    assert report["tables_only"] and not report["upgraded"]
    art = serving.load(path)
    assert art.beam_sizes == (4, 6)
    table = np.random.default_rng(3).standard_normal((compiled.max_length, V, V)).astype(np.float32)
    subset = art.subset(np.arange(art.items.num_items) % 2 == 0)
    state = art.init_beams(2, 6)
    for step in range(art.max_length):
        state = art.beam_step(state, table[step][np.asarray(state.last_tokens)], step,
                              subset=subset)
    table_j = jnp.asarray(table)
    want = sc.beam_search(compiled, lambda last, step, carry: (table_j[step, last], carry),
                          batch_size=2, beam_size=6,
                          subset=compiled.subset(np.arange(compiled.items.num_items) % 2 == 0))
    assert np.array_equal(np.asarray(art.finalize(state).tokens), np.asarray(want.tokens))
    code, out, err = run_cli(capsys, "re-export", path, "--beam-sizes", 8)
    assert code == 2 and "keeps them" in one_error_line(err)


def test_the_compile_command_writes_tables_only(tmp_path, capsys):
    np.save(tmp_path / "ids.npy", _rows(4))
    code, out, err = run_cli(capsys, "compile", tmp_path / "ids.npy", "--vocab-size", V,
                             "-o", tmp_path / "t.sc", "--tables-only", "--beam-sizes", "3")
    assert code == 0, err
    assert "tables only (no modules: `static-compiler re-export` adds them)" in out
    assert _manifest(tmp_path / "t.sc")["modules"] == {}
    assert _manifest(tmp_path / "t.sc")["export_plan"]["beam_sizes"] == [3]
    code, out, err = run_cli(capsys, "verify", tmp_path / "t.sc")
    assert code == 0, err
    code, out, err = run_cli(capsys, "decode", tmp_path / "t.sc")
    assert code == 2 and "holds tables only" in one_error_line(err)


@pytest.mark.parametrize("change, problem", [
    (lambda m: m.update(format_version=10), "from format version 11"),
    (lambda m: m.update(jax_version="0.10.2"), "jax_version '0.10.2'"),
    (lambda m: m.update(exported_at="2026-12-05"), "exported_at '2026-12-05'"),
    (lambda m: m["export_plan"].update(beam_sizes=[0]), r"export_plan'\]\['beam_sizes'\]"),
    (lambda m: m["export_plan"].update(tokens_per_beam=[1]), "expected 3 entries"),
    (lambda m: m["export_plan"].update(beam_schedules=[[2, 4]]), "a list of 3 ints"),
    (lambda m: m["export_plan"].pop("priors"), "has keys"),
])
def test_module_fields_that_disagree_are_format_errors(compiled, tmp_path, change, problem):
    path = compiled.save(tmp_path / "t.sc", modules=False)
    edit_manifest(path, change)
    with pytest.raises(ArtifactFormatError, match=problem):
        sc.load(path)


def test_an_artifact_with_modules_needs_every_module_field(compiled, tmp_path):
    path = compiled.save(tmp_path / "m.sc")
    edit_manifest(path, lambda m: m.update(calling_convention_version=None))
    with pytest.raises(ArtifactFormatError, match="calling_convention_version None"):
        sc.load(path)


# ----- the export plan (format version 15): re-export exports what the set asked for -----

def _module_records(path) -> dict:
    """{module name: (kind, beam sizes, per-step caps)} of an artifact's manifest."""
    return {name: (m["kind"], m.get("beam_size"), m.get("beam_size_out"),
                   m.get("tokens_per_beam")) for name, m in _manifest(path)["modules"].items()}


def _served_tokens(path, beam_size, seed: int = 5) -> np.ndarray:
    """The tokens a served beam search over the artifact at `path` finds
    with `beam_size` (an int or a schedule), for fixed random logits."""
    art = serving.load(path)
    widths = check_beam_schedule(beam_size, art.max_length)
    table = np.random.default_rng(seed).standard_normal((art.max_length, V, V)).astype(np.float32)
    state = art.init_beams(2, widths[0])
    for step in range(art.max_length):
        state = art.beam_step(state, table[step][np.asarray(state.last_tokens)], step,
                              beam_size=widths[step + 1])
    return np.asarray(art.finalize(state).tokens)


@pytest.mark.parametrize("how", ["modules=False", "without jax"])
def test_re_export_exports_the_beam_sizes_and_caps_the_set_was_saved_for(tmp_path, how,
                                                                        monkeypatch, capsys):
    """A tables-only save (modules=False, or a save where jax is missing)
    records the export plan; re-export with no beam sizes exports exactly
    the modules a save with modules writes (not beam size 70)."""
    from static_compiler.artifact import writer

    compiled = sc.compile_constraints(_rows(0), V, export_beam_sizes=(3, 5),
                                      export_tokens_per_beam=2)
    want = compiled.save(tmp_path / "with_modules.sc")
    if how == "without jax":
        monkeypatch.setattr(writer, "installed", lambda name: name != "jax")
        path = compiled.save(tmp_path / "t.sc")
        monkeypatch.undo()
    else:
        path = compiled.save(tmp_path / "t.sc", modules=False)
    plan = _manifest(path)["export_plan"]
    assert _manifest(path)["modules"] == {}
    assert plan == {"beam_sizes": [3, 5], "beam_schedules": [], "tokens_per_beam": [None, 2, 2],
                    "priors": False}
    assert sc.load(path).export_options.tokens_per_beam == 2
    code, out, err = run_cli(capsys, "re-export", path)
    assert code == 0, err
    assert _module_records(path) == _module_records(want)
    assert _manifest(path)["export_plan"] is None  # the modules say it now
    assert serving.load(path).beam_sizes == (3, 5)
    assert np.array_equal(_served_tokens(path, 5), _served_tokens(want, 5))


def test_explicit_beam_sizes_override_the_recorded_plan(compiled, tmp_path, capsys):
    path = compiled.save(tmp_path / "t.sc", modules=False)
    assert _manifest(path)["export_plan"]["beam_sizes"] == [4]
    code, out, err = run_cli(capsys, "re-export", path, "--beam-sizes", 2, 6)
    assert code == 0, err
    assert serving.load(path).beam_sizes == (2, 6)


def test_updates_keep_the_export_plan(tmp_path):
    compiled = sc.compile_constraints(_rows(0), V, export_subsets=True, capacity=1.5,
                                      export_beam_sizes=(3, (2, 3, 3)))
    path = compiled.save(tmp_path / "t.sc", modules=False)
    plan = _manifest(path)["export_plan"]
    assert plan["beam_sizes"] == [3] and plan["beam_schedules"] == [[2, 3, 3]]
    sc.update_artifact(path, remove=_rows(0)[:2])
    sc.update_artifact(path, add=_rows(1, 4))  # within the capacity
    sc.update_artifact(path, add=_rows(2, 200))  # past it: the set is compiled anew
    assert _manifest(path)["export_plan"] == plan


def test_a_schedule_re_exported_is_listed_in_the_manifest(tmp_path, capsys):
    """Re-export of a tables-only artifact for a beam schedule (API and CLI
    `--beam-sizes 4 2/4/4`) lists the schedule in the manifest's
    beam_schedules, so the served artifact runs it, as a save with the
    schedule does; so does a schedule the export plan records, and one
    re-exported into an artifact of an older format (upgraded on the way)."""
    compiled = sc.compile_constraints(_rows(0), V, export_beam_sizes=(4,))
    want = sc.compile_constraints(_rows(0), V, export_beam_sizes=(4, (2, 4, 4))).save(
        tmp_path / "want.sc")
    api = compiled.save(tmp_path / "api.sc", modules=False)
    sc.reexport_artifact(api, beam_sizes=(4, (2, 4, 4)))
    cli = compiled.save(tmp_path / "cli.sc", modules=False)
    code, out, err = run_cli(capsys, "re-export", cli, "--beam-sizes", 4, "2/4/4")
    assert code == 0, err
    planned = sc.compile_constraints(_rows(0), V, export_beam_sizes=(4, (2, 4, 4))).save(
        tmp_path / "planned.sc", modules=False)
    sc.reexport_artifact(planned)
    older = compiled.save(tmp_path / "older.sc", modules=False)
    edit_manifest(older, lambda m: (m.update(format_version=14), m.pop("export_plan")))
    assert sc.reexport_artifact(older, beam_sizes=(4, (2, 4, 4)))["upgraded"]
    expected = _served_tokens(want, (2, 4, 4))
    for path in (api, cli, planned, older):
        assert _manifest(path)["beam_schedules"] == [[2, 4, 4]], path.name
        assert _module_records(path) == _module_records(want), path.name
        assert serving.load(path).beam_schedules == ((2, 4, 4),)
        assert np.array_equal(_served_tokens(path, (2, 4, 4)), expected), path.name


def test_an_older_tables_only_artifact_re_exports_beam_size_70(compiled, tmp_path):
    """One saved before format version 15 records no plan: the default."""
    path = compiled.save(tmp_path / "t.sc", modules=False)
    edit_manifest(path, lambda m: (m.update(format_version=14), m.pop("export_plan")))
    assert sc.load(path).export_options.beam_sizes == (70,)
    sc.reexport_artifact(path)
    assert serving.load(path).beam_sizes == (70,)
    assert _manifest(path)["format_version"] == fmt.FORMAT_VERSION


def test_an_export_plan_beside_modules_is_a_format_error(compiled, tmp_path):
    path = compiled.save(tmp_path / "m.sc")
    edit_manifest(path, lambda m: m.update(export_plan={
        "beam_sizes": [4], "beam_schedules": [], "tokens_per_beam": [None, None, None],
        "priors": False}))
    with pytest.raises(ArtifactFormatError, match="export_plan beside"):
        sc.load(path)
