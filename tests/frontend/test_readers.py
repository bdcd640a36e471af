"""static_compiler.frontend.readers: every file format reads back what was written, and
every bad file raises a typed error naming the file, the line and the text."""

import json
import re

import numpy as np
import pytest

from static_compiler import compile_constraints
from static_compiler.errors import ConstraintSetError, IRParseError, IRVerificationError
from static_compiler.frontend import build_automaton, readers
from static_compiler.ir import Automaton

THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])
RAGGED = [[1, 2, 3], [1, 2], [4], [4, 5, 6, 2]]


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# ----- normal input -----

@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
def test_npy_is_returned_as_stored(tmp_path, dtype):
    np.save(tmp_path / "s.npy", THREE.astype(dtype))
    got = readers.read_constraints(tmp_path / "s.npy")
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == (3, 3)
    np.testing.assert_array_equal(got, THREE)


def test_jsonl_and_text_give_lists_of_ints(tmp_path):
    jsonl = write(tmp_path, "s.jsonl", "\n".join(json.dumps(s) for s in RAGGED) + "\n")
    text = write(tmp_path, "s.txt", "\n".join(" ".join(map(str, s)) for s in RAGGED))
    assert readers.read_constraints(jsonl) == RAGGED
    assert readers.read_constraints(str(text)) == RAGGED


def test_json_suffix_is_read_as_json_lines(tmp_path):
    path = write(tmp_path, "s.JSON", "[1, 2]\n[3]\n")
    assert readers.read_constraints(path) == [[1, 2], [3]]


def test_ir_dump_is_parsed_whatever_the_suffix(tmp_path):
    ir = compile_constraints(THREE, 4).ir
    for name in ("dump.ir", "dump.txt", "dump"):
        got = readers.read_constraints(write(tmp_path, name, ir.to_text()))
        assert isinstance(got, Automaton) and got == ir


# ----- edge cases -----

def test_blank_lines_comments_and_extra_whitespace_are_skipped(tmp_path):
    path = write(tmp_path, "s.txt", "# header\n\n  1\t2  3 \r\n\n# 9 9\n4\n")
    assert readers.read_constraints(path) == [[1, 2, 3], [4]]
    path = write(tmp_path, "s.jsonl", "# header\n\n  [1, 2]  \n")
    assert readers.read_constraints(path) == [[1, 2]]


def test_a_byte_order_mark_is_ignored(tmp_path):
    path = write(tmp_path, "s.txt", "\ufeff1 2\n3 4\n")
    assert readers.read_constraints(path) == [[1, 2], [3, 4]]


def test_empty_json_list_and_large_ids_pass_through_to_the_frontend(tmp_path):
    path = write(tmp_path, "s.jsonl", "[]\n[70000, 0]\n")
    assert readers.read_constraints(path) == [[], [70000, 0]]


def test_parsers_work_on_strings_without_a_file():
    assert readers.parse_token_lines("1 2\n3\n") == [[1, 2], [3]]
    assert readers.parse_jsonl("[1, 2]\n") == [[1, 2]]
    with pytest.raises(ConstraintSetError, match=r"input '<string>' line 1"):
        readers.parse_jsonl("1 2\n")


# ----- bad input -----

@pytest.mark.parametrize("name, content, pattern", [
    ("s.txt", "1 2\n1 x 3\n", r"s\.txt' line 2: '1 x 3' is not space-separated integer token ids"),
    ("s.txt", "1 2.5\n", r"line 1: '1 2\.5' is not space-separated"),
    ("s.csv", "1,2,3\n", r"s\.csv' line 1: '1,2,3' holds comma-separated ids: save it as \.npy"),
    ("s.jsonl", "[1, 2]\n\n[1, \"a\"]\n", r"line 3: '\[1, \"a\"\]' is not a JSON list of integer"),
    ("s.jsonl", "[true, 1]\n", r"line 1: .* is not a JSON list of integer"),
    ("s.jsonl", "[1.0]\n", r"line 1: .* is not a JSON list of integer"),
    ("s.jsonl", "{\"a\": 1}\n", r"line 1: .* is not a JSON list of integer"),
    ("s.jsonl", "[1, 2\n", r"s\.jsonl' line 1: not JSON"),
    ("s.txt", "", r"s\.txt': no sequences found"),
    ("s.jsonl", "\n# only a comment\n  \n", r"no sequences found \(expected one per line\)"),
    ("s.txt", b"\xff\xfe\x00", r"s\.txt': not a readable UTF-8 text file"),
    ("s.npy", "hello\n", r"s\.npy': not a readable \.npy array"),
])
def test_bad_files_raise_constraint_set_error(tmp_path, name, content, pattern):
    path = write(tmp_path, name, content)
    with pytest.raises(ConstraintSetError, match=pattern):
        readers.read_constraints(path)


def test_long_bad_lines_are_cut_in_the_message(tmp_path):
    path = write(tmp_path, "s.txt", "x" * 500 + "\n")
    with pytest.raises(ConstraintSetError) as info:
        readers.read_constraints(path)
    assert "x" * 80 in str(info.value) and "x" * 81 not in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConstraintSetError, match=r"absent\.npy': no such file"):
        readers.read_constraints(tmp_path / "absent.npy")
    with pytest.raises(ConstraintSetError, match="no such file"):
        readers.read_constraints(tmp_path)


def test_pickled_object_arrays_are_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([[1, 2], [3]], dtype=object), allow_pickle=True)
    with pytest.raises(ConstraintSetError, match=r"obj\.npy': not a readable \.npy array"):
        readers.read_npy(tmp_path / "obj.npy")


def test_broken_ir_dumps_name_the_file(tmp_path):
    path = write(tmp_path, "bad.ir", "automaton of sorts\n")
    with pytest.raises(IRParseError,
                       match=r"input '.*bad\.ir': line 1: expected 'automaton vocab="):
        readers.read_constraints(path)
    text = str(build_automaton(THREE, 4)).replace("s1: 2->1 3->2", "s1: 3->1 2->2")
    path = write(tmp_path, "broken.ir", text)
    with pytest.raises(IRVerificationError) as info:
        readers.read_constraints(path)
    assert re.search(r"broken\.ir'.*layer 2, state 1: tokens not strictly increasing",
                     str(info.value))


def test_every_reader_error_is_a_value_error(tmp_path):
    path = write(tmp_path, "s.txt", "a\n")
    with pytest.raises(ValueError):
        readers.read_constraints(path)
