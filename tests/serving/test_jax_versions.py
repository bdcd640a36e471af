"""Artifacts across JAX versions: the manifest records the exporting jax,
jaxlib and date; a module this jax cannot read is an ArtifactVersionError at
`load` naming both versions and `static-compiler re-export`; `re-export`
renews the modules with the running jax (tables kept, a serving `reload()`
reads them); a load warns as the export date nears the end of jax.export's
window. tests/data/jax_versions/ holds one small artifact per supported jax
(`python -m tools.jax_fixtures` under each): each loads and decodes here,
or fails at load as it should and decodes after a re-export."""

import datetime
import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DATA, edit_manifest, one_error_line, run_cli

import static_compiler as sc
from static_compiler import errors, serving
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import FileEntry, Manifest
from static_compiler.serving import runtime

FIXTURES = DATA / "jax_versions"
VOCAB, END, B, M = 16, 0, 2, 4


def fixture_items() -> list:
    return [[int(t) for t in row if t >= 0] for row in np.load(FIXTURES / "items.npy")]


def logits_fn(tokens, step, carry):
    """Deterministic logits that depend on each beam's last token and the step."""
    tokens = np.asarray(tokens)
    ramp = np.sin(np.arange(VOCAB, dtype=np.float32) * (step + 1))
    return ramp + 0.37 * tokens[..., None].astype(np.float32), carry


def jax_logits_fn(tokens, step, carry):
    ramp = jnp.sin(jnp.arange(VOCAB, dtype=jnp.float32) * (step + 1))
    return ramp + 0.37 * tokens[..., None].astype(jnp.float32), carry


@pytest.fixture(scope="module")
def compiled():
    return sc.compile_constraints(fixture_items(), VOCAB, end_token=END, export_beam_sizes=(M,),
                                  export_subsets=True)


@pytest.fixture(scope="module")
def want(compiled):
    """The in-process beams (tokens, scores, valid) the artifacts must give,
    without and with a subset of every third item."""
    pick = np.arange(compiled.items.num_items) % 3 == 0
    return [sc.beam_search(compiled, jax_logits_fn, batch_size=B, beam_size=M, subset=s)
            for s in (None, compiled.subset(pick))]


def served_beams(art) -> list:
    pick = np.arange(art.items.num_items) % 3 == 0
    return [art.beam_search(logits_fn, B, M, subset=s) for s in (None, art.subset(pick))]


def assert_same_beams(got, want):
    for g, w in zip(got, want):
        assert np.array_equal(np.asarray(g.tokens), np.asarray(w.tokens))
        assert np.array_equal(np.asarray(g.valid), np.asarray(w.valid))
        np.testing.assert_allclose(np.asarray(g.scores), np.asarray(w.scores), rtol=0, atol=0)


def version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


@pytest.fixture
def saved(compiled, tmp_path):
    return compiled.save(tmp_path / "set.static")


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith("jax-"))


def test_fixtures_exist_for_the_oldest_and_newest_supported_jax():
    assert "jax-0.10.2" in FIXTURE_NAMES and any(v.startswith("jax-0.12") for v in FIXTURE_NAMES)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_each_jaxs_artifact_decodes_here_or_fails_at_load_naming_both(name, want, tmp_path):
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    written_by = Manifest.from_json(json.loads((path / fmt.MANIFEST_FILE).read_text()), path)
    assert name == f"jax-{written_by.jax_version}" and written_by.exported_at is not None
    try:
        art = serving.load(path)
    except errors.ArtifactVersionError as e:
        # only a newer jax's modules may be unreadable here, and the error says what to do
        assert version_tuple(written_by.jax_version) > version_tuple(jax.__version__), e
        text = str(e)
        assert f"jax {written_by.jax_version}" in text and f"jax {jax.__version__}" in text
        assert f"static-compiler re-export {path}" in text and written_by.exported_at in text
        report = sc.reexport_artifact(path)
        assert (report["from_jax"], report["jax"]) == (written_by.jax_version, jax.__version__)
        art = serving.load(path)
    assert_same_beams(served_beams(art), want)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_torch_backend_reads_each_jaxs_artifact(name, want):
    torch_backend = pytest.importorskip("static_compiler.torch_backend")
    torch = pytest.importorskip("torch")
    tc = torch_backend.TorchConstraints.load(FIXTURES / name)
    got = tc.beam_search(lambda t, s, c: (torch.from_numpy(logits_fn(t.numpy(), s, c)[0]), c),
                         B, M)
    w = want[0]
    assert np.array_equal(np.asarray(got.tokens), np.asarray(w.tokens))
    assert np.array_equal(np.asarray(got.valid), np.asarray(w.valid))


def test_the_manifest_records_the_exporting_jax_and_date_and_an_update_keeps_them(
        compiled, tmp_path):
    path = compiled.save(tmp_path / "set.static", overwrite=False)
    manifest = serving.read_manifest(path)
    jax_now, jaxlib_now = runtime.running_versions()
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert (manifest.jax_version, manifest.jaxlib_version, manifest.exported_at) == \
        (jax_now, jaxlib_now, today)
    assert manifest.format_version == fmt.FORMAT_VERSION == 17
    edit_manifest(path, lambda m: m.update(exported_at="2026-07-01"))
    sc.update_artifact(path, remove=[fixture_items()[0]])  # keeps the modules
    assert serving.read_manifest(path).exported_at == "2026-07-01"  # the modules' date, kept


def test_modules_this_jax_cannot_read_are_a_version_error_at_load(saved):
    """Another jax's module (here: damaged bytes under another recorded
    version, as a newer jax's StableHLO reads here) fails in `load`, not at
    the first step, naming both versions, the date and the fix; the same
    damage under this jax's own version is a format error (damage)."""
    module = saved / "modules" / "advance.jaxexport"
    data = bytearray(module.read_bytes())
    data[len(data) // 2:] = b"\x00" * (len(data) - len(data) // 2)
    module.write_bytes(bytes(data))

    def rewrite(version):
        def change(m):
            m["jax_version"] = version
            m["files"]["modules/advance.jaxexport"] = FileEntry.of_bytes(bytes(data)).to_json()
        edit_manifest(saved, change)

    rewrite(jax.__version__)
    with pytest.raises(errors.ArtifactFormatError, match="cannot be deserialized"):
        serving.load(saved)
    rewrite("0.99.0")
    with pytest.raises(errors.ArtifactVersionError) as e:
        serving.load(saved)
    text = str(e.value)
    assert "exported by jax 0.99.0" in text and f"this process's jax {jax.__version__}" in text
    assert f"static-compiler re-export {saved}" in text


def test_re_export_keeps_the_tables_and_a_reload_reads_the_new_modules(saved, want,
                                                                       monkeypatch):
    edit_manifest(saved, lambda m: m.update(exported_at="2026-06-01"))
    with pytest.warns(errors.ArtifactExpiryWarning):
        art = serving.load(saved)
    tables = {p.name: p.stat().st_ino for p in (saved / "tables").iterdir()}
    report = sc.reexport_artifact(saved)
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert report["from_exported_at"] == "2026-06-01" and report["upgraded"] is False
    assert report["exported_at"] == today
    assert {p.name: p.stat().st_ino for p in (saved / "tables").iterdir()} == tables  # linked
    # this jax exports the same bytes again: the reload keeps its modules, takes the new date
    new = art.reload()
    assert new is not art and new.manifest.exported_at == today
    assert new._modules is art._modules and new._tables == art._tables
    # another exporter's modules (here: lowered for the CPU alone) are read by the reload
    monkeypatch.setattr(fmt, "PLATFORMS", ("cpu",))
    sc.reexport_artifact(saved)
    newer = new.reload()
    assert newer._modules.keys() == new._modules.keys()
    assert all(newer._modules[k] is not new._modules[k] for k in new._modules)
    assert newer._modules["advance"].exported.platforms == ("cpu",)
    assert newer._tables == art._tables  # the same device tables: nothing read again
    assert_same_beams(served_beams(newer), want)
    assert_same_beams(served_beams(art), want)


def test_re_export_of_an_older_format_upgrades_it(saved, want):
    edit_manifest(saved, lambda m: (m.update(format_version=9), m.pop("exported_at")))
    assert serving.read_manifest(saved).exported_at is None
    report = sc.reexport_artifact(saved)
    assert report["upgraded"] and (report["from_version"], report["to_version"]) == (9, fmt.FORMAT_VERSION)
    assert report["from_exported_at"] is None and report["exported_at"] is not None
    assert_same_beams(served_beams(serving.load(saved)), want)


def test_the_re_export_command(saved, capsys):
    code, out, err = run_cli(capsys, "re-export", saved)
    assert code == 0, err
    assert f"re-exported {saved}: jax {jax.__version__}" in out
    assert "tables kept" in out
    code, out, err = run_cli(capsys, "re-export", saved.parent / "missing.static")
    assert code == 2 and "missing.static" in one_error_line(err)


def test_re_export_while_another_writer_holds_the_lock_fails_at_once(saved):
    from static_compiler.artifact.lock import update_lock
    with update_lock(saved):
        with pytest.raises(errors.ArtifactBusyError):
            sc.reexport_artifact(saved)


@pytest.mark.parametrize("age_days, warns", [(0, False), (150, False), (154, True), (200, True)])
def test_a_load_warns_as_the_export_nears_the_end_of_jaxs_window(saved, age_days, warns):
    today = datetime.datetime.now(datetime.timezone.utc).date()
    date = (today - datetime.timedelta(days=age_days)).isoformat()
    edit_manifest(saved, lambda m: m.update(exported_at=date))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        serving.load(saved)
    expiry = [w for w in seen if issubclass(w.category, errors.ArtifactExpiryWarning)]
    assert bool(expiry) == warns, [str(w.message) for w in seen]
    if warns:
        text = str(expiry[0].message)
        assert date in text and f"static-compiler re-export {saved}" in text
        assert ("passed" in text) == (age_days >= fmt.EXPORT_WINDOW_DAYS)


def test_an_unknown_export_date_does_not_warn_and_a_bad_one_is_a_format_error(saved):
    edit_manifest(saved, lambda m: m.update(exported_at=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.ArtifactExpiryWarning)
        serving.load(saved)
    edit_manifest(saved, lambda m: m.update(exported_at="last tuesday"))
    with pytest.raises(errors.ArtifactFormatError, match="exported_at"):
        serving.load(saved)
