"""Validators of the torch backend's arguments: the checks (and messages)
of `static_compiler.decode_state` for torch tensors, without importing jax
(the rules themselves are `static_compiler.arguments`, shared with it).
They read shapes and dtypes only (no tensor values, so no host
synchronisation), except `check_token_values`, which `allowed` calls on
eager prefixes only.
"""

from __future__ import annotations

import numpy as np
import torch

from static_compiler import arguments
from static_compiler.arguments import (check_logits_shape, check_prefix_shape,
                                       check_token_shape, is_int)
from static_compiler.decode_types import BeamState, ProcessorState
from static_compiler.errors import DecodeInputError


def _is_int_dtype(dtype) -> bool:
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


def check_state(state, where: str) -> ProcessorState:
    """`state`: the 3 `ProcessorState` tensors (node, valid, finished), each (B,)."""
    state = _tensor_fields(state, ProcessorState, where)
    shapes = [tuple(f.shape) for f in state]
    if len(shapes[0]) != 1 or any(s != shapes[0] for s in shapes):
        raise DecodeInputError(f"{where}: state fields {ProcessorState._fields} have shapes "
                               f"{shapes}, expected one shape (batch,)")
    return state


def check_beam_state(state, where: str) -> BeamState:
    """`state`: the 8 `BeamState` tensors, (B, M, T) for tokens and (B, M)
    for the others."""
    state = _tensor_fields(state, BeamState, where, " (TorchConstraints.init_beams)")
    shape = tuple(state.node.shape)
    bad = [name for name, f in zip(BeamState._fields, state)
           if tuple(f.shape[:2]) != shape or f.ndim != (3 if name == "tokens" else 2)]
    if len(shape) != 2 or bad:
        raise DecodeInputError(f"{where}: state fields {bad or list(BeamState._fields)} do not "
                               f"have the shapes of a beam state (node {shape}: expected (batch, "
                               "beams); tokens (batch, beams, max_length), the others (batch, "
                               "beams))")
    return state


def check_logits(logits: torch.Tensor, batch_shape: tuple, vocab_size: int, where: str) -> None:
    """`logits` must be a float tensor of shape batch_shape + (vocab_size,)."""
    if not isinstance(logits, torch.Tensor):
        raise DecodeInputError(f"{where}: logits is a {type(logits).__name__}, expected a "
                               "float tensor")
    check_logits_shape(logits.shape, logits.dtype, logits.dtype.is_floating_point, batch_shape,
                       vocab_size, where)


def check_tokens(tokens: torch.Tensor, batch_size: int, where: str) -> None:
    """`tokens` (the chosen token per row) must be ints of shape (batch_size,)."""
    check_token_shape(tokens.shape, tokens.dtype, _is_int_dtype(tokens.dtype), batch_size, where)


def check_prefixes(prefixes: torch.Tensor, max_length: int, where: str) -> None:
    """`prefixes` must be an int tensor (N, t) with t in [0, max_length)."""
    check_prefix_shape(prefixes.shape, prefixes.dtype, _is_int_dtype(prefixes.dtype), max_length,
                       where)


def check_token_values(name: str, values: torch.Tensor, vocab_size: int, where: str) -> None:
    """Every entry must be a token in [0, vocab_size); the first that is
    not is named with its index (reads the values back to the host: eager
    callers only)."""
    arguments.check_token_values(name, values.cpu().numpy(), vocab_size, where)


def check_subset_rows(rows: torch.Tensor, batch_size: int, where: str) -> None:
    """A tensor subset_index: ints of shape (batch_size,) (values unchecked:
    one outside [0, R) reads some subset's bits)."""
    if tuple(rows.shape) != (batch_size,) or not _is_int_dtype(rows.dtype):
        raise DecodeInputError(f"{where}: subset_index has shape {tuple(rows.shape)} and dtype "
                               f"{rows.dtype}: expected ints ({batch_size},), one subset per "
                               "batch row")
