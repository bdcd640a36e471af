"""The decoding interface: state and result types, their constants, and the
validators of decoding arguments.

One definition shared by the in-process decoder (`static_compiler.backend.decode`)
and the serving loader (`static_compiler.serving`), so a state made by one is
the state the other takes, field for field (the exported modules' arguments
and results are these fields, in this order). It holds no decoding logic,
and it never imports jax itself: a value can be a jax array only once jax
is imported (`_jax`), so the compiler and the torch backend use these
validators in a process without jax.

The state and result types and the constants are `static_compiler.support.decode_types`
(no jax: the torch backend shares them); this module re-exports them.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from static_compiler.errors import DecodeInputError
from static_compiler.support.arguments import (  # noqa: F401
    check_callable,
    check_finite,
    check_int,
    check_logits_shape,
    check_prefix_shape,
    check_rows,
    check_start_tokens,
    check_token_shape,
    check_token_values,
    check_tokens_per_beam,
    vocab_columns,
)
from static_compiler.support.arguments import is_int as _is_int
from static_compiler.support.decode_types import (  # noqa: F401
    MIN_VALID_SCORE,
    PAD_TOKEN,
    SENTINEL_SCORE,
    BeamState,
    DecodeResult,
    ProcessorState,
)


class _NoJax:
    """What `_jax` gives before jax is imported: no value is a jax array."""

    class Array:  # matched by no value
        pass

    class core:  # noqa: N801 (jax.core's spelling)
        class Tracer:
            pass


def _jax():
    """The jax module when this process has imported it, else `_NoJax`
    (a value can be a jax array or tracer only once jax is imported)."""
    return sys.modules.get("jax") or _NoJax


# ---------------------------------------------------------------------------
# Argument validators. Each raises DecodeInputError naming the argument, the
# value and what was expected.


def _dtype(value, name: str = "value", where: str = ""):
    dtype = getattr(value, "dtype", None)  # arrays (jax, numpy): no dtype promotion to run
    if isinstance(dtype, np.dtype):
        return dtype
    try:  # nested lists: result_type takes no list; jax's keeps its scalar dtypes (x64 off)
        result_type = _jax().numpy.result_type if "jax" in sys.modules else np.result_type
        return result_type(value) if np.isscalar(value) else np.asarray(value).dtype
    except (TypeError, ValueError) as err:
        raise DecodeInputError(f"{where}: {name} {str(value)[:80]!r} is not an array of numbers "
                               f"({err})") from None


@functools.lru_cache(maxsize=None)
def _is_integer_dtype(dtype) -> bool:
    return bool(np.issubdtype(dtype, np.integer)) and dtype != np.bool_


def _is_float_dtype(dtype) -> bool:
    return _is_float_kind(dtype, "jax" in sys.modules)


@functools.lru_cache(maxsize=None)
def _is_float_kind(dtype, with_jax: bool) -> bool:
    if with_jax:  # jax knows ml_dtypes' floats (bfloat16, float8_*) as floating
        jnp = _jax().numpy
        return bool(jnp.issubdtype(dtype, jnp.floating))
    return bool(np.issubdtype(dtype, np.floating)) or \
        (dtype.kind == "V" and "float" in dtype.name)  # ml_dtypes without jax


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
        is_device = isinstance(step, _jax().Array)
        if traced and is_device:
            return step  # a device scalar, traced or not: read on the device, no host sync
        if not is_device:
            step = np.asarray(step).item()
    if _is_int(step) and 0 <= step < max_length:
        return int(step)
    found = f"{step!r}" + (f" ({_dtype(step)}{list(np.shape(step))})"
                           if hasattr(step, "dtype") else "")
    if traced:
        raise DecodeInputError(f"{where}: step={found} must be an int in [0, {max_length}) or a "
                               f"traced integer scalar ({traced_outside})")
    raise DecodeInputError(f"{where}: step={found} must be an int in [0, {max_length})")


def check_logits(logits, batch_shape: tuple, vocab_size: int, where: str):
    """`logits` must be a float array of shape batch_shape + (W,), W >=
    vocab_size (`arguments.check_logits_shape`: columns >= vocab_size are a
    padded vocabulary's, never allowed); returns the logits of the set's
    vocab_size tokens (`logits` itself when W == vocab_size)."""
    dtype = _dtype(logits, "logits", where)
    width = check_logits_shape(np.shape(logits), dtype, _is_float_dtype(dtype), batch_shape,
                               vocab_size, where)
    if width != vocab_size and not hasattr(logits, "dtype"):
        logits = np.asarray(logits)
    return vocab_columns(logits, width, vocab_size)


def padded_columns(masked, width: int):
    """Masked logits float32 (..., V) (a jax or numpy array) widened to the
    model's `width` columns (a padded vocabulary, `check_logits`), with
    SENTINEL_SCORE in the columns >= V, which are never allowed; `masked`
    itself when width == V."""
    extra = width - masked.shape[-1]
    if not extra:
        return masked
    xp = np if isinstance(masked, np.ndarray) else _jax().numpy
    return xp.concatenate([masked, xp.full(masked.shape[:-1] + (extra,), SENTINEL_SCORE,
                                           masked.dtype)], axis=-1)


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
    return isinstance(value, _jax().core.Tracer)


INT32_END = 2 ** 31
"""One past the largest int32: state ids and tokens the kernels read are int32."""


def int32_within(values, high: int):
    """Int `values` (any shape; checked ints) as int32, each value outside
    [0, high) replaced by -1 BEFORE the narrowing cast. jax (x64 off) keeps
    an int64's low 32 bits, so token 2**32 + 1 would be read as token 1;
    -1 is outside every vocabulary and state range, so the kernels treat it
    as they treat any token (or state id) outside them: the row becomes
    invalid. Concrete values (numpy, lists): one numpy pass; a jax array of
    a wider dtype (x64 on, traced or not): the same select on the device,
    never read back to the host; int32 and narrower jax arrays as they are
    (nothing to wrap: a uint32 past 2**31 becomes negative, also invalid)."""
    if isinstance(values, _jax().Array):  # tracers too
        if values.dtype.itemsize <= 4:
            return values
        jnp = _jax().numpy
        return jnp.where((values >= 0) & (values < high), values, -1).astype(jnp.int32)
    values = np.asarray(values)
    return np.where((values >= 0) & (values < high), values, -1).astype(np.int32)


def _state_field(state_type: type, fields: tuple, index: int, kind: str, where: str):
    """Field `index` of a state as an array (lists of numbers become numpy
    arrays); kind "int" (an integer dtype), "bool" or "float"."""
    name, value = state_type._fields[index], fields[index]
    if not (hasattr(value, "dtype") and hasattr(value, "shape")):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):  # ragged nested lists
            value = None
    dtype = getattr(value, "dtype", None)
    ok = dtype is not None and (_is_float_dtype(dtype) if kind == "float" else
                                _is_integer_dtype(dtype) if kind == "int" else dtype == bool)  # noqa: E721 (a numpy dtype)
    if not ok:
        found = (f"{dtype}{list(np.shape(value))}" if dtype is not None
                 else f"{str(fields[index])[:60]!r} (not an array)")
        raise DecodeInputError(f"{where}: state.{name} is {found}, expected {kind} array "
                               f"({state_type.__name__} fields {state_type._fields})")
    return value


def check_processor_state(state, where: str) -> ProcessorState:
    """`state` as a ProcessorState: `node` an integer array, `valid` and
    `finished` bool arrays, all of one shape (B,). Lists of ints / bools are
    read as numpy arrays; a node id outside int32 is replaced by -1 (not a
    state: the row is invalid, as for any id that is not a state at the
    step) before the kernels read it as int32 (`int32_within`)."""
    fields = check_fields(state, ProcessorState, where)
    node, valid, finished = (_state_field(ProcessorState, fields, i, kind, where)
                             for i, kind in enumerate(("int", "bool", "bool")))
    shapes = [tuple(np.shape(f)) for f in (node, valid, finished)]
    if len(shapes[0]) != 1 or any(s != shapes[0] for s in shapes):
        raise DecodeInputError(f"{where}: state fields {ProcessorState._fields} have shapes "
                               f"{shapes}, expected one shape (batch,)")
    return ProcessorState(int32_within(node, INT32_END), valid, finished)


_BEAM_KINDS = ("int", "float", "int", "bool", "bool", "int", "int", "int")
"""The dtype kind of each BeamState field (tokens, scores, node, valid,
finished, lengths, last_tokens, parent)."""


def check_beam_state(state, max_length: int, where: str) -> BeamState:
    """`state` as a BeamState: every field an array of its kind (tokens,
    node, lengths, last_tokens and parent integer, scores float, valid and
    finished bool), tokens of shape (B, M, max_length) and the others (B,
    M). Lists are read as numpy arrays; a concrete integer field is
    returned as int32 and must hold values within int32 (a wider one would
    wrap in the kernels)."""
    fields = check_fields(state, BeamState, where)
    fields = [_state_field(BeamState, fields, i, kind, where) for i, kind in enumerate(_BEAM_KINDS)]
    shapes = [tuple(np.shape(f)) for f in fields]
    batch = shapes[2]
    if len(batch) != 2 or shapes[0] != batch + (max_length,) or \
            any(s != batch for s in shapes[1:]):
        raise DecodeInputError(f"{where}: state fields {BeamState._fields} have shapes {shapes}, "
                               f"expected (batch, beams, {max_length}) for tokens and "
                               "(batch, beams) for the others")
    for i, kind in enumerate(_BEAM_KINDS):
        value = fields[i]
        if kind == "int" and not isinstance(value, _jax().Array) and value.dtype != np.int32:
            if value.size and (value.min() < -INT32_END or value.max() >= INT32_END):
                raise DecodeInputError(f"{where}: state.{BeamState._fields[i]} holds "
                                       f"{value.max() if value.max() >= INT32_END else value.min()}"
                                       ", expected values within int32")
            fields[i] = value.astype(np.int32)
    return BeamState(*fields)


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


class JaxStates:
    """The state checks and host reads both JAX engines share (the
    in-process `backend.decode.engine.JaxEngine` and the exported modules'
    `serving.engine.ExportedEngine`; a host of it has `max_length`)."""

    max_length: int

    def processor_state(self, state, where: str) -> tuple:
        """(state, B) after `check_processor_state`."""
        state = check_processor_state(state, where)
        return state, int(np.shape(state.node)[0])

    def beam_state(self, state, where: str) -> tuple:
        """(state, B, M) after `check_beam_state`."""
        state = check_beam_state(state, self.max_length, where)
        return (state, *np.shape(state.node))

    def unfinished(self, state) -> bool:
        """Whether a valid beam has not ended, read from host copies of the
        (B, M) flags: eager jax ops would compile a program each, per
        shape, on a first request."""
        return bool((np.asarray(state.valid) & ~np.asarray(state.finished)).any())

    def host_result(self, result):
        """A result as `NameTable.texts` reads it: jax arrays already are."""
        return result
