"""Beam schedules in a saved artifact (format version 13): the modules a
schedule's steps run, the manifest's "beam_schedules", the served search,
its warm-up, the CLI, and what a tampered manifest or an unexported
schedule gives."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from helpers import edit_manifest, one_error_line, run_cli

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ArtifactFormatError, DecodeInputError

V = 8
ROWS = np.unique(np.asarray(oracle.random_set(np.random.default_rng(3), 80, 4, V), np.int32),
                 axis=0)
SCHEDULE = (2, 4, 7, 5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    compiled = sc.compile_constraints(ROWS, V, export_subsets=True,
                                      export_beam_sizes=(3, SCHEDULE, [6] * 4))
    path = tmp_path_factory.mktemp("schedules") / "a.static"
    compiled.save(path)
    return compiled, path


def model(last, step, carry):
    last = jnp.asarray(last)
    return jnp.cos((last[..., None] + 2.0) * (jnp.arange(V) + 1) * (step + 0.7)), carry


def test_the_manifest_records_the_schedules_and_their_modules(saved):
    _, path = saved
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] >= 13  # (schedules came with 13)
    assert manifest["beam_schedules"] == [list(SCHEDULE), [6] * 4]
    steps = {name: (m["beam_size"], m.get("beam_size_out")) for name, m in
             manifest["modules"].items() if m["kind"] in ("beam_step", "beam_resize")}
    # a schedule starts from the start beam alone: init_m1, then 1 -> w_0
    assert steps == {"beam_step_m3": (3, None), "beam_step_m6": (6, None),
                     "beam_resize_m1_to2": (1, 2), "beam_resize_m2_to4": (2, 4),
                     "beam_resize_m4_to7": (4, 7), "beam_resize_m7_to5": (7, 5),
                     "beam_resize_m1_to6": (1, 6)}
    inits = {name for name, m in manifest["modules"].items() if m["kind"] == "init"}
    assert inits == {"init_m1", "init_m3", "init_m6"}
    assert "beam_resize_subset_m2_to4" in manifest["modules"]
    art = serving.load(path)
    assert art.beam_schedules == (SCHEDULE, (6,) * 4) and art.beam_sizes == (3, 6)


def test_the_served_search_is_the_library_search(saved):
    compiled, path = saved
    art = serving.load(path)
    keep = np.arange(len(ROWS)) % 4 != 1
    for kwargs in ({}, {"subset": keep}):
        want = compiled.beam_search(model, batch_size=3, beam_size=SCHEDULE,
                                    **({"subset": compiled.subset(keep)} if kwargs else {}))
        got = art.beam_search(model, batch_size=3, beam_size=list(SCHEDULE),
                              **({"subset": art.subset(keep)} if kwargs else {}))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(got.tokens).shape == (3, 5, 4)


def test_the_served_steps_keep_the_widths(saved):
    _, path = saved
    art = serving.load(path)
    state = art.init_beams(2, 1)  # (the start beam)
    for t, width in enumerate(SCHEDULE):
        logits, _ = model(state.last_tokens, t, None)
        state = art.beam_step(state, logits, t, beam_size=width)
        assert np.shape(state.node) == (2, width)
    with pytest.raises(DecodeInputError, match=r"no module 'beam_resize_m5_to9' \(its beam "
                                               r"schedules: \[2, 4, 7, 5\]"):
        art.beam_step(state, np.zeros((2, 5, V), np.float32), 0, beam_size=9)


def test_a_schedule_not_exported_is_named(saved):
    _, path = saved
    art = serving.load(path)
    with pytest.raises(DecodeInputError, match=r"beam_size=\[2, 4, 7, 6\]: this artifact was "
                                               r"exported for the beam schedules \[2, 4, 7, 5\]"):
        art.beam_search(model, batch_size=1, beam_size=(2, 4, 7, 6))
    with pytest.raises(DecodeInputError, match=r"expected an int >= 1, or a sequence of 4"):
        art.beam_search(model, batch_size=1, beam_size=(2, 4))


def test_warming_a_schedule_compiles_its_steps_once(saved):
    _, path = saved
    art = serving.load(path)
    report = art.warm([2], beam_sizes=[SCHEDULE], max_subsets=1)
    assert report.compilations > 0
    before = art.compilations()

    def host_model(last, step, carry):  # (numpy: no jax op of the model's own compiles)
        last = np.asarray(last)
        return np.cos((last[..., None] + 2.0) * (np.arange(V) + 1) * (step + 0.7)), carry

    art.beam_search(host_model, batch_size=2, beam_size=SCHEDULE)
    art.beam_search(host_model, batch_size=2, beam_size=SCHEDULE,
                    subset=art.subset(np.arange(len(ROWS)) < 5))
    assert art.compilations() == before
    with pytest.raises(DecodeInputError, match=r"warm .*beam_size=\[1, 1, 1, 2\]"):
        art.warm([2], beam_sizes=[(1, 1, 1, 2)])


def test_loading_and_saving_again_keeps_the_schedules(saved, tmp_path):
    _, path = saved
    loaded = sc.load(path)
    assert loaded.export_options.beam_sizes == (3, 6, SCHEDULE, (6,) * 4)
    loaded.save(tmp_path / "b.static")
    assert serving.load(tmp_path / "b.static").beam_schedules == (SCHEDULE, (6,) * 4)


def test_an_update_keeps_the_schedules(saved, tmp_path):
    compiled, path = saved
    copy = tmp_path / "c.static"
    compiled.save(copy)
    sc.update_artifact(copy, remove=ROWS[:3])
    assert serving.load(copy).beam_schedules == (SCHEDULE, (6,) * 4)


@pytest.mark.parametrize("change, problem", [
    (lambda m: m.update(beam_schedules=[[2, 4]]), r"\['beam_schedules'\]\[0\]=\[2, 4\]: "
                                                   r"expected a list of 4 ints >= 1"),
    (lambda m: m.update(beam_schedules=[[3, "3", 3, 3]]), r"expected a list of 4 ints"),
    (lambda m: m.update(beam_schedules=[[2, 4, 7, 9]]),
     r"lists no module\(s\) \[.beam_resize_m7_to9."),
    (lambda m: m["modules"]["beam_resize_m2_to4"].pop("beam_size_out"),
     r"has no key 'beam_size_out'"),
    (lambda m: m["modules"]["beam_resize_m2_to4"].update(beam_size_out=5),
     r"expected the name beam_resize_m2_to5"),
])
def test_a_tampered_schedule_record_is_a_format_error(saved, tmp_path, change, problem):
    compiled, _ = saved
    path = tmp_path / "d.static"
    compiled.save(path)
    edit_manifest(path, change)
    with pytest.raises(ArtifactFormatError, match=problem):
        serving.load(path)


def test_bad_export_schedules_are_named():
    with pytest.raises(DecodeInputError, match=r"entry 1 \(\(2, 0\)\) is not an int >= 1"):
        sc.compile_constraints(ROWS, V, export_beam_sizes=(3, (2, 0)))
    compiled = sc.compile_constraints(ROWS, V, export_beam_sizes=(3, (2, 4)))
    with pytest.raises(DecodeInputError, match=r"entry 1 \(\[2, 4\]\) is a beam schedule of 2 "
                                               r"steps, expected 4"):
        compiled.save("/nonexistent/never-written")


def test_the_cli_exports_and_decodes_a_schedule(tmp_path, capsys):
    src = tmp_path / "rows.npy"
    np.save(src, ROWS)
    art = tmp_path / "cli.static"
    code, out, err = run_cli(capsys, "compile", src, "--vocab-size", V, "-o", art,
                             "--beam-sizes", "3,2/4/7/5")
    assert code == 0, err
    assert "beam sizes 3, 2/4/7/5" in out
    code, out, err = run_cli(capsys, "decode", art, "--beam-size", "2/4/7/5", "--top", 5)
    assert code == 0, err
    assert "beams 2/4/7/5" in out and out.count("score") == 10
    code, out, err = run_cli(capsys, "decode", art, "--beam-size", "2/4/7/6")
    assert code == 2
    assert "--beam-size 2/4/7/6: artifact" in one_error_line(err)
    assert "and beam schedules [2/4/7/5]" in err
    with pytest.raises(SystemExit) as exited:  # (argparse's own exit, for a bad value)
        run_cli(capsys, "decode", art, "--beam-size", "2/x")
    assert exited.value.code == 2
    assert "argument --beam-size: '2/x': expected a beam size" in capsys.readouterr().err
