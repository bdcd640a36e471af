"""Hypothesis strategies for constraint sets and brute-force oracles of the
trie they must compile to (shared by the compiler-core tests)."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def token_alphabets(draw, vocab_size: int, exclude=None):
    """Tokens to draw from: a few (forces shared prefixes) or the whole vocabulary."""
    allowed = [v for v in range(vocab_size) if v != exclude] if vocab_size <= 4096 else None
    small = st.lists(st.integers(0, vocab_size - 1).filter(lambda v: v != exclude),
                     min_size=1, max_size=min(4, vocab_size), unique=True)
    alphabet = draw(st.one_of(small, st.just(allowed)) if allowed else small)
    return alphabet


@st.composite
def fixed_length_sets(draw, max_vocab: int = 300, max_length: int = 6, max_items: int = 30,
                      min_vocab: int = 1):
    """(rows: list of equal-length lists, vocab_size): unsorted, with duplicates."""
    vocab_size = draw(st.integers(min_vocab, max_vocab))
    length = draw(st.integers(1, max_length))
    alphabet = draw(token_alphabets(vocab_size))
    rows = draw(st.lists(st.lists(st.sampled_from(alphabet), min_size=length, max_size=length),
                         min_size=1, max_size=max_items))
    repeats = draw(st.lists(st.integers(0, len(rows) - 1), max_size=4))
    rows = rows + [list(rows[i]) for i in repeats]
    return draw(st.permutations(rows)), vocab_size


@st.composite
def ragged_sets(draw, max_vocab: int = 300, max_length: int = 6, max_items: int = 30):
    """(rows of lengths 1..max_length, vocab_size, end_token); rows never
    contain end_token; prefixes of other rows are likely."""
    vocab_size = draw(st.integers(2, max_vocab))
    end_token = draw(st.integers(0, vocab_size - 1))
    alphabet = draw(token_alphabets(vocab_size, exclude=end_token))
    rows = draw(st.lists(st.lists(st.sampled_from(alphabet), min_size=1, max_size=max_length),
                         min_size=1, max_size=max_items))
    cut = draw(st.lists(st.tuples(st.integers(0, len(rows) - 1), st.integers(1, max_length)),
                        max_size=4))
    rows = rows + [rows[i][:k] for i, k in cut]  # prefixes of existing rows
    return draw(st.permutations(rows)), vocab_size, end_token


def unique_sorted(rows) -> list:
    """The oracle for `Automaton.sequences()`: sorted distinct tuples."""
    return sorted(set(tuple(int(t) for t in r) for r in rows))


def trie_shape(rows) -> dict:
    """Brute-force trie counts: for each depth t, the number of states
    (distinct prefixes of length t), and which of them end a sequence."""
    seqs = unique_sorted(rows)
    depth = max(len(s) for s in seqs)
    states = [sorted(set(s[:t] for s in seqs if len(s) >= t)) for t in range(depth + 1)]
    ending = set(seqs)
    return {
        "depth": depth,
        "states": [len(p) for p in states],
        "accepting": [[p in ending for p in prefixes] for prefixes in states],
    }
