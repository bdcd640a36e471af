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

import static_compiler as sc
from helpers import edit_manifest, one_error_line, run_cli
from static_compiler.artifact import format as fmt
from static_compiler.artifact import serving
from static_compiler.errors import ArtifactFormatError, ArtifactVersionError, DecodeInputError

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
    assert back.export_beam_sizes == ()
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
                             "-o", tmp_path / "t.sc", "--tables-only")
    assert code == 0, err
    assert "tables only (no modules: `static-compiler re-export` adds them)" in out
    assert _manifest(tmp_path / "t.sc")["modules"] == {}
    code, out, err = run_cli(capsys, "verify", tmp_path / "t.sc")
    assert code == 0, err
    code, out, err = run_cli(capsys, "decode", tmp_path / "t.sc")
    assert code == 2 and "holds tables only" in one_error_line(err)


@pytest.mark.parametrize("change, problem", [
    (lambda m: m.update(format_version=10), "from format version 11"),
    (lambda m: m.update(jax_version="0.10.2"), "jax_version '0.10.2'"),
    (lambda m: m.update(exported_at="2026-12-05"), "exported_at '2026-12-05'"),
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
