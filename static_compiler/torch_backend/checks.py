"""Validators of the torch backend's arguments: the checks (and messages)
of `static_compiler.support.decode_state` for torch tensors, without importing jax
(the rules themselves are `static_compiler.support.arguments`, shared with it).
They read shapes and dtypes only (no tensor values, so no host
synchronisation), except `check_token_values`, which `allowed` calls on
eager prefixes only, and `check_device`, which allocates an empty tensor
once per device (whether torch can use it).
"""

from __future__ import annotations

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.support import arguments
from static_compiler.support.arguments import (
    check_logits_shape,
    check_prefix_shape,
    check_token_shape,
    is_int,
    vocab_columns,
)
from static_compiler.support.decode_types import SENTINEL_SCORE, BeamState, ProcessorState


def is_int_dtype(dtype) -> bool:
    if isinstance(dtype, torch.dtype):
        return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool
    return np.dtype(dtype).kind in "iu"


def as_tensor(name: str, value, device, where: str) -> torch.Tensor:
    """`value` (a tensor, numpy array or nested list) as a tensor on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    try:
        return torch.as_tensor(np.asarray(value), device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise DecodeInputError(f"{where}: {name}={value!r}: expected an array") from err


_USABLE: set = set()
"""The devices `check_device` allocated on (checked once each)."""


def check_device(device, where: str) -> torch.device:
    """`device` (None: the CPU; a torch.device or a string such as "cuda:0")
    as a torch.device that this torch can allocate on; else
    DecodeInputError naming it and what is wrong (not a device name, a
    CUDA device this machine does not have, a backend torch was not built
    with)."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device) and device in _USABLE:
        return device
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        why = str(err).splitlines()[0] if isinstance(err, RuntimeError) else \
            f"got a {type(device).__name__}"
        raise DecodeInputError(f"{where}: device={device!r} is not a torch device ({why}): "
                               "expected a torch.device or a name such as 'cpu', 'cuda', "
                               "'cuda:0'") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            build = "" if torch.version.cuda else " (a build without CUDA)"
            want = f"'cpu' or 'cuda:0' to 'cuda:{count - 1}'" if count else "'cpu'"
            raise DecodeInputError(f"{where}: device={device!r}: torch {torch.__version__}"
                                   f"{build} sees {count} CUDA device(s) here: expected {want}")
    try:
        torch.empty(0, device=dev)
    # torch reports a backend it was built without by its own assert ("Torch
    # not compiled with CUDA enabled"), an unbuilt kernel by NotImplementedError
    except (RuntimeError, AssertionError, NotImplementedError, ValueError) as err:
        why = (str(err).splitlines() or [type(err).__name__])[0]
        raise DecodeInputError(f"{where}: device={device!r} is not available to torch "
                               f"{torch.__version__} here ({why})") from None
    _USABLE.add(dev)
    return dev


def check_step(step, max_length: int, where: str) -> int:
    """A static decoding step: a Python or numpy int in [0, max_length)."""
    if isinstance(step, np.ndarray) and step.shape == () and step.dtype.kind in "iu":
        step = step.item()
    if is_int(step) and 0 <= step < max_length:
        return int(step)
    raise DecodeInputError(f"{where}: step={step!r} must be an int in [0, {max_length})")


def _tensor_fields(state, state_type, where: str, hint: str = ""):
    """`state` as a `state_type` (a decode_types NamedTuple) when it is a
    tuple of as many tensors; else DecodeInputError naming the fields."""
    fields = state_type._fields
    if not isinstance(state, tuple) or len(state) != len(fields) or \
            not all(isinstance(f, torch.Tensor) for f in state):
        raise DecodeInputError(f"{where}: state is a {type(state).__name__}, expected a "
                               f"tuple of {len(fields)} tensors {fields}{hint}")
    return state_type(*state)


_DTYPE_KINDS = {
    "int": is_int_dtype,
    "bool": lambda dtype: dtype == torch.bool,
    "float": lambda dtype: dtype.is_floating_point,
}


def _check_dtypes(state, kinds: dict, where: str) -> None:
    """Each field of `state` named in `kinds` (field -> "int", "bool" or
    "float") must have a dtype of that kind; else DecodeInputError naming
    the fields, their dtypes and the dtypes expected."""
    bad = [f"{name} {getattr(state, name).dtype}" for name, kind in kinds.items()
           if not _DTYPE_KINDS[kind](getattr(state, name).dtype)]
    if bad:
        want = ", ".join(f"{name} {kind}" for name, kind in kinds.items())
        raise DecodeInputError(f"{where}: state fields have dtypes {', '.join(bad)}: expected "
                               f"{want}")


def check_state(state, where: str) -> ProcessorState:
    """`state`: the 3 `ProcessorState` tensors (node int, valid bool,
    finished bool), each (B,)."""
    state = _tensor_fields(state, ProcessorState, where)
    shapes = [tuple(f.shape) for f in state]
    if len(shapes[0]) != 1 or any(s != shapes[0] for s in shapes):
        raise DecodeInputError(f"{where}: state fields {ProcessorState._fields} have shapes "
                               f"{shapes}, expected one shape (batch,)")
    _check_dtypes(state, {"node": "int", "valid": "bool", "finished": "bool"}, where)
    return state


_BEAM_KINDS = {"tokens": "int", "scores": "float", "node": "int", "valid": "bool",
               "finished": "bool", "lengths": "int", "last_tokens": "int", "parent": "int"}


def check_beam_state(state, max_length: int, where: str) -> BeamState:
    """`state`: the 8 `BeamState` tensors, (B, M, max_length) for tokens and
    (B, M) for the others; float scores, bool valid and finished, int
    others."""
    state = _tensor_fields(state, BeamState, where, " (TorchConstraints.init_beams)")
    shape = tuple(state.node.shape)
    bad = [name for name, f in zip(BeamState._fields, state)
           if tuple(f.shape[:2]) != shape or f.ndim != (3 if name == "tokens" else 2)]
    if len(shape) != 2 or bad:
        raise DecodeInputError(f"{where}: state fields {bad or list(BeamState._fields)} do not "
                               f"have the shapes of a beam state (node {shape}: expected (batch, "
                               "beams); tokens (batch, beams, max_length), the others (batch, "
                               "beams))")
    if state.tokens.shape[2] != max_length:
        raise DecodeInputError(f"{where}: state tokens have shape {tuple(state.tokens.shape)}: "
                               f"expected {shape + (max_length,)} (the set's max_length is "
                               f"{max_length})")
    _check_dtypes(state, _BEAM_KINDS, where)
    return state


def check_logits(logits: torch.Tensor, batch_shape: tuple, vocab_size: int,
                 where: str) -> torch.Tensor:
    """`logits` must be a float tensor of shape batch_shape + (W,), W >=
    vocab_size (`arguments.check_logits_shape`: the columns >= vocab_size
    of a padded vocabulary are never allowed); returns the logits of the
    set's vocab_size tokens (`logits` itself when W == vocab_size)."""
    if not isinstance(logits, torch.Tensor):
        raise DecodeInputError(f"{where}: logits is a {type(logits).__name__}, expected a "
                               "float tensor")
    width = check_logits_shape(logits.shape, logits.dtype, logits.dtype.is_floating_point,
                               batch_shape, vocab_size, where)
    return vocab_columns(logits, width, vocab_size)


def padded_columns(masked: torch.Tensor, width: int) -> torch.Tensor:
    """Masked logits float32 (..., V) widened to the model's `width` columns
    (`check_logits`), SENTINEL_SCORE in the columns >= V; `masked` itself
    when width == V."""
    extra = width - masked.shape[-1]
    return masked if not extra else \
        torch.nn.functional.pad(masked, (0, extra), value=SENTINEL_SCORE)


def check_tokens(tokens: torch.Tensor, batch_size: int, where: str) -> None:
    """`tokens` (the chosen token per row) must be ints of shape (batch_size,)."""
    check_token_shape(tokens.shape, tokens.dtype, is_int_dtype(tokens.dtype), batch_size, where)


def check_prefixes(prefixes: torch.Tensor, max_length: int, where: str) -> None:
    """`prefixes` must be an int tensor (N, t) with t in [0, max_length)."""
    check_prefix_shape(prefixes.shape, prefixes.dtype, is_int_dtype(prefixes.dtype), max_length,
                       where)


def check_token_values(name: str, values: torch.Tensor, vocab_size: int, where: str) -> None:
    """Every entry must be a token in [0, vocab_size); the first that is
    not is named with its index (reads the values back to the host: eager
    callers only)."""
    arguments.check_token_values(name, values.cpu().numpy(), vocab_size, where)


def check_subset_rows(rows: torch.Tensor, batch_size: int, where: str) -> None:
    """A tensor subset_index: ints of shape (batch_size,) (values unchecked:
    one outside [0, R) reads some subset's bits)."""
    if tuple(rows.shape) != (batch_size,) or not is_int_dtype(rows.dtype):
        raise DecodeInputError(f"{where}: subset_index has shape {tuple(rows.shape)} and dtype "
                               f"{rows.dtype}: expected ints ({batch_size},), one subset per "
                               "batch row")
