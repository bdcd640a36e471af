"""The real-world set: every Unicode character name, word-tokenized. The
dataset round-trips through `unicodedata.lookup`, minimizing keeps its
language, and beam search over it only ever produces real character names."""

import unicodedata

import numpy as np
import oracle
import pytest

import static_compiler as sc
from static_compiler.frontend import build_automaton, datasets
from static_compiler.ir.merge_states import minimize_automaton


@pytest.fixture(scope="module")
def names():
    return datasets.unicode_names()


def character_of(words) -> str:
    """The character whose name is `words` joined by spaces; raises KeyError
    when it is not a character name (aliases and named sequences excluded)."""
    name = " ".join(words)
    char = unicodedata.lookup(name)
    if len(char) != 1 or unicodedata.name(char, None) != name:
        raise KeyError(f"{name!r} is an alias or a named sequence, not a character name")
    return char


def test_dataset_is_every_character_name_word_tokenized(names):
    sequences, V, end, id_to_word = names
    assert end == datasets.UNICODE_END_TOKEN == 0 and id_to_word[0] == "<end>"
    assert V == len(id_to_word) == len(set(id_to_word))
    want = [unicodedata.name(chr(cp)) for cp in range(0x110000) if unicodedata.name(chr(cp), None)]
    assert [" ".join(id_to_word[t] for t in seq) for seq in sequences] == want
    assert len(set(sequences)) == len(sequences)
    assert all(0 not in seq for seq in sequences)
    lengths = [len(s) for s in sequences]
    assert min(lengths) == 1 and max(lengths) >= 10
    counts = np.bincount(np.concatenate([np.asarray(s) for s in sequences]), minlength=V)
    assert counts[0] == 0 and (counts[1:] > 0).all()
    assert (np.diff(counts[1:]) <= 0).all()  # ids by descending frequency
    assert datasets.unicode_names() is names  # cached


def test_dataset_table_entry(names):
    sequences, V, end, _ = names
    full = datasets.load_dataset("unicode-names", 10 ** 7, seed=0)
    assert full.sequences == sequences and full.vocab_size == V and full.end_token == end
    part = datasets.load_dataset("unicode-names", 500, seed=3)
    assert len(part.sequences) == 500 and part.vocab_size == V
    assert set(part.sequences) <= set(sequences)
    assert part.sequences == datasets.load_dataset("unicode-names", 500, seed=3).sequences
    assert part.sequences != datasets.load_dataset("unicode-names", 500, seed=4).sequences
    assert "unicode-names" in datasets.DATASETS


def test_minimize_keeps_every_name(names):
    sequences, V, end, _ = names
    trie = build_automaton(sequences, V, end_token=end)
    small, stats = minimize_automaton(trie)
    assert stats.applied and stats.bytes_after < stats.bytes_before
    assert small.num_states < trie.num_states // 10  # suffixes like "WITH ACUTE" are shared
    assert list(small.sequences()) == sorted(sequences)


def test_beam_search_outputs_real_character_names(names):
    sequences, V, end, id_to_word = names
    compiled = sc.compile_constraints(sequences, V, end_token=end)
    assert compiled.ir.num_sequences == len(sequences)
    model = oracle.HashModel(V, dup=20)
    B, M = 2, 6
    result = sc.beam_search(compiled, model, batch_size=B, beam_size=M,
                            carry_axes=model.carry_axes, carry=model.init_carry([7, 8], M))
    tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
    assert np.asarray(result.valid).all()
    decoded = set()
    for b in range(B):
        for j in range(M):
            n = int(lengths[b, j])
            words = [id_to_word[t] for t in tokens[b, j, :n]]
            character_of(words)  # raises unless a real character name
            assert tokens[b, j, n] == end and (tokens[b, j, n + 1:] == sc.PAD_TOKEN).all()
            decoded.add(tuple(tokens[b, j, :n]))
    assert decoded <= set(sequences)
