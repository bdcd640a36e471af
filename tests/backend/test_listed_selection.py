"""The listed selection of the JAX beam step over ranked subsets
(`selection.select_listed`, `step.listed_selection`): candidates scored by
structure, each batch row's best LIST_FACTOR x beam_size ranked and only
their liveness read, the full read as a fallback when a list holds too
few live ones. The selection equals `select_beams` over the full liveness
(ties, sparse and dense liveness, lists of every size, the fallback flag
as numpy predicts it); beam steps (static and traced) and searches over a
ranked subset give the `BeamState` they give over `subset()` of the same
selection, bit for bit, with the list deciding and with the fallback
taken (a list of beam_size forces it), random and all-zero logits, one
and stacked per-row subsets; `subset()`, no subset and a binding
tokens_per_beam never list.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from live_cases import grid_logits, ragged_set

import static_compiler as sc
from static_compiler.backend import selection_kernels
from static_compiler.backend.decode import selection
from static_compiler.support.decode_state import SENTINEL_SCORE


def _same(a, b, where) -> None:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb), where
    for i, (x, y) in enumerate(zip(la, lb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str((where, i)))


def _listed_in_numpy(scores: np.ndarray, live: np.ndarray, beam_size: int, R: int) -> bool:
    """Whether every row's first R candidates (score desc, flat index asc)
    hold beam_size valid live ones."""
    B = scores.shape[0]
    flat, ok = scores.reshape(B, -1), (live & (scores > SENTINEL_SCORE)).reshape(B, -1)
    for b in range(B):
        order = np.lexsort((np.arange(flat.shape[1]), -flat[b]))[:R]
        if ok[b, order].sum() < beam_size:
            return False
    return True


def _selections(scores: np.ndarray, live: np.ndarray, beams: int, list_sizes=None):
    """(select_listed's selection, whether a list decided, select_beams over
    the live scores, the shapes live_at was read at) for scores (B, M, K)."""
    B, M, K = scores.shape
    reads = []

    @jax.jit
    def both(scores, live):
        def live_at(parent, col):
            reads.append(parent.shape)
            return jnp.take_along_axis(live.reshape(B, -1), parent * K + col, axis=-1)

        full_scores = jnp.where(live, scores, SENTINEL_SCORE)
        got, listed = selection.select_listed(
            scores, beams, live_at, lambda: tuple(selection.select_beams(full_scores, beams)[:3]),
            list_sizes)
        return got, listed, selection.select_beams(full_scores, beams)

    got, listed, want = both(scores, live)
    return got, bool(listed), want, reads


def _scores(rng, shape) -> np.ndarray:
    """Tied scores (a coarse grid) with invalid entries, and a row with
    fewer valid candidates."""
    scores = np.round(rng.normal(size=shape), 1).astype(np.float32)
    scores[rng.random(shape) < 0.2] = SENTINEL_SCORE
    scores[1, :, shape[2] // 2:] = SENTINEL_SCORE
    return scores


@pytest.mark.parametrize("density", [1.0, 0.4, 0.05, 0.0])
@pytest.mark.parametrize("list_size", [5, 12, 40])
def test_a_list_selects_as_the_full_liveness_does(density, list_size, monkeypatch):
    """Every list tried (LIST_MARGIN 0), of every length and liveness of
    every density: the winners of `select_beams` over the live scores, and
    the list decides exactly when numpy says it holds enough."""
    monkeypatch.setattr(selection, "LIST_MARGIN", 0.0)
    rng = np.random.default_rng(int(density * 100) + list_size)
    B, M, K, beams = 3, 6, 9, 5
    scores = _scores(rng, (B, M, K))
    live = rng.random(scores.shape) < density
    got, listed, want, reads = _selections(scores, live, beams, (list_size,))
    _same(got, want, "selection")
    assert reads == [(B, M * K), (B, list_size)]  # a sample (all 54 here), then the list
    assert listed == _listed_in_numpy(scores, live, beams, list_size)
    if density == 0.0:
        assert not listed


@pytest.fixture
def by_threshold(monkeypatch):
    """`select_listed` lists by `top_prefix` on rows from 16 entries (read
    when tracing: programs traced afresh, and dropped after)."""
    monkeypatch.setattr(selection_kernels, "TOP_PREFIX_FROM", 16)
    jax.clear_caches()
    yield
    jax.clear_caches()


def _prefix_decides(scores: np.ndarray, live: np.ndarray, beams: int, R: int) -> bool:
    """Whether a threshold list of R decides: every row's prefix (the
    kernel's, tested against numpy on its own) whole and holding beams
    valid live candidates."""
    B = scores.shape[0]
    flat, ok = scores.reshape(B, -1), (live & (scores > SENTINEL_SCORE)).reshape(B, -1)
    at, real, whole = jax.jit(selection_kernels.top_prefix, static_argnums=1)(
        flat, selection.list_capacity(R))
    at, real = np.asarray(at), np.asarray(real)
    return bool(np.asarray(whole).all()) and all(
        ok[b, at[b][real[b]]].sum() >= beams for b in range(B))


@pytest.mark.parametrize("density", [1.0, 0.4, 0.05, 0.0])
@pytest.mark.parametrize("list_size", [16, 40])
@pytest.mark.parametrize("kind", ["normal", "clustered"])
def test_a_threshold_list_selects_as_the_full_liveness_does(density, list_size, kind,
                                                            by_threshold, monkeypatch):
    """Untied scores (a list by `top_prefix`, in index order): the winners
    of `select_beams` over the live scores, every list tried (LIST_MARGIN
    0), the list deciding exactly when its prefix is whole and holds
    enough; the best candidates in the best beams (clustered) too."""
    monkeypatch.setattr(selection, "LIST_MARGIN", 0.0)
    rng = np.random.default_rng(int(density * 100) + list_size)
    B, M, K, beams = 3, 8, 64, 5
    scores = rng.normal(size=(B, M, K)).astype(np.float32)
    if kind == "clustered":
        scores -= np.sort(rng.exponential(3, (B, M)))[..., None].astype(np.float32)
    scores[rng.random(scores.shape) < 0.2] = SENTINEL_SCORE
    scores[1, :, K // 2:] = SENTINEL_SCORE
    live = rng.random(scores.shape) < density
    got, listed, want, reads = _selections(scores, live, beams, (list_size,))
    _same(got, want, "selection")
    # the sample, then the list's read (the threshold's prefix, or the top-k list padded to it)
    assert reads == [(B, selection.LIST_SAMPLES), (B, selection.list_capacity(list_size))]
    assert listed == _prefix_decides(scores, live, beams, list_size)
    if density == 1.0 and kind == "normal":
        assert listed
    if density == 0.0:
        assert not listed


def test_tied_scores_list_by_top_k(by_threshold, monkeypatch):
    """Scores with many ties in the sample (a coarse grid: a zeros model's
    shape) take the list of the R best by `top_k`, which decides as numpy
    says; untied ones the threshold's."""
    monkeypatch.setattr(selection, "LIST_MARGIN", 0.0)
    rng = np.random.default_rng(11)
    B, M, K, beams, R = 3, 8, 64, 5, 16
    tied = _scores(rng, (B, M, K))
    live = rng.random(tied.shape) < 0.3
    got, listed, want, _ = _selections(tied, live, beams, (R,))
    _same(got, want, "tied")
    assert listed == _listed_in_numpy(tied, live, beams, R)
    # Where the two lists disagree: only the beams candidates after the R
    # best live, which the top R miss and the threshold's longer prefix holds.
    untied = rng.normal(size=(B, M, K)).astype(np.float32)
    for scores in (tied, untied):
        flat = scores.reshape(B, -1)
        order = np.stack([np.lexsort((np.arange(flat.shape[1]), -flat[b])) for b in range(B)])
        after = np.zeros(flat.shape, bool)
        np.put_along_axis(after, order[:, R:R + beams], True, axis=-1)
        got, listed, want, _ = _selections(scores, after.reshape(scores.shape), beams, (R,))
        _same(got, want, "only after the list live")
        assert listed == (scores is untied)


def test_the_sample_picks_the_list_or_the_full_read():
    """Dense liveness: the shorter list (its expected live count enough);
    15 %: the longer one; sparse: no list (the full read at once);
    every time the selection over the full liveness. The sample reads
    LIST_SAMPLES candidates a row, each list its own length (no padding
    to the longest to read)."""
    rng = np.random.default_rng(4)
    B, M, K, beams = 3, 40, 64, 8
    scores = _scores(rng, (B, M, K))
    sizes = tuple(f * beams for f in selection.LIST_FACTORS)
    for density, listed_by in ((1.0, sizes[0]), (0.15, sizes[1]), (0.01, None)):
        live = rng.random(scores.shape) < density
        got, listed, want, reads = _selections(scores, live, beams)
        _same(got, want, ("selection", density))
        # (traced: the sample, then a read per list in its own branch; the taken one runs)
        assert reads == [(B, selection.LIST_SAMPLES)] + [(B, R) for R in sizes]
        assert listed == (listed_by is not None), density


def test_select_listed_refuses_a_list_outside_its_bounds():
    scores = jnp.zeros((1, 2, 3), jnp.float32)
    live_at = lambda parent, col: jnp.ones(parent.shape, bool)  # noqa: E731
    for size in (1, 6):  # below beam_size; not below M' * K (nothing to save)
        with pytest.raises(AssertionError):
            selection.select_listed(scores, 2, live_at, lambda: None, (size,))


def wide_set():
    """A fixed-length set whose depth-2 step has many children a beam (V
    64): the shape of the depth-2 step of a large Semantic ID set."""
    rng = np.random.default_rng(7)
    rows = np.unique(rng.integers(0, 64, (3000, 3)), axis=0)
    return rows, sc.compile_constraints(rows, 64, export_subsets=True)


@pytest.fixture
def listed_flags(monkeypatch):
    """The flags `select_listed` returns as the decoders run it (whether
    each list decided), recorded by a debug callback; programs traced
    afresh (and dropped after)."""
    flags: list = []
    real = selection.select_listed

    def recording(*args, **kwargs):
        picked, listed = real(*args, **kwargs)
        jax.debug.callback(lambda x: flags.append(bool(x)), listed)
        return picked, listed

    monkeypatch.setattr(selection, "select_listed", recording)
    jax.clear_caches()
    yield flags
    jax.clear_caches()


def _check_beams(c, ranked, subset, index, B: int, M: int, zeros: bool, seed: int,
                 static: bool, fine: bool = False) -> None:
    """beam_step at traced steps (and static ones: `static`) and a beam
    search over `ranked` equal them over `subset` (index: each row's
    subset, or None); logits on a coarse grid (ties), or normal (fine)."""
    T, V = c.max_length, c.vocab_size
    rng = np.random.default_rng(seed)
    kw_r, kw_s = dict(subset=ranked, subset_index=index), dict(subset=subset, subset_index=index)
    a = b = traced = c.init_beams(B, M)
    for step in range(T):
        logits = np.zeros((B, M, V), np.float32) if zeros else \
            rng.normal(size=(B, M, V)).astype(np.float32) if fine else grid_logits(rng, (B, M), V)
        b = c.beam_step(b, logits, jnp.asarray(step, jnp.int32), **kw_s)
        if static:
            a = c.beam_step(a, logits, step, **kw_r)
            _same(a, b, ("beam_step", step))
        traced = c.beam_step(traced, logits, jnp.asarray(step, jnp.int32), **kw_r)
        _same(traced, b, ("beam_step traced", step))
    table = jnp.asarray(np.zeros((T, V + 1, V)) if zeros else rng.normal(size=(T, V + 1, V)),
                        jnp.float32)

    def model(last, step, carry):
        return table[step][jnp.clip(last, 0, V)], carry

    _same(sc.beam_search(c, model, batch_size=B, beam_size=M, **kw_r),
          sc.beam_search(c, model, batch_size=B, beam_size=M, **kw_s), "beam_search")


@pytest.mark.parametrize("make, forced, threshold", [
    (wide_set, False, False), (wide_set, True, False), (ragged_set, True, False),
    (wide_set, False, True)])
def test_beams_over_a_ranked_subset_equal_them_over_the_subset(make, forced, threshold,
                                                               listed_flags, monkeypatch):
    """Dense, sparse and stacked per-row selections (the ragged set:
    stacked), random and all-zero logits: the same `BeamState` bit for bit
    at every step (traced; static too on the wide set; a beam search),
    through the listed selection; on the wide set the lists decide on the
    dense selections and not on the sparse ones (the sample skips the
    list, or, forced: a list of beam_size always tried, LIST_MARGIN 0,
    falls back); threshold: lists by `top_prefix` (from rows of 16, with
    normal logits: the tied zeros list by `top_k`); a binding
    tokens_per_beam, LiveBits subsets and no subset never list."""
    if threshold:
        monkeypatch.setattr(selection_kernels, "TOP_PREFIX_FROM", 16)
    if forced:
        monkeypatch.setattr(selection, "LIST_FACTORS", (1,))
        monkeypatch.setattr(selection, "LIST_MARGIN", 0.0)
    rows, c = make()
    n = c.items.num_items
    rng = np.random.default_rng(n)
    B, M = 3, 8
    dense, sparse = rng.random(n) < 0.7, np.zeros(n, bool)
    sparse[rng.choice(n, 3, replace=False)] = True
    stacked = np.stack([dense, sparse, rng.random(n) < 0.2])
    index = np.array([2, 0, 1], np.int32)
    decided = {}
    kinds = [("dense", dense, None), ("sparse", sparse, None), ("stacked", stacked, index)]
    for name, masks, rows_of in kinds if make is wide_set else kinds[2:]:
        ranked = c.ranked_subset(masks)
        subset = c.subset(masks) if masks.ndim == 1 else \
            sc.stack_subsets([c.subset(m) for m in masks])
        for zeros in (False, True):
            del listed_flags[:]
            _check_beams(c, ranked, subset, rows_of, B, M, zeros, seed=int(zeros),
                         static=make is wide_set, fine=threshold)
            decided[name, zeros] = set(listed_flags)
    assert all(flags for flags in decided.values()), decided  # listed selections ran
    if make is wide_set:
        assert all(decided["sparse", zeros] == {False} for zeros in (False, True)), decided
        if not forced:
            assert all(True in decided["dense", zeros] for zeros in (False, True)), decided
    # LiveBits subsets and no subset take the full read, never a list
    del listed_flags[:]
    state = c.init_beams(B, M)
    for kw in ({}, dict(subset=c.subset(dense))):
        jax.block_until_ready(c.beam_step(state, np.zeros((B, M, c.vocab_size), np.float32),
                                          1, **kw))
    assert listed_flags == []
    if make is wide_set:  # a per-beam cap that binds: the full read, the same beams
        a = b = c.init_beams(B, M)
        for step in range(c.max_length):
            logits = grid_logits(rng, (B, M), c.vocab_size)
            a = c.beam_step(a, logits, step, subset=c.ranked_subset(dense), tokens_per_beam=2)
            b = c.beam_step(b, logits, step, subset=c.subset(dense), tokens_per_beam=2)
            _same(a, b, ("tokens_per_beam", step))
        assert listed_flags == []
