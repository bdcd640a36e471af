"""`static-compiler show-ir`: output equals the library's own printers; bad
input exits 2 with one line on stderr and no traceback. (`python -m
tools.show_ir` is tested beside it, in tools/tests/test_show_ir.py.)"""

import importlib
import os
import re
import subprocess
import sys

import helpers
import numpy as np
import oracle
import pytest

from static_compiler import compile_constraints, report
from static_compiler.cli import main
from static_compiler.frontend import build_automaton

REPO = str(helpers.REPO)
THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])


@pytest.fixture
def sids(tmp_path):
    path = tmp_path / "sids.npy"
    np.save(path, THREE)
    return str(path)


def run_cli(capsys, *argv):
    """`static-compiler show-ir ARGV` (helpers.run_cli)."""
    return helpers.run_cli(capsys, "show-ir", *argv)


def test_npy_prints_the_compiled_ir(capsys, sids):
    assert run_cli(capsys, sids, "--vocab-size", 4) == (0, str(compile_constraints(THREE, 4).ir), "")


def test_stats_prints_the_report_table(capsys, sids):
    code, out, _ = run_cli(capsys, sids, "--vocab-size", 4, "--stats")
    assert code == 0 and out == report.stats_table(compile_constraints(THREE, 4))


def test_layer_prints_one_layer(capsys, sids):
    ir = compile_constraints(THREE, 4).ir
    for t in range(3):
        code, out, _ = run_cli(capsys, sids, "--vocab-size", 4, "--layer", t)
        assert code == 0 and out == report.layer_text(ir, t)
    code, out, _ = run_cli(capsys, sids, "--vocab-size", 4, "--stats", "--layer", 1)
    assert out == report.stats_table(compile_constraints(THREE, 4)) + report.layer_text(ir, 1)


def test_print_ir_after_all_goes_to_stderr(capsys, sids):
    code, out, err = run_cli(capsys, sids, "--vocab-size", 4, "--print-ir-after-all")
    assert code == 0 and out == str(compile_constraints(THREE, 4).ir)
    headers = [ln for ln in err.splitlines() if ln.startswith("// ----- IR after ")]
    assert headers == [f"// ----- IR after {s} -----" for s in
                       ("frontend", "verify", "choose-layout", "split-heavy", "pad-branches",
                        "pack-dtypes")]


def test_pipeline_flag(capsys, sids):
    spec = "verify,choose-layout{force=csr},pack-dtypes"
    code, out, _ = run_cli(capsys, sids, "--vocab-size", 4, "--pipeline", spec)
    assert code == 0 and out == str(compile_constraints(THREE, 4, pipeline=spec).ir)
    assert out.count("layout=csr(") == 3


def test_end_token_flag(capsys, tmp_path):
    path = tmp_path / "fixed.npy"
    np.save(path, THREE)
    code, out, _ = run_cli(capsys, path, "--vocab-size", 5, "--end-token", 4)
    assert code == 0 and out == str(compile_constraints(THREE, 5, end_token=4).ir)


def test_ir_dump_is_shown_as_read_or_through_a_pipeline(capsys, tmp_path):
    compiled = compile_constraints(THREE, 4)
    dump = tmp_path / "compiled.ir"
    dump.write_text(str(compiled.ir))
    assert run_cli(capsys, dump) == (0, str(compiled.ir), "")
    code, out, _ = run_cli(capsys, dump, "--stats", "--vocab-size", 4)
    assert code == 0 and out == oracle.stats_without_subsets(compiled)  # a dump has no items

    raw = tmp_path / "frontend.txt"
    raw.write_text(str(build_automaton(THREE, 4)))
    code, out, _ = run_cli(capsys, raw, "--stats")
    assert code == 0 and "layout; run a pipeline with choose-layout" in out
    code, out, _ = run_cli(capsys, raw, "--pipeline", "verify,choose-layout,pad-branches,pack-dtypes")
    assert code == 0 and out == str(compiled.ir)


def test_max_edges_elides_rows(capsys, tmp_path):
    path = tmp_path / "many.npy"
    np.save(path, np.random.default_rng(0).integers(0, 30, size=(200, 3)))
    code, out, _ = run_cli(capsys, path, "--vocab-size", 30, "--max-edges", 0)
    assert code == 0 and "more rows elided" in out
    code, out, _ = run_cli(capsys, path, "--vocab-size", 30, "--max-edges", 10 ** 6)
    assert "elided" not in out


def _write(tmp_path, name, data):
    path = tmp_path / name
    if isinstance(data, np.ndarray):
        np.save(path, data, allow_pickle=True)
    else:
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


ERRORS = [
    # (id, file name, file contents or None for a missing file, extra flags, message regex)
    ("missing file", "absent.npy", None, ["--vocab-size", "4"], r"input '.*absent.npy': no such file"),
    ("not space separated", "sids.csv", "1,2,3\n", ["--vocab-size", "4"],
     r"line 1: '1,2,3' holds comma-separated ids: save it as .npy or space-separated ids"),
    ("npy without vocab", "sids.npy", THREE, [], r"--vocab-size is required for a constraint set"),
    ("token out of range", "sids.npy", THREE, ["--vocab-size", "3"],
     r"sequence 1, position 0: token 3 is outside the vocabulary \[0, 3\)"),
    ("vocab size 0", "sids.npy", THREE, ["--vocab-size", "0"], r"--vocab-size 0: expected an int in \[1, "),
    ("3-D array", "cube.npy", np.zeros((2, 2, 2), dtype=np.int64), ["--vocab-size", "4"],
     r"shape \(2, 2, 2\): expected 2-D"),
    ("nan in array", "nan.npy", np.array([[1.0, np.nan]]), ["--vocab-size", "4"],
     r"value nan is not a finite integer"),
    ("empty array", "empty.npy", np.zeros((0, 3), dtype=np.int64), ["--vocab-size", "4"],
     r"empty constraint set"),
    ("pickled object array", "obj.npy", np.array([[1, 2], [3]], dtype=object), ["--vocab-size", "4"],
     r"not a readable .npy array"),
    ("not an npy file", "text.npy", "hello\n", ["--vocab-size", "4"], r"not a readable .npy array"),
    ("unknown pass", "sids.npy", THREE, ["--vocab-size", "4", "--pipeline", "verify,bogus"],
     r"entry 1: unknown pass 'bogus'"),
    ("option of the wrong type", "sids.npy", THREE,
     ["--vocab-size", "4", "--pipeline", "pad-branches{multiple=x}"], r"expected int, got 'x'"),
    ("budget too small", "sids.npy", THREE,
     ["--vocab-size", "4", "--pipeline", "choose-layout{memory-budget=8}"],
     r"the smallest layouts need 23 bytes"),
    ("layer out of range", "sids.npy", THREE, ["--vocab-size", "4", "--layer", "3"],
     r"layer 3: expected an int in \[0, 3\)"),
    ("negative max edges", "sids.npy", THREE, ["--vocab-size", "4", "--max-edges", "-1"],
     r"--max-edges -1: expected an int >= 0"),
    ("garbage IR", "bad.ir", "automaton of sorts\n", [], r"line 1: expected 'automaton vocab="),
    ("binary IR", "bad.txt", b"\xff\xfe\x00", [], r"not a readable UTF-8 text file"),
    ("broken IR", "broken.ir", str(build_automaton(THREE, 4)).replace("s1: 2->1 3->2", "s1: 3->1 2->2"),
     [], r"layer 2, state 1: tokens not strictly increasing"),
    ("vocab differs from dump", "dump.ir", str(build_automaton(THREE, 4)), ["--vocab-size", "5"],
     r"--vocab-size 5 differs from the dump's value 4"),
    ("end token differs from dump", "dump.ir", str(build_automaton(THREE, 4)), ["--end-token", "0"],
     r"--end-token 0 differs from the dump's value None"),
]


@pytest.mark.parametrize("name,data,flags,pattern", [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, name, data, flags, pattern):
    path = str(tmp_path / name) if data is None else _write(tmp_path, name, data)
    code, out, err = run_cli(capsys, path, *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("static-compiler show-ir: error: ")
    assert "Traceback" not in err
    assert re.search(pattern, err), err


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["show-ir"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["show-ir", "x.npy", "--layer", "one"])
    assert info.value.code == 2


@pytest.mark.parametrize("command", [["show-ir", "x.npy"], ["compile", "x.npy", "-o", "a"]])
def test_the_ir_printing_flag_has_one_spelling(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([*command, "--print-after-all"])
    assert info.value.code == 2
    assert "unrecognized arguments: --print-after-all" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli(sids, tmp_path):
    done = subprocess.run([sys.executable, "-m", "static_compiler.cli", "show-ir", sids,
                           "--vocab-size", "4", "--stats"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == report.stats_table(compile_constraints(THREE, 4))


def test_console_script_points_at_main():
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["static-compiler"]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is main
