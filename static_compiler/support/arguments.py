"""Validators of decoding arguments that need neither jax nor torch: ints,
floats, callables, token values, start tokens, the per-step cap on each
beam's children, and the shape-and-dtype rules for tokens
and prefixes, each raising `DecodeInputError` naming the argument, the value
and what was expected. One definition for the JAX decoder
(`static_compiler.support.decode_state` adds the checks of jax values) and the
PyTorch backend (`static_compiler.torch_backend.checks`), so both give the
same messages. numpy only.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from static_compiler.errors import DecodeInputError


def is_int(value) -> bool:
    """A Python or numpy int, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value, *, low: Optional[int] = None, high: Optional[int] = None,
              allow_none: bool = False) -> Optional[int]:
    """`value` as a Python int; it must be a Python or numpy int (not a bool)
    in [low, high) (either bound optional), or None when `allow_none`."""
    if value is None and allow_none:
        return None
    if not is_int(value) or (low is not None and value < low) \
            or (high is not None and value >= high):
        if low is not None and high is not None:
            bound = f" in [{low}, {high})"
        elif low is not None:
            bound = f" >= {low}"
        else:
            bound = ""
        raise DecodeInputError(f"{name}={value!r}: expected an int{bound}")
    return int(value)


def check_rows(batch_size, beam_size=1) -> tuple[int, int]:
    """(B, M): batch_size and beam_size, ints >= 1 whose product (the rows
    of a decoding state, B * M) is below 2**31: row ids are int32 on the
    JAX backend, and a state that large would not fit in memory anyway
    (2**40 rows must not reach an allocator)."""
    B = check_int("batch_size", batch_size, low=1)
    M = check_int("beam_size", beam_size, low=1)
    if B * M >= 2 ** 31:  # (so each is below 2**31 too)
        raise DecodeInputError(f"batch_size={B} x beam_size={M}: {B * M} rows, expected fewer "
                               "than 2**31 rows in one decoding state")
    return B, M


def check_beam_schedule(beam_size, max_length: int, batch_size: int = 1) -> tuple[int, ...]:
    """The beams of a search's state before each step and after the last
    (its widths: max_length + 1 ints), from beam_size.

    beam_size: an int M >= 1: M beams throughout, beam 0 alone valid before
    step 0 (M, M, ..., M); or a beam schedule, a sequence of max_length
    ints >= 1, e.g. (16, 32, 64, 64): the search starts from the start beam
    alone and step t keeps its best beam_size[t] candidates (1, 16, 32, 64,
    64). The model at step t sees widths[t] beams per row, the result has
    widths[-1]. Every width times batch_size must stay below 2**31
    (`check_rows`)."""
    if is_int(beam_size):
        return (check_rows(batch_size, beam_size)[1],) * (max_length + 1)
    if isinstance(beam_size, (str, bytes)) or not hasattr(beam_size, "__len__") \
            or len(beam_size) != max_length:
        raise DecodeInputError(f"beam_size={beam_size!r}: expected an int >= 1, or a sequence "
                               f"of {max_length} ints >= 1 (the beams kept after each step)")
    widths = (1,) + tuple(check_int(f"beam_size[{t}]", m, low=1)
                          for t, m in enumerate(beam_size))
    check_rows(batch_size, max(widths))
    return widths


def check_warm_beam_sizes(sizes, max_length: int) -> tuple:
    """A warm-up's beam_sizes (every front door's ``warm``): an int, or a
    sequence of ints >= 1 and beam schedules, each checked as a search
    checks its beam_size (`check_beam_schedule`), as ints and tuples in
    first-seen order, no repeats. DecodeInputError naming the entry."""
    if is_int(sizes):
        sizes = (sizes,)
    if not isinstance(sizes, (tuple, list, range, np.ndarray)):
        raise DecodeInputError(f"warm: beam_sizes={sizes!r}: expected a sequence of ints >= 1 "
                               f"or beam schedules ({max_length} ints >= 1 each, one per step)")
    for m in sizes:
        try:
            check_beam_schedule(m, max_length)
        except DecodeInputError as err:
            raise DecodeInputError(f"warm: beam_sizes entry {m!r}: {err}") from None
    return tuple(dict.fromkeys(int(m) if is_int(m) else tuple(int(w) for w in m)
                               for m in sizes))


def check_export_beam_sizes(sizes, max_length: Optional[int] = None) -> tuple:
    """The beam sizes and schedules to export modules for (a compiled set's
    export_beam_sizes): a non-empty sequence whose entries are ints M >= 1
    (init and beam_step modules for M beams) or beam schedules (tuples of
    ints >= 1, one per step: the modules each of their steps runs, from the
    start beam alone). With max_length, each schedule must have that many
    entries. Raises DecodeInputError naming the entry."""
    expected = ("a non-empty tuple of ints >= 1 (beam sizes) or of sequences of ints >= 1, "
                "one per step (beam schedules)")
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__") or not len(sizes):
        raise DecodeInputError(f"export_beam_sizes={sizes!r}: expected {expected}")
    out = []
    for i, entry in enumerate(sizes):
        if is_int(entry) and entry >= 1:
            out.append(int(entry))
            continue
        if is_int(entry) or isinstance(entry, (str, bytes, bool)) or not hasattr(entry, "__len__") \
                or not len(entry) or not all(is_int(m) and m >= 1 for m in entry):
            raise DecodeInputError(f"export_beam_sizes={sizes!r}: entry {i} ({entry!r}) is not "
                                   "an int >= 1 nor a sequence of ints >= 1 (a beam schedule, "
                                   "one width per step)")
        if max_length is not None and len(entry) != max_length:
            raise DecodeInputError(f"export_beam_sizes={sizes!r}: entry {i} ({list(entry)!r}) is "
                                   f"a beam schedule of {len(entry)} steps, expected {max_length} "
                                   "(one width per step of the set)")
        out.append(tuple(int(m) for m in entry))
    return tuple(dict.fromkeys(out))  # (first-seen order, no repeats)


def check_finite(name: str, value) -> float:
    """`value` as a Python float; it must be a finite real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise DecodeInputError(f"{name}={value!r}: expected a finite float")
    return float(value)


def check_callable(name: str, value) -> None:
    if not callable(value):
        raise DecodeInputError(f"{name}={value!r}: expected a callable")


def check_token_shape(shape: tuple, dtype, int_dtype: bool, batch_size: int, where: str) -> None:
    """Tokens (the chosen token per row) of `shape` and `dtype` (`int_dtype`:
    whether the caller's framework calls it an integer dtype) must be ints
    of shape (batch_size,)."""
    if tuple(shape) != (batch_size,) or not int_dtype:
        raise DecodeInputError(f"{where}: tokens have shape {tuple(shape)} dtype {dtype}, "
                               f"expected int of shape ({batch_size},)")


def check_logits_shape(shape: tuple, dtype, float_dtype: bool, batch_shape: tuple,
                       vocab_size: int, where: str) -> int:
    """Logits of `shape` and `dtype` (`float_dtype`: whether the caller's
    framework calls it a floating dtype) must be floats of shape
    batch_shape + (W,) with W >= vocab_size; returns W.

    The one rule of every door that takes logits: a model's padded
    vocabulary (V = 50257 tokens in logits of 50304 columns) is accepted,
    and the columns >= vocab_size are padding, not tokens: never allowed,
    never a candidate, and not part of the log_softmax (a search over W
    columns is the search over the first V). `vocab_columns` cuts them off;
    a mask gives them SENTINEL_SCORE."""
    shape, batch = tuple(shape), tuple(batch_shape)
    if len(shape) != len(batch) + 1 or shape[:-1] != batch or shape[-1] < vocab_size:
        raise DecodeInputError(f"{where}: logits have shape {shape}, expected "
                               f"{batch + (vocab_size,)} (batch dims {batch}, vocab "
                               f"{vocab_size}; or more columns, a padded vocabulary, whose "
                               f"columns >= {vocab_size} are never allowed)")
    if not float_dtype:
        raise DecodeInputError(f"{where}: logits have dtype {dtype}, expected a float dtype "
                               "(computed in float32)")
    return int(shape[-1])


def vocab_columns(logits, width: int, vocab_size: int):
    """`logits` (an array or tensor of any framework, last axis `width` >=
    vocab_size, checked by `check_logits_shape`) restricted to the set's
    vocabulary: itself when width == vocab_size, else its first vocab_size
    columns (a view)."""
    return logits if width == vocab_size else logits[..., :vocab_size]


def check_prefix_shape(shape: tuple, dtype, int_dtype: bool, max_length: int, where: str) -> None:
    """Prefixes of `shape` and `dtype` must be an int array (N, t) with t in
    [0, max_length)."""
    shape = tuple(shape)
    if len(shape) != 2 or not int_dtype:
        raise DecodeInputError(f"{where}: prefixes have shape {shape} dtype {dtype}, expected "
                               "an int array (N, t)")
    if shape[1] >= max_length:
        raise DecodeInputError(f"{where}: prefixes have length t={shape[1]}, expected t in "
                               f"[0, {max_length}) (the set's max_length)")


def check_token_values(name: str, values: np.ndarray, vocab_size: int, where: str) -> None:
    """Every entry of the concrete int array `values` must be a token in
    [0, vocab_size); the first that is not is named with its index."""
    bad = (values < 0) | (values >= vocab_size)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise DecodeInputError(f"{where}: {name}[{', '.join(map(str, index))}]={values[index]} "
                               f"is not a token in [0, {vocab_size})")


def check_start_tokens(start_token, batch_size: int, where: str) -> np.ndarray:
    """The model's input at step 0 per row: an int, or ints of shape
    (batch_size,), within int32. Returns int32 (batch_size,)."""
    start = np.asarray(start_token) if not isinstance(start_token, (bool, np.bool_)) else None
    if start is None or start.dtype.kind not in "iu" or start.shape not in ((), (batch_size,)) \
            or (start.size and (start.min() < -2 ** 31 or start.max() >= 2 ** 31)):
        raise DecodeInputError(f"{where}: start_token={start_token!r}: expected an int or ints "
                               f"of shape ({batch_size},), within int32")
    return np.broadcast_to(start, (batch_size,)).astype(np.int32)


def check_tokens_per_beam(tokens_per_beam, max_length: int) -> tuple[Optional[int], ...]:
    """The cap on the children each beam may contribute, per step (None: no cap).

    tokens_per_beam: None (no cap); an int >= 1, which applies from step 1
    on (step 0 expands the start beam to its top beam_size children, as the
    paper and its reference do); or a sequence of max_length entries, each
    None or an int >= 1, applied as given at every step (step 0 included)."""
    if tokens_per_beam is None or is_int(tokens_per_beam):
        cap = check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        return (None,) + (cap,) * (max_length - 1)
    if isinstance(tokens_per_beam, (str, bytes)) or not hasattr(tokens_per_beam, "__len__") \
            or len(tokens_per_beam) != max_length:
        raise DecodeInputError(f"tokens_per_beam={tokens_per_beam!r}: expected None, an int >= 1, "
                               f"or a sequence of {max_length} entries (one per step, each None "
                               "or an int >= 1)")
    return tuple(check_int(f"tokens_per_beam[{t}]", cap, low=1, allow_none=True)
                 for t, cap in enumerate(tokens_per_beam))


def model_output(out, want: tuple, where: str) -> tuple:
    """(logits, new_carry): what a decoder's ``logits_fn`` returned, which
    must be that pair (a tuple or list of two); a model returning only
    logits would otherwise fail in the unpacking with Python's own message
    (or, with B = 2, unpack its batch rows). want: the logits' shape (B, M,
    V), for the message."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        if hasattr(out, "shape") and hasattr(out, "dtype"):  # an array or tensor, traced or not
            got = f"an array {out.dtype}{list(out.shape)} alone"
        elif isinstance(out, (tuple, list)):
            got = f"a {type(out).__name__} of length {len(out)}"
        else:
            got = f"a {type(out).__name__}"
        raise DecodeInputError(f"{where}: logits_fn must return (logits float (B, M, V) = "
                               f"{want}, new_carry); got {got} (return (logits, carry): the "
                               "new carry, of the carry's structure, None without carry=)")
    return out[0], out[1]
