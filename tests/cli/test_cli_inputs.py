"""The CLI's inputs and messages: a .jsonl catalogue of
names is read as JSON; `update --remove` checks its rows as `--add` does; a -1 padded
.npy compiles alike with and without --partitions; messages name the CLI's
flags, not the library's parameters; `decode` checks --beam-size before it
compiles; `show-ir --help` and `compile --help` list the same inputs."""

import ast
import json
import re

import numpy as np
import pytest
from helpers import REPO, run_cli
from helpers import one_error_line as error_line

import static_compiler as sc
from static_compiler import serving
from static_compiler.cli import main
from static_compiler.errors import ConstraintSetError, IRVerificationError
from static_compiler.frontend import readers

SIDS = np.array([[1, 2, 3], [1, 4, 5], [2, 2, 2]])
PADDED = np.array([[1, 2, 3], [1, 2, -1], [4, -1, -1], [4, 5, 6]])
NAMES = ["Zurich", "Lima", "Quito", "New York"]


def no_parameter_names(line: str) -> bool:
    """No `name=` of a Python parameter and no library function in a message."""
    return not re.search(r"\b[a-z]+_[a-z_]+=", line) and "read_names" not in line


@pytest.fixture(scope="module")
def sids_art(tmp_path_factory):
    """SIDS compiled with --export-subsets and beam sizes 3 and 5."""
    root = tmp_path_factory.mktemp("edges")
    np.save(root / "sids.npy", SIDS)
    assert main(["compile", str(root / "sids.npy"), "-o", str(root / "sids.static"),
                 "--vocab-size", "8", "--beam-sizes", "3,5", "--export-subsets"]) == 0
    return root / "sids.static"


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A word-level `tokenizers` JSON file: one token per word, </s> = 1."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    words = sorted({w for name in NAMES for w in name.split()})
    vocab = {"<unk>": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path, len(vocab)


# -- a .jsonl catalogue of names is JSON ---------------------------

def write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_jsonl_catalogue_compiles_its_names_not_its_lines(tokenizer_json, tmp_path, capsys):
    tok, V = tokenizer_json
    src = write_jsonl(tmp_path / "names.jsonl", [json.dumps(NAMES[0]), "",
                                                  json.dumps({"name": NAMES[1], "id": 7})] +
                      [json.dumps({"name": n}) for n in NAMES[2:]])
    art = tmp_path / "names.static"
    code, _, err = run_cli(capsys, "compile", src, "--tokenizer", tok, "--vocab-size", V,
                           "--end-token", 1, "-o", art, "--beam-sizes", 4)
    assert code == 0, err
    assert sorted(serving.load(art).names.names) == sorted(NAMES)
    code, out, _ = run_cli(capsys, "show-ir", src, "--tokenizer", tok, "--vocab-size", V,
                           "--end-token", 1)
    assert code == 0 and "'New York'" in out and '"name"' not in out
    code, out, _ = run_cli(capsys, "verify", art, "--input", src, "--tokenizer", tok)
    assert code == 0 and f"{len(NAMES)} unique input sequences: OK" in out
    assert readers.read_names(src) == NAMES


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", r"line 2: '\[1, 2\]' is not a name: .*\(token ids are read without a tokenizer\)"),
    ('{"title": "Bern"}', r"line 2: '\{\"title\": \"Bern\"\}' is not a name"),
    ('{"name": 5}', r"line 2: .* is not a name"),
    ("42", r"line 2: '42' is not a name"),
    ('""', r"line 2: '\"\"' is not a name"),
    ("Bern", r"line 2: not JSON"),
])
def test_a_jsonl_line_that_is_not_a_name_is_refused(tokenizer_json, tmp_path, capsys, line,
                                                    message):
    tok, V = tokenizer_json
    src = write_jsonl(tmp_path / "names.jsonl", ['"Lima"', line])
    code, out, err = run_cli(capsys, "compile", src, "--tokenizer", tok, "--vocab-size", V,
                             "-o", tmp_path / "a.static")
    assert code == 2 and out == "" and not (tmp_path / "a.static").exists()
    assert re.search(message, error_line(err)), err
    assert 'JSON string ("Zurich") or object with a string "name"' in err  # what is accepted
    with pytest.raises(ConstraintSetError, match=message):
        readers.read_names(src)


def test_a_jsonl_of_names_without_a_tokenizer_points_at_the_flag(tmp_path, capsys):
    src = write_jsonl(tmp_path / "names.jsonl", ['{"name": "Zurich"}'])
    code, _, err = run_cli(capsys, "compile", src, "--vocab-size", 8, "-o", tmp_path / "a")
    line = error_line(err)
    assert code == 2 and "is not a JSON list of integer token ids" in line
    assert "--tokenizer TOKENIZER_JSON" in line and no_parameter_names(line)


def test_spellings_any_with_subsets_names_the_flags(tokenizer_json, tmp_path, capsys):
    tok, V = tokenizer_json
    src = write_jsonl(tmp_path / "names.jsonl", ['"Lima"', '"New York"'])
    code, _, err = run_cli(capsys, "compile", src, "--tokenizer", tok, "--vocab-size", V,
                           "--end-token", 1, "--spellings", "any", "--export-subsets",
                           "-o", tmp_path / "a")
    line = error_line(err)
    assert code == 2 and "--spellings any keeps no item index: --export-subsets" in line


# -- --remove rows are checked as --add rows are -------------------

BAD_ROWS = {
    "out of range": (np.array([[1, 2, 99]]), r"sequence 0, position 2: token 99 is outside the "
                                              r"vocabulary \[0, 8\)"),
    "negative": (np.array([[1, -5, 2]]), r"sequence 0, position 1: token -5 is outside the "
                                          r"vocabulary \[0, 8\)"),
    "wrong length": (np.array([[1, 2]]), r"sequence 0 has length 2: this set's sequences all "
                                          r"have length 3"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_update_remove_refuses_rows_that_add_refuses(sids_art, tmp_path, capsys, case):
    rows, message = BAD_ROWS[case]
    np.save(tmp_path / "rows.npy", rows)
    before = serving.read_manifest(sids_art)
    for flag, role in (("--remove", "removed"), ("--add", "added")):
        code, out, err = run_cli(capsys, "update", sids_art, flag, tmp_path / "rows.npy")
        line = error_line(err)
        assert code == 2 and out == "", (flag, out)
        assert re.search(f"update: {role} {message}", line), line
        assert no_parameter_names(line), line
    assert serving.read_manifest(sids_art) == before


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_library_removals_refuse_the_same_rows(sids_art, tmp_path, case):
    rows, message = BAD_ROWS[case]
    compiled = sc.load(sids_art)
    with pytest.raises(ConstraintSetError, match=message):
        compiled.update(remove=rows)
    with pytest.raises(ConstraintSetError, match=message):
        compiled.update(remove=[list(r) for r in rows.tolist()])
    import shutil
    path = shutil.copytree(sids_art, tmp_path / "copy.static")
    for kw in (dict(remove=rows), dict(remove=rows, add=[[7, 7, 7]])):
        with pytest.raises(ConstraintSetError, match=message):
            sc.update_artifact(path, **kw)


def test_a_valid_sequence_not_in_the_set_is_still_counted(sids_art, tmp_path, capsys):
    import shutil
    path = shutil.copytree(sids_art, tmp_path / "copy.static")
    np.save(tmp_path / "rows.npy", np.array([[7, 7, 7], [1, 2, 3]]))
    code, out, _ = run_cli(capsys, "update", path, "--remove", tmp_path / "rows.npy")
    assert code == 0 and "1 items removed, 0 already removed, 1 not in the set" in out


def test_removing_minus_one_padded_rows_of_a_variable_length_set():
    compiled = sc.compile_constraints(PADDED, 8, end_token=0, export_subsets=True)
    v2 = compiled.update(remove=np.array([[4, -1, -1], [1, 2, -1], [1, 7, -1]]))
    assert v2.build.last_update == {"removed": 2, "already_removed": 0, "absent": 1}
    with pytest.raises(ConstraintSetError, match=r"removed sequence 0, position 1: holds the end "
                                                 r"token 0"):
        compiled.update(remove=[[1, 0]])


# -- a -1 padded .npy, one answer on every path --------------------

def test_a_minus_one_padded_npy_compiles_alike_in_memory_and_partitioned(tmp_path, capsys):
    np.save(tmp_path / "padded.npy", PADDED)
    texts = []
    for name, extra in (("memory", []), ("parts", ["--partitions", 1])):
        art = tmp_path / f"{name}.static"
        code, _, err = run_cli(capsys, "compile", tmp_path / "padded.npy", "--vocab-size", 8,
                               "--end-token", 0, "-o", art, "--beam-sizes", 4, *extra)
        assert code == 0, err
        code, out, _ = run_cli(capsys, "show-ir", art)
        assert code == 0
        texts.append(out)
    code, out, _ = run_cli(capsys, "show-ir", tmp_path / "padded.npy", "--vocab-size", 8,
                           "--end-token", 0)
    texts.append(out)
    rows = [[int(t) for t in r if t >= 0] for r in PADDED]
    want = sc.compile_constraints(rows, 8, end_token=0).ir
    assert texts == [want.to_text()] * 3
    shards = sc.compile_constraints(sc.Shards([PADDED], partitions=1), 8, end_token=0)
    assert sc.compile_constraints(PADDED, 8, end_token=0).ir == want == shards.ir


def test_a_minus_one_padded_npy_without_end_token_is_refused_alike(tmp_path, capsys):
    np.save(tmp_path / "padded.npy", PADDED)
    for extra in ([], ["--partitions", 1]):
        code, _, err = run_cli(capsys, "compile", tmp_path / "padded.npy", "--vocab-size", 8,
                               "-o", tmp_path / "a", *extra)
        line = err.strip().splitlines()[-1]  # (after the partitioned build's progress)
        assert code == 2 and "pass --end-token E to compile a variable-length set" in line, extra
        assert no_parameter_names(line)


def test_minus_one_padding_inside_a_row_is_refused_alike():
    gap = np.array([[1, 2, 3], [1, -1, 3]])
    message = r"sequence 1: has a token after -1 padding: -1 may only follow a row's last token"
    with pytest.raises(ConstraintSetError, match=message):
        sc.compile_constraints(gap, 8, end_token=0)
    with pytest.raises(ConstraintSetError, match=message):
        sc.compile_constraints(sc.Shards([gap], partitions=1), 8, end_token=0)
    with pytest.raises(ConstraintSetError, match=r"sequence 0: is empty"):
        sc.compile_constraints(np.array([[-1, -1], [1, 2]]), 8, end_token=0)
    # rows all padded at the same column are one fixed length, as in shards
    short = sc.compile_constraints(np.array([[1, 2, -1], [3, 4, -1]]), 8)
    assert list(short.ir.sequences()) == [(1, 2), (3, 4)]


# -- the CLI's messages name its flags ------------------------------

@pytest.mark.parametrize("content, args, flag_text", [
    ("1 2\n3\n", ["--vocab-size", 8], "pass --end-token E to compile a variable-length set"),
    ("1 2\n", ["--vocab-size", 8, "--end-token", 9], "--end-token 9: expected an int in [0, 8)"),
    ("1 2\n", ["--vocab-size", 0], "--vocab-size 0: expected an int in [1, "),
    ("1 2\n", ["--vocab-size", 8, "--capacity", 1.5, "--pipeline", "verify"],
     "--capacity 1.5 needs a pipeline with choose-layout"),
    ("Zurich\n", ["--vocab-size", 8], "(a file of names is compiled with --tokenizer "
                                      "TOKENIZER_JSON)"),
])
def test_compile_messages_name_the_flags(tmp_path, capsys, content, args, flag_text):
    (tmp_path / "set.txt").write_text(content)
    code, _, err = run_cli(capsys, "compile", tmp_path / "set.txt", "-o", tmp_path / "a", *args)
    line = error_line(err)
    assert code == 2 and flag_text in line and no_parameter_names(line), line


def test_a_csv_input_is_told_what_to_save_it_as(tmp_path, capsys):
    (tmp_path / "set.csv").write_text("1,2,3\n4,5,6\n")
    code, _, err = run_cli(capsys, "compile", tmp_path / "set.csv", "--vocab-size", 8, "-o",
                           tmp_path / "a")
    line = error_line(err)
    assert code == 2 and "line 1: '1,2,3' holds comma-separated ids" in line
    assert "save it as .npy or space-separated ids" in line and "names" not in line


def test_update_messages_name_the_flags(sids_art, tmp_path, capsys):
    np.save(tmp_path / "plain.npy", SIDS)
    assert main(["compile", str(tmp_path / "plain.npy"), "-o", str(tmp_path / "plain.static"),
                 "--vocab-size", "8", "--beam-sizes", "2"]) == 0
    capsys.readouterr()
    code, _, err = run_cli(capsys, "update", tmp_path / "plain.static", "--remove",
                           tmp_path / "plain.npy")
    line = error_line(err)
    assert code == 2 and "(compile with --export-subsets to update it)" in line
    np.save(tmp_path / "short.npy", np.array([[1, 2]]))
    code, _, err = run_cli(capsys, "update", sids_art, "--add", tmp_path / "short.npy")
    line = error_line(err)
    assert code == 2 and "(compile with --end-token E for variable lengths)" in line
    assert no_parameter_names(line)


def test_decode_checks_the_beam_size_before_loading_or_compiling(sids_art, capsys, monkeypatch):
    from static_compiler.cli import demo_model

    def refuse(*a, **k):
        raise AssertionError("loaded or compiled before the arguments were checked")

    monkeypatch.setattr(serving, "load", refuse)
    monkeypatch.setattr(demo_model, "decode_artifact", refuse)
    code, out, err = run_cli(capsys, "decode", sids_art, "--beam-size", 8)
    line = error_line(err)
    assert code == 2 and out == ""
    assert (f"--beam-size 8: artifact '{sids_art}' exports beam sizes [3, 5] (compile with "
            "--beam-sizes 8 to add one)") in line


def test_in_cli_terms_words_parameters_as_flags_and_leaves_file_contents_alone():
    from static_compiler.cli.common import in_cli_terms

    cases = {
        "pass end_token=... to compile": "pass --end-token E to compile",
        "compile with export_subsets=True": "compile with --export-subsets",
        "compile with export_beam_sizes=... to add": "compile with --beam-sizes M,... to add",
        "spellings='any': no token": "--spellings any: no token",
        "exists: pass overwrite=True to replace it": "exists: pass --force to replace it",
        "pass add=... and/or remove=...": "pass --add FILE and/or --remove FILE",
        "remove the end_token from compiled.end_token": "remove the --end-token from "
                                                        "compiled.end_token",
        "vocab_size=(4,): expected": "vocab_size=(4,): expected",  # no value to name as a flag
        "input 'end_token.npy' or '/a/end_token.npy'": "input 'end_token.npy' or "
                                                        "'/a/end_token.npy'",
    }
    for library, cli in cases.items():
        assert in_cli_terms(ConstraintSetError(library)) == cli
    dump = "input 'x.ir': end_token=9 is outside the vocabulary [0, 8)"  # the dump's own field
    assert in_cli_terms(IRVerificationError(dump)) == dump


NOT_CLI_PARAMETERS = {
    "accept": "graph input (networkx), which the CLI does not read",
    "split": "sc.BeamAxis of a decode carry, which the CLI's demo model does not declare",
    "pipeline": "the memory budget's advice: it names --memory-budget and --pipeline itself, "
                "then the Python call",
    "enable_prefix_caching": "a vllm.LLM setting the vLLM beam driver asks for, not ours",
    "ranked": "warm's option for ranked subsets, which only the Python API makes",
}


def test_every_parameter_a_library_message_advises_has_a_flag():
    """A `name=...` / `name=True` in a library string (not a docstring) is
    advice to pass a parameter: the CLI words each as its flag (`FLAGS`),
    or it is one no CLI command sets."""
    from static_compiler.cli.common import FLAGS

    advice = re.compile(r"(?<![\w.-])([a-z][a-z0-9_]*)=(\.\.\.|True)")
    named = {}
    for path in sorted((REPO / "static_compiler").rglob("*.py")):
        if path.parent.name == "cli":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docs:
                for m in advice.finditer(node.value):
                    named.setdefault(m.group(1), f"{path.relative_to(REPO)}:{node.lineno}")
    unmapped = {name: where for name, where in named.items()
                if name not in FLAGS and name not in NOT_CLI_PARAMETERS}
    assert not unmapped, f"library messages advise parameters the CLI does not word: {unmapped}"


# -- show-ir --help lists every input it accepts -----------

def input_help(command: str) -> str:
    from static_compiler.cli import dispatch

    sub = next(a for a in dispatch.build_parser()._actions if a.dest == "command")
    return next(a.help for a in sub.choices[command]._actions if a.dest == "input")


def test_show_ir_and_compile_help_list_the_same_inputs(capsys):
    show, comp = input_help("show-ir"), input_help("compile")
    for fmt in (".npy", "padded with -1", ".jsonl (one JSON list of token ids per line)",
                "IR text dump", "one space-separated sequence per line", "--tokenizer",
                "one name per line", 'object with a "name"'):
        assert fmt in show and fmt in comp, fmt
    assert show.endswith(comp.split(": ", 1)[1]) and "artifact directory" in show
    with pytest.raises(SystemExit) as e:
        main(["show-ir", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and ".jsonl (one JSON list of token ids per line)" in out
