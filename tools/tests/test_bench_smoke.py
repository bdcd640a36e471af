"""The benchmark suite (`python -m tools.bench`) on tiny sizes, run as the
user runs it: a subprocess from the repository root.

* `--check`: the suite's own checks of its baselines against the library
  (the exact baselines decode exactly what `static_compiler.beam_search`
  decodes, the hash bitmap's false-positive estimate matches brute force,
  ...) must all pass; a wrong baseline makes it exit 1 and this test fail.
* a tiny run of every sweep and method: exit status, results.csv cells and
  columns, the targets table of results.md.
* the build benchmark at scale (`python -m tools.bench.build`), its option
  checks and the --gpu plan.
* each other benchmark module once, at tiny sizes; the two marked slow (the
  sharded tables at 150,000 items, the table-held benchmark again from
  shard files) run with `-m slow`.

Timings are not asserted: speed is measured by the suite itself, never in tests.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALL_METHODS = {"static", "static_mask", "unconstrained", "host_trie", "exact_bsearch",
               "approx_bsearch", "hash_bitmap"}
SWEEP_METHODS = {"static", "unconstrained"}  # re-timed across the cells of a sweep
GPU_ITEMS = 2 * 10 ** 7


def _run(module: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_check_mode_passes_every_baseline_check():
    out = _run("tools.bench", "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("ok ") for line in lines), out.stdout
    text = out.stdout
    assert text.count("exact baselines == beam_search") == 4
    for name in ("non-exact baselines differ", "hash bitmap false-positive rate vs brute force",
                 "baselines reject bad sets", "zipf sets deterministic and skewed",
                 "targets report misses"):
        assert f"ok    {name}:" in text, name


def test_suite_runs_end_to_end_on_tiny_sizes(tmp_path):
    out = tmp_path / "bench"
    # Three distinct sets (cells shared between sweeps are measured once).
    run = _run("tools.bench", "--quick", "--out", out, "--no-plots", "--length", 3, "--beams", 6,
               "--tokens-per-beam", 2, "--repeats", 2, "--items", 400, "--items-vocab", 32,
               "--baseline-min-items", 400, "--vocabs", 8, 32, "--vocab-items", 400,
               "--skew-items", 400, "--branches", 8, "--branch-items", 400)
    assert run.returncode == 0, run.stderr
    with open(out / "results.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert "sweep_kernel_ms" in reader.fieldnames and len(reader.fieldnames) == 39
    cells = {(r["sweep"], r["dataset"], int(r["items"]), int(r["vocab"])) for r in rows}
    assert cells == {("items", "uniform", 400, 32), ("vocab", "uniform", 400, 8),
                     ("vocab", "uniform", 400, 32), ("skew", "uniform", 400, 32),
                     ("skew", "zipf", 400, 32), ("branch", "uniform", 400, 8)}
    at_400 = {r["method"]: r for r in rows if r["sweep"] == "items" and r["items"] == "400"}
    assert set(at_400) == ALL_METHODS
    for name in ("static_mask", "host_trie", "exact_bsearch"):
        assert at_400[name]["same_as_static"] == "True", name
    assert 0.0 <= float(at_400["hash_bitmap"]["fpr"]) < 0.2
    for r in rows:
        assert float(r["step_ms"]) > 0 and math.isfinite(float(r["step_ms"]))
        assert len(r["step_ms_by_t"].split()) == 3
    static = [r for r in rows if r["method"] == "static"]
    assert all(int(r["index_bytes"]) > 0 and float(r["u_max_bytes"]) > 0 for r in static)
    assert all(float(r["sweep_step_ms"]) > 0 for r in rows
               if r["sweep"] in ("vocab", "skew") and r["method"] in SWEEP_METHODS)
    report = (out / "results.md").read_text()
    assert "Machine:" in report and "## Targets" in report and "### Sweep: branch" in report
    assert "Command: `python -m tools.bench --quick --out" in report
    targets = report.split("## Targets", 1)[1].split("## Results", 1)[0]
    assert "| target | measured | met |" in targets
    assert "| exact baselines decode static's sequences | 3 of 3 (method, cell) pairs identical " \
           "| yes |" in targets
    assert "constraint cost flat in V from 8 to 32" in targets
    assert "skewed set within 1.5x of uniform per step at |C|=4e+02" in targets
    assert "[bench] wrote" in run.stderr


def test_build_benchmark_runs_each_size_in_a_child(tmp_path):
    table = tmp_path / "out" / "build.md"
    run = _run("tools.bench.build", "--items", 200, 300, "--length", 3, "--vocab-size", 8,
               "--out", table)
    assert run.returncode == 0, run.stderr
    text = table.read_text()
    assert text == run.stdout.rstrip("\n") + "\n" or text in run.stdout
    assert "| 2e+02 |" in text and "| 3e+02 |" in text and "Per layer at 3e+02 items:" in text
    assert run.stderr.count("bytes/item") == 2


def test_partitioned_build_benchmark_compares_equal_tries(tmp_path):
    run = _run("tools.bench.partitioned", "--items", 3000, "--shards", 3, "--partitions", 4,
               "--length", 3, "--vocab", 16, "--compile")
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| monolithic", "| partitioned", "| partitioned, 2 workers",
        "| compile_constraints(Shards), 2 workers"]
    assert [r.rstrip(" |").rsplit(" | ", 1)[-1] for r in rows] == ["yes", "yes", "yes",
                                                                    "(a compile)"]


@pytest.mark.slow  # 150,000 items, so that tables pass the split threshold: a scale run
def test_sharded_tables_benchmark_splits_and_matches(tmp_path):
    run = _run("tools.bench.sharded", "--items", 150_000, "--length", 4, "--vocab", 64,
               "--repeats", 1, "--min-bytes", 1024)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if "split over" in line]
    assert len(rows) == 8 and all(r.endswith("| yes |") for r in rows), run.stdout
    ratio = [float(r.split(" | ")[2].rstrip("x")) for r in rows]  # bytes per device / replicated
    # no capacity: split tables padded to divide; small ones (<= 65536 entries) stay whole
    assert ratio[0] == 1.0 and ratio[3] < ratio[0] / 3, ratio
    assert ratio[7] < ratio[4] / 3, ratio  # capacity 1.25


def test_long_lived_benchmark_reports_maps_and_rss():
    run = _run("tools.bench.long_lived", "--sets", 4, "--every", 2, "--bound", 2,
               "--artifacts", 2, "--rounds", 1)
    assert run.returncode == 0, run.stderr
    rows = [line.split(" | ")[0] for line in run.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["| process", "| library, bound 2", "| library, bound 2", "| serving loader"]


def test_gpu_configuration_plan():
    run = _run("tools.bench", "--gpu", "--dry-run")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        f"items\tuniform |C|={GPU_ITEMS:.0e} V=2048 L=8\tstatic unconstrained host_trie exact_bsearch"]
    run = _run("tools.bench", "--gpu", "--quick")
    assert run.returncode == 2 and "--gpu runs its own configuration" in run.stderr


@pytest.mark.parametrize("bad", [["--items", "0"], ["--items", "1.5"], ["--sweeps", "nope"]])
def test_command_line_rejects_bad_values(bad):
    run = _run("tools.bench", *bad, "--dry-run")
    assert run.returncode == 2 and bad[-1] in run.stderr


def test_first_call_benchmark_measures_in_fresh_processes():
    """`python -m tools.bench.first_call` on the time-zone set: a table row
    with every measurement, from this checkout's library."""
    done = _run("tools.bench.first_call", "--sets", "timezones", "--repeats", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("library: ") and lines[0].endswith("static_compiler/__init__.py")
    header = [cell.strip() for cell in lines[1].strip("|").split("|")]
    row = dict(zip(header, (cell.strip() for cell in lines[-1].strip("|").split("|"))))
    assert (row["set"], row["steps"]) == ("timezones", "33")
    assert all(float(row[k]) > 0 for k in ("first_call_s", "steady_call_ms",
                                           "artifact_first_step_s"))
    assert row["first_call_cached_s"] == row["artifact_first_step_cached_s"] == "-"  # no --cache


def test_live_subset_benchmark_runs_and_compiles_nothing_new():
    """`python -m tools.bench.live` at tiny size: exits 0 only when new
    subsets of the set compiled no new program; prints its tables."""
    out = _run("tools.bench.live", "--items", "1000", "--length", "4", "--vocab", "16",
               "--repeats", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| new XLA compilations for 3 new subsets | 0 | 0 |" in out.stdout
    assert "| 3 per-row subsets, B=3 |" in out.stdout


def test_decode_loops_benchmark_times_both_searches():
    """`python -m tools.bench.decode_loops`: the looped and the inline beam
    search each timed beside the harness decodes; the last line is JSON."""
    # L=4, V=16: steps 0 and 1 run inline, steps 2-3 as one loop (both kinds of segment)
    out = _run("tools.bench.decode_loops", "--items", 1000, "--vocab", 16, "--length", 4,
               "--rounds", 1, "--calls", 2)
    assert out.returncode == 0, out.stdout + out.stderr
    cell = json.loads(out.stdout.splitlines()[-1])["cells"]["1e+03"]
    assert set(cell["first_call_s"]) == {"loops", "inline"}
    assert all(cell[f"{k}_ms"] > 0 for k in ("loops", "inline", "static_mask", "unconstrained"))


def test_compile_time_benchmark_writes_and_compares_a_baseline(tmp_path):
    """`python -m tools.bench compile-time`: per-stage medians of fresh
    builds, written as a baseline only when asked, then compared with it."""
    baseline = tmp_path / "baseline.json"
    args = ("tools.bench", "compile-time", "--items", "2000", "--repeats", "1",
            "--baseline", baseline)
    first = _run(*args, "--write-baseline")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "No baseline" in first.stdout and baseline.exists()
    stages = json.loads(baseline.read_text())["items"]["2000"]["stages"]
    assert {"frontend", "verify", "choose-layout", "lower"} <= set(stages)
    again = _run(*args, "--check")
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert "| frontend |" in again.stdout and "REGRESSED" not in again.stdout
    assert json.loads(baseline.read_text())["items"]["2000"]["stages"] == stages  # unchanged


def test_compile_time_comparison_flags_only_real_regressions(tmp_path):
    """A saved run compared with a baseline (`--run`, no measuring): a stage
    twice as slow is flagged and fails --check; one under the noise floor or
    unchanged is not; another machine's baseline is called indicative."""
    saved, baseline = tmp_path / "run.json", tmp_path / "baseline.json"
    saved.write_text(json.dumps({"10": {"total": 3.0, "repeats": 3, "library": "x", "stages": {
        "frontend": 2.0, "verify": 0.04, "lower": 0.9}}}))
    baseline.write_text(json.dumps({"machine": {"cpu": "elsewhere", "cores": 64}, "items": {"10": {
        "total": 2.0, "stages": {"frontend": 1.0, "verify": 0.001, "lower": 0.9}}}}))
    args = ("tools.bench", "compile-time", "--run", saved, "--baseline", baseline)
    shown = _run(*args)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "indicative only" in shown.stdout
    assert "| frontend | 2.000 | 1.000 | 2.00 REGRESSED |" in shown.stdout
    assert "| verify | 0.040 | 0.001 | 40.00 |" in shown.stdout  # below the noise floor
    assert "| lower | 0.900 | 0.900 | 1.00 |" in shown.stdout
    assert shown.stdout.split("REGRESSED:")[1].split() == [
        "1e+01", "frontend:", "2.000", "s", "vs", "1.000", "s", "(2.00x)",
        "1e+01", "total:", "3.000", "s", "vs", "2.000", "s", "(1.50x)"]
    assert _run(*args, "--check").returncode == 1

def test_table_held_benchmark_runs_every_operation_without_the_ir():
    run = _run("tools.bench.table_held", "--items", 3000, "--length", 4, "--vocab", 64,
               "--partitions", 2)
    assert run.returncode == 0, run.stderr[-3000:]
    table, loop = run.stdout.split("\nthe serving loop: page cache warm for the tables")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "|---" not in line]
    names = [r.split(" | ")[0].lstrip("| ") for r in rows[1:]]
    assert names == ["load + IR", "load", "subset", "serving subset", "show-ir --stats", "remove",
                     "add", "verify", "serving loop", "serving loop, ranked"], run.stdout
    # the loops' stages, each timed, and their sum end to end (subset(), then ranked_subset())
    header, _, *values = [line for line in loop.splitlines() if line.startswith("|")]
    assert header.startswith("| subsets | load | masks | first subset | second subset | "
                             "first decode |")
    assert [v.split(" | ")[0] for v in values] == ["| `subset()` of masks",
                                                  "| `ranked_subset()` of masks"]
    for line in values:
        seconds = [float(v) for v in line.strip("| ").split(" | ")[1:]]
        assert len(seconds) == 7 and min(seconds) >= 0
        assert abs(sum(seconds[:5]) - seconds[5]) < 0.02 and seconds[6] <= seconds[5]


def test_table_held_serving_loop_over_filters_checks_each_against_numpy():
    """A set in trie order with the filters' columns: the loop over
    `ranked_subset(where=)` (each subset's size checked against numpy's
    evaluation of its filter in the child: a mismatch fails the run)."""
    args = ("tools.bench.table_held", "--items", 3000, "--length", 4, "--vocab", 64,
            "--partitions", 2)
    run = _run(*args, "--in-trie-order", "--attributes", "--modes",
               "serving-loop-where,serving-loop-ranked")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| `ranked_subset(where=)` | " in run.stdout
    assert "| `ranked_subset()` of masks | " in run.stdout
    refused = _run(*args, "--modes", "serving-loop-where")
    assert refused.returncode == 2 and "needs --attributes" in refused.stderr


@pytest.mark.slow  # the same benchmark as above, three more runs from files on disk
def test_table_held_benchmark_builds_from_shard_files_and_reuses_the_artifact(tmp_path):
    """The 1e9 way: shards on disk, a kept artifact, then the operations
    picked on it again (an earlier removal counts as already removed)."""
    args = ("tools.bench.table_held", "--items", 3000, "--length", 4, "--vocab", 64,
            "--partitions", 2, "--shards", 3, "--capacity", 0, "--workdir", tmp_path)
    run = _run(*args, "--keep", "--modes", "load,subset,remove")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "set.static").is_dir() and (tmp_path / "shards").is_dir()
    again = _run(*args, "--artifact", tmp_path / "set.static", "--modes",
                 "serving-subset,verify,remove")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "| serving subset |" in again.stdout and "| verify |" in again.stdout
    assert _run(*args, "--modes", "load,nope").returncode == 2


def test_row_order_bench_checks_the_scatter_and_the_packing():
    """`python -m tools.bench.row_order`: a row mask's item bits by the rows'
    order, each output checked (a mismatch exits 1)."""
    run = _run("tools.bench.row_order", "--items", "5000", "--repeats", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "--" not in line]
    assert len(rows) == 9 and all(r.endswith("| same |") for r in rows[1:]), run.stdout


def test_rules_benchmark_times_the_filter_against_numpy():
    """`python -m tools.bench rules`: the filter, a subset from its mask and
    subset(where=) on a compiled set, then the filter over memory-mapped
    columns alone; both checked against numpy's evaluation; and the beam
    schedules against the fixed width (a schedule of 70 at every step keeps
    the fixed width's beams)."""
    outputs = []
    for extra in (("--schedule-items", "2000"), ("--rows-only",)):
        run = _run("tools.bench", "rules", "--items", "3000", "--repeats", "1", *extra)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "| same |" in run.stdout and "DIFFERENT" not in run.stdout
        outputs.append(run.stdout)
    assert "(PASS <= 50)" in outputs[0] and "memory-mapped" in outputs[1]
    assert "| fixed 70 (beam_size=70) | 1120 |" in outputs[0]
    assert "gives the fixed width's beams: yes" in outputs[0]
    assert "| table lookup (next to no model cost) |" in outputs[0]
    assert "making the prior on the host" in outputs[0]
    assert "beam schedules" not in outputs[1] and "item priors" not in outputs[1]


def test_rank_section_checks_every_count_against_the_liveness_bits():
    """`python -m tools.bench rules --section rank`: a subset as rank bits
    against packbits and today's subset, and per step the candidates'
    counts (numpy, jitted, torch) against the set's liveness bools."""
    run = _run("tools.bench.rank", "--items", "3000", "--repeats", "1", "--torch")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "DIFFERENT" not in run.stdout and "MISS" not in run.stdout
    lines = run.stdout.splitlines()
    steps = [line for line in lines if " x 32 |" in line and line.endswith("| same |")]
    assert len(steps) == 4 * 2  # L = 4 steps x two row counts
    wide = [line for line in lines if line.startswith("| 0 | 140 x ")]
    assert len(wide) == 1 and wide[0].endswith("| same |")  # the root's many children
    assert "`ranked_subset` from the ready item mask" in run.stdout
    names = _run("tools.bench.rank", "--names", "--items", "2000", "--repeats", "1")
    assert names.returncode == 0, names.stderr[-3000:]
    assert "DIFFERENT" not in names.stdout and names.stdout.count("| same |") >= 3


def test_torch_step_section_checks_every_rank_read_against_todays_bits():
    """`python -m tools.bench.rank --section torch-step`: per step the torch
    rank read (`torch_backend.rank_kernels`) against today's bit read, each
    answer checked, the hybrid's cut and its subset costs printed."""
    run = _run("tools.bench.rank", "--section", "torch-step", "--items", "3000", "--repeats",
               "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "DIFFERENT" not in run.stdout
    steps = [line for line in run.stdout.splitlines()
             if line.startswith("| ") and line.endswith("| same |")]
    assert len(steps) == 4 * 2  # L = 4 steps x two batch sizes
    assert "the hybrid: bits at the steps into depths 1.." in run.stdout
    assert "16 per-row subsets, all of it" in run.stdout and "- B = 140:" in run.stdout


def test_torch_door_section_checks_ranked_subsets_against_todays():
    """`python -m tools.bench.rank --section torch-door`: ranked subsets
    made through the torch door and decoded by its beam search, against
    today's subsets, every result checked equal."""
    run = _run("tools.bench.rank", "--section", "torch-door", "--items", "3000", "--repeats",
               "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "DIFFERENT" not in run.stdout
    lines = run.stdout.splitlines()
    assert sum(line.startswith(("| sorted", "| random order")) and "| same |" in line
               for line in lines) == 4  # a subset from a mask, and from a filter
    assert "`ranked_subset(where=...)` of a 2-clause rule" in run.stdout
    assert sum(line.startswith(("| random logits |", "| zeros |")) and "| same |" in line
               for line in lines) == 2


def test_jax_door_section_checks_ranked_beam_steps_against_todays():
    """`python -m tools.bench.rank --section jax-door`: the JAX door's beam
    step over ranked per-row subsets against today's and none, every state
    checked equal."""
    run = _run("tools.bench.rank", "--section", "jax-door", "--items", "3000", "--repeats", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "DIFFERENT" not in run.stdout and "3 per-row subsets made: ranked" in run.stdout
    lines = run.stdout.splitlines()
    assert sum(line.startswith(("| random logits |", "| zeros |")) and "| same |" in line
               for line in lines) == 2
    per_step = [line for line in lines if line.startswith(("| random logits | ", "| zeros | "))
                and line.split("|")[2].strip() in ("no subset", "ranked")]
    assert len(per_step) == 4 and all(line.count("|") == 4 + 5 for line in per_step), per_step


def test_versions_benchmark_measures_kept_versions_on_disk():
    """`python -m tools.bench versions`: the artifact plus its kept versions
    after removals and additions, with the default keep and keep 1 (fewer
    kept versions take less disk)."""
    run = _run("tools.bench", "versions", "--items", "2000", "--updates", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[3:]
            for line in run.stdout.splitlines() if line.startswith("| 3 ")}
    assert sorted(rows) == [("3 additions", "1"), ("3 additions", "5"), ("3 removals", "1"),
                            ("3 removals", "5")]
    ratio = {key: float(cells[-2].strip().rstrip("x")) for key, cells in rows.items()}
    kept = {key: int(cells[0]) for key, cells in rows.items()}
    assert kept[("3 removals", "5")] == 3 and kept[("3 additions", "1")] == 1
    for kind in ("3 removals", "3 additions"):
        assert 1.0 < ratio[(kind, "1")] < ratio[(kind, "5")]
    assert ratio[("3 removals", "5")] < ratio[("3 additions", "5")]  # removals link more


def test_processor_step_bench_checks_the_host_loops_against_the_torch_ops():
    """`python -m tools.bench.processor_step` on a tiny set: every step's
    states and masks are compared (it exits 1 on a difference) and timed."""
    pytest.importorskip("numba")
    out = _run("tools.bench.processor_step", "--items", 300, "--length", 3, "--vocab", 16,
               "--repeats", 2, "--calls", 2, "--rows", 5)
    assert out.returncode == 0, out.stderr[-2000:]
    for form in ("none", "subset", "ranked"):  # (every form by default)
        assert f"| 1 | {form} | dense_rows->dense_rows |" in out.stdout
    assert "| 2 | ranked |" in out.stdout


def test_request_filters_bench_compares_the_two_forms_step_by_step():
    """`python -m tools.bench.request_filters` at a tiny size: every form's
    row printed, every step's allowed tokens of the ranked subset equal to
    the Subset's (it exits 1 otherwise)."""
    out = _run("tools.bench.request_filters", "--sizes", 2000, "--length", 3, "--requests", 2)
    assert out.returncode == 0, out.stderr[-2000:]
    for form in ("none", "subset", "ranked"):
        assert f"| 2e+03 | {form} |" in out.stdout
    assert "ranked = subset() at every step: yes" in out.stdout
