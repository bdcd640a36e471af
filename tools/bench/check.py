"""`python -m tools.bench --check`: the baselines checked against the library.

The timings of a run mean something only if the methods agree on what they
decode, so this mode checks, on small sets, that

* the exact baselines (host_trie, exact_bsearch, approx_bsearch searching
  every token, and static_mask) decode exactly the tokens, validity and
  scores that `static_compiler.beam_search` decodes, and only members;
* the non-exact ones really differ (unconstrained leaves the set, the
  approximate search loses beams the exact one keeps);
* the hash bitmap has no false negatives and its false-positive estimate
  matches a brute-force count;
* the baselines reject ragged and out-of-range sets, Zipf sets are
  deterministic and skewed, and the targets report misses.

Prints one line per check ("ok" or "FAIL" with the reason) and returns 1
when any fails.
"""

from __future__ import annotations

import numpy as np

import static_compiler as sc
from static_compiler.errors import ConstraintSetError
from tools.bench import baselines as bl
from tools.bench.cli import run_checks
from tools.bench.config import GPU_ITEMS, PAPER_TPU_ADDED_MS, zipf_sids
from tools.bench.runners import StaticMask
from tools.bench.targets import evaluate_targets


class CheckFailed(AssertionError):
    pass


def _expect(cond, message: str):
    if not cond:
        raise CheckFailed(message)


def _small_set(n, vocab, length, seed):
    return np.random.default_rng(seed).integers(0, vocab, size=(n, length))


EXACT_CASES = (
    # (n, vocab, length, beams, tokens_per_beam)
    (300, 16, 4, 7, 3),      # pruning binds
    (40, 6, 3, 20, None),    # more beams than some prefixes have items
    (3, 4, 2, 9, 2),         # fewer sequences than beams: invalid beams
    (500, 2, 6, 70, 30),     # branch factor 2: 64 sequences for 70 beams
)


def check_exact_baselines(n, vocab, length, beams, tokens_per_beam):
    """The exact methods decode what static_compiler.beam_search decodes."""
    sequences = _small_set(n, vocab, length, seed=n)
    compiled = sc.compile_constraints(sequences, vocab_size=vocab)
    model = bl.TableModel(vocab)
    want = sc.beam_search(compiled, bl.TableModel.logits_fn, batch_size=2, beam_size=beams,
                          tokens_per_beam=tokens_per_beam, carry_axes=None, carry=model.table)
    sorted_set = bl.SortedSet(sequences, vocab)
    methods = [bl.HostTrie(sorted_set), bl.ExactBinarySearch(sorted_set),
               bl.ApproxBinarySearch(sorted_set, top_n=vocab),  # every token searched: exact
               StaticMask(compiled)]
    for method in methods:
        tokens, scores, valid = (np.asarray(x) for x in bl.masked_beam_search(
            method, method.tables, model.table, batch_size=2, beam_size=beams, length=length,
            tokens_per_beam=tokens_per_beam))
        _expect(np.array_equal(valid, np.asarray(want.valid)), f"{method.name}: valid differs")
        _expect(np.array_equal(tokens, np.asarray(want.tokens)), f"{method.name}: tokens differ")
        _expect(np.allclose(scores, np.asarray(want.scores), rtol=1e-5, atol=0),
                f"{method.name}: scores differ")
    members = {tuple(row) for row in sequences.tolist()}
    decoded = np.asarray(want.tokens)[np.asarray(want.valid)]
    _expect(all(tuple(row) in members for row in decoded.tolist()),
            "beam_search decoded a sequence outside the set")
    return f"{len(methods)} methods identical over {int(np.asarray(want.valid).sum())} valid beams"


def check_inexact_baselines_differ():
    """On a sparse set the unconstrained search leaves the set, and the
    approximate search (top 2 of 64 tokens) loses beams the exact one keeps."""
    sequences = _small_set(50, 64, 3, seed=1)
    sorted_set = bl.SortedSet(sequences, 64)
    model = bl.TableModel(64)
    members = {tuple(row) for row in sequences.tolist()}
    run = lambda m: [np.asarray(x) for x in bl.masked_beam_search(  # noqa: E731
        m, m.tables, model.table, batch_size=2, beam_size=8, length=3, tokens_per_beam=None)]
    tokens, _, valid = run(bl.Unconstrained())
    _expect(any(tuple(row) not in members for row in tokens[valid].tolist()),
            "unconstrained decoded only members")
    _, _, approx_valid = run(bl.ApproxBinarySearch(sorted_set, top_n=2))
    _, _, exact_valid = run(bl.ExactBinarySearch(sorted_set))
    _expect(approx_valid.sum() < exact_valid.sum(),
            f"approx kept {approx_valid.sum()} beams, exact {exact_valid.sum()}")
    return f"approx keeps {approx_valid.sum()} of exact's {exact_valid.sum()} beams"


def check_bitmap_false_positive_rate():
    """Every (prefix, token) of a small set looked up by hand: no false
    negatives, and false_positive_rate() near the brute-force rate."""
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
                _expect(allowed[v] == truth, f"host trie wrong at {prefix + (v,)}")
                hit = bitmap._lookup(bitmap._words, bl._mix(h, np.uint32(v), np), np,
                                     lambda a, i: a[i])
                _expect(hit or not truth, f"bitmap false negative at {prefix + (v,)}")
                false_pos += int(hit and not truth)
                negatives += int(not truth)
    # false_positive_rate samples rows with replacement: compare on many samples.
    estimate = bitmap.false_positive_rate(sorted_set, samples=20000)
    brute = false_pos / max(1, negatives)
    _expect(false_pos > 0, "no false positive at 2 bits per prefix: the check is too weak")
    _expect(abs(estimate - brute) < 0.5 * brute, f"estimate {estimate:.4f} vs brute force {brute:.4f}")
    return f"estimate {estimate:.4f}, brute force {brute:.4f}"


def _raises(fn, exc, text: str) -> bool:
    try:
        fn()
    except exc as e:
        return text in str(e)
    return False


def check_baselines_reject_bad_sets():
    _expect(_raises(lambda: bl.SortedSet([[1, 2], [1, 2, 3]], 8), ConstraintSetError,
                    "fixed-length"), "a ragged set was accepted")
    _expect(_raises(lambda: bl.SortedSet(np.array([[1, 9]]), 8), ConstraintSetError, "[0, 8)"),
            "an out-of-range token was accepted")
    _expect(_raises(lambda: bl.TableModel(0), ValueError, "vocab_size=0"),
            "a model with V = 0 was accepted")
    return "ragged, out-of-range and empty-vocabulary inputs rejected"


def check_zipf_sets():
    a = zipf_sids(20000, 3, 64, seed=5)
    _expect(np.array_equal(a, zipf_sids(20000, 3, 64, seed=5)), "not deterministic")
    _expect(a.dtype == np.int32 and a.min() >= 0 and a.max() < 64, "dtype or range")
    counts = np.bincount(a[:, 0], minlength=64)
    _expect(counts[0] == counts.max() and counts[0] > 4 * counts[32], "not skewed to token 0")
    _expect(_raises(lambda: zipf_sids(0, 3, 64), ValueError, "num_items=0"), "empty set accepted")
    return f"token 0: {counts[0]}, token 32: {counts[32]} of 20000"


def _row(**kw):
    base = dict(sweep="items", dataset="uniform", items=100, unique_items=100, vocab=8,
                method="static", exact=True, step_ms=1.0, decode_ms=8.0, kernel_ms=0.1,
                added_ms=-0.5, same_as_static="", index_bytes=10, u_max_bytes=20,
                build_s=1.0, build_peak_bytes=5)
    base.update(kw)
    return base


def check_targets_report_misses():
    """Rows that miss targets are reported as missed; the GPU target only off CPU."""
    rows = [_row(items=100, step_ms=1.0), _row(items=100, method="unconstrained", decode_ms=4.0),
            _row(items=1000, step_ms=2.0), _row(items=1000, method="unconstrained", decode_ms=9.0),
            _row(items=1000, method="host_trie", exact=True, kernel_ms=0.5, added_ms=0.3,
                 same_as_static=False)]
    met = {name.split(":")[0]: ok for name, _, ok in evaluate_targets(rows, backend="cpu")}
    for name in ("constrained decode <= unconstrained decode at every |C| and V",
                 "per-step time flat in |C|",  # 2.0 / 1.0 > 1.3
                 ">= 100x faster per step than host_trie at |C|=1e+03",  # 5x
                 "exact baselines decode static's sequences"):
        _expect(met.get(name) is False, f"{name!r}: {met.get(name)}, expected a miss")
    gpu = [_row(items=GPU_ITEMS, added_ms=0.05, step_ms=0.4)]
    name = (f"added time per step <= {PAPER_TPU_ADDED_MS} ms at |C|={GPU_ITEMS:.0e} on gpu "
            "(paper: TPU v6e)")
    _expect(name not in {t[0] for t in evaluate_targets(gpu, backend="cpu")},
            "a CPU run reports the GPU target")
    _expect((name, "+0.0500 ms (step 0.4000 ms)", False) in evaluate_targets(gpu, backend="gpu"),
            "the GPU target is not reported as missed")
    return "4 misses and the GPU target reported"


def all_checks() -> list:
    """[(name, thunk)] in run order."""
    checks = [(f"exact baselines == beam_search (N={c[0]}, V={c[1]}, L={c[2]}, beams={c[3]}, "
               f"tokens_per_beam={c[4]})", lambda c=c: check_exact_baselines(*c))
              for c in EXACT_CASES]
    return checks + [
        ("non-exact baselines differ", check_inexact_baselines_differ),
        ("hash bitmap false-positive rate vs brute force", check_bitmap_false_positive_rate),
        ("baselines reject bad sets", check_baselines_reject_bad_sets),
        ("zipf sets deterministic and skewed", check_zipf_sets),
        ("targets report misses", check_targets_report_misses),
    ]


def main() -> int:
    return run_checks(all_checks(), "[bench] check")
