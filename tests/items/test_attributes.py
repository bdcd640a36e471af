"""Item attributes (`compile_constraints(attributes=...)`,
`items.attributes`): int, float, bool and category columns over the input
rows, read back equal from every front door (the compiled set, `sc.load`,
`serving.load`, `TorchConstraints.load`), saved memory-mapped (format version
12), appended to by additions in the library and in a saved artifact (new
categories after the old ones), kept by removals; reported by `show-ir
--stats` and `verify`; bad columns are AttributeColumnErrors naming the column.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil

import numpy as np
import pytest
from helpers import edit_manifest, one_error_line, run_cli

import static_compiler as sc
from static_compiler.errors import (
    ArtifactFormatError,
    AttributeColumnError,
    ConstraintSetError,
    DecodeInputError,
    FilterExpressionError,
)
from static_compiler.format import spec as fmt
from static_compiler.items.attributes import appended, checked_attributes, code_dtype

ROWS = np.array([[1, 2, 3], [1, 2, 4], [2, 3, 1], [3, 1, 1], [3, 1, 2]])
VOCAB = 5
ATTRIBUTES = {"age": np.array([1, 5, 9, 2, 7], np.int16),
              "score": np.array([0.5, -1.0, np.nan, 2.25, 0.0], np.float32),
              "fresh": np.array([True, False, True, False, True]),
              "topic": ["news", "sport", "news", "météo", "sport"]}
ADDED = np.array([[1, 2, 1], [3, 1, 4]])  # (within the capacity: no layer grows)
ADDED_ATTRIBUTES = {"age": [3, 4], "score": [1, 2.5], "fresh": [False, True],
                    "topic": ["sport", "🎵 music"]}


def compiled_set(**options):
    return sc.compile_constraints(ROWS, VOCAB, export_subsets=True, capacity=2.0,
                                  export_beam_sizes=(2,), attributes=ATTRIBUTES, **options)


def columns(attributes) -> dict:
    """{name: (kind, dtype, categories, values as numpy)} of an ItemAttributes."""
    return {name: (c.kind, str(c.dtype), c.categories, np.asarray(c.to_numpy()))
            for name, c in attributes.items()}


def assert_same_columns(got, want) -> None:
    got, want = columns(got), columns(want)
    assert list(got) == list(want)
    for name in want:
        assert got[name][:3] == want[name][:3], name
        np.testing.assert_array_equal(got[name][3], want[name][3], err_msg=name)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The set saved without modules (what every test but serving reads)."""
    return compiled_set().save(tmp_path_factory.mktemp("attrs") / "a", modules=False)


def test_columns_keep_their_kind_dtype_and_values():
    attributes = compiled_set().attributes
    assert list(attributes) == ["age", "fresh", "score", "topic"]  # sorted by name
    assert attributes.num_rows == len(ROWS)
    assert [(r["name"], r["kind"], r["dtype"], r["categories"]) for r in attributes.describe()] \
        == [("age", "int", "int16", None), ("fresh", "bool", "bool", None),
            ("score", "float", "float32", None), ("topic", "category", "uint8", 3)]
    assert attributes.nbytes == sum(r["nbytes"] for r in attributes.describe()) == 10 + 5 + 20 + 5
    topic = attributes["topic"]
    assert topic.categories == ("news", "sport", "météo")  # first-seen order
    np.testing.assert_array_equal(topic.values, [0, 1, 0, 2, 1])
    np.testing.assert_array_equal(topic.to_numpy(), ATTRIBUTES["topic"])
    for name in ("age", "score", "fresh"):
        np.testing.assert_array_equal(attributes[name].to_numpy(), ATTRIBUTES[name])
    with pytest.raises(KeyError, match="no attribute 'nope'"):
        attributes["nope"]


def test_every_front_door_reads_the_same_columns(saved):
    want = compiled_set().attributes
    back = sc.load(saved)
    assert_same_columns(back.attributes, want)
    assert all(isinstance(c.values, np.memmap) for c in back.attributes.values())
    manifest = json.loads((saved / fmt.MANIFEST_FILE).read_text())
    assert manifest["format_version"] == fmt.FORMAT_VERSION
    assert manifest["attributes"]["topic"] == {"kind": "category", "dtype": "uint8",
                                               "file": "items/attr.topic.npy",
                                               "categories": ["news", "sport", "météo"]}
    assert all(entry["file"] in manifest["files"] for entry in manifest["attributes"].values())
    if importlib.util.find_spec("torch") is not None:
        from static_compiler.torch_backend import TorchConstraints

        assert_same_columns(TorchConstraints.load(saved).attributes, want)
        assert_same_columns(TorchConstraints.from_compiled(back).attributes, want)


def test_the_served_artifact_reads_them(tmp_path):
    pytest.importorskip("jax")
    from static_compiler import serving

    compiled = compiled_set()
    art = serving.load(compiled.save(tmp_path / "a"))
    assert_same_columns(art.attributes, compiled.attributes)
    assert isinstance(art.attributes["age"].values, np.memmap)
    assert art.reload().attributes is not None


def test_additions_append_and_removals_keep():
    compiled = compiled_set()
    old = compiled.attributes
    new = compiled.update(add=ADDED, attributes=ADDED_ATTRIBUTES)
    assert new.build.last_update["added"] == 2
    got = new.attributes
    assert got.num_rows == len(ROWS) + 2
    assert got["topic"].categories == ("news", "sport", "météo", "🎵 music")  # appended at the end
    np.testing.assert_array_equal(got["topic"].values[:len(ROWS)], old["topic"].values)
    np.testing.assert_array_equal(got["topic"].to_numpy(),
                                  ATTRIBUTES["topic"] + ADDED_ATTRIBUTES["topic"])
    assert got["age"].dtype == np.int16 and got["score"].dtype == np.float32
    np.testing.assert_array_equal(got["score"].values[-2:], [1.0, 2.5])
    np.testing.assert_array_equal(new.item_index(ADDED), [len(ROWS), len(ROWS) + 1])
    kept = new.update(remove=np.arange(len(ROWS) + 2) == 0)
    assert_same_columns(kept.attributes, got)
    both = compiled.update(add=ADDED, remove=ROWS[:1], attributes=ADDED_ATTRIBUTES)
    assert_same_columns(both.attributes, got)


def test_update_artifact_appends_and_removals_keep(saved, tmp_path):
    path = shutil.copytree(saved, tmp_path / "a")
    report = sc.update_artifact(path, add=ADDED, attributes=ADDED_ATTRIBUTES)
    assert report["added"] == 2 and report["grew"] == []
    want = compiled_set().update(add=ADDED, attributes=ADDED_ATTRIBUTES).attributes
    assert_same_columns(sc.load(path).attributes, want)
    sc.update_artifact(path, remove=ROWS[:2])
    assert_same_columns(sc.load(path).attributes, want)
    with pytest.raises(AttributeColumnError, match=r"\['topic'\] are not given"):
        sc.update_artifact(path, add=[[4, 1, 1]], attributes={
            k: v[:1] for k, v in ADDED_ATTRIBUTES.items() if k != "topic"})
    with pytest.raises(AttributeColumnError, match="pass add="):
        sc.update_artifact(path, remove=ROWS[:1], attributes=ADDED_ATTRIBUTES)
    assert_same_columns(sc.load(path).attributes, want)  # nothing written


@pytest.mark.parametrize("count, dtype", [(1, np.uint8), (256, np.uint8), (257, np.uint16),
                                           (65536, np.uint16), (65537, np.int32)])
def test_category_codes_take_the_narrowest_dtype(count, dtype):
    labels = np.array([f"c{i}" for i in range(count)])
    column = checked_attributes({"c": labels[::-1]}, count, "test")["c"]
    assert column.values.dtype == dtype and column.categories[0] == f"c{count - 1}"
    np.testing.assert_array_equal(column.to_numpy(), labels[::-1])
    assert code_dtype(count) == dtype and code_dtype(count, at_least=np.int32) == np.int32


def test_added_categories_widen_the_codes(tmp_path):
    """The 257th category turns uint8 codes into uint16, old codes kept: in
    memory, and in a saved artifact's update (its columns joined a range at
    a time)."""
    labels = np.array([f"c{i:03d}" for i in range(256)])
    rows = np.stack([np.arange(256) // 16, np.arange(256) % 16], axis=1)
    compiled = sc.compile_constraints(rows, 16, export_subsets=True, capacity=2.0,
                                      attributes={"c": labels})
    assert compiled.attributes["c"].dtype == np.uint8
    added, new_labels = [[0, 0], [15, 15], [3, 4]], ["c000", "new", "c255"]
    want = np.concatenate([labels, new_labels])
    grown = compiled.update(add=added, attributes={"c": new_labels})
    path = compiled.save(tmp_path / "a", modules=False)
    sc.update_artifact(path, add=added, attributes={"c": new_labels})
    for got in (grown.attributes["c"], sc.load(path).attributes["c"]):
        assert got.dtype == np.uint16 and got.categories[-1] == "new"
        np.testing.assert_array_equal(got.to_numpy(), want)
    np.testing.assert_array_equal(grown.subset(where="c == 'new' or c == 'c255'").sizes,
                                  grown.subset(np.isin(want, ["new", "c255"])).sizes)
    assert compiled.update(add=added[:1], attributes={"c": ["c001"]}).attributes["c"].dtype \
        == np.uint8  # (no new category: the codes keep their dtype)


def test_a_format_13_artifact_reads_its_int32_codes(tmp_path):
    """tests/data/artifact_v13_attributes (written by format version 13, int32
    codes) is read, filtered, updated and saved again: its codes stay int32,
    now in the current format version."""
    frozen = pathlib.Path(__file__).parents[1] / "data" / "artifact_v13_attributes"
    sids = np.load(frozen.parent / "artifact_v13_attributes_sids.npy")
    assert json.loads((frozen / fmt.MANIFEST_FILE).read_text())["format_version"] == 13
    old = sc.load(frozen)
    topic = old.attributes["topic"]
    assert topic.dtype == np.int32 and topic.categories == ("music", "news", "sport")
    want = (topic.to_numpy() == "news") & (old.attributes["day"].values < 10)
    assert want.any()
    np.testing.assert_array_equal(old.subset(where="topic == 'news' and day < 10").sizes,
                                  old.subset(want).sizes)
    path = shutil.copytree(frozen, tmp_path / "a")
    sc.update_artifact(path, add=[[7, 7, 7]], attributes={"topic": ["film"], "day": [3]})
    assert json.loads((path / fmt.MANIFEST_FILE).read_text())["format_version"] == \
        fmt.FORMAT_VERSION
    back = sc.load(path).attributes["topic"]
    assert back.dtype == np.int32 and back.categories[-1] == "film"
    assert back.to_numpy().tolist() == topic.to_numpy().tolist() + ["film"]
    np.testing.assert_array_equal(sc.load(path).item_index(sids[:3]), [0, 1, 2])


def test_an_addition_outgrowing_the_capacity_keeps_the_columns():
    compiled = sc.compile_constraints(ROWS, VOCAB, export_subsets=True, attributes=ATTRIBUTES)
    new = compiled.update(add=[[0, 0, 0]], attributes={k: v[:1] for k, v in
                                                          ADDED_ATTRIBUTES.items()})
    assert new.build.last_update["grew"]
    np.testing.assert_array_equal(new.attributes["age"].values, [1, 5, 9, 2, 7, 3])


def test_show_ir_stats_and_verify_report_them(saved, capsys):
    code, out, err = run_cli(capsys, "show-ir", saved, "--stats")
    assert code == 0, err
    assert "attribute topic: category uint8, 3 categories, 5 bytes\n" in out
    assert "attribute age: int int16, 10 bytes\n" in out
    code, out, err = run_cli(capsys, "verify", saved)
    assert code == 0, err
    assert ("4 item attributes (age: int int16, fresh: bool bool, score: float float32, topic: "
            "category uint8 (3 categories)) over 5 rows: OK\n") in out


def test_the_compile_command_takes_an_npz(tmp_path, capsys):
    np.save(tmp_path / "rows.npy", ROWS)
    np.savez(tmp_path / "attrs.npz", age=ATTRIBUTES["age"], topic=np.array(ATTRIBUTES["topic"]))
    code, out, err = run_cli(capsys, "compile", tmp_path / "rows.npy", "--vocab-size", "5",
                             "--export-subsets", "--tables-only", "--attributes",
                             tmp_path / "attrs.npz", "-o", tmp_path / "a")
    assert code == 0, err
    back = sc.load(tmp_path / "a").attributes
    assert list(back) == ["age", "topic"]
    np.testing.assert_array_equal(back["topic"].to_numpy(), ATTRIBUTES["topic"])


def test_the_update_command_takes_the_added_rows_attributes(tmp_path, capsys):
    """`update --add ROWS --attributes FILE.npz` adds items to a catalogue
    with attributes (before, the error named --attributes, which update did
    not take), as `update_artifact(add=..., attributes=...)` does; without
    it the line names the flag; --attributes without --add names --add."""
    np.save(tmp_path / "rows.npy", ROWS)
    np.savez(tmp_path / "attrs.npz", age=ATTRIBUTES["age"], topic=np.array(ATTRIBUTES["topic"]))
    assert run_cli(capsys, "compile", tmp_path / "rows.npy", "--vocab-size", "5",
                   "--export-subsets", "--tables-only", "--capacity", "2", "--attributes",
                   tmp_path / "attrs.npz", "-o", tmp_path / "a")[0] == 0
    np.save(tmp_path / "added.npy", ADDED)
    code, _, err = run_cli(capsys, "update", tmp_path / "a", "--add", tmp_path / "added.npy")
    line = one_error_line(err)
    assert code == 2 and "['age', 'topic'] are not given" in line and "--attributes" in line
    np.savez(tmp_path / "added.npz", age=ADDED_ATTRIBUTES["age"],
             topic=np.array(ADDED_ATTRIBUTES["topic"]))
    code, _, err = run_cli(capsys, "update", tmp_path / "a", "--remove", tmp_path / "rows.npy",
                           "--attributes", tmp_path / "added.npz")
    assert code == 2 and "pass --add FILE with them" in one_error_line(err)
    code, out, err = run_cli(capsys, "update", tmp_path / "a", "--add", tmp_path / "added.npy",
                             "--attributes", tmp_path / "added.npz")
    assert code == 0 and "2 items added" in out, err
    back = sc.load(tmp_path / "a").attributes
    np.testing.assert_array_equal(back["topic"].to_numpy(),
                                  ATTRIBUTES["topic"] + ADDED_ATTRIBUTES["topic"])
    np.testing.assert_array_equal(back["age"].to_numpy(),
                                  np.r_[ATTRIBUTES["age"], ADDED_ATTRIBUTES["age"]])
    (tmp_path / "bad.npz").write_bytes(b"no npz")
    code, _, err = run_cli(capsys, "update", tmp_path / "a", "--add", tmp_path / "added.npy",
                           "--attributes", tmp_path / "bad.npz")
    assert code == 2 and "--attributes" in one_error_line(err)


@pytest.mark.parametrize("where", ["compiled", "artifact"])
def test_a_removal_mask_beside_additions_covers_the_rows_before_or_after(where, tmp_path):
    """update(add=..., remove=mask): the mask has one entry per row of the
    set the update starts from (N, as the docstring says) or N + n, the n
    added rows last; the same items go either way; another length names
    both."""
    n = len(ROWS)
    before = np.zeros(n, bool)
    before[1] = True
    after = np.r_[before, [False, True]]  # also the second added row

    def updated(remove):
        if where == "compiled":
            return compiled_set().update(add=ADDED, remove=remove, attributes=ADDED_ATTRIBUTES)
        path = compiled_set().save(tmp_path / f"s{len(list(tmp_path.iterdir()))}",
                                   modules=False)
        sc.update_artifact(path, add=ADDED, remove=remove, attributes=ADDED_ATTRIBUTES)
        return sc.load(path)

    over_n = updated(before)
    assert over_n.item_index(ROWS[1:2]).tolist() == [-1]
    assert over_n.item_index(ADDED).tolist() == [n, n + 1]
    over_all = updated(after)
    assert over_all.item_index(ROWS[1:2]).tolist() == [-1]
    assert over_all.item_index(ADDED).tolist() == [n, -1]
    for bad in (np.zeros(n + 1, bool), np.zeros(n - 1, bool), np.zeros(n, np.int8)):
        with pytest.raises(ConstraintSetError) as info:
            updated(bad)
        message = str(info.value)
        assert f"remove mask has shape {bad.shape}" in message, message
        assert f"expected ({n},) bool, one entry per row of the set" in message
        assert f"or ({n + 2},) counting the 2 rows add= appends" in message


# Edge cases


def test_no_columns_and_one_row(tmp_path):
    empty = sc.compile_constraints(ROWS, VOCAB, export_subsets=True, attributes={})
    assert empty.attributes is not None and len(empty.attributes) == 0
    assert sc.load(empty.save(tmp_path / "e", modules=False)).attributes == {}
    assert len(empty.update(add=ADDED).attributes) == 0
    assert sc.compile_constraints(ROWS, VOCAB).attributes is None
    one = sc.compile_constraints([[1, 2]], VOCAB, export_subsets=True,
                                 attributes={"x": [3.5], "u": ["ünï"]})
    back = sc.load(one.save(tmp_path / "one", modules=False)).attributes
    assert back["x"].dtype == np.float64 and back["x"].values.tolist() == [3.5]
    assert back["u"].to_numpy().tolist() == ["ünï"]


def test_ragged_rows_and_duplicates_are_rows():
    rows = [[1, 2], [1], [1, 2], [3, 3, 3]]
    compiled = sc.compile_constraints(rows, VOCAB, end_token=0, export_subsets=True,
                                      attributes={"k": ["a", "b", "a", "c"]})
    assert compiled.attributes.num_rows == 4
    np.testing.assert_array_equal(compiled.attributes["k"].values, [0, 1, 0, 2])


def test_a_memory_mapped_column_is_not_copied(tmp_path):
    np.save(tmp_path / "age.npy", ATTRIBUTES["age"])
    age = np.load(tmp_path / "age.npy", mmap_mode="r")
    compiled = sc.compile_constraints(ROWS, VOCAB, attributes={"age": age})
    assert np.shares_memory(compiled.attributes["age"].values, age)


def test_a_partitioned_build_takes_them_over_its_rows():
    compiled = sc.compile_constraints(sc.Shards([ROWS[:2], ROWS[2:]], partitions=2), VOCAB,
                                      export_subsets=True, attributes=ATTRIBUTES)
    assert compiled._held_ir is None  # (lowered piece by piece)
    assert_same_columns(compiled.attributes, compiled_set().attributes)
    np.testing.assert_array_equal(compiled.item_index(ROWS[3:4]), [3])


# Bad input


@pytest.mark.parametrize("given, problem", [
    ({"and": [1] * 5}, "word of the filter grammar"),
    ({"2x": [1] * 5}, "expected an identifier"),
    ({"a-b": [1] * 5}, "expected an identifier"),
    ({"x": [1] * 4}, r"attribute 'x': expected a 1-D array of 5 values"),
    ({"x": np.zeros((5, 1))}, r"attribute 'x': expected a 1-D array of 5 values"),
    ({"x": 3}, r"attribute 'x': expected a 1-D array"),
    ({"x": [1, 2, None, 4, 5]}, r"attribute 'x': holds None"),
    ({"x": np.array([1, 2, np.nan, 4, 5], dtype=object)}, r"attribute 'x': holds NaN"),
    ({"x": ["a", "b", 3, "d", "e"]}, r"attribute 'x': mixes types \(int, str\)"),
    ({"x": [True, 1, 0, 1, 0]}, r"attribute 'x': mixes types \(bool, int\)"),
    ({"x": ["a", "b", float("nan"), "d", "e"]}, r"attribute 'x': holds NaN"),
    ({"x": np.zeros(5, complex)}, r"attribute 'x': dtype complex128 is not supported"),
    ({"x": np.zeros(5, "datetime64[D]")}, r"attribute 'x': .*convert it to int"),
    ({"x": [object()] * 5}, r"attribute 'x': values of type \['object'\]"),
    ([1, 2], "expected a mapping"),
    ({"x": ["a", "a\0", "b", "c", "d"]}, r"attribute 'x': category value 'a\\x00' holds a NUL"),
    ({"x": np.array(["a", "b\0c", "b", "c", "d"])}, r"attribute 'x': category value 'b\\x00c'"),
    ({"x": np.array(["a", "\0", "b", "c", "d"], object)}, r"attribute 'x': .*'\\x00' holds a NUL"),
])
def test_bad_columns_name_the_column(given, problem):
    with pytest.raises(AttributeColumnError, match=problem):
        sc.compile_constraints(ROWS, VOCAB, attributes=given)


def test_attributes_need_sequence_input():
    ir = sc.compile_constraints(ROWS, VOCAB).ir
    with pytest.raises(ConstraintSetError, match="need sequence input"):
        sc.compile_constraints(ir, VOCAB, attributes={"x": [1] * 5})


@pytest.mark.parametrize("added, problem", [
    (None, r"\['age', 'fresh', 'score', 'topic'\] are not given"),
    (dict(ADDED_ATTRIBUTES, extra=[1, 2]), r"\['extra'\] are not attributes of the set"),
    (dict(ADDED_ATTRIBUTES, age=[1]), r"attribute 'age': expected a 1-D array of 2 values"),
    (dict(ADDED_ATTRIBUTES, age=[1.5, 2]), "attribute 'age' holds int values; the added "
                                           "values are float"),
    (dict(ADDED_ATTRIBUTES, age=[1, 40000]), r"attribute 'age' is int16; the added values "
                                             r"span \[1, 40000\]"),
    (dict(ADDED_ATTRIBUTES, topic=[1, 2]), "attribute 'topic' holds category values"),
    (dict(ADDED_ATTRIBUTES, fresh=[1, 0]), "attribute 'fresh' holds bool values"),
    (dict(ADDED_ATTRIBUTES, topic=["news", "news\0"]), r"attribute 'topic': category value "
                                                       r"'news\\x00' holds a NUL"),
    (dict(ADDED_ATTRIBUTES, topic=np.array(["x\0y", "news"])), r"'x\\x00y' holds a NUL"),
])
def test_bad_additions_name_the_column(added, problem):
    with pytest.raises(AttributeColumnError, match=problem):
        compiled_set().update(add=ADDED, attributes=added)


def test_additions_to_a_set_without_attributes_take_none():
    compiled = sc.compile_constraints(ROWS, VOCAB, export_subsets=True, capacity=2.0)
    with pytest.raises(AttributeColumnError, match="the set has no attributes"):
        compiled.update(add=ADDED, attributes=ADDED_ATTRIBUTES)


def test_appended_int_values_widen_into_a_float_column():
    attrs = checked_attributes({"f": np.array([0.5], np.float32)}, 1, "t")
    assert appended(attrs, {"f": [2]}, 1, "t")["f"].values.tolist() == [0.5, 2.0]


def test_saving_attributes_needs_export_subsets(tmp_path):
    compiled = sc.compile_constraints(ROWS, VOCAB, attributes=ATTRIBUTES)
    with pytest.raises(DecodeInputError, match="export_subsets=True"):
        compiled.save(tmp_path / "a", modules=False)


@pytest.mark.parametrize("change, problem", [
    (lambda a: a["topic"].update(categories=None), r"\['categories'\] is None"),
    (lambda a: a["age"].update(categories=["x"]), r"\['categories'\] is \['x'\]"),
    (lambda a: a["topic"].update(categories=["x", 3]), r"\['categories'\]"),
    (lambda a: a["age"].update(kind="date"), "kind 'date'"),
    (lambda a: a["age"].update(dtype="float32"), "kind 'int' with dtype 'float32'"),
    (lambda a: a["topic"].update(dtype="int16"), "uint8, uint16 or int32 codes"),
    (lambda a: a["topic"].update(dtype="int32"), r"holds uint8 \(5,\), expected int32"),
    (lambda a: a["age"].update(dtype="int64"), r"holds int16 \(5,\), expected int64"),
    (lambda a: a["age"].update(file="items/nope.npy"), "not among the manifest's files"),
    (lambda a: a.update({"not": a.pop("age")}), "word of the filter grammar"),
])
def test_a_tampered_manifest_entry_is_a_format_error(saved, tmp_path, change, problem):
    path = shutil.copytree(saved, tmp_path / "a")
    edit_manifest(path, lambda m: change(m["attributes"]))
    with pytest.raises(ArtifactFormatError, match=problem):
        sc.load(path)


def test_attributes_without_an_item_index_are_a_format_error(saved, tmp_path):
    path = shutil.copytree(saved, tmp_path / "a")
    edit_manifest(path, lambda m: m.update(item_files=None))
    with pytest.raises(ArtifactFormatError, match="without an item index"):
        sc.load(path)


def test_verify_finds_a_code_outside_the_categories(saved, tmp_path, capsys):
    path = shutil.copytree(saved, tmp_path / "a")
    rel = "items/attr.topic.npy"
    np.save(path / rel, np.array([0, 1, 0, 7, 1], np.uint8))
    edit_manifest(path, lambda m: m["files"].update({rel: {
        "size": (path / rel).stat().st_size, "sha256": fmt.sha256_file(path / rel)}}))
    code, out, err = run_cli(capsys, "verify", path)
    assert code == 1 and "MISMATCH: topic: a code outside its 3 categories" in out, (out, err)


def test_the_compile_command_refuses_a_bad_npz(tmp_path, capsys):
    np.save(tmp_path / "rows.npy", ROWS)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    code, out, err = run_cli(capsys, "compile", tmp_path / "rows.npy", "--vocab-size", "5",
                             "--attributes", tmp_path / "bad.npz", "-o", tmp_path / "a")
    assert code == 2 and "--attributes" in one_error_line(err)



def test_a_nul_character_never_merges_two_categories():
    """"a" and "a\\x00" would be one category in numpy's fixed-width strings:
    a value with a NUL is refused at compile time, on update and in a
    filter's literal (text or built), so no filter can tell them apart
    wrongly."""
    compiled = compiled_set()
    with pytest.raises(AttributeColumnError, match="NUL"):
        sc.compile_constraints(ROWS, VOCAB, export_subsets=True,
                               attributes={**ATTRIBUTES, "topic": ["a", "a\0", "a", "b", "b"]})
    with pytest.raises(AttributeColumnError, match="NUL"):
        compiled.update(add=ADDED, attributes={**ADDED_ATTRIBUTES, "topic": ["news", "news\0"]})
    with pytest.raises(FilterExpressionError, match=r"NUL character in a string at position 14"):
        compiled.subset(where="topic == 'news\0'")
    with pytest.raises(FilterExpressionError, match=r"literal 'news\\x00' holds a NUL"):
        compiled.subset(where=sc.attr("topic").isin(["sport", "news\0"]))
    assert compiled.subset(where="topic == 'news'").live is not None
