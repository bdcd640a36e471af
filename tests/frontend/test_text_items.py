"""A text catalogue's items are the names as given: item i is names[i], so a bool mask over the names picks exactly
those names (`subset`, `update(remove=...)`, `serving.Artifact.subset`
after save and load), `item_index` of a name's tokens is the first position
of that name, and names given twice or encoding to the same tokens are one
item. And names.jsonl round-trips every name, line breaks included (U+2028,
U+2029, U+0085 were written raw and split by `str.splitlines`).

Decoding uses all-zero logits with at least as many beams as items, so a
decode over a subset returns every item of that subset.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ConstraintSetError
from static_compiler.format.names import read_names_jsonl

END = 0
V = 256
BEAMS = 8


def chars(name: str) -> list:
    """Per-character ids (code point mod 255, plus one: 0 stays the end token)."""
    return [ord(c) % 255 + 1 for c in name]


def folded(name: str) -> list:
    """`chars` of the lower-cased name: "Ab" and "ab" encode alike."""
    return chars(name.lower())


def utf8(name: str) -> list:
    """The name's UTF-8 bytes plus one: distinct names never collide."""
    return [b + 1 for b in name.encode("utf-8")]


def zeros(tokens, step, carry):
    """All-zero logits (B, M, V): every live item scores alike."""
    return jnp.zeros(tokens.shape + (V,), jnp.float32), carry


def decoded(compiled, subset=None) -> set:
    """The names a beam search over `compiled` (or its `subset`) returns."""
    result = sc.beam_search(compiled, zeros, batch_size=1, beam_size=BEAMS, subset=subset)
    return {name for name in compiled.texts(result)[0] if name is not None}


def served(art, subset=None) -> set:
    """The names the artifact's exported modules decode (zero logits)."""
    state = art.init_beams(1, BEAMS)
    logits = np.zeros((1, BEAMS, art.vocab_size), np.float32)
    for t in range(art.max_length):
        state = art.beam_step(state, logits, t, subset=subset)
    return {name for name in art.texts(art.finalize(state))[0] if name is not None}


def mask_of(n: int, *picked: int) -> np.ndarray:
    mask = np.zeros(n, bool)
    mask[list(picked)] = True
    return mask


# ----- items in the order the names are given -----

ORDER = ["zeta", "alpha", "mid"]
DUPES = ["b", "a", "b", "A", "ab"]  # folded: "b" twice, "a" and "A" alike


@pytest.fixture(scope="module")
def ordered():
    return sc.compile_constraints(ORDER, vocab_size=V, tokenizer=chars, end_token=END,
                                  export_beam_sizes=(BEAMS,), export_subsets=True)


@pytest.fixture(scope="module")
def dupes():
    return sc.compile_constraints(DUPES, vocab_size=V, tokenizer=folded, end_token=END)


def test_item_i_is_the_ith_name_given(ordered):
    assert ordered.items.num_items == len(ORDER)
    np.testing.assert_array_equal(ordered.item_index([chars(n) for n in ORDER]), [0, 1, 2])
    assert decoded(ordered, ordered.subset(mask_of(3, 0))) == {"zeta"}
    assert decoded(ordered, ordered.subset(mask_of(3, 1, 2))) == {"alpha", "mid"}
    assert decoded(ordered) == set(ORDER)


def test_removing_by_a_mask_over_the_names_removes_those_names(ordered):
    version = ordered.update(remove=mask_of(3, 0))
    assert version.build.last_update == {"removed": 1, "already_removed": 0, "absent": 0}
    assert decoded(version) == {"alpha", "mid"}
    assert version.item_index([chars("zeta"), chars("mid")]).tolist() == [-1, 2]
    assert decoded(version.update(remove=mask_of(3, 2))) == {"alpha"}


def test_duplicate_and_colliding_names_are_one_item(dupes):
    c = dupes
    assert c.items.num_items == len(DUPES) and c.items.num_unique == 3
    assert c.build.frontend_stats["text"]["duplicates"] == 2
    # the first position of each name (or of the first name with its tokens)
    assert c.item_index([folded(n) for n in DUPES]).tolist() == [0, 1, 0, 1, 4]
    assert decoded(c, c.subset(mask_of(5, 2))) == {"b"}
    assert decoded(c, c.subset(mask_of(5, 3))) == {"a"}  # "A" is an alias of "a"
    assert decoded(c, c.subset(mask_of(5, 3, 4))) == {"a", "ab"}
    assert decoded(c.update(remove=mask_of(5, 0))) == {"a", "ab"}  # both "b"s: one item
    assert dict(zip(c.names.names, c.names.aliases)) == {"a": ("A",), "ab": (), "b": ()}


@pytest.mark.parametrize("n", [3, 4, 6])
def test_a_mask_of_another_length_than_the_names_is_refused(dupes, n):
    with pytest.raises(ConstraintSetError, match=r"expected \(5,\)"):
        dupes.subset(np.ones(n, bool))
    with pytest.raises(ConstraintSetError, match=r"expected \(5,\)"):
        dupes.update(remove=np.ones(n, bool))


def test_a_mask_over_the_names_picks_the_same_names_after_save_and_load(ordered, tmp_path):
    path = ordered.save(tmp_path / "order.static")
    art = serving.load(path)
    np.testing.assert_array_equal(art.items.row_item, ordered.items.row_item)
    for picked in [(0,), (1,), (0, 2), ()]:
        mask = mask_of(3, *picked)
        by_art, by_lib = art.subset(mask), ordered.subset(mask)
        for a, b in zip(by_art.live + by_art.ends, by_lib.live + by_lib.ends):
            assert (a is None and b is None) or np.array_equal(a, b)
        assert served(art, by_art) == {ORDER[i] for i in picked}
    with pytest.raises(ConstraintSetError, match=r"expected \(3,\)"):
        art.subset(np.ones(2, bool))
    sc.update_artifact(path, remove=mask_of(3, 0))
    assert served(serving.load(path)) == {"alpha", "mid"}


# ----- names.jsonl keeps every name -----

ODD = ["line\u2028sep", "para\u2029sep", "next\x85line", "cr\rlf\r\n", "\x1c\x1d\x1e",
       "\x0b\x0c", "nl\n", "emoji \U0001F600\u200d\U0001F4BB", "\u200b", " ", "\t", "\x00",
       "\ufeffbom", "\\u2028", '"quoted"', "plain"]


def test_names_with_line_breaks_round_trip_through_the_artifact(tmp_path):
    compiled = sc.compile_constraints(ODD, vocab_size=V + 1, tokenizer=utf8, end_token=END,
                                      export_beam_sizes=(BEAMS,))
    data = compiled.names.to_jsonl()
    text = data.decode("utf-8")
    assert not set(text) & {"\u2028", "\u2029", "\x85", "\r"}  # escaped: one line per item
    assert len(text.splitlines()) == len(ODD) and text.endswith("\n")
    again = sc.compile_constraints(ODD, vocab_size=V + 1, tokenizer=utf8, end_token=END)
    assert again.names.to_jsonl() == data  # byte-deterministic
    path = compiled.save(tmp_path / "odd.static")
    art = serving.load(path)
    assert art.names.names == compiled.names.names and sorted(art.names.names) == sorted(ODD)
    assert art.names.to_jsonl() == data
    for name in ODD:
        assert art.names.name_of(utf8(name)) == name
    tokens = [utf8(n) for n in ODD]
    width = max(map(len, tokens)) + 1
    result = sc.DecodeResult(
        np.asarray([[t + [END] * (width - len(t)) for t in tokens]], np.int32),
        np.zeros((1, len(ODD)), np.float32), np.ones((1, len(ODD)), bool),
        np.asarray([[len(t) for t in tokens]], np.int32))
    assert art.texts(result) == compiled.texts(result) == [ODD]


def test_a_names_file_written_with_raw_line_breaks_reads():
    """Writers before the escapes wrote U+2028, U+2029 and U+0085 raw."""
    raw = ('{"name": "a\u2028b", "tokens": [1]}\n{"name": "c\x85d\u2029", "tokens": [2, 3]}\n'
           '{"name": "e", "tokens": [4]}').encode("utf-8")  # and no final line feed
    table = read_names_jsonl(raw, "test")
    assert table.names == ("a\u2028b", "c\x85d\u2029", "e")
    assert table.tokens.tolist() == [[1, -1], [2, 3], [4, -1]]


# ----- property: masks over random name lists -----

POOL = ["a", "ab", "abc", "b", "ba", "c"]
"""Every drawn list spells each of these at least once (in some case), so
every list compiles to the same set and the decode compiles once."""

spellings = st.lists(st.booleans(), min_size=3, max_size=3).map(
    lambda upper: lambda word: "".join(c.upper() if u else c for c, u in zip(word, upper)))


@st.composite
def name_lists(draw, pool=POOL, extra=6):
    """Names: each pool word once, up to `extra` more from the pool, each in
    a drawn case (alike under `folded`), in a drawn order."""
    words = list(pool) + draw(st.lists(st.sampled_from(pool), max_size=extra))
    names = [draw(spellings)(w) for w in words]
    return draw(st.permutations(names))


def first_of(names: list, i: int) -> int:
    """The first position whose name encodes as names[i] does."""
    return next(j for j, n in enumerate(names) if folded(n) == folded(names[i]))


@settings(max_examples=12, deadline=None)
@given(names=name_lists(), seed=st.integers(0, 2 ** 32 - 1))
def test_decoding_a_mask_over_names_gives_exactly_those_names(names, seed):
    compiled = sc.compile_constraints(names, vocab_size=V, tokenizer=folded, end_token=END)
    n = len(names)
    ids = compiled.item_index([folded(name) for name in names])
    assert ids.tolist() == [first_of(names, i) for i in range(n)]
    table = compiled.names
    item_name = [table.name_of(folded(name)) for name in names]
    assert item_name == [names[first_of(names, i)] for i in range(n)]
    mask = np.random.default_rng(seed).random(n) < 0.5
    picked = {item_name[i] for i in np.flatnonzero(mask)}
    assert decoded(compiled, compiled.subset(mask)) == picked
    rest = {item_name[i] for i in range(n)
            if not any(mask[j] for j in range(n) if folded(names[j]) == folded(names[i]))}
    assert decoded(compiled.update(remove=mask)) == rest


@settings(max_examples=25, deadline=None)
@given(names=st.lists(st.text(alphabet="abAB\u2028", min_size=1, max_size=4), min_size=1,
                      max_size=12),
       seed=st.integers(0, 2 ** 32 - 1))
def test_any_name_list_numbers_its_items_as_given(names, seed):
    """No decode: item_index, the name table, and a mask's subset equal to
    the subset of the selected names' token sequences."""
    compiled = sc.compile_constraints(names, vocab_size=V, tokenizer=folded, end_token=END)
    n = len(names)
    assert compiled.items.num_items == n
    assert compiled.item_index([folded(name) for name in names]).tolist() == \
        [first_of(names, i) for i in range(n)]
    assert [compiled.names.name_of(folded(name)) for name in names] == \
        [names[first_of(names, i)] for i in range(n)]
    back = read_names_jsonl(compiled.names.to_jsonl(), "test")
    assert back.names == compiled.names.names and back.aliases == compiled.names.aliases
    mask = np.random.default_rng(seed).random(n) < 0.5
    if mask.any():
        by_mask = compiled.subset(mask)
        by_tokens = compiled.subset([folded(names[i]) for i in np.flatnonzero(mask)])
        for a, b in zip(by_mask.live + by_mask.ends, by_tokens.live + by_tokens.ends):
            assert (a is None and b is None) or np.array_equal(a, b)
