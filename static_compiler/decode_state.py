"""The decoding interface: state and result types, their constants, and the
validators of decoding arguments.

One definition shared by the in-process decoder (`static_compiler.backend.decode`)
and the serving loader (`static_compiler.artifact.serving`), so a state made by one is
the state the other takes, field for field (the exported modules' arguments
and results are these fields, in this order). It imports jax.numpy only to
read the dtypes of traced values; it holds no decoding logic.

The state and result types and the constants are `static_compiler.decode_types`
(no jax: the torch backend shares them); this module re-exports them.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler.arguments import (check_callable, check_finite, check_int,  # noqa: F401
                                       check_logits_shape,
                                       check_prefix_shape, check_start_tokens,
                                       check_token_shape, check_token_values,
                                       check_tokens_per_beam)
from static_compiler.decode_types import (MIN_VALID_SCORE, PAD_TOKEN, SENTINEL_SCORE,  # noqa: F401
                                          BeamState, DecodeResult, ProcessorState)
from static_compiler.arguments import is_int as _is_int
from static_compiler.errors import DecodeInputError

# ---------------------------------------------------------------------------
# Argument validators. Each raises DecodeInputError naming the argument, the
# value and what was expected.


def _dtype(value, name: str = "value", where: str = ""):
    dtype = getattr(value, "dtype", None)  # arrays (jax, numpy): no dtype promotion to run
    if isinstance(dtype, np.dtype):
        return dtype
    try:  # nested lists: jnp.result_type takes no list
        return jnp.result_type(value) if np.isscalar(value) else np.asarray(value).dtype
    except (TypeError, ValueError) as err:
        raise DecodeInputError(f"{where}: {name} {str(value)[:80]!r} is not an array of numbers "
                               f"({err})") from None


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
    dtype = _dtype(logits, "logits", where)
    check_logits_shape(np.shape(logits), dtype, _is_float_dtype(dtype), batch_shape, vocab_size,
                       where)


def check_tokens(tokens, batch_size: int, where: str) -> None:
    """`tokens` (the chosen token per row) must be ints of shape (batch_size,)."""
    dtype = _dtype(tokens, "tokens", where)
    check_token_shape(np.shape(tokens), dtype, _is_integer_dtype(dtype), batch_size, where)


def check_fields(state, state_type: type, where: str) -> tuple[Any, ...]:
    """`state` as a plain tuple; it must be a tuple with the fields of the
    NamedTuple `state_type` (a BeamState or ProcessorState, or any tuple of
    as many arrays)."""
    fields = state_type._fields
    if not isinstance(state, tuple) or len(state) != len(fields):
        raise DecodeInputError(f"{where}: state is a {type(state).__name__}, expected a "
                               f"tuple of {len(fields)} arrays {fields}")
    return tuple(state)


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
