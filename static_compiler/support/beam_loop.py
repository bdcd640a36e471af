"""The beam-search loop of the front doors that step a search from Python:
the served artifact (`artifact.serving.Artifact.beam_search`, over its
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
from static_compiler.support.arguments import check_callable, check_rows, model_output


def check_search(logits_fn, batch_size, beam_size, carry, reorder) -> tuple[int, int]:
    """(B, M) after checking a search's arguments: sizes, callables, and a
    carry with beam_size > 1 needs `reorder` (the model state of each beam's
    parent). Raises DecodeInputError naming the bad value."""
    B, M = check_rows(batch_size, beam_size)
    check_callable("logits_fn", logits_fn)
    if reorder is not None:
        check_callable("reorder", reorder)
    elif carry is not None and M > 1:
        raise DecodeInputError("beam_search: a carry with beam_size > 1 needs reorder="
                               "fn(carry, parent) (the model state of each beam's parent)")
    return B, M


def run_search(state, step_fn: Callable, logits_fn: Callable, *, max_length: int,
               vocab_size: int, end_token: Optional[int], carry=None,
               reorder: Optional[Callable] = None) -> tuple:
    """(last state, carry) of a search from `state` (a BeamState (B, M)):
    at each step t, ``logits, carry = logits_fn(state.last_tokens, t,
    carry)`` (logits (B, M, V), checked as a pair), ``state = step_fn(state,
    logits, t)``, and ``carry = reorder(carry, state.parent)``; with an end
    token it stops once no valid beam is unfinished (one host read of a
    bool per step)."""
    B, M = state.node.shape[:2]
    for step in range(max_length):
        if end_token is not None and step and not bool((state.valid & ~state.finished).any()):
            break  # every valid beam has ended: the steps left change nothing
        logits, carry = model_output(logits_fn(state.last_tokens, step, carry),
                                     (B, M, vocab_size), f"beam_search (step {step})")
        state = step_fn(state, logits, step)
        if reorder is not None:
            carry = reorder(carry, state.parent)
    return state, carry
