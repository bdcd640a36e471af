"""PyTorch without JAX, end to end: in a process where jax cannot
be imported (as after `pip install '.[torch]'`, which brings none: CI runs
this file in such an environment too, scripts/test-torch-only.sh), a set of
1e5 items is compiled and saved (tables only), 1e3 items are removed, a
subset is taken and a torch beam search decodes it: every beam is a live
item of the subset. Then, where jax is installed, the same artifact in a
jax serving process: `serving.load` names `static-compiler re-export`,
which adds the modules, after which the served artifact, `sc.load` and the
torch backend give the same beams.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import REPO, one_error_line, run_cli

ITEMS, REMOVED, V, L, B, M = 100_000, 1_000, 512, 4, 2, 8

SCRIPT = """
import importlib.util, json, sys
sys.modules["jax"] = None  # no jax, as the torch install has none
import numpy as np, torch
import static_compiler as sc
from static_compiler.torch_backend import TorchConstraints

out = sys.argv[1]
sids, keep, table = (np.load(f"{{out}}/{{name}}.npy") for name in ("sids", "keep", "table"))
compiled = sc.compile_constraints(sids, vocab_size={V}, export_subsets=True,
                                  export_beam_sizes=({M},))
compiled.save(f"{{out}}/set.static")  # no jax: the tables alone
removed = sc.update_artifact(f"{{out}}/set.static", remove=np.arange(len(sids)) < {REMOVED})
tc = TorchConstraints.load(f"{{out}}/set.static")
subset = tc.subset(keep)
table = torch.from_numpy(table)
result = tc.beam_search(lambda last, step, carry: (table[step][last], None),
                        batch_size={B}, beam_size={M}, subset=subset)
np.save(f"{{out}}/tokens.npy", result.tokens.numpy())
np.save(f"{{out}}/valid.npy", result.valid.numpy())
loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] in ("jax", "jaxlib")
                and mod is not None)
print(json.dumps({{"removed": removed, "jax_modules": loaded}}))
""".format(V=V, M=M, B=B, REMOVED=REMOVED)


@pytest.fixture(scope="module")
def torch_only(tmp_path_factory):
    """The artifact and beams a process without jax made: (folder, rows,
    keep mask, logits table, its report)."""
    out = tmp_path_factory.mktemp("torch_only")
    rng = np.random.default_rng(42)
    rows = np.unique(rng.integers(0, V, (ITEMS + ITEMS // 10, L)), axis=0)
    rows = rows[rng.permutation(len(rows))[:ITEMS]]
    keep = rng.random(ITEMS) < 0.5
    table = rng.standard_normal((L, V, V)).astype(np.float32)
    for name, arr in (("sids", rows), ("keep", keep), ("table", table)):
        np.save(out / f"{name}.npy", arr)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr
    return out, rows, keep, table, json.loads(run.stdout.strip().splitlines()[-1])


def test_torch_path_without_jax(torch_only):
    out, rows, keep, _, report = torch_only
    assert report["jax_modules"] == []
    assert report["removed"] == {"removed": REMOVED, "already_removed": 0, "absent": 0}
    tokens, valid = np.load(out / "tokens.npy"), np.load(out / "valid.npy")
    assert tokens.shape == (B, M, L) and valid.all()
    live = keep & (np.arange(ITEMS) >= REMOVED)  # in the subset, not removed
    index = {tuple(r): i for i, r in enumerate(rows)}
    for beam in tokens.reshape(-1, L):
        assert live[index[tuple(beam)]], beam
    manifest = json.loads((out / "set.static" / "manifest.json").read_text())
    assert manifest["modules"] == {} and manifest["jax_version"] is None
    assert not (out / "set.static" / "modules").exists()


def test_jax_serving_process_gets_the_modules_by_re_export(torch_only, capsys):
    """A tables-only artifact in a jax process: `serving.load` refuses it
    naming re-export; after `static-compiler re-export --beam-sizes M` the
    served artifact, `sc.load` and the torch backend give the torch beams."""
    jax = pytest.importorskip("jax")
    import static_compiler as sc
    from static_compiler import serving
    from static_compiler.errors import ArtifactVersionError

    out, _, keep, table, _ = torch_only
    path = out / "set.static"
    with pytest.raises(ArtifactVersionError, match=r"tables only.*re-export"):
        serving.load(path)
    code, text, err = run_cli(capsys, "re-export", path, "--beam-sizes", M)
    assert code == 0, err
    assert f"re-exported {path}: no modules (tables only) -> modules of jax" in text
    art = serving.load(path)
    assert art.beam_sizes == (M,)
    want = np.load(out / "tokens.npy")
    subset = art.subset(keep)
    state = art.init_beams(B, M)
    for step in range(art.max_length):
        logits = table[step][np.asarray(state.last_tokens)]
        state = art.beam_step(state, logits, step, subset=subset)
    assert np.array_equal(np.asarray(art.finalize(state).tokens), want)
    compiled, table_j = sc.load(path), jax.numpy.asarray(table)
    result = sc.beam_search(compiled, lambda last, step, carry: (table_j[step, last], carry),
                            batch_size=B, beam_size=M, subset=compiled.subset(keep))
    assert np.array_equal(np.asarray(result.tokens), want)
    # an artifact with modules keeps its beam sizes
    code, text, err = run_cli(capsys, "re-export", path, "--beam-sizes", M + 1)
    assert code == 2 and "keeps them" in one_error_line(err)


def test_save_rejects_a_bad_modules_option(tmp_path):
    import static_compiler as sc
    from static_compiler.errors import DecodeInputError

    compiled = sc.compile_constraints([[1, 2], [1, 3]], vocab_size=4)
    with pytest.raises(DecodeInputError, match=r"modules='yes'"):
        compiled.save(tmp_path / "a.sc", modules="yes")
    compiled.save(tmp_path / "b.sc", modules=False)
    assert json.loads((tmp_path / "b.sc" / "manifest.json").read_text())["modules"] == {}


TABLES_ONLY_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["jax"] = None
    import static_compiler as sc
    from static_compiler.errors import MissingDependencyError
    compiled = sc.compile_constraints([[1, 2], [1, 3]], vocab_size=4)
    for call in (lambda: compiled.save(sys.argv[1], modules=True),
                 lambda: sc.beam_search(compiled, None, batch_size=1, beam_size=2),
                 lambda: compiled.init_processor(1), lambda: compiled.lowered.device_tables):
        try:
            call()
        except MissingDependencyError as err:
            print(err)
""")


def test_jax_calls_without_jax_name_the_install(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", TABLES_ONLY_SCRIPT, str(tmp_path / "x.sc")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 4, run.stdout
    for line in lines:
        assert "needs the 'jax' package, which is not installed: pip install " \
               "'static-compiler[jax]'" in line, line
    assert "exporting an artifact's StableHLO modules" in lines[0]
    assert "save(path, modules=False)" in lines[0]
    assert "TorchConstraints" in lines[1]


CLI_SCRIPT = textwrap.dedent("""
    import contextlib, io, json, os, sys
    sys.modules["jax"] = None  # no jax, as the torch install has none
    import numpy as np
    from static_compiler.cli import dispatch, main
    from static_compiler.errors import MissingDependencyError

    out = sys.argv[1]
    cases = json.loads(sys.argv[2])
    runs = {}
    for name, argv in cases:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
            except SystemExit as exit:
                code = exit.code
            except BaseException as err:  # a traceback: the test names it
                code, stderr = "raised", io.StringIO(f"{type(err).__name__}: {err}")
        runs[name] = [code, stdout.getvalue(), stderr.getvalue()]
    from static_compiler import report
    import static_compiler as sc
    compiled = sc.compile_constraints(np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1]]), 5,
                                      export_subsets=True)
    table = report.stats_table(compiled)
    try:
        sc.enable_compilation_cache(out + "/cache")
        cache = "no error"
    except MissingDependencyError as err:
        cache = str(err)
    print(json.dumps({"runs": runs, "subcommands": [c.name for c in dispatch.SUBCOMMANDS],
                      "table": table, "cache": cache,
                      "cache_dir_made": os.path.exists(out + "/cache"),
                      "jax": [m for m, mod in sys.modules.items()
                              if m.split(".")[0] == "jax" and mod is not None]}))
""")


def test_every_cli_subcommand_without_jax_runs_or_names_the_install(tmp_path):
    """Without jax, each subcommand (and its --help) either works, as
    everything but the JAX decoders does (show-ir --stats and --layer,
    compile, verify, update, versions, rollback, upgrade), or stops with one
    line and exit status 2 naming the [jax] extra (demo, decode, re-export):
    never a traceback. `report.stats_table` is numpy-only, and
    `enable_compilation_cache` raises MissingDependencyError before it
    creates its directory."""
    (tmp_path / "set.txt").write_text("1 2 3\n1 2 4\n2 3 1\n")
    (tmp_path / "add.txt").write_text("4 4 4\n")
    art = str(tmp_path / "art.sc")
    cases = [
        ("help", ["--help"]),
        ("show-ir --stats", ["show-ir", str(tmp_path / "set.txt"), "--vocab-size", "5",
                             "--stats"]),
        ("show-ir --layer", ["show-ir", str(tmp_path / "set.txt"), "--vocab-size", "5",
                             "--layer", "1"]),
        ("compile", ["compile", str(tmp_path / "set.txt"), "--vocab-size", "5", "-o", art,
                     "--export-subsets"]),
        ("show-ir artifact --stats", ["show-ir", art, "--stats"]),
        ("verify", ["verify", art, "--input", str(tmp_path / "set.txt")]),
        ("update", ["update", art, "--add", str(tmp_path / "add.txt")]),
        ("versions", ["versions", art]),
        ("rollback", ["rollback", art]),
        ("upgrade", ["upgrade", art]),
        ("decode", ["decode", art]),
        ("re-export", ["re-export", art]),
        ("demo", ["demo", "--num-items", "100"]),
    ] + [(f"{name} --help", [name, "--help"]) for name in
         ("show-ir", "compile", "decode", "verify", "update", "upgrade", "re-export", "versions",
          "rollback", "demo")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", CLI_SCRIPT, str(tmp_path), json.dumps(cases)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    runs = report["runs"]
    assert {c for c in report["subcommands"]} <= {name.split()[0] for name in runs}, \
        "a new subcommand: add its case without jax"
    needs_jax = {"decode", "re-export", "demo"}
    for name, (code, out, err) in runs.items():
        if name in needs_jax:
            assert code == 2, (name, code, out, err)
            line = one_error_line(err)
            assert line.startswith(f"static-compiler {name}: error: "), line
            assert "needs the 'jax' package, which is not installed: pip install " \
                   "'static-compiler[jax]'" in line, line
        else:
            assert code == 0 and "Traceback" not in err, (name, code, err)
    assert "TorchConstraints.load" in runs["demo"][2] and "TorchConstraints" in runs["decode"][2]
    for name in ("show-ir --stats", "show-ir artifact --stats"):
        assert "paper bound U_max" in runs[name][1] and "branch histogram" in runs[name][1]
    assert "item subsets:" in runs["show-ir artifact --stats"][1]
    assert "layer 1" in runs["show-ir --layer"][1]
    assert "OK" in runs["verify"][1] and "000002" in runs["versions"][1]
    assert "paper bound U_max" in report["table"] and "item subsets:" in report["table"]
    assert "enable_compilation_cache" in report["cache"] and "static-compiler[jax]" in \
        report["cache"]
    assert not report["cache_dir_made"] and report["jax"] == []
