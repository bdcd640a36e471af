"""Every tokenization of a text catalogue's names (``spellings="any"``).

By default a text catalogue holds each name's canonical encoding, the one
sequence its tokenizer produces (`static_compiler.frontend.text`): what a
model trained with that tokenizer emits. Grammar engines (xgrammar,
outlines-core) constrain the text instead, so a name spelled with other
tokens (one byte token per byte, or a merge the tokenizer would not make)
passes too. ``compile_constraints(names, tokenizer=..., spellings="any")``
compiles that language: every token sequence whose bytes are a name's
bytes (the bytes of its canonical encoding), then the end token.

How: a byte trie of the names; from each of its nodes, the tokens whose
bytes continue it (a walk of the vocabulary's own byte trie alongside),
each an edge to the node its bytes reach. That graph is deterministic and
acyclic; `frontend.graph` lays it out by depth (a node reached with 3 or 5
tokens is two states) and merges equivalent states.

Cost, on the peers bench's catalogues (tools/bench/peers.py, V = 16384
byte-level BPE; the states are ``compiled.build.frontend_stats["graph"]``): at
1e3 / 1e4 / 1e5 names the layered graph has 140k / 1.01M / 9.33M states,
merged to 92k / 445k / 2.56M (22x / 16x / 7.7x the canonical trie's
states, 52x / 44x / 25x its edges), with as many steps as the longest name
has bytes (69 / 84 / 89 against 26 / 34 / 36 tokens). Compile time, from
``python -m tools.bench peers`` (engine "static-any"): 0.56 s at 1e3 and
2.42 s at 1e4 (``--quick``, V = 8192), 33.6 s and 1.0 GB at 1e5. The set
has no item index (no subsets or removals by name) and no name table:
decode a beam's tokens with the tokenizer.

Token bytes come from the adapter's ``token_bytes()`` (a sequence of
``bytes`` or None per token id, None: never part of a spelling), or, for a
``tokenizers.Tokenizer`` / transformers fast tokenizer with a ByteLevel
decoder or pre-tokenizer (GPT-2, Llama 3, Qwen and most BPE vocabularies), from its
vocabulary; special tokens are left out.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend.graph import GraphStats
from static_compiler.ir import Automaton

SPELLINGS = ("canonical", "any")
"""The values of ``compile_constraints(spellings=...)``."""


def _byte_level_alphabet() -> dict:
    """The ByteLevel pre-tokenizer's map from its printable stand-in
    characters back to bytes (GPT-2's ``bytes_to_unicode``, inverted)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(spec) -> bool:
    """Whether a decoder or pre-tokenizer spec (tokenizer.json) is, or holds,
    ByteLevel."""
    if isinstance(spec, dict):
        return spec.get("type") == "ByteLevel" or any(
            _byte_level(d) for d in (spec.get("decoders") or spec.get("pretokenizers") or []))
    return False


def token_bytes(adapter, vocab_size: int) -> list:
    """bytes or None per token id in [0, vocab_size): the adapter's own
    ``token_bytes()``, or a byte-level tokenizer's vocabulary read back to
    bytes. Raises ConstraintSetError when neither is available."""
    own = getattr(adapter, "token_bytes", None)
    if callable(own):
        table = list(own())
        if len(table) < vocab_size or any(t is not None and not isinstance(t, bytes)
                                           for t in table[:vocab_size]):
            raise ConstraintSetError(f"token_bytes() gave {len(table)} entries: expected bytes "
                                     f"or None for each of the {vocab_size} token ids")
        return table[:vocab_size]
    tok = getattr(adapter, "tokenizer", None)
    tok = getattr(tok, "backend_tokenizer", tok)  # transformers fast -> tokenizers
    spec = json.loads(tok.to_str()) if hasattr(tok, "to_str") else {}
    if not (_byte_level(spec.get("decoder")) or _byte_level(spec.get("pre_tokenizer"))):
        raise ConstraintSetError(
            "spellings='any' needs each token's bytes: a tokenizers / transformers fast "
            "tokenizer with a ByteLevel decoder or pre-tokenizer, or an adapter with "
            "token_bytes() (bytes or None per token id)")
    alphabet = _byte_level_alphabet()
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    table: list = [None] * vocab_size
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if 0 <= i < vocab_size and i not in special:
            try:
                table[i] = bytes(alphabet[c] for c in text)
            except KeyError:  # an added token outside the byte alphabet
                table[i] = text.encode("utf-8")
    return table


def _byte_trie(targets: Sequence[bytes]) -> tuple[list, list]:
    """(children: per node {byte: node}, ends: per node bool) of the trie of
    `targets`; node 0 is the root and a child's id exceeds its parent's."""
    children, ends = [{}], [False]
    for target in targets:
        node = 0
        for b in target:
            nxt = children[node].get(b)
            if nxt is None:
                nxt = len(children)
                children[node][b] = nxt
                children.append({})
                ends.append(False)
            node = nxt
        ends[node] = True
    return children, ends


def spelling_edges(targets: Sequence[bytes], table: Sequence[Optional[bytes]]) -> tuple:
    """(out, ends): out[node] = {token: (node,)} every token whose bytes
    continue byte-trie node `node` (to the node they reach), only towards
    nodes that still reach a name's end; ends[node]: a name ends there."""
    children, ends = _byte_trie(targets)
    vocab_trie: dict = {}  # byte -> (token id or -1, subtrie)
    for i, spelled in enumerate(table):
        if spelled:
            level = vocab_trie
            for j, b in enumerate(spelled):
                entry = level.setdefault(b, [-1, {}])
                if j == len(spelled) - 1:
                    entry[0] = i
                level = entry[1]
    out = [None] * len(children)
    useful = [False] * len(children)
    for node in range(len(children) - 1, -1, -1):  # children first: ids grow downwards
        row: dict = {}
        stack = [(node, vocab_trie)]
        while stack:
            at, level = stack.pop()
            for b, nxt in children[at].items():
                entry = level.get(b)
                if entry is None:
                    continue
                if entry[0] >= 0 and useful[nxt]:
                    row[entry[0]] = (nxt,)
                if entry[1]:
                    stack.append((nxt, entry[1]))
        out[node] = row
        useful[node] = ends[node] or bool(row)
    return out, ends


def any_spelling_automaton(targets: Sequence[bytes], table: Sequence[Optional[bytes]],
                           vocab_size: int, end_token: int) -> tuple[Automaton, GraphStats]:
    """The automaton of every token sequence whose bytes (per `table`) are
    one of `targets`, then `end_token`, laid out by depth and minimized as
    `frontend.graph.automaton_from_graph` does (see module doc)."""
    from static_compiler.frontend.graph import automaton_from_edges
    out, ends = spelling_edges(targets, table)
    if not out[0]:
        raise ConstraintSetError("spellings='any': no token sequence spells any name (the "
                                 "tokens' bytes do not cover the names')")
    accepting = {n for n, e in enumerate(ends) if e}
    return automaton_from_edges(dict(enumerate(out)), accepting, 0, vocab_size, end_token,
                                num_edges=sum(len(r) for r in out))


def catalogue_spellings(catalogue, tokenizer, vocab_size: int) -> tuple[Automaton, GraphStats]:
    """`any_spelling_automaton` of an encoded catalogue (`text.Catalogue`):
    the targets are the bytes of its names' canonical encodings (so each
    canonical encoding is one of the spellings). Raises ConstraintSetError
    without an end token, or when a canonical encoding holds a token with
    no bytes (a special token), naming the name."""
    from static_compiler.frontend.text import as_adapter
    if catalogue.end_token is None:
        raise ConstraintSetError("spellings='any': spellings of one name differ in length; pass "
                                 "end_token=... (or a tokenizer with an end-of-sequence token)")
    table = token_bytes(as_adapter(tokenizer), vocab_size)
    targets = []
    for u, row in enumerate(catalogue.names.tokens):
        pieces = [table[t] for t in row.tolist() if t >= 0]
        if any(p is None for p in pieces):
            bad = next(int(t) for t in row if t >= 0 and table[t] is None)
            raise ConstraintSetError(f"spellings='any': name {catalogue.names.names[u]!r} encodes "
                                     f"to token {bad}, which has no bytes (a special token)")
        targets.append(b"".join(pieces))
    return any_spelling_automaton(targets, table, vocab_size, catalogue.end_token)
