"""Smoke test of examples/timezones.py at CI size, and the real check: the
library's constrained beams over a trained Flax model with a flattened KV
cache are exactly the catalogue items ranked by a brute-force score of each
item's full sequence (one forward pass per item, no cache)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("flax", reason="needs the examples extra: pip install -e '.[examples]'")

from helpers import REPO as ROOT

EXAMPLE = ROOT / "examples" / "timezones.py"

# Variable lengths, and names that are prefixes of others ("GB" / "GB-Eire",
# "GMT" / "GMT+0", "Etc/GMT+1" / "Etc/GMT+10"): ending is a scored token.
NAMES = ["Etc/GMT+1", "Etc/GMT+10", "Etc/GMT+11", "GB", "GB-Eire", "GMT", "GMT+0",
         "Europe/Paris", "Europe/Prague", "Asia/Tokyo", "America/Argentina/Buenos_Aires"]


def load_example():
    name = "timezones_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module          # dataclasses look their module up while executing it
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_tiny_run_prints_the_recall_table():
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--tiny", "--seconds", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for label in ("unconstrained (lax.scan)", "constrained: catalogue", "constrained: held-out"):
        row = re.search(rf"^{re.escape(label)}\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
        assert row, f"no recall row {label!r} in:\n{out}"
        r1, r10 = map(float, row.groups())
        assert 0.0 <= r1 <= r10 <= 1.0
    assert "not in the catalogue" in out
    assert re.search(r"first call [0-9.]+x .* steady call [0-9.]+x", out), out


def test_constrained_beams_are_the_items_ranked_by_brute_force():
    ex = load_example()
    retriever, _, _ = ex.build(tiny=True, seconds=1.0, log=lambda *a: None)
    compiled = retriever.compile(NAMES)
    queries = ["Europe/Paris", "Asia/Tokyo"]           # the prompts of two rows
    # beam_size >= number of items and no tokens_per_beam cap: every item
    # survives every step, so the beams are the whole set, ranked.
    result = retriever.constrained(compiled, queries, beam_size=len(NAMES) + 1)
    brute = ex.sequence_scores(retriever.model, retriever.vocab, NAMES, queries)

    texts = compiled.texts(result)
    scores = np.asarray(result.scores)
    valid = np.asarray(result.valid)
    for row in range(len(queries)):
        assert valid[row, :len(NAMES)].all() and not valid[row, len(NAMES):].any()
        got = texts[row][:len(NAMES)]
        assert sorted(got) == sorted(NAMES)
        by_name = dict(zip(NAMES, brute[row]))
        # Each beam's score is its item's brute-force score ...
        np.testing.assert_allclose(scores[row, :len(NAMES)], [by_name[n] for n in got],
                                   atol=1e-4, rtol=0)
        # ... and the beams are in brute-force order (ties aside: equal ranks
        # hold scores within 1e-4).
        np.testing.assert_allclose([by_name[n] for n in got], np.sort(brute[row])[::-1],
                                   atol=1e-4, rtol=0)
        assert len({round(s, 3) for s in brute[row]}) > len(NAMES) // 2, "scores barely differ"
