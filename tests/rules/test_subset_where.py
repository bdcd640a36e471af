"""`subset(where=..., masks=...)` on every front door:
the subset a filter expression picks over the items' attributes and named
per-request masks is the subset of numpy's evaluation of the same
expression (random columns and expressions), the compiled set, the served
artifact and the torch backend give the same bits and beams, every beam of
a search over it satisfies the expression, and the CLI's `decode --where`
decodes over it. The expression language itself: tests/rules/test_where.py;
the columns: tests/items/test_attributes.py.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import examples, one_error_line, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ConstraintSetError, FilterExpressionError
from static_compiler.rules.where import And

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
    from static_compiler.item_bits import item_masks, layer_walk
    from static_compiler.rules import where

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
    from static_compiler.jax_support.compile_events import xla_compilations

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


def _doors(catalogue):
    """(name, door) for every front door a subset is asked of: the compiled
    set, the served artifact and (where torch is installed) the torch
    backend."""
    _, _, compiled, path = catalogue
    doors = [("CompiledConstraints", compiled), ("Artifact", serving.load(path))]
    if importlib.util.find_spec("torch") is not None:
        from static_compiler.torch_backend import TorchConstraints
        doors.append(("TorchConstraints", TorchConstraints.load(path)))
    return doors


@pytest.mark.parametrize("masks, fragments", [
    ([np.ones(N, bool)], ["masks=[array(", "is a list", "mapping of names to bool arrays "
                                                         f"({N},)"]),
    ((np.ones(N, bool),), ["is a tuple", "mapping"]),
    (np.ones(N, bool), ["is a ndarray", "mapping"]),
    ({0: np.ones(N, bool)}, ["masks key 0 is a int", "name"]),
    ({"seen": np.ones(N, np.int8)}, ["mask 'seen' has dtype int8", f"bool mask of shape ({N},)"]),
    ({"seen": np.ones(N + 1, bool)}, [f"shape ({N + 1},)", f"({N},)"]),
    ({"seen": [True] * N}, ["mask 'seen' has list", "bool mask"]),
])
def test_masks_are_checked_where_they_enter_on_every_door(catalogue, masks, fragments):
    """masks that are not a mapping of names to bool (N,) arrays (a list of
    masks, a bare array, a key that is no name, another dtype or length) are
    a FilterExpressionError naming the door and the value on every door, for
    subsets and priors alike; never numpy's "truth value is ambiguous"."""
    for name, door in _doors(catalogue):
        for call in (lambda: door.subset(where="not seen", masks=masks),
                     lambda: door.subset(np.ones(N, bool), masks=masks),
                     lambda: door.prior("price", where="not seen", masks=masks),
                     lambda: door.prior("price", masks=masks)):
            with pytest.raises(FilterExpressionError) as info:
                call()
            message = str(info.value)
            assert message.startswith(f"{name}.") and "ambiguous" not in message, message
            for fragment in fragments:
                assert fragment in message, (name, message)


def _deep(shape: str, depth: int):
    """A filter built in Python whose `not`s and junctions nest `depth` deep."""
    expr = sc.attr("in_stock")
    for level in range(depth):
        if shape == "not":
            expr = ~expr
        elif shape == "alternating":  # and inside or inside and: a bracket every other level
            expr = (expr & (sc.attr("day") > level)) if level % 2 else \
                (expr | (sc.attr("price") < level))
        else:  # explicit And of an And: a bracket at every level
            expr = And((expr, sc.attr("day") >= level % 7))
    return expr


def _deep_oracle(shape: str, depth: int, attributes) -> np.ndarray:
    rows = attributes["in_stock"].copy()
    for level in range(depth):
        if shape == "not":
            rows = ~rows
        elif shape == "alternating":
            rows = (rows & (attributes["day"] > level)) if level % 2 else \
                (rows | (attributes["price"] < level))
        else:
            rows = rows & (attributes["day"] >= level % 7)
    return rows


def _with_frames(frames: int, call):
    """call() beneath `frames` more Python frames (a caller's own stack)."""
    return call() if frames == 0 else _with_frames(frames - 1, call)


@pytest.mark.parametrize("shape", ["not", "alternating", "and_of_and"])
def test_a_deeply_built_filter_is_one_rule_with_the_parser(catalogue, shape):
    """A filter built in Python as deep as the limit works on every door
    (printing, parsing back, comparing and evaluating do not run out of
    stack, beneath 100 frames of the caller's); one level more is the
    parser's FilterExpressionError naming the depth and the limit, when it
    is built and for its text alike."""
    from static_compiler.rules.where import MAX_NESTING, nesting, parse
    rows, attributes, compiled, _ = catalogue
    deepest = _deep(shape, MAX_NESTING)
    assert nesting(deepest) == MAX_NESTING
    want = compiled.subset(_deep_oracle(shape, MAX_NESTING, attributes))
    for name, door in _doors(catalogue):
        got = _with_frames(100, lambda: door.subset(where=deepest))
        assert _same(got, want), name
        assert _same(_with_frames(100, lambda: door.subset(where=str(deepest))), want), name
    text = _with_frames(100, lambda: str(deepest))
    assert _with_frames(100, lambda: parse(text)) == deepest
    assert hash(parse(text)) == hash(deepest)
    with pytest.raises(FilterExpressionError, match=f"nested {MAX_NESTING + 1} deep.*at most "
                                                    f"{MAX_NESTING}"):
        _deep(shape, MAX_NESTING + 1)
    with pytest.raises(FilterExpressionError, match=f"nested {MAX_NESTING + 1} deep at position "
                                                    fr"\d+: at most {MAX_NESTING}"):
        parse("not " + text if shape == "not" else f"in_stock and ({text})")
    with pytest.raises(FilterExpressionError, match=f"CompiledConstraints.subset: .*nested "
                                                    f"{MAX_NESTING + 1} deep"):
        compiled.subset(where="not " * 400 + "in_stock")


class _RowsModel:
    """The brute force of items and their rows through updates: every input
    row (its sequence and attributes) with whether it still stands for its
    item (an update that removes an item ends all its rows; adding it again
    brings new ones)."""

    def __init__(self, rows, attributes):
        self.rows = [tuple(r) for r in rows.tolist()]
        self.attrs = {k: list(v) for k, v in attributes.items()}
        self.alive = [True] * len(self.rows)

    def remove(self, sequences):
        gone = {tuple(s) for s in sequences}
        self.alive = [a and r not in gone for r, a in zip(self.rows, self.alive)]

    def add(self, sequences, attributes):
        self.rows += [tuple(s) for s in sequences]
        self.alive += [True] * len(sequences)
        for k, v in attributes.items():
            self.attrs[k] += list(v)

    def picked(self, predicate) -> set:
        """The items a filter picks: those with a live row it holds for."""
        columns = {k: np.array(v) for k, v in self.attrs.items()}
        holds = predicate(columns)
        return {r for r, a, h in zip(self.rows, self.alive, holds) if a and h}

    def first_live_rows(self) -> dict:
        out = {}
        for i, (r, a) in enumerate(zip(self.rows, self.alive)):
            if a:
                out.setdefault(r, i)
        return out


FILTERS = [("not in_stock", lambda c: ~c["in_stock"]),
           ("in_stock", lambda c: c["in_stock"]),
           ("day >= 15 or category == 'news'", lambda c: (c["day"] >= 15) |
            (c["category"] == "news")),
           ("not (in_stock and day < 10)", lambda c: ~(c["in_stock"] & (c["day"] < 10)))]


def _subset_of(door, items: set, num_rows: int):
    """The subset of exactly the sequences `items` (the brute force's)."""
    if not items:
        return door.subset(np.zeros(num_rows, bool))
    return door.subset(np.array(sorted(items), np.int64))


@pytest.mark.parametrize("seed", range(4))
def test_a_filter_picks_an_item_through_its_live_rows_only(seed, tmp_path):
    """Attributes belong to input rows: an item removed, then added again
    with in_stock=true, is not picked by `not in_stock` through its removed
    row. Random removals and re-adds (duplicates, items never removed,
    items removed twice) against the brute force, on the compiled set and
    the artifact it saves; the item's attributes (a prior) and
    `item_index` are its first live row's."""
    rng = np.random.default_rng(seed)
    v, length, n = 6, 3, 24
    rows = rng.integers(1, v, (n, length))
    rows[5] = rows[2]  # a duplicate from the start
    attributes = {"in_stock": rng.random(n) < 0.5, "day": rng.integers(0, 30, n),
                  "category": np.array(["news", "sport"])[rng.integers(0, 2, n)],
                  "pop": rng.standard_normal(n).astype(np.float32)}
    compiled = sc.compile_constraints(rows, v, export_subsets=True, capacity=3.0,
                                      attributes=attributes)
    model = _RowsModel(rows, attributes)
    for step in range(4):
        known = sorted(set(model.rows))
        out = [known[i] for i in rng.choice(len(known), 3, replace=False)]
        compiled = compiled.update(remove=np.array(out))
        model.remove(out)
        back = [out[0], out[0], known[rng.integers(len(known))]]  # re-added twice, and one other
        added = {"in_stock": rng.random(3) < 0.5, "day": rng.integers(0, 30, 3),
                 "category": np.array(["news", "sport"])[rng.integers(0, 2, 3)],
                 "pop": rng.standard_normal(3).astype(np.float32)}
        compiled = compiled.update(add=np.array(back), attributes=added)
        model.add(back, added)
        num_rows = len(model.rows)
        for text, predicate in FILTERS:
            want = _subset_of(compiled, model.picked(predicate), num_rows)
            assert _same(compiled.subset(where=text), want), (seed, step, text)
        first = model.first_live_rows()
        live = sorted(first)
        assert compiled.item_index(np.array(live)).tolist() == [first[r] for r in live]
    prior = compiled.prior("pop")
    by_rows = compiled.prior("pop", selection=np.ones(num_rows, bool))
    np.testing.assert_array_equal(prior.best, by_rows.best)
    path = compiled.save(tmp_path / "s", modules=False)
    loaded = sc.load(path)
    stale = np.asarray(loaded.items.stale_rows)
    assert np.array_equal(stale, np.asarray(compiled.items.stale_rows))
    assert stale.any() and not (stale & np.array(model.alive)).any()  # (only rows that ended)
    for text, predicate in FILTERS:
        want = _subset_of(loaded, model.picked(predicate), num_rows)
        assert _same(loaded.subset(where=text), want), (seed, text)
    np.testing.assert_array_equal(loaded.prior("pop").best, prior.best)


def test_a_re_added_item_is_picked_by_its_new_row_alone():
    """The issue's construction: in_stock=false, removed, added again with
    in_stock=true: `not in_stock` does not pick it, `in_stock` does, and a
    row mask naming its removed row picks nothing; its prior is the new
    row's value."""
    rows = np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1]])
    compiled = sc.compile_constraints(rows, 5, export_subsets=True, capacity=2.0, attributes={
        "in_stock": np.array([False, True, True]), "pop": np.array([5.0, 0.0, 1.0], np.float32)})
    again = compiled.update(remove=rows[:1]).update(
        add=rows[:1], attributes={"in_stock": [True], "pop": [-3.0]})
    assert again.item_index(rows[:1]).tolist() == [3]
    assert _same(again.subset(where="not in_stock"), again.subset(np.zeros(4, bool)))
    assert _same(again.subset(where="in_stock"), again.subset(rows))
    assert _same(again.subset(np.array([True, False, False, False])),
                 again.subset(np.zeros(4, bool)))
    assert float(again.prior("pop").best.max()) == 1.0  # not the removed row's 5.0
    stale_only = again.update(remove=np.array([True, False, False, False]))
    assert stale_only.build.last_update["removed"] == 0  # (the row no longer stands for the item)
    assert stale_only.item_index(rows[:1]).tolist() == [3]


def test_a_saved_catalogue_updated_in_place_keeps_the_rule(tmp_path):
    """The same construction through `update_artifact` (a removal, then an
    addition streamed into the artifact's files): the served artifact and
    the torch backend pick the re-added item through its new row only."""
    rows = np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1]])
    compiled = sc.compile_constraints(rows, 5, export_subsets=True, capacity=2.0,
                                      export_beam_sizes=(2,),
                                      attributes={"in_stock": np.array([False, True, True])})
    path = compiled.save(tmp_path / "s")
    sc.update_artifact(path, remove=rows[:1])
    report = sc.update_artifact(path, add=rows[:1], attributes={"in_stock": [True]})
    assert report["restored"] == 1
    doors = [serving.load(path), sc.load(path)]
    if importlib.util.find_spec("torch") is not None:
        from static_compiler.torch_backend import TorchConstraints
        doors.append(TorchConstraints.load(path))
    for door in doors:
        assert np.asarray(door._set_view.items.stale_rows).tolist() == [True, False, False, False]
        assert _same(door.subset(where="not in_stock"), door.subset(np.zeros(4, bool)))
        assert _same(door.subset(where="in_stock"), door.subset(np.ones(4, bool)))
