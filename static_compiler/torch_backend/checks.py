"""Validators of the torch backend's arguments: the checks (and messages)
of `static_compiler.decode_state` for torch tensors, without importing jax.
They read shapes and dtypes only (no tensor values, so no host
synchronisation), except `check_token_values`, which `allowed` calls on
eager prefixes only.
"""

from __future__ import annotations

import numpy as np
import torch

from static_compiler.errors import DecodeInputError


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


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


def check_int(name: str, value, *, low=None) -> int:
    """`value` as a Python int (not a bool), >= low when given."""
    if not _is_int(value) or (low is not None and value < low):
        bound = "" if low is None else f" >= {low}"
        raise DecodeInputError(f"{name}={value!r}: expected an int{bound}")
    return int(value)


def check_step(step, max_length: int, where: str) -> int:
    """A static decoding step: a Python or numpy int in [0, max_length)."""
    if isinstance(step, np.ndarray) and step.shape == () and step.dtype.kind in "iu":
        step = step.item()
    if _is_int(step) and 0 <= step < max_length:
        return int(step)
    raise DecodeInputError(f"{where}: step={step!r} must be an int in [0, {max_length})")


def check_state(state, where: str):
    """`state`: a tuple of three tensors (node, valid, finished) of one shape (B,)."""
    if not isinstance(state, tuple) or len(state) != 3 or \
            not all(isinstance(f, torch.Tensor) for f in state):
        raise DecodeInputError(f"{where}: state is a {type(state).__name__}, expected a "
                               "tuple of 3 tensors ('node', 'valid', 'finished')")
    shapes = [tuple(f.shape) for f in state]
    if len(shapes[0]) != 1 or any(s != shapes[0] for s in shapes):
        raise DecodeInputError(f"{where}: state fields ('node', 'valid', 'finished') have shapes "
                               f"{shapes}, expected one shape (batch,)")
    return state


def check_tokens(tokens: torch.Tensor, batch_size: int, where: str) -> None:
    """`tokens` (the chosen token per row) must be ints of shape (batch_size,)."""
    shape = tuple(tokens.shape)
    if shape != (batch_size,) or not _is_int_dtype(tokens.dtype):
        raise DecodeInputError(f"{where}: tokens have shape {shape} dtype {tokens.dtype}, "
                               f"expected int of shape ({batch_size},)")


def check_prefixes(prefixes: torch.Tensor, max_length: int, where: str) -> None:
    """`prefixes` must be an int tensor (N, t) with t in [0, max_length)."""
    shape = tuple(prefixes.shape)
    if len(shape) != 2 or not _is_int_dtype(prefixes.dtype):
        raise DecodeInputError(f"{where}: prefixes have shape {shape} dtype {prefixes.dtype}, "
                               "expected an int array (N, t)")
    if shape[1] >= max_length:
        raise DecodeInputError(f"{where}: prefixes have length t={shape[1]}, expected t in "
                               f"[0, {max_length}) (the set's max_length)")


def check_token_values(name: str, values: torch.Tensor, vocab_size: int, where: str) -> None:
    """Every entry must be a token in [0, vocab_size); the first that is
    not is named with its index (reads the values: eager callers only)."""
    bad = (values < 0) | (values >= vocab_size)
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
        raise DecodeInputError(f"{where}: {name}[{', '.join(map(str, index))}]="
                               f"{int(values[index])} is not a token in [0, {vocab_size})")


def check_subset_rows(rows: torch.Tensor, batch_size: int, where: str) -> None:
    """A tensor subset_index: ints of shape (batch_size,) (values unchecked:
    one outside [0, R) reads some subset's bits)."""
    if tuple(rows.shape) != (batch_size,) or not _is_int_dtype(rows.dtype):
        raise DecodeInputError(f"{where}: subset_index has shape {tuple(rows.shape)} and dtype "
                               f"{rows.dtype}: expected ints ({batch_size},), one subset per "
                               "batch row")
