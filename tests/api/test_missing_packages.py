"""Where a package is missing, each in a fresh process
that blocks its import (``sys.modules[name] = None`` makes ``import name``
raise ModuleNotFoundError):

* without jax, the JAX decoders' names (`sc.BeamAxis`, `sc.greedy_decode`,
  ...) raise MissingDependencyError naming jax, how to install it and the
  torch backend, which decodes without it (the compiler needs no jax);
* without numba (and jax), the torch backend serves an artifact with
  removals and additions and makes its subsets: the bit kernels fall back
  to their numpy twins, which write the same bits as the compiled kernels
  (checked here on random inputs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import REPO, packed_words

import static_compiler as sc
from static_compiler.item_bits import bit_kernels
from static_compiler.item_bits.bit_kernels import NUMPY_KERNELS


def _run_without(packages, script: str) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter where importing any of `packages` fails."""
    block = "".join(f"sys.modules[{p!r}] = None\n" for p in packages)
    code = "import sys\n" + block + textwrap.dedent(script)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)


def test_decoders_without_jax_name_the_package():
    """The compiler runs without jax (tests/torch_backend/test_torch_without_jax.py);
    the JAX decoders' names raise naming the install and the torch backend."""
    out = _run_without(["jax"], """
        import static_compiler as sc
        from static_compiler.errors import MissingDependencyError
        compiled = sc.compile_constraints([[1, 2]], vocab_size=4)
        for call in (lambda: sc.BeamAxis, lambda: sc.max_programs,
                     lambda: sc.greedy_decode(compiled, None, batch_size=1)):
            try:
                call()
            except MissingDependencyError as err:
                assert isinstance(err, ImportError)
                print(err)
            else:
                raise AssertionError("no error")
        from static_compiler.errors import DecodeInputError
        from static_compiler.integrations.torch import StaticLogitsProcessor
        try:
            StaticLogitsProcessor("set.sc", 0)
        except DecodeInputError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4, out.stdout
    for line in lines[:3]:
        assert "needs the 'jax' package, which is not installed: pip install " \
               "'static-compiler[jax]'" in line, line
        assert "TorchConstraints" in line, line
    assert "static_compiler.BeamAxis (the JAX decoders)" in lines[0]
    assert "expected the CompiledConstraints" in lines[3] and "TorchConstraints" in lines[3]


def _sets(tmp_path):
    """An artifact that took additions and removals (saved), the compiled
    version it equals, and prefixes of each length t (the items', some
    removed, and random ones)."""
    rng = np.random.default_rng(5)
    rows = rng.integers(1, 12, (60, 3))
    pipeline = "verify,choose-layout{force=near_unary},reserve-capacity{growth=1.5},pack-dtypes"
    compiled = sc.compile_constraints(rows, 12, pipeline=pipeline, export_subsets=True)
    path = tmp_path / "set.sc"
    compiled.save(path)
    added = rng.integers(1, 12, (8, 3))
    removed = rows[::5]  # token sequences: the mask would be over the rows after the additions
    sc.update_artifact(path, add=added, remove=removed)
    version = compiled.update(add=added, remove=removed)
    items = np.concatenate([rows, added])
    prefixes = {t: np.unique(np.concatenate([items[:, :t], rng.integers(0, 12, (20, t))]), axis=0)
                for t in range(version.max_length)}
    return version, path, prefixes


def test_torch_backend_without_numba(tmp_path):
    """TorchConstraints.load of an artifact with removals and
    additions, its subsets and masks, with neither numba nor jax: the masks
    of the compiled set (JAX, numba) bit for bit."""
    version, path, prefixes = _sets(tmp_path)
    for t, pre in prefixes.items():
        np.save(tmp_path / f"pre{t}.npy", pre)
    n = version.items.num_items
    out = _run_without(["numba", "jax"], f"""
        import numpy as np, torch
        from static_compiler.item_bits import bit_kernels
        from static_compiler.torch_backend import TorchConstraints
        assert not bit_kernels.HAVE_NUMBA
        tc = TorchConstraints.load({str(path)!r})
        assert tc._set_view.base_subset() is not None  # the removals
        sub = tc.subset(np.arange({n}) % 3 != 1)
        for t in range({version.max_length}):
            pre = torch.from_numpy(np.load({str(tmp_path)!r} + f"/pre{{t}}.npy"))
            np.save({str(tmp_path)!r} + f"/got{{t}}.npy", tc.allowed(pre).numpy())
            np.save({str(tmp_path)!r} + f"/sub{{t}}.npy", tc.allowed(pre, subset=sub).numpy())
        bad = [m for m, mod in sys.modules.items()
               if m.split(".")[0] in ("jax", "numba") and mod is not None]
        assert not bad, bad
    """)
    assert out.returncode == 0, out.stderr
    sub = version.subset(np.arange(n) % 3 != 1)
    for t, pre in prefixes.items():
        assert np.array_equal(np.load(tmp_path / f"got{t}.npy"), np.asarray(version.allowed(pre)))
        assert np.array_equal(np.load(tmp_path / f"sub{t}.npy"),
                              np.asarray(version.allowed(pre, subset=sub)))


def _both(name: str, make_args, out_index: int) -> None:
    """Runs kernel `name` compiled and in numpy on copies of make_args():
    the written words (argument out_index) and the results are equal."""
    runs = []
    for kernel in (getattr(bit_kernels, name), NUMPY_KERNELS[name]):
        args = make_args()
        result = kernel(*args)
        runs.append((args[out_index], result))
    (want, want_result), (got, got_result) = runs
    np.testing.assert_array_equal(got, want, err_msg=name)
    assert got_result == want_result, name


@pytest.mark.skipif(not bit_kernels.HAVE_NUMBA, reason="compares with the numba kernels")
@pytest.mark.parametrize("seed", range(40))
def test_numpy_kernels_equal_the_compiled_ones(seed):
    """Each numpy twin writes the compiled kernel's bits (a range starting
    at any bit of a later word, children at any bit, exceptions with no,
    one or several children, at either end or adjacent, insertions
    anywhere, selections with repeats)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    density = [0.0, 0.03, 0.5, 1.0][seed % 4]
    first = int(rng.integers(0, 130))
    lead = int(rng.integers(0, 130))
    out = lambda size: np.zeros(-(-(first + size) // 64) + 1, np.uint64)
    # Rows: near-unary layers (exceptions) and any layer (row pointers).
    branch = np.where(rng.random(n) < rng.random(), rng.integers(0, 5, n), 1)
    indptr = np.concatenate([[0], np.cumsum(branch)]).astype(np.int64)
    children = packed_words(rng.random(int(indptr[-1])) < density, lead)
    ex = np.flatnonzero(branch != 1)
    _both("near_rows_any", lambda: (children, lead, out(n), first, n, ex + first,
                                    indptr[ex] + lead, indptr[ex + 1] + lead), 2)
    ex_states = np.concatenate([ex, [n]]).astype(np.int32)  # (a padding entry past them)
    ex_starts = np.concatenate([indptr[ex], indptr[-1:]]).astype(np.int32)
    for lo in range(min(3, ex.shape[0] + 1)):  # (a range after each of the first exceptions)
        a = int(ex[lo - 1]) + 1 if lo else 0  # (state a is output bit `first`)
        extra = int(indptr[-1]) + lead - (n - a + first)  # (past the last exception)
        _both("near_table_rows_any", lambda: (children, out(n - a), first, n - a,
                                              ex_states[lo:] - a + first, ex_starts[lo:] + lead,
                                              ex.shape[0] - lo, extra), 1)
        _both("near_table_rows_any", lambda: (children, out(n - a), first, n - a,
                                              ex_states[lo:-1] - a + first,
                                              ex_starts[lo:-1] + lead, ex.shape[0] - lo, extra),
              1)  # (no padding entry: the last exception's end from end_extra)
    _both("rows_any", lambda: (children, indptr + lead, out(n), first, n), 2)
    # Item masks in final-state order: gathered, and with insertions.
    m = n + 10
    bits = rng.random(m) < max(density, 0.1)
    index = rng.integers(0, m, n).astype(np.int32)
    _both("gather_bits", lambda: (bits, index, out(n), first, n), 2)
    k = int(rng.integers(0, n + 1)) if n else 0
    at = np.sort(rng.choice(n, k, replace=False)).astype(np.int32) + first
    ids = rng.integers(0, m, k).astype(np.int32)
    base = int(rng.integers(0, m - (n - k) + 1))
    _both("inserted_bits", lambda: (bits, at, ids, base, out(n), first, n), 4)
    packed = packed_words(bits)
    _both("inserted_words", lambda: (packed, at, ids, base, out(n), first, n), 4)
    # Selected rows' items, repeats included.
    selection = rng.random(n) < max(density, 0.1)
    row_item = rng.integers(0, m, n).astype(np.int32)
    picked = bit_kernels.selection_words(selection, np.empty(n // 64 + 1, np.uint64))
    _both("mark_selected_words", lambda: (picked, row_item, packed_words(np.zeros(m, bool))), 2)
    # Rank bits: positions set (ascending, then one out of order, repeated or out of
    # range: the bits before it set, its index returned), then counted per word and block.
    size = n + 40
    positions = np.sort(rng.choice(size, min(size, int(rng.integers(0, 60))), replace=False))
    words = lambda: np.zeros(size // 32 + 17, np.uint32)  # noqa: E731
    for dtype in (np.int32, np.int64):
        _both("position_words", lambda d=dtype: (positions.astype(d), size, words()), 2)
    if positions.shape[0] > 2:
        for bad in (positions[1], positions[0] - 1, size + 3):
            wrong = positions.copy()
            wrong[2] = bad
            _both("position_words", lambda w=wrong: (w, size, words()), 2)
    blocks = int(rng.integers(1, 5))
    counted = rng.integers(0, 1 << 32, blocks * 16, dtype=np.uint64).astype(np.uint32)
    counted[rng.random(counted.shape[0]) < density] = 0
    start = int(rng.integers(0, blocks))
    _both("word_counts", lambda: (counted, np.zeros(blocks * 16, np.uint16),
                                  np.zeros(blocks, np.uint64), start, blocks - start), 1)
    _both("word_counts", lambda: (counted, np.zeros(blocks * 16, np.uint16),
                                  np.zeros(blocks, np.uint64), start, blocks - start), 2)
    # A permutation's insertions, and a part with repeated values.
    order = np.arange(n)
    moved = rng.choice(n, min(n, int(rng.integers(0, 20))), replace=False)
    order[moved] = order[rng.permutation(moved)]
    start = int(rng.integers(0, 3))
    for values in (order + start, rng.integers(0, 5, n)):
        _both("split_insertions", lambda v=values: (v, start, np.zeros(n, bool)), 2)


def test_kernels_without_numba_are_the_numpy_twins():
    out = _run_without(["numba"], """
        from static_compiler.item_bits import bit_kernels
        assert not bit_kernels.HAVE_NUMBA
        for name, twin in bit_kernels.NUMPY_KERNELS.items():
            assert getattr(bit_kernels, name) is twin, name
        bit_kernels.warm()
    """)
    assert out.returncode == 0, out.stderr
