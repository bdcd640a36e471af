"""The beam-search loop of the front doors that step a search from Python:
the served artifact (`serving.Artifact.beam_search`, over its
exported modules) and the torch backend (`TorchConstraints.beam_search`).
The compiled set's search is one compiled program instead
(`backend.decode.search`); all three follow its rules: the model sees each
step's `last_tokens`, per-beam model state follows `parent`, and with an end
token the search stops once every valid beam has ended (the result is the
same; the model runs fewer steps). Standard library and `support.arguments`
only: states are duck-typed (jax arrays or torch tensors).
"""

from __future__ import annotations

from typing import Callable, Optional

from static_compiler.errors import DecodeInputError
from static_compiler.support.arguments import check_beam_schedule, check_callable, check_rows, model_output


def check_search(logits_fn, batch_size, beam_size, carry, reorder, max_length: int
                 ) -> tuple[int, tuple[int, ...]]:
    """(B, widths) after checking a search's arguments: the batch size, the
    state's beams before each step and after the last
    (`arguments.check_beam_schedule` of beam_size: an int or one width per
    step), callables, and a carry with more than one beam needs `reorder`
    (the model state of each beam's parent). Raises DecodeInputError naming
    the bad value."""
    B = check_rows(batch_size)[0]
    widths = check_beam_schedule(beam_size, max_length, B)
    check_callable("logits_fn", logits_fn)
    if reorder is not None:
        check_callable("reorder", reorder)
    elif carry is not None and max(widths) > 1:
        raise DecodeInputError("beam_search: a carry with beam_size > 1 needs reorder="
                               "fn(carry, parent) (the model state of each beam's parent)")
    return B, widths


def any_unfinished(state) -> bool:
    """Whether some valid beam of `state` has not ended: its ops on the
    state's own arrays (torch tensors: eager ops that compile nothing)."""
    return bool((state.valid & ~state.finished).any())


def run_search(state, step_fn: Callable, logits_fn: Callable, *, max_length: int,
               vocab_size: int, end_token: Optional[int], carry=None,
               reorder: Optional[Callable] = None, widths: Optional[tuple] = None,
               unfinished: Callable = any_unfinished) -> tuple:
    """(last state, carry) of a search from `state` (a BeamState (B, M)):
    at each step t, ``logits, carry = logits_fn(state.last_tokens, t,
    carry)`` (logits (B, M_t, V), M_t the state's beams, checked as a pair),
    ``state = step_fn(state, logits, t)`` (keeping widths[t + 1] beams, when
    `check_beam_schedule`'s widths are given), and ``carry = reorder(carry,
    state.parent)``; with an end token it stops once no valid beam is
    unfinished (one host read of a bool per step), but still runs each step
    where the widths change, so the result has widths[-1] beams (finished
    beams carry over unchanged: the result is the same). unfinished(state)
    -> bool: that check (the served artifact reads the flags on the host,
    where jax would compile each op of `any_unfinished`)."""
    B = state.node.shape[0]
    for step in range(max_length):
        M = state.node.shape[1]
        if end_token is not None and step and not unfinished(state) \
                and (widths is None or all(w == M for w in widths[step:])):
            break  # every valid beam has ended: the steps left change nothing
        logits, carry = model_output(logits_fn(state.last_tokens, step, carry),
                                     (B, M, vocab_size), f"beam_search (step {step})")
        state = step_fn(state, logits, step)
        if reorder is not None:
            carry = reorder(carry, state.parent)
    return state, carry
