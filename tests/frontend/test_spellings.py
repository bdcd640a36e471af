"""``spellings="any"``: every token sequence whose bytes spell a name,
against a brute-force oracle (all spellings by recursion over the
vocabulary), on catalogues with shared prefixes, names that are prefixes
of others, non-ASCII names and random names (hypothesis); decoding stays
inside it; bad input is named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_text import CITIES, train_bpe

import static_compiler as sc
from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import spellings, text
from static_compiler.ir import enumerate_sequences

END = 1  # train_bpe's </s>


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(CITIES + ["Newcastle", "Nairobi", "Nara"])


def oracle_spellings(names, tok, vocab_size: int) -> set:
    """Every tuple of non-special tokens whose bytes are a name's canonical
    bytes, then END (recursion over the vocabulary)."""
    table = spellings.token_bytes(text.as_adapter(tok), vocab_size)
    out = set()
    for name in names:
        ids = tok.encode(name, add_special_tokens=False).ids
        target = b"".join(table[i] for i in ids)

        def walk(pos, prefix):
            if pos == len(target):
                out.add(prefix + (END,))
            for i, b in enumerate(table):
                if b and target.startswith(b, pos):
                    walk(pos + len(b), prefix + (i,))
        walk(0, ())
    return out


def compiled_sequences(compiled) -> set:
    tokens, lengths = enumerate_sequences(compiled.ir)
    return {tuple(int(t) for t in row[:n]) + (END,) for row, n in zip(tokens, lengths)}


def test_every_spelling_and_nothing_else(bpe):
    names = CITIES + ["Nara", "Nairobi"]
    V = bpe.get_vocab_size()
    compiled = sc.compile_constraints(names, vocab_size=V, tokenizer=bpe, spellings="any")
    want = oracle_spellings(names, bpe, V)
    assert compiled_sequences(compiled) == want
    canonical = {tuple(bpe.encode(n, add_special_tokens=False).ids) + (END,) for n in names}
    assert canonical < want  # the canonical spellings and more
    assert compiled.build.frontend_stats["text"]["spellings"] == "any"
    assert compiled.names is None


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.text(alphabet="abN é東", min_size=1, max_size=6), min_size=1, max_size=6))
def test_random_names_against_the_oracle(bpe, names):
    V = bpe.get_vocab_size()
    compiled = sc.compile_constraints(names, vocab_size=V, tokenizer=bpe, spellings="any")
    assert compiled_sequences(compiled) == oracle_spellings(names, bpe, V)


def test_beam_search_returns_spellings_of_names(bpe):
    names = ["Newark", "New", "Newcastle", "Nara"]
    V = bpe.get_vocab_size()
    compiled = sc.compile_constraints(names, vocab_size=V, tokenizer=bpe, spellings="any",
                                      export_beam_sizes=(16,))
    table = np.random.default_rng(0).standard_normal((V, V)).astype(np.float32)
    import jax.numpy as jnp
    jt = jnp.asarray(table)
    result = sc.beam_search(compiled, lambda last, step, carry: (jt[last], None), batch_size=1,
                            beam_size=16)
    assert np.asarray(result.valid).all()
    texts = set()
    for row, n in zip(np.asarray(result.tokens)[0], np.asarray(result.lengths)[0]):
        texts.add(bpe.decode([int(t) for t in row[:n]]))
    assert texts == set(names)  # 16 beams: several spellings of each name


def test_an_adapter_with_token_bytes():
    vocab = [None, None, b"a", b"b", b"ab", b"ba"]  # 0, 1 special

    class Adapter:
        end_token = END

        def encode_batch(self, names):
            return [[{"a": 2, "b": 3}[c] for c in n] for n in names]

        def token_bytes(self):
            return vocab

    compiled = sc.compile_constraints(["ab", "aba"], vocab_size=6, tokenizer=Adapter(),
                                      spellings="any")
    assert compiled_sequences(compiled) == {(2, 3, END), (4, END), (2, 3, 2, END), (4, 2, END),
                                            (2, 5, END)}


def test_bad_input(bpe):
    V = bpe.get_vocab_size()
    with pytest.raises(ConstraintSetError, match="spellings='every'"):
        sc.compile_constraints(CITIES, vocab_size=V, tokenizer=bpe, spellings="every")
    with pytest.raises(ConstraintSetError, match="'any' only for names with a tokenizer"):
        sc.compile_constraints([[1, 2]], vocab_size=V, spellings="any")
    with pytest.raises(ConstraintSetError, match="keeps no item index"):
        sc.compile_constraints(CITIES, vocab_size=V, tokenizer=bpe, spellings="any",
                               export_subsets=True)
    with pytest.raises(ConstraintSetError, match="needs each token's bytes"):
        sc.compile_constraints(["ab"], vocab_size=8, tokenizer=lambda s: [2, 3], end_token=1,
                               spellings="any")

    class Short:
        end_token = END

        def encode_batch(self, names):
            return [[2] for _ in names]

        def token_bytes(self):
            return [None, None, b"a"]

    with pytest.raises(ConstraintSetError, match="token_bytes\\(\\) gave 3 entries"):
        sc.compile_constraints(["a"], vocab_size=6, tokenizer=Short(), spellings="any")

    class Special(Short):
        def token_bytes(self):
            return [None, None, None, None]

    with pytest.raises(ConstraintSetError, match="name 'a' encodes to token 2, which has no "
                                                 "bytes"):
        sc.compile_constraints(["a"], vocab_size=4, tokenizer=Special(), spellings="any")


def test_cli_compile_with_every_spelling(bpe, tmp_path, capsys):
    from static_compiler import serving
    from static_compiler.cli import main
    names = ["New York", "Newark", "Nara"]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    bpe.save(str(tmp_path / "tokenizer.json"))
    V = bpe.get_vocab_size()
    art = tmp_path / "any.static"
    code = main(["compile", str(tmp_path / "names.txt"), "--tokenizer",
                 str(tmp_path / "tokenizer.json"), "--vocab-size", str(V), "-o", str(art),
                 "--beam-sizes", "4", "--spellings", "any"])
    _, err = capsys.readouterr()
    assert code == 0, err
    loaded = serving.load(art)
    assert loaded.max_length == len("New York") + 1
    assert compiled_sequences(sc.compile_constraints(
        names, vocab_size=V, tokenizer=bpe, spellings="any")) == oracle_spellings(names, bpe, V)
