"""The decoding interface's types and constants, shared by the JAX decoder
(`static_compiler.backend.decode`), the serving loader and the PyTorch
backend (`static_compiler.torch_backend`): a state made by one backend's
`init` has the fields the other's step takes, in the same order (the
exported modules' arguments and results are these fields). No imports
beyond the standard library, so the torch backend loads it without jax.

Shapes below: B = batch size, M = beams per row (1 for `greedy_decode` and
`sample`), T = the set's max length (tokens per sequence, the end token
included where there is one). Arrays are jax arrays in the JAX backend
(int32 ints) and torch tensors in the torch backend (int64 ints).

Constants
---------
PAD_TOKEN : int
    -1. Token written where a beam holds no sequence, and after the end
    token: in ``DecodeResult.tokens`` and ``BeamState.tokens``.
SENTINEL_SCORE : float
    -1e30. Score of invalid candidates and beams: finite, so no -inf
    arithmetic. ``DecodeResult.scores`` holds it where ``valid`` is False,
    and masked logits hold it at disallowed tokens.
MIN_VALID_SCORE : float
    -1e29. Floor of a valid score: above SENTINEL_SCORE, so valid beams
    rank first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

SENTINEL_SCORE = -1e30
"""Score of invalid candidates and beams: finite, so no -inf arithmetic."""

MIN_VALID_SCORE = -1e29
"""Floor of a valid score: above SENTINEL_SCORE, so valid beams rank first."""

PAD_TOKEN = -1
"""Token written where a beam holds no sequence, and after the end token."""


class BeamState(NamedTuple):
    """Beam-search state carried between steps (B = batch, M = beams, T = max length).

    Made by ``init_beam_state`` and advanced a step at a time by
    ``beam_step`` (`static_compiler.backend.decode.step`); an exported
    artifact's ``init_m{M}`` and ``beam_step_m{M}`` modules take and return
    these fields as separate arrays, in this order.

    Attributes
    ----------
    tokens : int32 array (B, M, T)
        Decoded tokens so far, PAD_TOKEN elsewhere.
    scores : float32 array (B, M)
        Summed log-probabilities, SENTINEL_SCORE if not valid.
    node : int32 array (B, M)
        Automaton state at the current depth (0 when not live).
    valid : bool array (B, M)
        The beam holds a real (live or finished) sequence.
    finished : bool array (B, M)
        The beam has taken the end token.
    lengths : int32 array (B, M)
        Tokens before the end token.
    last_tokens : int32 array (B, M)
        Token to feed the model at the next step.
    parent : int32 array (B, M)
        Beam each beam came from at the last step; reorder per-beam model
        state (KV caches) with it.
    """

    tokens: Any
    scores: Any
    node: Any
    valid: Any
    finished: Any
    lengths: Any
    last_tokens: Any
    parent: Any


class DecodeResult(NamedTuple):
    """What every decoder returns (B = batch, M = beams, T = max length).

    `beam_search` returns M = beam_size beams per row; `greedy_decode` and
    `sample` return M = 1.

    Attributes
    ----------
    tokens : int32 array (B, M, T)
        Decoded sequences, PAD_TOKEN past the end (and where a beam holds
        no sequence).
    scores : float32 array (B, M)
        Summed log-probabilities, sorted descending per row;
        SENTINEL_SCORE where not valid.
    valid : bool array (B, M)
        The beam holds a sequence; False only where fewer than M valid
        sequences exist.
    lengths : int32 array (B, M)
        Tokens of each sequence, without the end token.
    """

    tokens: Any
    scores: Any
    valid: Any
    lengths: Any


class ProcessorState(NamedTuple):
    """Per-row state of the logits-processor pair (`mask` / `advance`).

    One entry per row (B = batch size); every field has the same shape (B,).

    Attributes
    ----------
    node : int32 array (B,)
        Automaton state at the current depth.
    valid : bool array (B,)
        False once a row took a disallowed token.
    finished : bool array (B,)
        The row has taken the end token.
    """

    node: Any
    valid: Any
    finished: Any


@dataclasses.dataclass(frozen=True)
class WarmReport:
    """What a front door's `warm` ran: `compilations`, the XLA compilations
    it caused (0 when everything was compiled before; always 0 on the torch
    backend, whose eager ops compile nothing); `calls`, the request-path
    calls it made on dummy inputs; `seconds`, its wall time; `batch_sizes`,
    `beam_sizes` as warmed; `subset_rows`, the stacked subsets warmed (on
    the served artifact, the count every stack up to it is padded to; None
    without subsets)."""

    compilations: int
    calls: int
    seconds: float
    batch_sizes: tuple
    beam_sizes: tuple
    subset_rows: Optional[int]
