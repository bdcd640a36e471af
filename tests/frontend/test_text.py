"""Text catalogues: names compiled with a tokenizer (a plain callable, a BPE
`tokenizers.Tokenizer` trained here on the catalogue, a transformers-like
tokenizer), names kept through decoding, the artifact and the CLI, and every
bad catalogue rejected with an error naming the name and the token.

Tests that need the `tokenizers` package (the `text` extra) skip without it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import oracle
import pytest
from helpers import run_cli

import static_compiler as sc
from static_compiler import artifact, serving
from static_compiler.errors import ArtifactFormatError, ConstraintSetError, DecodeInputError
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import FileEntry
from static_compiler.frontend import readers, text

CITIES = ["New York", "New York City", "Newark", "New", "Zürich", "São Paulo", "東京",
          "Kraków", "Los Angeles", "Las Vegas", "Lagos", "Lima", "Paris", "Parma"]
END = 0


def chars(name: str) -> list:
    """Per-character ids (code point mod 255, plus one, so 0 stays the end token)."""
    return [ord(c) % 255 + 1 for c in name]


def train_bpe(names, vocab_size=300):
    """A byte-level BPE tokenizer trained on `names` (no download), with
    special tokens <pad>=0, </s>=1, <s>=2 and a post-processor that adds <s>
    when asked for special tokens."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(names, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    return tok


def result_of(tokens, lengths, valid=None):
    """A DecodeResult (batch 1) holding the given sequences, end token appended."""
    width = max(len(t) for t in tokens) + 1
    mat = np.full((1, len(tokens), width), sc.PAD_TOKEN, np.int32)
    for m, t in enumerate(tokens):
        mat[0, m, :len(t) + 1] = list(t) + [END]
    valid = np.ones((1, len(tokens)), bool) if valid is None else np.asarray([valid])
    return sc.DecodeResult(mat, np.zeros(valid.shape, np.float32), valid,
                           np.asarray([lengths], np.int32))


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(CITIES)


@pytest.fixture(scope="module")
def compiled_chars():
    return sc.compile_constraints(CITIES, vocab_size=256, tokenizer=chars, end_token=END,
                                  export_beam_sizes=(6,))


# ----- compiling -----

def test_a_callable_tokenizer_compiles_the_catalogue(compiled_chars):
    c = compiled_chars
    assert c.ir.num_sequences == len(CITIES) == len(c.names)
    assert c.build.frontend_stats["text"] == {"names": 14, "items": 14, "duplicates": 0,
                                        "end_token": END, "end_token_from": "argument",
                                        "spellings": "canonical"}
    assert sorted(c.names.names) == sorted(CITIES)
    rows = [tuple(int(t) for t in row if t >= 0) for row in c.names.tokens]
    assert rows == sorted(rows) and rows == sorted(tuple(chars(n)) for n in CITIES)
    for name in CITIES:
        assert c.names.name_of(chars(name)) == name
    assert c.names.name_of(chars("New Yo")) is None


def test_the_same_set_as_compiling_the_token_ids(compiled_chars):
    ids = sc.compile_constraints([chars(n) for n in CITIES], vocab_size=256, end_token=END)
    assert compiled_chars.ir == ids.ir


def test_chunked_encoding_gives_the_same_set_and_names_the_right_name(monkeypatch,
                                                                     compiled_chars):
    """Names are encoded ENCODE_CHUNK at a time: the same set, names and item
    index as one call, and an error in a later chunk names the name's index
    in the catalogue."""
    monkeypatch.setattr(text, "ENCODE_CHUNK", 3)
    c = sc.compile_constraints(CITIES, vocab_size=256, tokenizer=chars, end_token=END,
                               export_beam_sizes=(6,))
    assert c.ir == compiled_chars.ir
    assert c.names.names == compiled_chars.names.names
    assert c.names.aliases == compiled_chars.names.aliases
    assert np.array_equal(c.names.tokens, compiled_chars.names.tokens)
    assert c.build.frontend_stats["text"] == compiled_chars.build.frontend_stats["text"]
    with pytest.raises(ConstraintSetError, match="name 7 'Kraków' encodes to no tokens"):
        sc.compile_constraints(CITIES, vocab_size=256, end_token=END,
                               tokenizer=lambda s: [] if s == "Kraków" else chars(s))


def test_names_that_encode_alike_are_one_item_with_aliases():
    upper = lambda s: chars(s.upper())
    c = sc.compile_constraints(["Paris", "PARIS", "paris", "Lima", "Paris", "Lim"], vocab_size=256,
                               tokenizer=upper, end_token=END)
    text = c.build.frontend_stats["text"]
    assert text["items"] == 3 and text["duplicates"] == 3
    assert c.ir.num_sequences == 3
    by_name = dict(zip(c.names.names, c.names.aliases))
    assert by_name == {"Lim": (), "Lima": (), "Paris": ("PARIS", "paris")}  # first name kept


def test_one_name_fixed_length_needs_no_end_token():
    c = sc.compile_constraints(["ab", "cd"], vocab_size=256, tokenizer=chars)
    assert c.plan.end_token is None and c.build.frontend_stats["text"]["end_token_from"] is None
    one = sc.compile_constraints(["東京"], vocab_size=256, tokenizer=chars)
    assert one.ir.num_sequences == 1 and one.names.names == ("東京",)


def test_the_adapter_end_token_is_used_unless_one_is_given():
    adapter = text.CallableTokenizer(chars, end_token=END)
    c = sc.compile_constraints(["a", "ab"], vocab_size=256, tokenizer=adapter)
    assert c.plan.end_token == END and c.build.frontend_stats["text"]["end_token_from"] == "tokenizer"
    c = sc.compile_constraints(["a", "ab"], vocab_size=256, tokenizer=adapter, end_token=255)
    assert c.plan.end_token == 255 and c.build.frontend_stats["text"]["end_token_from"] == "argument"


def test_a_bpe_tokenizer_trained_on_the_catalogue(bpe):
    V = bpe.get_vocab_size()
    c = sc.compile_constraints(CITIES, vocab_size=V, tokenizer=bpe)
    assert c.plan.end_token == bpe.token_to_id("</s>") == 1
    assert c.ir.num_sequences == len(CITIES)
    for name, row in zip(c.names.names, c.names.tokens):
        ids = [int(t) for t in row if t >= 0]
        assert ids == bpe.encode(name, add_special_tokens=False).ids
        assert bpe.decode(ids) == name
    assert c.names.name_of(bpe.encode("Zürich", add_special_tokens=False).ids) == "Zürich"


def test_special_tokens_only_when_asked(bpe):
    plain = text.HFTokenizer(bpe).encode_batch(["Paris"])[0]
    special = text.HFTokenizer(bpe, add_special_tokens=True).encode_batch(["Paris"])[0]
    assert special == [2] + plain
    c = sc.compile_constraints(CITIES, vocab_size=bpe.get_vocab_size(),
                               tokenizer=text.HFTokenizer(bpe, add_special_tokens=True))
    assert {int(row[0]) for row in c.names.tokens} == {2}


class FakeTransformersTokenizer:
    """The part of transformers' PreTrainedTokenizer API the adapter uses."""

    eos_token_id = END

    def convert_tokens_to_ids(self, token):
        return {"</s>": END}.get(token)

    def __call__(self, names, add_special_tokens=True):
        bos = [255] if add_special_tokens else []
        return {"input_ids": [bos + chars(n) for n in names]}


def test_a_transformers_like_tokenizer_gives_its_eos_and_no_special_tokens():
    c = sc.compile_constraints(["Lima", "Lim"], vocab_size=256,
                               tokenizer=FakeTransformersTokenizer())
    assert c.plan.end_token == END
    assert c.names.name_of(chars("Lima")) == "Lima"
    asked = text.TransformersTokenizer(FakeTransformersTokenizer(), add_special_tokens=True)
    assert asked.encode_batch(["a"]) == [[255, chars("a")[0]]]


def test_a_real_transformers_fast_tokenizer(bpe):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    c = sc.compile_constraints(CITIES, vocab_size=bpe.get_vocab_size(), tokenizer=fast)
    assert c.plan.end_token == 1 and sorted(c.names.names) == sorted(CITIES)


# ----- bad catalogues -----

@pytest.mark.parametrize("names, kwargs, match", [
    ([], {}, r"empty catalogue"),
    ("Paris", {}, r"names of type str: expected a sequence of str"),
    (["Paris", 3], {}, r"name 1 is 3 \(int\): expected str"),
    (["Paris", b"Lima"], {}, r"name 1 is b'Lima' \(bytes\)"),
    (["Paris", ""], {}, r"name 1 '' encodes to no tokens"),
    (["Lima", "Ω"], dict(vocab_size=150),
     r"name 1 'Ω', token 0: id 173 is outside the vocabulary \[0, 150\)"),
    (["Lima", "Lim"], dict(end_token=None), r"names encode to 3..4 tokens .* pass end_token="),
    (["Paris", "L\x00ma"], dict(end_token=1), r"name 1 'L\\x00ma', token 1: is the end token 1 \(from the "
                               r"argument\)"),
    (["Paris"], dict(end_token=300), r"end_token=300: expected an int in \[0, 256\)"),
])
def test_bad_catalogues_name_the_name_and_token(names, kwargs, match):
    kwargs = {"vocab_size": 256, "end_token": END, **kwargs}
    with pytest.raises(ConstraintSetError, match=match):
        sc.compile_constraints(names, tokenizer=chars, **kwargs)


def test_a_tokenizer_that_returns_no_ints_is_named():
    with pytest.raises(ConstraintSetError, match=r"name 0 'ab': the tokenizer returned 'a' \(str\)"):
        sc.compile_constraints(["ab"], vocab_size=256, tokenizer=list)
    with pytest.raises(ConstraintSetError, match=r"returned 1 encodings for 2 names"):
        sc.compile_constraints(["a", "b"], vocab_size=256, tokenizer=_OneEncoding())
    with pytest.raises(ConstraintSetError, match=r"tokenizer of type int: expected a callable"):
        sc.compile_constraints(["a"], vocab_size=256, tokenizer=3)


class _OneEncoding:
    end_token = None

    def encode_batch(self, names):
        return [[1]]


def test_names_without_a_tokenizer_say_to_pass_one():
    with pytest.raises(ConstraintSetError, match=r"constraints hold names \('Paris', \.\.\.\): "
                                                 r"pass tokenizer="):
        sc.compile_constraints(["Paris", "Lima"], vocab_size=256)


def test_a_tokenizer_file_that_is_missing_or_bad(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(ConstraintSetError, match=r"no such file"):
        text.load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConstraintSetError, match=r"not a tokenizers JSON file"):
        text.load_tokenizer(tmp_path / "bad.json")


# ----- decoding back to names -----

def test_beam_search_returns_only_catalogue_names(bpe):
    V = bpe.get_vocab_size()
    compiled = sc.compile_constraints(CITIES, vocab_size=V, tokenizer=bpe)
    model = oracle.HashModel(V)
    beams = 8
    result = sc.beam_search(compiled, model, batch_size=2, beam_size=beams,
                            carry=model.init_carry([1, 2], beams), carry_axes=model.carry_axes)
    texts = compiled.texts(result)
    assert len(texts) == 2 and all(len(row) == beams for row in texts)
    valid = np.asarray(result.valid)
    assert valid.all()  # 14 names, 8 beams: every beam holds one
    for b, row in enumerate(texts):
        assert len(set(row)) == beams and set(row) <= set(CITIES)
        for m, name in enumerate(row):
            n = int(result.lengths[b, m])
            assert bpe.decode([int(t) for t in result.tokens[b, m, :n]]) == name


def test_texts_are_none_for_invalid_beams_and_reject_foreign_results(compiled_chars):
    c = compiled_chars
    got = c.texts(result_of([chars("Lima"), chars("New")], [4, 3], valid=[True, False]))
    assert got == [["Lima", None]]
    with pytest.raises(DecodeInputError, match=r"beam \(0, 0\) holds tokens \[77, 106\], which "
                                               r"are no item of this catalogue of 14 names"):
        c.texts(result_of([chars("Li")], [2]))
    bad = result_of([chars("Lima")], [4])._replace(lengths=np.zeros((2, 1), np.int32))
    with pytest.raises(DecodeInputError, match=r"do not describe one result"):
        c.texts(bad)
    ids = sc.compile_constraints([[1, 2]], vocab_size=4)
    with pytest.raises(DecodeInputError, match=r"compiled from token ids"):
        ids.texts(result_of([[1, 2]], [2]))


# ----- the artifact -----

@pytest.fixture(scope="module")
def saved(compiled_chars, tmp_path_factory):
    return artifact.save(compiled_chars, tmp_path_factory.mktemp("text") / "cities.static")


def test_names_survive_save_and_load(compiled_chars, saved):
    manifest = serving.read_manifest(saved)
    assert manifest.format_version == fmt.FORMAT_VERSION and manifest.names_file == "names.jsonl"
    assert "names.jsonl" in manifest.files
    lines = [json.loads(line) for line in (saved / "names.jsonl").read_text("utf-8").splitlines()]
    assert [(o["name"], o["tokens"]) for o in lines] == [
        (n, [int(t) for t in row if t >= 0])
        for n, row in zip(compiled_chars.names.names, compiled_chars.names.tokens)]
    art = serving.load(saved)
    assert art.names.names == compiled_chars.names.names
    assert art.names.to_jsonl() == compiled_chars.names.to_jsonl()
    assert artifact.read_names(saved).names == compiled_chars.names.names
    result = result_of([chars("Zürich"), chars("東京")], [6, 2])
    assert art.texts(result) == compiled_chars.texts(result) == [["Zürich", "東京"]]


def test_decoding_through_the_artifact_gives_names(compiled_chars, saved):
    art = serving.load(saved)
    model = oracle.HashModel(256)
    result = sc.beam_search(compiled_chars, model, batch_size=1, beam_size=6,
                            carry=model.init_carry([5], 6), carry_axes=model.carry_axes)
    assert art.texts(result) == compiled_chars.texts(result)
    assert set(art.texts(result)[0]) <= set(CITIES)


@pytest.fixture
def copy(saved, tmp_path):
    dst = tmp_path / "copy.static"
    shutil.copytree(saved, dst)
    return dst


def rewrite(path, rel, data: bytes):
    """Replaces file `rel` and updates the manifest's size and sha256 (a
    consistent artifact with different content)."""
    (path / rel).write_bytes(data)
    m = json.loads((path / fmt.MANIFEST_FILE).read_text())
    m["files"][rel] = FileEntry.of_bytes(data).to_json()
    (path / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(m))


@pytest.mark.parametrize("content, match", [
    (b'{"name": "Lima"}\n', r"names.jsonl line 1 has no key 'tokens'"),
    (b'{"name": "Lima", "tokens": []}\n', r"names.jsonl line 1: tokens \[\] are not"),
    (b'{"name": 3, "tokens": [1]}\n', r"names.jsonl line 1\['name'\] is 3"),
    (b'not json\n', r"names.jsonl line 1 is not JSON"),
    (b'\xff\n', r"names.jsonl is not UTF-8"),
    (b'{"name": "Lima", "tokens": [1, 2]}\n', r"names.jsonl holds 1 names, the manifest records 14"),
])
def test_a_damaged_names_file_is_named(copy, content, match):
    rewrite(copy, "names.jsonl", content)
    with pytest.raises(ArtifactFormatError, match=match):
        serving.load(copy)


def test_a_names_file_the_manifest_does_not_list(copy):
    original = (copy / fmt.MANIFEST_FILE).read_bytes()
    m = json.loads(original)
    m["names_file"] = None
    m["files"].pop("names.jsonl")
    (copy / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(m))
    with pytest.raises(ArtifactFormatError, match=r"extra file\(s\) \['names.jsonl'\]"):
        serving.load(copy)
    m = json.loads(original)
    m["names_file"] = "other.jsonl"
    (copy / fmt.MANIFEST_FILE).write_bytes(fmt.seal_manifest(m))
    with pytest.raises(ArtifactFormatError, match=r"names_file names file 'other.jsonl', which "
                                                  r"is not among the manifest's files"):
        serving.load(copy)


# ----- files and the command line -----

def test_read_names_keeps_lines_as_written(tmp_path):
    path = tmp_path / "names.txt"
    path.write_bytes("\ufeffNew York\r\n\n # not a comment\nZürich \n".encode("utf-8"))
    assert readers.read_names(path) == ["New York", " # not a comment", "Zürich "]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ConstraintSetError, match=r"no names found"):
        readers.read_names(tmp_path / "empty.txt")


def test_cli_compile_decode_and_show_ir_print_names(bpe, tmp_path, capsys):
    (tmp_path / "names.txt").write_text("\n".join(CITIES) + "\n", encoding="utf-8")
    bpe.save(str(tmp_path / "tokenizer.json"))
    V = bpe.get_vocab_size()
    art = tmp_path / "cities.static"
    code, out, err = run_cli(capsys, "compile", tmp_path / "names.txt", "--tokenizer",
                             tmp_path / "tokenizer.json", "--vocab-size", V, "-o", art,
                             "--beam-sizes", "4")
    assert code == 0, err
    assert f"wrote {art}: {len(CITIES)} sequences" in out
    assert f"{len(CITIES)} names -> {len(CITIES)} items (0 names share" in err
    assert sorted(serving.load(art).names.names) == sorted(CITIES)

    code, out, err = run_cli(capsys, "decode", art, "--top", "3")
    assert code == 0, err
    shown = [line for line in out.splitlines() if line.startswith("  #")]
    assert len(shown) == 6 and all(line.rsplit("  ", 1)[1].strip("'") in CITIES for line in shown)

    code, out, _ = run_cli(capsys, "show-ir", art, "--max-names", "3")
    assert code == 0
    assert f"names items={len(CITIES)} aliases=0" in out and "... 11 more (--max-names)" in out
    code, out, _ = run_cli(capsys, "show-ir", tmp_path / "names.txt", "--tokenizer",
                           tmp_path / "tokenizer.json", "--vocab-size", V)
    assert code == 0 and out.startswith("automaton ") and "'Zürich'" in out

    code, out, err = run_cli(capsys, "verify", art, "--input", tmp_path / "names.txt",
                             "--tokenizer", tmp_path / "tokenizer.json")
    assert code == 0, err
    assert f"{len(CITIES)} unique input sequences: OK" in out
    (tmp_path / "more.txt").write_text("\n".join(CITIES[1:] + ["Quito"]) + "\n", encoding="utf-8")
    code, out, _ = run_cli(capsys, "verify", art, "--input", tmp_path / "more.txt",
                           "--tokenizer", tmp_path / "tokenizer.json")
    assert code == 1 and "1 sequences in the input but not in the artifact" in out
    assert "1 sequences in the artifact but not in the input" in out
    code, _, err = run_cli(capsys, "verify", art, "--tokenizer", tmp_path / "tokenizer.json")
    assert code == 2 and "--tokenizer goes with --input" in err


def test_cli_text_catalogue_errors(tmp_path, capsys):
    (tmp_path / "names.txt").write_text("Lima\n", encoding="utf-8")
    pytest.importorskip("tokenizers")
    code, _, err = run_cli(capsys, "compile", tmp_path / "names.txt", "--tokenizer",
                           tmp_path / "tokenizer.json", "--vocab-size", 10, "-o",
                           tmp_path / "a.static")
    assert code == 2 and "tokenizer.json'" in err and "no such file" in err


# ----- token id rows back to names (generate's output) -----

def _generated(compiled, names, prompt, pad=END, width=None):
    """Rows as `generate` returns them: the prompt, each name's tokens, the
    end token, then `pad` up to `width`."""
    rows = [list(prompt) + chars(n) + ([compiled.end_token] if compiled.end_token is not None
                                       else []) for n in names]
    width = width or max(map(len, rows))
    return np.array([r + [pad] * (width - len(r)) for r in rows])


def test_texts_of_token_rows_drop_the_prompt_and_the_padding(compiled_chars):
    rows = _generated(compiled_chars, ["Lima", "New York City", "New"], [7, 7, 9], pad=3)
    assert compiled_chars.texts(rows, prompt_length=3) == ["Lima", "New York City", "New"]
    torch = pytest.importorskip("torch")
    assert compiled_chars.texts(torch.from_numpy(rows), prompt_length=3) == \
        ["Lima", "New York City", "New"]
    # no prompt: the prompt's tokens would be read as the name's
    assert compiled_chars.texts(rows, prompt_length=0) == [None, None, None]
    assert compiled_chars.texts(rows[:, 3:]) == ["Lima", "New York City", "New"]
    # a row cut before its end token, a row of a name not in the set, an end token first
    odd = np.array([r + [3] * (15 - len(r)) for r in ([5] + chars("New York"),
                                                      [5] + chars("Quito") + [END],
                                                      [5, END] + chars("Lima") + [END])])
    assert compiled_chars.texts(odd, prompt_length=1) == [None, None, None]
    assert compiled_chars.texts(odd[:, :6], prompt_length=1) == [None] * 3


def test_texts_of_token_rows_of_a_fixed_length_set():
    fixed = sc.compile_constraints(["Lima", "Rome", "Oslo"], vocab_size=256, tokenizer=chars)
    assert fixed.end_token is None
    rows = np.array([[9] + chars("Rome") + [0, 0], [9] + chars("Oslo") + [1, 2],
                     [9] + chars("Lim") + [0, 0, 0]])
    assert fixed.texts(rows, prompt_length=1) == ["Rome", "Oslo", None]
    assert fixed.texts(rows[:, :4], prompt_length=1) == [None] * 3  # too short for 4 tokens


def test_texts_of_an_object_with_sequences(compiled_chars):
    class Generated:  # what generate(..., return_dict_in_generate=True) returns
        sequences = _generated(compiled_chars, ["Paris", "Parma"], [1, 2])

    assert compiled_chars.texts(Generated(), prompt_length=2) == ["Paris", "Parma"]


@pytest.mark.parametrize("rows, kwargs, match", [
    (np.zeros((2, 3), np.float32), {}, r"texts: got float32\[2, 3\]: expected a decoding result, "
                                       r"or token id rows int \(N, T\)"),
    (np.zeros(4, np.int64), {}, r"got int64\[4\]"),
    ([[1, 2], [3]], {}, r"got object"),
    (np.zeros((2, 3), np.int64), {"prompt_length": 4}, r"prompt_length=4: expected an int in "
                                                       r"\[0, 3\]"),
    (np.zeros((2, 3), np.int64), {"prompt_length": -1}, r"prompt_length=-1"),
    (np.zeros((2, 3), np.int64), {"prompt_length": 1.0}, r"prompt_length=1.0"),
    (np.zeros((2, 3), np.int64), {"prompt_length": True}, r"prompt_length=True"),
])
def test_bad_token_rows_are_named(compiled_chars, rows, kwargs, match):
    with pytest.raises(DecodeInputError, match=match):
        compiled_chars.texts(rows, **kwargs)


def test_prompt_length_with_a_decoding_result_is_refused(compiled_chars):
    with pytest.raises(DecodeInputError, match=r"prompt_length=2 applies to rows of token ids"):
        compiled_chars.texts(result_of([chars("Lima")], [5]), prompt_length=2)


# ----- the vocabulary size from the tokenizer, and a tokenizer.json path -----

def test_vocab_size_comes_from_the_tokenizer(bpe, tmp_path):
    bpe.save(str(tmp_path / "tokenizer.json"))
    V = bpe.get_vocab_size(with_added_tokens=True)
    given = sc.compile_constraints(CITIES, vocab_size=V, tokenizer=bpe)
    for tokenizer in (bpe, str(tmp_path / "tokenizer.json"), tmp_path / "tokenizer.json"):
        derived = sc.compile_constraints(CITIES, tokenizer=tokenizer)
        assert derived.vocab_size == V and derived.fingerprint == given.fingerprint
    assert sc.compile_constraints(CITIES, V + 100, tokenizer=bpe).vocab_size == V + 100
    with pytest.raises(ConstraintSetError, match=rf"vocab_size={V - 1} is smaller than the "
                                                 rf"tokenizer's vocabulary of {V} tokens"):
        sc.compile_constraints(CITIES, V - 1, tokenizer=tmp_path / "tokenizer.json")
    anyway = sc.compile_constraints(["Lima"], tokenizer=tmp_path / "tokenizer.json",
                                    spellings="any")
    assert anyway.vocab_size == V


def test_vocab_size_counts_added_tokens(bpe):
    import copy

    grown = copy.deepcopy(bpe)
    grown.add_tokens(["<city>", "<country>"])
    V = grown.get_vocab_size(with_added_tokens=True)
    assert V == bpe.get_vocab_size(with_added_tokens=True) + 2
    assert sc.compile_constraints(CITIES, tokenizer=grown).vocab_size == V
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=grown, eos_token="</s>")
    assert len(fast) == V and sc.compile_constraints(CITIES, tokenizer=fast).vocab_size == V


def test_vocab_size_without_a_tokenizer_that_knows_it():
    with pytest.raises(ConstraintSetError, match=r"vocab_size=None with a tokenizer of type "
                                                 r"CallableTokenizer.*pass vocab_size=V"):
        sc.compile_constraints(CITIES, tokenizer=chars, end_token=END)
    with pytest.raises(ConstraintSetError, match=r"vocab_size=None: expected a positive int"):
        sc.compile_constraints([[1, 2], [2, 3]])
    adapter = text.CallableTokenizer(chars, end_token=END, vocab_size=256)
    assert sc.compile_constraints(CITIES, tokenizer=adapter).vocab_size == 256


def test_a_missing_tokenizer_path_is_named(tmp_path):
    with pytest.raises(ConstraintSetError, match=r"tokenizer '.*nope.json': no such file"):
        sc.compile_constraints(CITIES, tokenizer=tmp_path / "nope.json")


def test_cli_compile_takes_the_vocab_size_from_the_tokenizer(bpe, tmp_path, capsys):
    (tmp_path / "names.txt").write_text("\n".join(CITIES) + "\n", encoding="utf-8")
    bpe.save(str(tmp_path / "tokenizer.json"))
    code, out, err = run_cli(capsys, "compile", tmp_path / "names.txt", "--tokenizer",
                             tmp_path / "tokenizer.json", "-o", tmp_path / "a.static")
    assert code == 0, err
    assert f"vocab {bpe.get_vocab_size(with_added_tokens=True)}," in out
    code, _, err = run_cli(capsys, "compile", tmp_path / "names.txt", "--tokenizer",
                           tmp_path / "tokenizer.json", "--vocab-size", 5, "-o",
                           tmp_path / "b.static")
    assert code == 2 and "--vocab-size 5 is smaller than the tokenizer's vocabulary" in err
