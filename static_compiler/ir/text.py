"""The IR's text form read back: `parse_ir`, the inverse of `printer.print_ir`
when no row was elided."""

from __future__ import annotations

import re

import numpy as np

from static_compiler.errors import IRParseError
from static_compiler.ir.types import Automaton, Layer, Layout
from static_compiler.ir.verify import verify

_HEAD_RE = re.compile(r"automaton vocab=(\d+) depth=(\d+) sequences=(\d+) "
                      r"final_states=(\d+)(?: end_token=(\d+))?")
_LAYER_RE = re.compile(r"layer (\d+)  states=(\d+) edges=(\d+) max_branch=\d+ "
                       r"mean_branch=[0-9.]+ targets=(implicit|explicit) layout=(\S+)")
_ROW_RE = re.compile(r"  s(\d+)( accept)?:((?: \d+->\d+)*)")


def _elided(line: int) -> IRParseError:
    return IRParseError(f"line {line}: rows were elided in this dump; print it with max_edges "
                        "large enough to parse it back")


def parse_ir(text: str) -> Automaton:
    """Parses the full text form back into an equal `Automaton`.

    Raises IRParseError (with the line number) on malformed text or on a dump
    whose rows were elided; the result is verified."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise IRParseError("empty IR text")
    m = _HEAD_RE.fullmatch(lines[0])
    if not m:
        raise IRParseError(f"line 1: expected 'automaton vocab=.. depth=.. sequences=.. "
                           f"final_states=..', got {lines[0]!r}")
    vocab, depth, nseq, nfinal = (int(m.group(i)) for i in range(1, 5))
    end_token = int(m.group(5)) if m.group(5) is not None else None
    layers = []
    i = 1
    for t in range(depth):
        if i >= len(lines):
            raise IRParseError(f"expected layer {t} header after line {i}, text ended")
        lm = _LAYER_RE.fullmatch(lines[i])
        if not lm or int(lm.group(1)) != t:
            raise IRParseError(f"line {i + 1}: expected header of layer {t}, got {lines[i]!r}")
        S, E = int(lm.group(2)), int(lm.group(3))
        implicit = lm.group(4) == "implicit"
        layout = None if lm.group(5) == "none" else Layout.from_text(lm.group(5))
        i += 1
        if S > len(lines) - i:  # one row per state follows: refuse before allocating
            if any(ln.startswith("  ...") for ln in lines[i:]):
                raise _elided(i)
            left = len(lines) - i
            raise IRParseError(f"line {i}: layer {t} header says states={S}, but only {left} "
                               f"line{'s' * (left != 1)} follow{'s' * (left == 1)}")
        indptr = np.zeros(S + 1, dtype=np.int64)
        tokens, targets = [], []
        accepting = np.zeros(S, dtype=bool)
        for s in range(S):
            if i >= len(lines):
                raise IRParseError(f"layer {t}: expected row s{s}, text ended")
            if lines[i].startswith("  ..."):
                raise _elided(i + 1)
            rm = _ROW_RE.fullmatch(lines[i])
            if not rm or int(rm.group(1)) != s:
                raise IRParseError(f"line {i + 1}: expected row s{s} of layer {t}, got {lines[i]!r}")
            accepting[s] = rm.group(2) is not None
            for pair in rm.group(3).split():
                a_, b_ = pair.split("->")
                tokens.append(int(a_))
                targets.append(int(b_))
            indptr[s + 1] = len(tokens)
            i += 1
        if len(tokens) != E:
            raise IRParseError(f"layer {t}: header says edges={E}, rows hold {len(tokens)}")
        try:
            tg, tok = np.asarray(targets, dtype=np.int64), np.asarray(tokens, dtype=np.int64)
        except OverflowError:
            big = max(tokens + targets, key=abs)
            raise IRParseError(f"layer {t}: token or target {big} does not fit int64") from None
        if implicit and not np.array_equal(tg, np.arange(E)):
            raise IRParseError(f"layer {t}: targets=implicit but rows name other targets")
        layers.append(Layer(indptr=indptr, tokens=tok,
                            targets=None if implicit else tg,
                            accepting=accepting if accepting.any() else None,
                            layout=layout))
    if i != len(lines):
        raise IRParseError(f"line {i + 1}: unexpected text after the last layer: {lines[i]!r}")
    a = Automaton(vocab_size=vocab, layers=tuple(layers), num_final_states=nfinal,
                  num_sequences=nseq, end_token=end_token)
    verify(a)
    return a

