"""`subset(where=..., masks=...)` on every front door (issue 43, item 2):
the subset a filter expression picks over the items' attributes and named
per-request masks is the subset of numpy's evaluation of the same
expression (random columns and expressions), the compiled set, the served
artifact and the torch backend give the same bits and beams, every beam of
a search over it satisfies the expression, and the CLI's `decode --where`
decodes over it. The expression language itself: tests/live/test_where.py;
the columns: tests/live/test_attributes.py.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import static_compiler as sc
from helpers import examples, one_error_line, run_cli
from static_compiler.artifact import serving
from static_compiler.errors import ConstraintSetError, FilterExpressionError

V, L, N = 24, 3, 300
CATEGORIES = np.array(["news", "sport", "music", "film"])


def _catalogue(seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, V, (N, L))
    attributes = {"day": rng.integers(0, 30, N).astype(np.int32),
                  "price": np.round(rng.random(N) * 100, 1).astype(np.float32),
                  "in_stock": rng.random(N) < 0.7,
                  "category": CATEGORIES[rng.integers(0, len(CATEGORIES), N)]}
    return rows, attributes


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    """(rows, attributes, compiled set, saved path)."""
    rows, attributes = _catalogue()
    compiled = sc.compile_constraints(rows, V, export_subsets=True, export_beam_sizes=(6,),
                                      attributes=attributes)
    path = compiled.save(tmp_path_factory.mktemp("where") / "set.sc")
    return rows, attributes, compiled, path


def _bits(subset) -> list:
    return [None if w is None else np.asarray(w) for w in subset.live + subset.ends]


def _same(a, b) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and
                                             np.array_equal(x, y))
               for x, y in zip(_bits(a), _bits(b)))


CLAUSES = st.sampled_from([
    ("day >= {n}", lambda a, n, s: a["day"] >= n),
    ("price < {f}", lambda a, n, s: a["price"] < np.float32(n + 0.5)),
    ("in_stock", lambda a, n, s: a["in_stock"]),
    ("category in ('news', 'film')", lambda a, n, s: np.isin(a["category"], ["news", "film"])),
    ("category != 'sport'", lambda a, n, s: a["category"] != "sport"),
    ("not seen", lambda a, n, s: ~s),
])


@settings(max_examples=examples(25), deadline=None)
@given(clauses=st.lists(CLAUSES, min_size=1, max_size=3), joins=st.lists(
    st.sampled_from(["and", "or"]), min_size=2, max_size=2), n=st.integers(0, 30),
       seed=st.integers(0, 2 ** 16))
def test_a_filter_is_the_subset_of_numpys_evaluation(catalogue, clauses, joins, n, seed):
    _, attributes, compiled, _ = catalogue
    seen = np.random.default_rng(seed).random(N) < 0.3
    text = clauses[0][0].format(n=n, f=n + 0.5)
    groups = [clauses[0][1](attributes, n, seen)]  # "and" binds tighter than "or"
    for (clause, fn), join in zip(clauses[1:], joins):
        text += f" {join} " + clause.format(n=n, f=n + 0.5)
        value = fn(attributes, n, seen)
        if join == "and":
            groups[-1] = groups[-1] & value
        else:
            groups.append(value)
    want = np.logical_or.reduce(groups)
    subset = compiled.subset(where=text, masks={"seen": seen})
    assert _same(subset, compiled.subset(want)), text


@pytest.mark.parametrize("item_chunk, chunk_rows", [(64, 7), (128, 128), (1 << 24, 1 << 22)])
@pytest.mark.parametrize("lengths", ["fixed", "variable"])
def test_a_filter_fills_item_bits_a_chunk_at_a_time(monkeypatch, item_chunk, chunk_rows,
                                                    lengths):
    """`subset(where=)` evaluates the filter a chunk of rows at a time on
    threads straight into item bits (no bool (N,) mask): the same subset as
    numpy's mask, over several chunks and threads, with duplicate rows,
    removals, and items that end at several depths."""
    from static_compiler.live import item_masks, layer_walk, where

    monkeypatch.setattr(item_masks, "ITEM_CHUNK", item_chunk)
    monkeypatch.setattr(layer_walk, "WALK_THREADS", 3)
    real_row_filter = where.row_filter
    monkeypatch.setattr(where, "row_filter",
                        lambda *a, **k: real_row_filter(*a, **k, chunk_rows=chunk_rows))
    rows, attributes = _catalogue(seed=5)
    rows[::9] = rows[1::9]  # duplicate rows: one item each
    end = None
    if lengths == "variable":
        rows, end = [list(r[:1 + i % L]) for i, r in enumerate(rows)], 0
    compiled = sc.compile_constraints(rows, V, export_subsets=True, export_beam_sizes=(6,),
                                      attributes=attributes, capacity=1.5, end_token=end)
    compiled = compiled.update(remove=np.arange(N) % 11 == 0)
    seen = np.random.default_rng(6).random(N) < 0.4
    text = "day >= 12 and category in ('news', 'film') or price < 20.0 and not seen"
    want = ((attributes["day"] >= 12) & np.isin(attributes["category"], ["news", "film"])) | (
        (attributes["price"] < np.float32(20.0)) & ~seen)
    got = compiled.subset(where=text, masks={"seen": seen})
    assert _same(got, compiled.subset(want))
    assert int(got.sizes[0]) == int(compiled.subset(want).sizes[0]) > 0
    prior_where = compiled.prior("price", where=text, masks={"seen": seen})
    np.testing.assert_array_equal(prior_where.best, compiled.prior("price", selection=want).best)


def test_every_door_picks_the_same_items_and_beams(catalogue):
    rows, attributes, compiled, path = catalogue
    text = "day >= 10 and category in ('news', 'film') and not seen"
    seen = np.arange(N) % 4 == 0
    art = serving.load(path)
    subsets = [door.subset(where=text, masks={"seen": seen}) for door in (compiled, art)]
    assert _same(subsets[0], subsets[1])
    table = np.random.default_rng(1).standard_normal((L, V, V)).astype(np.float32)
    import jax.numpy as jnp
    table_j = jnp.asarray(table)
    want = sc.beam_search(compiled, lambda last, step, carry: (table_j[step, last], carry),
                          batch_size=2, beam_size=6, subset=subsets[0])
    if importlib.util.find_spec("torch") is not None:  # (the newest environment has none)
        import torch
        from static_compiler.torch_backend import TorchConstraints
        tc = TorchConstraints.load(path)
        in_torch = tc.subset(where=text, masks={"seen": seen})
        assert _same(subsets[0], in_torch)
        table_t = torch.from_numpy(table)
        got = tc.beam_search(lambda last, step, carry: (table_t[step][last], None),
                             batch_size=2, beam_size=6, subset=in_torch)
        assert np.array_equal(np.asarray(want.tokens), got.tokens.numpy())
    picked = (attributes["day"] >= 10) & np.isin(attributes["category"], ["news", "film"]) & ~seen
    allowed = {tuple(r) for r in rows[picked]}
    tokens, valid = np.asarray(want.tokens), np.asarray(want.valid)
    assert valid.any()
    for beam, ok in zip(tokens.reshape(-1, L), valid.reshape(-1)):
        assert not ok or tuple(beam) in allowed


def test_a_built_expression_equals_its_text(catalogue):
    _, _, compiled, _ = catalogue
    built = (sc.attr("day") >= 10) & sc.attr("category").isin(["news"]) & ~sc.item_mask("seen")
    seen = np.zeros(N, bool)
    assert _same(compiled.subset(where=built, masks={"seen": seen}),
                 compiled.subset(where="day >= 10 and category in ('news') and not seen",
                                 masks={"seen": seen}))


def test_bad_calls_name_the_door_and_the_problem(catalogue):
    _, _, compiled, path = catalogue
    art = serving.load(path)
    with pytest.raises(FilterExpressionError, match=r"Artifact.subset: where: unknown attribute "
                                                    r"'categroy' at position 0"):
        art.subset(where="categroy == 'news'")
    with pytest.raises(FilterExpressionError, match="'category'.*category"):
        compiled.subset(where="category < 'news'")
    with pytest.raises(ConstraintSetError, match="a selection and where=... at once"):
        compiled.subset(np.ones(N, bool), where="in_stock")
    with pytest.raises(ConstraintSetError, match="nothing selected"):
        compiled.subset()
    with pytest.raises(FilterExpressionError, match=r"masks=\['seen'\] without where"):
        compiled.subset(np.ones(N, bool), masks={"seen": np.ones(N, bool)})
    with pytest.raises(FilterExpressionError, match="seen"):
        compiled.subset(where="not seen", masks={"seen": np.ones(N - 1, bool)})


def test_a_set_without_attributes_reads_masks_only():
    compiled = sc.compile_constraints(np.array([[1, 2], [1, 3], [2, 3]]), 4, export_subsets=True)
    sub = compiled.subset(where="picked", masks={"picked": np.array([True, False, True])})
    assert _same(sub, compiled.subset(np.array([True, False, True])))
    with pytest.raises(FilterExpressionError, match="unknown attribute 'day'"):
        compiled.subset(where="day > 3")


def test_decode_where_on_the_command_line(catalogue, tmp_path, capsys):
    _, attributes, _, path = catalogue
    np.save(tmp_path / "seen.npy", np.arange(N) % 2 == 0)
    code, out, err = run_cli(capsys, "decode", path, "--where", "in_stock and not seen",
                             "--mask", f"seen={tmp_path / 'seen.npy'}")
    assert code == 0, err
    assert "batch row 0:" in out
    code, out, err = run_cli(capsys, "decode", path, "--where", "in_stok")
    assert code == 2 and "unknown attribute 'in_stok'" in one_error_line(err)
    code, out, err = run_cli(capsys, "decode", path, "--mask", "seen=x.npy")
    assert code == 2 and "--mask NAME=FILE names a mask for --where" in one_error_line(err)


def test_after_warm_a_filtered_request_compiles_nothing(catalogue):
    """A filter is host work (numpy over the columns) before the subset the
    warmed programs take: a request over subset(where=...) compiles nothing."""
    from static_compiler.support.compile_events import xla_compilations

    rows, attributes, compiled, _ = catalogue
    table = np.random.default_rng(2).standard_normal((L, V, V)).astype(np.float32)
    import jax.numpy as jnp
    table_j = jnp.asarray(table)
    model = lambda last, step, carry: (table_j[step, last], carry)
    compiled.warm([2], beam_sizes=[6], logits_fn=model, max_subsets=1)
    before = xla_compilations()
    for text in ("in_stock and day >= 5", "category == 'film' or price < 20.5"):
        sub = compiled.subset(where=text)
        result = sc.beam_search(compiled, model, batch_size=2, beam_size=6, subset=sub,
                                subset_index=np.zeros(2, np.int32))
        np.asarray(result.tokens)
    assert xla_compilations() == before
