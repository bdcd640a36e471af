"""`static-compiler compile / verify / decode / demo` and `show-ir` on
artifacts: outputs agree with the library, bad input exits 2 with one line
naming what was expected, and the main job checks its decodes against the set."""

import io
import json
import os
import re
import shutil
import threading

import numpy as np
import oracle
import pytest
from helpers import one_error_line, run_cli

from static_compiler import artifact, compile_constraints, serving
from static_compiler.cli import main, main_job
from static_compiler.cli.common import progress
from static_compiler.errors import MainJobError

SIDS = np.array(oracle.random_set(np.random.default_rng(7), 120, 4, 16))
RAGGED = [[1, 2, 3], [1, 2], [4], [4, 5, 6, 2], [6, 6], [0]]


@pytest.fixture(scope="module")
def npy_artifact(tmp_path_factory):
    """SIDS saved as .npy and compiled through the CLI (once per module)."""
    root = tmp_path_factory.mktemp("cli")
    np.save(root / "sids.npy", SIDS)
    code = main(["compile", str(root / "sids.npy"), "-o", str(root / "sids.static"),
                 "--vocab-size", "16", "--beam-sizes", "3,5", "--tokens-per-beam", "4"])
    assert code == 0
    return root


def test_compile_npy_matches_the_library(npy_artifact, capsys):
    path = npy_artifact / "sids.static"
    compiled = compile_constraints(SIDS, 16)
    assert artifact.read_automaton(path) == compiled.ir
    m = serving.read_manifest(path)
    assert sorted(k for k in m.modules if k.startswith("beam_step")) == [
        "beam_step_m3", "beam_step_m5"]
    assert m.modules["beam_step_m5"].tokens_per_beam == [None, 4, 4, 4]  # per step; step 0 uncapped
    assert run_cli(capsys, "show-ir", path) == (0, compiled.ir.to_text(), "")
    code, out, _ = run_cli(capsys, "show-ir", path, "--stats")
    # saved without export_subsets: the artifact has no item subsets to report
    assert code == 0 and out == oracle.stats_without_subsets(compiled)


def test_compile_logs_every_stage_with_its_time(tmp_path, capsys):
    np.save(tmp_path / "s.npy", SIDS[:20])
    code, out, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "a",
                             "--vocab-size", 16, "--beam-sizes", 2, "--print-ir-after-all")
    assert code == 0
    compiled = compile_constraints(SIDS[:20], 16)
    for stage, _ in compiled.build.timings:
        assert re.search(rf"\[compile\]\s+{re.escape(stage)}\s+\d+\.\d+ s", err), stage
    assert re.search(r"\[export \+ save\] done in \d+\.\d+ s", err)
    assert "// ----- IR after pack-dtypes -----" in err
    assert out.startswith(f"wrote {tmp_path / 'a'}: 20 sequences, vocab 16")


@pytest.mark.parametrize("fmt", ["txt", "jsonl"])
def test_compile_text_and_jsonl_inputs(tmp_path, capsys, fmt):
    src = tmp_path / f"set.{fmt}"
    lines = [" ".join(map(str, s)) if fmt == "txt" else json.dumps(s) for s in RAGGED]
    src.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n")  # a blank line is skipped
    code, _, _ = run_cli(capsys, "compile", src, "-o", tmp_path / "a", "--vocab-size", 8,
                         "--end-token", 7, "--memory-budget", "1MiB", "--beam-sizes", 2)
    assert code == 0
    want = compile_constraints(RAGGED, 8, end_token=7,
                               pipeline="verify,choose-layout{memory-budget=1MiB},split-heavy,"
                                        "pad-branches,pack-dtypes")
    assert artifact.read_automaton(tmp_path / "a") == want.ir
    assert serving.read_manifest(tmp_path / "a").pipeline == want.build.pipeline
    code, out, _ = run_cli(capsys, "verify", tmp_path / "a", "--input", src)
    assert code == 0 and out.endswith("6 unique input sequences: OK\n")


def test_verify_reports_differences(npy_artifact, tmp_path, capsys):
    path = npy_artifact / "sids.static"
    code, out, _ = run_cli(capsys, "verify", path, "--input", npy_artifact / "sids.npy")
    unique = len({tuple(r) for r in SIDS.tolist()})
    assert code == 0
    assert out.startswith(f"{path}: {unique} sequences enumerated from the tables; the manifest "
                          f"records {unique}: OK")
    changed = SIDS[1:].tolist() + [[15, 15, 15, 15]]
    assert tuple(SIDS[0]) not in {tuple(r) for r in changed}
    (tmp_path / "changed.txt").write_text("\n".join(" ".join(map(str, r)) for r in changed))
    code, out, _ = run_cli(capsys, "verify", path, "--input", tmp_path / "changed.txt")
    assert code == 1
    assert "1 sequences in the input but not in the artifact\n  [15, 15, 15, 15]\n" in out
    assert f"1 sequences in the artifact but not in the input\n  {SIDS[0].tolist()}\n" in out
    assert out.endswith("MISMATCH\n")


def test_verify_of_a_damaged_artifact_is_a_typed_error(npy_artifact, tmp_path, capsys):
    dst = tmp_path / "copy"
    shutil.copytree(npy_artifact / "sids.static", dst)
    table = dst / "tables" / "layer0.next.npy"
    data = table.read_bytes()
    table.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    code, _, err = run_cli(capsys, "verify", dst)
    assert code == 2 and "layer0.next.npy' has sha256" in one_error_line(err)


def test_compile_refuses_to_overwrite_without_force(npy_artifact, tmp_path, capsys):
    target = tmp_path / "a"
    shutil.copytree(npy_artifact / "sids.static", target)
    before = serving.read_manifest(target)
    np.save(tmp_path / "t.npy", SIDS[:5])
    code, _, err = run_cli(capsys, "compile", tmp_path / "t.npy", "-o", target, "--vocab-size",
                           16, "--beam-sizes", 2)
    assert code == 2 and "already exists: pass --force" in one_error_line(err)
    assert serving.read_manifest(target) == before
    code, _, _ = run_cli(capsys, "compile", tmp_path / "t.npy", "-o", target, "--vocab-size", 16,
                         "--beam-sizes", 2, "--force")
    assert code == 0 and serving.read_manifest(target).num_sequences == 5


@pytest.mark.parametrize("content, args, message", [
    ("1 2 3\n", [], "--vocab-size is required"),
    ("1 2 x\n", ["--vocab-size", 8], r"line 1: '1 2 x' is not space-separated integer"),
    ("\n# only a comment\n", ["--vocab-size", 8], "no sequences found"),
    ("1 2\n3\n", ["--vocab-size", 8], "pass --end-token E"),
    ("1 2 9\n", ["--vocab-size", 8], r"token 9 is outside the vocabulary \[0, 8\)"),
    ("1 2\n", ["--vocab-size", 8, "--beam-sizes", "0,3"],
     "--beam-sizes '0,3': entry '0': expected a beam size"),
    ("1 2\n", ["--vocab-size", 8, "--beam-sizes", "x"], "--beam-sizes 'x': entry 'x': expected"),
    ("1 2\n", ["--vocab-size", 8, "--memory-budget", "lots"], "--memory-budget 'lots'"),
    ("1 2\n", ["--vocab-size", 8, "--memory-budget", "1MiB", "--pipeline", "verify"],
     "no choose-layout pass"),
    ("1 2\n", ["--vocab-size", 8, "--tokens-per-beam", 0], "--tokens-per-beam 0: expected"),
    ("1 2\n", ["--vocab-size", 8, "--pipeline", "nonsense"], "unknown pass 'nonsense'"),
])
def test_bad_compile_input_exits_2_with_one_line(tmp_path, capsys, content, args, message):
    src = tmp_path / "set.txt"
    src.write_text(content)
    code, out, err = run_cli(capsys, "compile", src, "-o", tmp_path / "a", *args)
    assert code == 2 and out == ""
    assert re.search(message, one_error_line(err)), err
    assert not (tmp_path / "a").exists()


def test_bad_jsonl_and_missing_files(tmp_path, capsys):
    src = tmp_path / "set.jsonl"
    src.write_text("[1, 2]\n[1, \"a\"]\n")
    code, _, err = run_cli(capsys, "compile", src, "-o", tmp_path / "a", "--vocab-size", 8)
    assert code == 2 and "line 2: '[1, \"a\"]' is not a JSON list of integer" in one_error_line(err)
    src.write_text("[1, 2\n")
    code, _, err = run_cli(capsys, "compile", src, "-o", tmp_path / "a", "--vocab-size", 8)
    assert code == 2 and "line 1: not JSON" in one_error_line(err)
    code, _, err = run_cli(capsys, "compile", tmp_path / "none.npy", "-o", tmp_path / "a",
                           "--vocab-size", 8)
    assert code == 2 and "no such file" in one_error_line(err)
    for command in ("verify", "decode", "show-ir"):
        code, _, err = run_cli(capsys, command, tmp_path / "none.static")
        assert code == 2, command


def test_show_ir_of_an_artifact_rejects_compile_options(npy_artifact, capsys):
    code, _, err = run_cli(capsys, "show-ir", npy_artifact / "sids.static", "--pipeline", "verify")
    assert code == 2 and "is an artifact, shown as compiled: --pipeline" in one_error_line(err)


def test_decode_prints_valid_top_sequences(npy_artifact, capsys):
    code, out, _ = run_cli(capsys, "decode", npy_artifact / "sids.static", "--beam-size", 5,
                           "--top", 3)
    assert code == 0
    found = [json.loads(t) for t in re.findall(r"tokens (\[[^\]]*\])", out)]
    assert len(found) == 6  # 3 per batch row
    items = {tuple(r) for r in SIDS.tolist()}
    assert all(tuple(seq) in items for seq in found)
    scores = [float(s) for s in re.findall(r"score\s+(-?\d+\.\d+)", out)]
    assert scores[:3] == sorted(scores[:3], reverse=True)
    code, _, err = run_cli(capsys, "decode", npy_artifact / "sids.static", "--beam-size", 4)
    assert code == 2 and "--beam-size 4: artifact" in one_error_line(err)
    assert "exports beam sizes [3, 5] (compile with --beam-sizes 4" in err


@pytest.mark.parametrize("schedule", ["2/4", "2/4/4/4/4"])
def test_decode_names_the_length_of_a_beam_schedule(npy_artifact, capsys, schedule):
    """A schedule of another length than the set's 4 steps is refused with
    the length a schedule has, and no compile command (the compiler refuses
    that schedule too); one of the right length the artifact lacks names the
    compile option that adds it."""
    path = npy_artifact / "sids.static"
    code, _, err = run_cli(capsys, "decode", path, "--beam-size", schedule)
    line = one_error_line(err)
    assert code == 2 and f"--beam-size {schedule}: a beam schedule has one width per step" in line
    assert "decodes 4 steps: give 4 widths joined by '/'" in line, line
    assert "compile with" not in line
    code, _, err = run_cli(capsys, "compile", npy_artifact / "sids.npy", "-o",
                           npy_artifact / "refused.static", "--vocab-size", 16, "--beam-sizes",
                           schedule)
    assert code == 2  # (what the old message suggested)
    code, _, err = run_cli(capsys, "decode", path, "--beam-size", "2/4/4/4")
    assert code == 2 and "exports beam sizes [3, 5] (compile with --beam-sizes 2/4/4/4 to " \
                         "add one)" in one_error_line(err)


def test_decode_prior_weight_needs_a_prior(npy_artifact, capsys):
    code, _, err = run_cli(capsys, "decode", npy_artifact / "sids.static", "--prior-weight", 2)
    line = one_error_line(err)
    assert code == 2 and "--prior-weight 2.0 without --prior" in line, line


def test_membership_is_exact_for_fixed_and_ragged_sets():
    tokens = np.array([[1, 2, 3, -1], [1, 2, 8, -1], [4, 8, -1, -1], [1, 2, 8, -1]])
    lengths = np.array([3, 2, 1, 3])
    inside = main_job.membership(RAGGED, tokens, lengths)
    assert inside.tolist() == [True, True, True, False]  # the end token past a length is ignored
    fixed = main_job.membership(SIDS, SIDS[:3], np.full(3, 4))
    assert fixed.all()
    other = SIDS[:1].copy()
    other[0, -1] = (other[0, -1] + 1) % 16
    if tuple(other[0]) not in {tuple(r) for r in SIDS.tolist()}:
        assert not main_job.membership(SIDS, other, np.array([4])).any()


def test_demo_main_job_end_to_end(capsys):
    code, out, _ = run_cli(capsys, "demo", "--num-items", 3000, "--beam-size", 8,
                           "--tokens-per-beam", 4, "--verbose")
    assert code == 0, out
    assert "dataset  synthetic-sids: 3000 uniform random Semantic IDs, L=8, V=2048" in out
    assert re.search(r"compile  \d+ unique sequences in \d+\.\d+ s \(frontend", out)
    assert "est_bytes" in out and "paper bound U_max" in out  # the per-layer table
    # the serving process loads the loader, format, live bits and utilities: no compiler stage
    serve = re.search(r"(\d+) serving-only modules, no compiler module: (\[.*?\]);", out)
    loaded = json.loads(serve[2].replace("'", '"'))
    assert int(serve[1]) == len(loaded)
    assert "static_compiler.serving" in loaded and "static_compiler.cli" in loaded
    stages = ("passes", "backend", "compiler", "compiled", "target.lowering", "target.raising",
              "frontend.sequences", "artifact.writer", "artifact.export")
    assert not [m for m in loaded if m.partition(".")[2].startswith(stages)], loaded
    assert re.search(r"constrained step \(serving beam_step\): median \d+\.\d+ ms", out)
    valid = re.search(r"check    (\d+)/16 beams valid; (\d+)/(\d+) valid beams are in the set: OK",
                      out)
    assert valid and int(valid[1]) >= 8 and valid[1] == valid[2] == valid[3], out


def test_demo_serve_line_counts_modules_and_names_them_only_with_verbose(monkeypatch):
    info = {"backend": "cpu", "modules": ["static_compiler", "static_compiler.serving",
                                         "static_compiler.errors"],
            "load_seconds": 0.25, "first_pass_seconds": 1.5}
    short = main_job.serve_line(info)
    assert short == ("serve    fresh process (cpu): 3 serving-only modules, no compiler module; "
                     "load + verify 0.250 s, first pass (XLA compile) 1.50 s")
    long = main_job.serve_line(info, verbose=True)
    assert "3 serving-only modules, no compiler module: ['static_compiler', " in long
    assert all(name in long for name in info["modules"]) and not any(
        name in short for name in info["modules"][1:])
    assert main_job.serve_line({**info, "modules": []}).count("0 serving-only modules") == 1
    # `demo` passes --verbose to the job (off by default)
    seen = []
    monkeypatch.setattr(main_job, "run", lambda config: seen.append(config.verbose) or 0)
    assert main(["demo"]) == 0 and main(["demo", "--verbose"]) == 0
    assert seen == [False, True]


def test_demo_rejects_bad_options(capsys):
    code, _, err = run_cli(capsys, "demo", "--num-items", 0)
    assert code == 2 and "--num-items 0: expected an int >= 1" in one_error_line(err)
    with pytest.raises(SystemExit) as e:
        main(["demo", "--dataset", "nope"])
    assert e.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


class _TickStream(io.StringIO):
    """A log stream that sets `ticked` once `ticks` "still running" lines
    have been written (the work waits for that, not for a clock)."""

    def __init__(self, ticks: int):
        super().__init__()
        self.ticks, self.ticked = ticks, threading.Event()

    def write(self, text):
        n = super().write(text)
        if self.getvalue().count("still running") >= self.ticks:
            self.ticked.set()
        return n


def test_progress_logs_long_work_only():
    stream = io.StringIO()
    with progress("quick", stream, after=600.0):
        pass
    assert stream.getvalue().startswith("[quick] done in ")
    stream = _TickStream(ticks=2)
    with progress("slow", stream, after=0.01, every=0.01):
        assert stream.ticked.wait(timeout=120)  # the work lasts until the second tick
    lines = stream.getvalue().splitlines()
    assert len([ln for ln in lines if ln.startswith("[slow] still running")]) >= 2
    assert lines[-1].startswith("[slow] done in ")


def test_compile_an_ir_dump(tmp_path, capsys):
    compiled = compile_constraints(RAGGED, 8, end_token=7)
    dump = tmp_path / "set.ir"
    dump.write_text(compiled.ir.to_text())
    code, _, _ = run_cli(capsys, "compile", dump, "-o", tmp_path / "a", "--beam-sizes", 2)
    assert code == 0 and artifact.read_automaton(tmp_path / "a") == compiled.ir
    code, _, err = run_cli(capsys, "compile", dump, "-o", tmp_path / "b", "--end-token", 3)
    assert code == 2 and "--end-token 3 differs from the dump's value 7" in one_error_line(err)


def test_serving_modules_are_the_loaders_own_and_the_demo_server():
    allowed = main_job.serving_modules()
    assert {"static_compiler", "static_compiler.errors", "static_compiler.serving",
            "static_compiler.cli", main_job.DEMO_SERVER} <= allowed
    # (the frontend package's __init__ is lazy: its builders are the compiler side)
    compiler_side = {"static_compiler.compiler", "static_compiler.frontend.sequences",
                     "static_compiler.frontend.graph", "static_compiler.frontend.text",
                     "static_compiler.frontend.inputs", "static_compiler.target.lowering",
                     "static_compiler.passes.pipeline", "static_compiler.passes",
                     "static_compiler.frontend.readers", "static_compiler.cli.dispatch",
                     "static_compiler.cli.main_job", "static_compiler.backend",
                     "static_compiler.artifact.writer", "static_compiler.artifact.export",
                     "static_compiler.compiled", "static_compiler.saved", "static_compiler.lifecycle",
                     "static_compiler.lifecycle.update", "static_compiler.lifecycle.next_version"}
    assert not allowed & compiler_side


def test_a_serving_process_importing_the_compiler_fails_the_main_job(monkeypatch, tmp_path):
    modules = ["static_compiler", "static_compiler.compiler", "static_compiler.serving"]
    monkeypatch.setattr(main_job, "serving_modules",
                        lambda: frozenset({"static_compiler", "static_compiler.serving"}))
    monkeypatch.setattr(main_job, "_run_child", lambda cmd: json.dumps({"modules": modules}))
    with pytest.raises(MainJobError, match=r"imported \['static_compiler.compiler'\]"):
        main_job.serve_in_fresh_process(tmp_path / "a", tmp_path / "o.npz", batch_size=1,
                                        beam_size=1)


def test_compile_with_export_subsets_serves_subsets(tmp_path, capsys):
    np.save(tmp_path / "s.npy", SIDS[:20])
    code, out, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "a",
                             "--vocab-size", 16, "--beam-sizes", 2, "--export-subsets")
    assert code == 0, err
    art = serving.load(tmp_path / "a")
    assert art.items is not None and "mask_subset" in art.manifest.modules
    mask = np.zeros(20, bool)
    mask[[3, 7]] = True
    sub = art.subset(mask)
    state = art.init_beams(1, 2)
    for t in range(art.max_length):
        state = art.beam_step(state, np.zeros((1, 2, 16), np.float32), t, subset=sub)
    got = {tuple(row) for row in np.asarray(art.finalize(state).tokens)[0].tolist()}
    assert got == {tuple(SIDS[3].tolist()), tuple(SIDS[7].tolist())}


def test_compile_with_capacity_reserves_room_shown_by_show_ir(tmp_path, capsys):
    np.save(tmp_path / "s.npy", SIDS[:20])
    code, out, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "a",
                             "--vocab-size", 16, "--beam-sizes", 2, "--capacity", 1.5)
    assert code == 0, err
    assert "reserve-capacity{growth=1.5}" in serving.load(tmp_path / "a").manifest.pipeline
    code, out, err = run_cli(capsys, "show-ir", tmp_path / "a")
    assert code == 0, err
    assert "capacity=1/" in out
    code, out, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "b",
                             "--vocab-size", 16, "--capacity", 0.5)
    assert code != 0 and "growth" in err


def test_cli_user_errors_print_one_line_and_exit_2(tmp_path, capsys):
    """These printed a traceback with exit 1 (or exited 0)."""
    np.save(tmp_path / "s.npy", SIDS[:20])
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "file" / "a",
                           "--vocab-size", 16, "--beam-sizes", 2)
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("static-compiler compile: error: FileExistsError")
    (tmp_path / "deep.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    code, _, err = run_cli(capsys, "show-ir", tmp_path / "deep.jsonl", "--vocab-size", 16)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "a",
                   "--vocab-size", 16, "--beam-sizes", 2)[0] == 0
    code, _, err = run_cli(capsys, "decode", tmp_path / "a", "--top", 0)
    assert code == 2 and "--top 0" in err


def test_decode_into_a_closed_pipe_stops_quietly(tmp_path):
    import subprocess
    import sys
    np.save(tmp_path / "s.npy", SIDS[:20])
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-m", "static_compiler.cli", "compile", str(tmp_path / "s.npy"),
                    "-o", str(tmp_path / "a"), "--vocab-size", "16", "--beam-sizes", "2"],
                   check=True, capture_output=True, env=env)
    done = subprocess.run(f"{sys.executable} -m static_compiler.cli decode {tmp_path / 'a'} "
                          "--batch-size 64 | head -c 10", shell=True, capture_output=True,
                          text=True, env=env)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


IR_DUMP = """automaton vocab=5 depth=2 sequences=2 final_states=2
layer 0  states=1 edges=2 max_branch=2 mean_branch=2.000 targets=implicit layout=csr(k=5,tokens=uint16,states=int16,est=8B)
  s0: 1->0 2->1
layer 1  states=2 edges=2 max_branch=1 mean_branch=1.000 targets=implicit layout=unary(k=1,tokens=uint16,states=int16,est=4B)
  s0: 3->0
  s1: 4->1
"""


@pytest.mark.parametrize("edit, message", [
    (("states=1 ", "states=99999999999999999999 "), r"line 2: layer 0 header says "
                                                    r"states=99999999999999999999, but only 4"),
    (("1->0", "99999999999999999999->0"), "token or target 99999999999999999999 does not fit"),
    (("csr(k=5,", "csr(k,"), "'k' has no value"),
    (("tokens=uint16,states=int16,est=8B", "tokens=float32,states=int16,est=8B"),
     "does not fit token dtype float32"),
])
def test_malformed_ir_dumps_exit_2_with_one_line(tmp_path, capsys, edit, message):
    """The first three printed a traceback (ValueError, OverflowError)."""
    (tmp_path / "ok.ir").write_text(IR_DUMP)
    assert run_cli(capsys, "compile", tmp_path / "ok.ir", "-o", tmp_path / "a",
                   "--beam-sizes", 2)[0] == 0
    (tmp_path / "bad.ir").write_text(IR_DUMP.replace(*edit))
    code, out, err = run_cli(capsys, "compile", tmp_path / "bad.ir", "-o", tmp_path / "b")
    assert code == 2 and "Traceback" not in err
    assert re.search(message, one_error_line(err)), err


def test_an_npy_header_claiming_more_rows_than_the_file_holds(tmp_path, capsys):
    """Used to try to allocate what the header claimed (745 GiB here)."""
    import numpy.lib.format as npy_format
    with open(tmp_path / "huge.npy", "wb") as f:
        npy_format.write_array_header_1_0(f, {"descr": "<i4", "fortran_order": False,
                                              "shape": (10 ** 11, 2)})
        f.write(b"\0" * 16)
    code, _, err = run_cli(capsys, "compile", tmp_path / "huge.npy", "-o", tmp_path / "a",
                           "--vocab-size", 5)
    assert code == 2 and "not a readable .npy array (mmap length is greater than file size)" \
        in one_error_line(err)


@pytest.mark.parametrize("value, message", [
    ("d4", "--mesh 'd4': expected NAME=SIZE[,NAME=SIZE...]"),
    ("d=0", "--mesh 'd=0': expected NAME=SIZE"),
    ("d=2,d=2", "--mesh 'd=2,d=2': expected NAME=SIZE[,NAME=SIZE...] with distinct names"),
    ("d=64", "--mesh d=64: a mesh {d: 64} needs 64 devices, this process has"),
])
def test_compile_mesh_bad_input(tmp_path, capsys, value, message):
    np.save(tmp_path / "s.npy", np.array([[1, 2], [2, 3]]))
    code = main(["compile", str(tmp_path / "s.npy"), "--vocab-size", "4", "-o",
                 str(tmp_path / "a.static"), "--mesh", value])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "a.static").exists()
