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


@st.composite
def random_dags(draw, max_vocab: int = 40, max_depth: int = 4, max_states: int = 6):
    """A layered DAG automaton with explicit targets (states share children,
    as after suffix merging): every state has >= 1 edge, every state at the
    next depth is entered. Returns the `ir.Automaton`."""
    import numpy as np

    from static_compiler.ir import Automaton, Layer

    vocab_size = draw(st.integers(1, max_vocab))
    depth = draw(st.integers(1, max_depth))
    widths = [1] + [draw(st.integers(1, max_states)) for _ in range(depth)]
    layers, paths = [], np.ones(1, dtype=object)  # paths[s]: number of root->s paths
    for t in range(depth):
        rows, targets = [], []
        for _ in range(widths[t]):
            toks = draw(st.lists(st.integers(0, vocab_size - 1), min_size=1,
                                 max_size=min(vocab_size, 5), unique=True))
            rows.append(sorted(toks))
            targets.append([draw(st.integers(0, widths[t + 1] - 1)) for _ in toks])
        flat_targets = [x for row in targets for x in row]
        if len(flat_targets) < widths[t + 1]:  # too few edges to enter every next state
            widths[t + 1] = len(flat_targets)
            flat_targets = list(range(widths[t + 1]))
        missing = sorted(set(range(widths[t + 1])) - set(flat_targets))
        for i, s in enumerate(missing):  # reroute edges whose target is entered twice
            counts = {x: flat_targets.count(x) for x in flat_targets}
            j = next(j for j, x in enumerate(flat_targets) if counts[x] > 1)
            flat_targets[j] = s
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        layers.append(Layer(indptr=indptr, tokens=np.array([x for r in rows for x in r]),
                            targets=np.array(flat_targets)))
        nxt = np.zeros(widths[t + 1], dtype=object)
        src = np.repeat(np.arange(widths[t]), np.diff(indptr))
        for e, target in enumerate(flat_targets):
            nxt[target] += paths[src[e]]
        paths = nxt
    return Automaton(vocab_size=vocab_size, layers=tuple(layers), num_final_states=widths[-1],
                     num_sequences=int(paths.sum()))
