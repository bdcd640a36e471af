"""The decoding interface: state and result types, their constants, and the
validators of decoding arguments.

One definition shared by the in-process decoder (`static_compiler.backend.decode`)
and the serving loader (`static_compiler.artifact.serving`), so a state made by one is
the state the other takes, field for field (the exported modules' arguments
and results are these fields, in this order). It imports jax.numpy only to
read the dtypes of traced values; it holds no decoding logic.

Shapes below: B = batch size, M = beams per row (1 for `greedy_decode` and
`sample`), T = the set's max length (tokens per sequence, the end token
included where there is one).

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

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler.arguments import (check_callable, check_finite, check_int,  # noqa: F401
                                       check_prefix_shape, check_token_shape,
                                       check_token_values)
from static_compiler.arguments import is_int as _is_int
from static_compiler.errors import DecodeInputError

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


# ---------------------------------------------------------------------------
# Argument validators. Each raises DecodeInputError naming the argument, the
# value and what was expected.


def _dtype(value):
    dtype = getattr(value, "dtype", None)  # arrays (jax, numpy): no dtype promotion to run
    return dtype if isinstance(dtype, np.dtype) else jnp.result_type(value)


@functools.lru_cache(maxsize=None)
def _is_integer_dtype(dtype) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer)) and dtype != jnp.bool_


@functools.lru_cache(maxsize=None)
def _is_float_dtype(dtype) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.floating))


def check_step(step, max_length: int, where: str, *, traced: bool = False,
               traced_outside: str = "a traced step outside that range appends "
                                     "nothing"):
    """A decoding step in [0, max_length): a Python or numpy int (or numpy
    integer scalar array), returned as a Python int. With `traced`, a jax
    integer scalar (traced, or a device value: never read back to the host
    on the per-step path) is also accepted and returned as is; the caller
    handles one outside the range as `traced_outside` says."""
    if not isinstance(step, (bool, np.bool_, str)) and not _is_int(step) \
            and hasattr(step, "dtype") and np.shape(step) == () and _is_integer_dtype(step.dtype):
        if traced and isinstance(step, jax.Array):
            return step  # a device scalar, traced or not: read on the device, no host sync
        if not isinstance(step, jax.Array):
            step = np.asarray(step).item()
    if _is_int(step) and 0 <= step < max_length:
        return int(step)
    found = f"{step!r}" + (f" ({_dtype(step)}{list(np.shape(step))})"
                           if hasattr(step, "dtype") else "")
    if traced:
        raise DecodeInputError(f"{where}: step={found} must be an int in [0, {max_length}) or a "
                               f"traced integer scalar ({traced_outside})")
    raise DecodeInputError(f"{where}: step={found} must be an int in [0, {max_length})")


def check_logits(logits, batch_shape: tuple, vocab_size: int, where: str) -> None:
    """`logits` must be a float array of shape batch_shape + (vocab_size,)."""
    shape = tuple(np.shape(logits))
    want = tuple(batch_shape) + (vocab_size,)
    if shape != want:
        raise DecodeInputError(f"{where}: logits have shape {shape}, expected {want} "
                               f"(batch dims {tuple(batch_shape)}, vocab {vocab_size})")
    dtype = _dtype(logits)
    if not _is_float_dtype(dtype):
        raise DecodeInputError(f"{where}: logits have dtype {dtype}, expected a float dtype "
                               "(computed in float32)")


def check_tokens(tokens, batch_size: int, where: str) -> None:
    """`tokens` (the chosen token per row) must be ints of shape (batch_size,)."""
    dtype = _dtype(tokens)
    check_token_shape(np.shape(tokens), dtype, _is_integer_dtype(dtype), batch_size, where)


def check_start_tokens(start_token, batch_size: int, where: str) -> np.ndarray:
    """The model's input at step 0 per row: an int, or ints of shape
    (batch_size,), within int32. Returns int32 (batch_size,)."""
    start = np.asarray(start_token) if not isinstance(start_token, (bool, np.bool_)) else None
    if start is None or start.dtype.kind not in "iu" or start.shape not in ((), (batch_size,)) \
            or (start.size and (start.min() < -2 ** 31 or start.max() >= 2 ** 31)):
        raise DecodeInputError(f"{where}: start_token={start_token!r}: expected an int or ints "
                               f"of shape ({batch_size},), within int32")
    return np.broadcast_to(start, (batch_size,)).astype(np.int32)


def check_fields(state, state_type: type, where: str) -> tuple[Any, ...]:
    """`state` as a plain tuple; it must be a tuple with the fields of the
    NamedTuple `state_type` (a BeamState or ProcessorState, or any tuple of
    as many arrays)."""
    fields = state_type._fields
    if not isinstance(state, tuple) or len(state) != len(fields):
        raise DecodeInputError(f"{where}: state is a {type(state).__name__}, expected a "
                               f"tuple of {len(fields)} arrays {fields}")
    return tuple(state)


def check_tokens_per_beam(tokens_per_beam, max_length: int) -> tuple[Optional[int], ...]:
    """The cap on the children each beam may contribute, per step (None: no cap).

    tokens_per_beam: None (no cap); an int >= 1, which applies from step 1
    on (step 0 expands the start beam to its top beam_size children, as the
    paper and its reference do); or a sequence of max_length entries, each
    None or an int >= 1, applied as given at every step (step 0 included)."""
    if tokens_per_beam is None or _is_int(tokens_per_beam):
        cap = check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        return (None,) + (cap,) * (max_length - 1)
    if isinstance(tokens_per_beam, (str, bytes)) or not hasattr(tokens_per_beam, "__len__") \
            or len(tokens_per_beam) != max_length:
        raise DecodeInputError(f"tokens_per_beam={tokens_per_beam!r}: expected None, an int >= 1, "
                               f"or a sequence of {max_length} entries (one per step, each None "
                               "or an int >= 1)")
    return tuple(check_int(f"tokens_per_beam[{t}]", cap, low=1, allow_none=True)
                 for t, cap in enumerate(tokens_per_beam))


def is_traced(value) -> bool:
    """Whether `value` is a jax tracer (its values are unknown until run)."""
    return isinstance(value, jax.core.Tracer)


def check_processor_state(state, where: str) -> ProcessorState:
    """`state` as a ProcessorState; its fields must be arrays of one shape (B,)."""
    fields = check_fields(state, ProcessorState, where)
    shapes = [tuple(np.shape(f)) for f in fields]
    if len(shapes[0]) != 1 or any(s != shapes[0] for s in shapes):
        raise DecodeInputError(f"{where}: state fields {ProcessorState._fields} have shapes "
                               f"{shapes}, expected one shape (batch,)")
    return ProcessorState(*fields)


def check_drafts(drafts, batch_size: int, vocab_size: int, where: str):
    """Draft tokens: ints of shape (batch_size, n), n >= 0 (n static).

    A concrete array must hold tokens in [0, vocab_size) (the first one
    outside is named); a traced array cannot be range-checked: the caller
    treats its tokens outside [0, vocab_size) as not allowed. Returns the
    drafts as an array (numpy for lists)."""
    if not is_traced(drafts) and not hasattr(drafts, "dtype"):
        try:
            drafts = np.asarray(drafts)
        except ValueError as err:  # ragged nested lists
            raise DecodeInputError(f"{where}: drafts={drafts!r}: expected int of shape "
                                   f"({batch_size}, n)") from err
    shape, dtype = tuple(np.shape(drafts)), drafts.dtype
    if len(shape) != 2 or shape[0] != batch_size or not _is_integer_dtype(dtype):
        raise DecodeInputError(f"{where}: drafts have shape {shape} dtype {dtype}, expected int "
                               f"of shape ({batch_size}, n): n draft tokens per row")
    if not is_traced(drafts):
        check_token_values("drafts", np.asarray(drafts), vocab_size, where)
    return drafts


def check_prefixes(prefixes, max_length: int, where: str) -> None:
    """`prefixes` must be an int array (N, t) with t in [0, max_length)."""
    dtype = _dtype(prefixes)
    check_prefix_shape(np.shape(prefixes), dtype, _is_integer_dtype(dtype), max_length, where)
