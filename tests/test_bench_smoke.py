"""The benchmark suite on tiny sizes, and its baselines against the library.

Runs `tools/bench.py` end to end (every sweep, every method, tiny sets) and
checks what it writes; checks that the exact baselines decode exactly the
sequences `static_compiler.beam_search` decodes; checks the hash bitmap's
false-positive estimate against brute force. Timings are not asserted: speed
is measured by the suite itself, never in tests.
"""

from __future__ import annotations

import csv
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import static_compiler as sc  # noqa: E402
from tools import baselines as bl  # noqa: E402
from tools import bench  # noqa: E402


def _small_set(n, vocab, length, seed):
    return np.random.default_rng(seed).integers(0, vocab, size=(n, length))


@pytest.mark.parametrize("n, vocab, length, beams, tokens_per_beam", [
    (300, 16, 4, 7, 3),      # pruning binds
    (40, 6, 3, 20, None),    # more beams than some prefixes have items
    (3, 4, 2, 9, 2),         # fewer sequences than beams: invalid beams
    (500, 2, 6, 70, 30),     # branch factor 2: 64 sequences for 70 beams
])
def test_exact_baselines_decode_the_same_sequences(n, vocab, length, beams, tokens_per_beam):
    sequences = _small_set(n, vocab, length, seed=n)
    compiled = sc.compile_constraints(sequences, vocab_size=vocab)
    model = bl.TableModel(vocab)
    want = sc.beam_search(compiled, bl.TableModel.logits_fn, batch_size=2, beam_size=beams,
                          tokens_per_beam=tokens_per_beam, carry=model.table)
    sorted_set = bl.SortedSet(sequences, vocab)
    methods = [bl.HostTrie(sorted_set), bl.ExactBinarySearch(sorted_set),
               bl.ApproxBinarySearch(sorted_set, top_n=vocab),  # every token searched: exact
               bench.StaticMask(compiled)]
    for method in methods:
        tokens, scores, valid = bl.masked_beam_search(
            method, method.tables, model.table, batch_size=2, beam_size=beams, length=length,
            tokens_per_beam=tokens_per_beam)
        np.testing.assert_array_equal(np.asarray(valid), np.asarray(want.valid), method.name)
        np.testing.assert_array_equal(np.asarray(tokens), np.asarray(want.tokens), method.name)
        np.testing.assert_allclose(np.asarray(scores), np.asarray(want.scores), rtol=1e-5,
                                   err_msg=method.name)
    members = {tuple(row) for row in sequences.tolist()}
    decoded = np.asarray(want.tokens)[np.asarray(want.valid)]
    assert all(tuple(row) in members for row in decoded.tolist())


def test_unconstrained_and_approx_baselines_can_leave_the_set():
    """The non-exact methods really are different: on a sparse set the
    unconstrained search decodes sequences outside it, and the approximate
    search (top 2 of 64 tokens) loses beams the exact one keeps."""
    sequences = _small_set(50, 64, 3, seed=1)
    sorted_set = bl.SortedSet(sequences, 64)
    model = bl.TableModel(64)
    members = {tuple(row) for row in sequences.tolist()}
    run = lambda m: [np.asarray(x) for x in bl.masked_beam_search(
        m, m.tables, model.table, batch_size=2, beam_size=8, length=3, tokens_per_beam=None)]
    tokens, _, valid = run(bl.Unconstrained())
    assert any(tuple(row) not in members for row in tokens[valid].tolist())
    _, _, approx_valid = run(bl.ApproxBinarySearch(sorted_set, top_n=2))
    _, _, exact_valid = run(bl.ExactBinarySearch(sorted_set))
    assert approx_valid.sum() < exact_valid.sum()


def test_hash_bitmap_false_positive_rate_matches_brute_force():
    sequences = _small_set(200, 8, 3, seed=3)
    sorted_set = bl.SortedSet(sequences, 8)
    bitmap = bl.HashBitmap(sorted_set, bits_per_prefix=2)  # small: collisions happen
    prefixes = {tuple(row[:t]) for row in sequences.tolist() for t in range(4)}
    rows = np.arange(sorted_set.num_items)
    states = sorted_set.states_of_rows(rows)
    trie = bl.HostTrie(sorted_set)
    false_pos = negatives = 0
    for t in range(3):
        seen = set()
        for r in rows:
            prefix = tuple(sorted_set.tokens[r, :t].tolist())
            if prefix in seen:
                continue
            seen.add(prefix)
            h = np.uint32(bl._HASH_SEED)
            for tok in prefix:
                h = bl._mix(h, np.uint32(tok), np)
            allowed = trie.children(np.array([states[t][r]]), t)[0] >= 0
            for v in range(8):
                truth = prefix + (v,) in prefixes
                assert allowed[v] == truth
                hit = bitmap._lookup(bitmap._words, bl._mix(h, np.uint32(v), np), np,
                                     lambda a, i: a[i])
                assert hit or not truth  # no false negatives
                false_pos += int(hit and not truth)
                negatives += int(not truth)
    # false_positive_rate samples rows with replacement: compare on many samples.
    estimate = bitmap.false_positive_rate(sorted_set, samples=20000)
    assert false_pos > 0
    assert abs(estimate - false_pos / negatives) < 0.5 * false_pos / negatives


def test_suite_runs_end_to_end_on_tiny_sizes(tmp_path):
    out = tmp_path / "bench"
    # Three distinct sets (cells shared between sweeps are measured once).
    args = ["--quick", "--out", str(out), "--no-plots", "--length", "3", "--beams", "6",
            "--tokens-per-beam", "2", "--repeats", "2", "--items", "400", "--items-vocab", "32",
            "--baseline-min-items", "400", "--vocabs", "8", "32", "--vocab-items", "400",
            "--skew-items", "400", "--branches", "8", "--branch-items", "400"]
    assert bench.main(args) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["sweep"], r["dataset"], int(r["items"]), int(r["vocab"])) for r in rows}
    assert cells == {("items", "uniform", 400, 32), ("vocab", "uniform", 400, 8),
                     ("vocab", "uniform", 400, 32), ("skew", "uniform", 400, 32),
                     ("skew", "zipf", 400, 32), ("branch", "uniform", 400, 8)}
    at_400 = {r["method"]: r for r in rows if r["sweep"] == "items" and r["items"] == "400"}
    assert set(at_400) == set(bench.ALL_METHODS)
    for name in ("static_mask", "host_trie", "exact_bsearch"):
        assert at_400[name]["same_as_static"] == "True", name
    assert 0.0 <= float(at_400["hash_bitmap"]["fpr"]) < 0.2
    for r in rows:
        assert float(r["step_ms"]) > 0 and math.isfinite(float(r["step_ms"]))
        assert len(r["step_ms_by_t"].split()) == 3
    static = [r for r in rows if r["method"] == "static"]
    assert all(int(r["index_bytes"]) > 0 and float(r["u_max_bytes"]) > 0 for r in static)
    assert all(float(r["sweep_step_ms"]) > 0 for r in rows
               if r["sweep"] in ("vocab", "skew") and r["method"] in bench.SWEEP_METHODS)
    report = (out / "results.md").read_text()
    assert "Machine:" in report and "## Targets" in report and "### Sweep: branch" in report
    assert "exact baselines decode static's sequences | 3 of 3" in report


def _row(**kw):
    base = dict(sweep="items", dataset="uniform", items=100, unique_items=100, vocab=8,
                method="static", exact=True, step_ms=1.0, decode_ms=8.0, kernel_ms=0.1,
                added_ms=-0.5, same_as_static="", index_bytes=10, u_max_bytes=20,
                build_s=1.0, build_peak_bytes=5)
    base.update(kw)
    return base


def test_targets_report_misses():
    rows = [_row(items=100, step_ms=1.0), _row(items=100, method="unconstrained", decode_ms=4.0),
            _row(items=1000, step_ms=2.0), _row(items=1000, method="unconstrained", decode_ms=9.0),
            _row(items=1000, method="host_trie", exact=True, kernel_ms=0.5, added_ms=0.3,
                 same_as_static=False)]
    met = {name.split(":")[0]: ok for name, _, ok in bench.evaluate_targets(rows)}
    assert met["constrained decode <= unconstrained decode at every |C| and V"] is False
    assert met["per-step time flat in |C|"] is False  # 2.0 / 1.0 > 1.3
    assert met[">= 100x faster per step than host_trie at |C|=1e+03"] is False  # 5x
    assert met["exact baselines decode static's sequences"] is False


def test_gpu_configuration_and_its_target(monkeypatch):
    args = bench.parse_args(["--gpu"])
    assert args.sweeps == ["items"] and args.items == [bench.GPU_ITEMS]
    assert args.methods == list(bench.GPU_METHODS) and args.baseline_max_items >= bench.GPU_ITEMS
    assert bench.plan_cells(args)[0][1].items == bench.GPU_ITEMS
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpu", "--quick"])
    rows = [_row(items=bench.GPU_ITEMS, added_ms=0.05, step_ms=0.4)]
    name = f"added time per step <= 0.033 ms at |C|={bench.GPU_ITEMS:.0e} on gpu (paper: TPU v6e)"
    assert name not in {t[0] for t in bench.evaluate_targets(rows)}  # a CPU run has no GPU target
    monkeypatch.setattr(bench.jax, "default_backend", lambda: "gpu")
    assert (name, "+0.0500 ms (step 0.4000 ms)", False) in bench.evaluate_targets(rows)


def test_zipf_sets_are_deterministic_and_skewed():
    a = bench.zipf_sids(20000, 3, 64, seed=5)
    assert np.array_equal(a, bench.zipf_sids(20000, 3, 64, seed=5))
    assert a.dtype == np.int32 and a.min() >= 0 and a.max() < 64
    counts = np.bincount(a[:, 0], minlength=64)
    assert counts[0] == counts.max() and counts[0] > 4 * counts[32]
    with pytest.raises(ValueError, match="num_items=0"):
        bench.zipf_sids(0, 3, 64)


@pytest.mark.parametrize("bad", [["--items", "0"], ["--items", "1.5"], ["--sweeps", "nope"]])
def test_command_line_rejects_bad_values(bad, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(bad)
    assert bad[-1] in capsys.readouterr().err


def test_baselines_reject_ragged_and_out_of_range_sets():
    with pytest.raises(sc.errors.ConstraintSetError, match="fixed-length"):
        bl.SortedSet([[1, 2], [1, 2, 3]], 8)
    with pytest.raises(sc.errors.ConstraintSetError, match=r"\[0, 8\)"):
        bl.SortedSet(np.array([[1, 9]]), 8)
    with pytest.raises(ValueError, match="vocab_size=0"):
        bl.TableModel(0)
