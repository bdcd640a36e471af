"""The served artifact's verbs that no exported module runs by itself, built
from those that do (`serving.Artifact.mask`, `advance`, `init_beams`,
`beam_step`, `finalize`), so that the artifact speaks the verb family of
every front door (the table is in docs/README.md): `init_processor`,
`allowed_tokens` (`mask` of zero logits), `allowed` (prefixes replayed
through `advance`, as `backend.decode.prefix.allowed` does in process) and
`beam_search` (the exported step in a Python loop, `support.beam_loop`).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax.numpy as jnp
import numpy as np

from static_compiler.artifact.warm import counted
from static_compiler.rules.priors import check_no_length_penalty
from static_compiler.support.beam_loop import check_search, run_search
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    ProcessorState,
    check_prefixes,
    check_processor_state,
    check_rows,
    check_step,
    check_token_values,
)


def _root_state(batch_size) -> ProcessorState:
    """Every row at the root, valid, not finished (host arrays put on the
    device: no program to compile)."""
    batch_size = check_rows(batch_size)[0]
    return ProcessorState(node=jnp.asarray(np.zeros((batch_size,), np.int32)),
                          valid=jnp.asarray(np.ones((batch_size,), bool)),
                          finished=jnp.asarray(np.zeros((batch_size,), bool)))


def _unfinished_on_host(state) -> bool:
    """`beam_loop.any_unfinished` on host copies of the (B, M) flags: eager
    jax ops would compile a program each, per shape, on a first request."""
    return bool((np.asarray(state.valid) & ~np.asarray(state.finished)).any())


class ServedVerbs:
    """Verbs of `serving.Artifact` composed from its modules (a mixin: it
    calls the artifact's `mask`, `advance`, `init_beams`, `beam_step` and
    `finalize`, and reads `max_length`, `vocab_size` and `end_token`)."""

    def init_processor(self, batch_size: int) -> ProcessorState:
        """`ProcessorState` of `batch_size` rows: every row at the root,
        valid, not finished."""
        return _root_state(batch_size)

    def allowed_tokens(self, state: ProcessorState, step, *, subset=None, subset_index=None):
        """bool (B, V): the tokens each row of `state` may take at `step`
        (an int in [0, max_length) or an int32 scalar): `mask` of zero
        logits, kept where not SENTINEL_SCORE. A finished row allows only
        the end token, an invalid row nothing. subset / subset_index as in
        `beam_step`."""
        fields = check_processor_state(state, "allowed_tokens")
        step = check_step(step, self.max_length, "allowed_tokens", traced=True)
        zeros = np.zeros((int(np.shape(fields.node)[0]), self.vocab_size), np.float32)
        masked = self.mask(zeros, fields, step, subset=subset, subset_index=subset_index)
        with self._warmth.counter.counting():  # (mask counts its own)
            return masked != SENTINEL_SCORE

    def allowed(self, prefixes, *, subset=None, subset_index=None):
        """prefixes int (N, t), t in [0, max_length) -> bool (N, V): the
        tokens that may follow each prefix, with no per-row state (the
        semantics of `backend.decode.prefix.allowed`: a finished prefix
        allows the end token, one outside the set nothing). subset_index:
        one subset per prefix row. Raises DecodeInputError for a token
        outside [0, V)."""
        check_prefixes(prefixes, self.max_length, "allowed")
        prefixes = np.asarray(prefixes)
        check_token_values("prefixes", prefixes, self.vocab_size, "allowed")
        n, t = prefixes.shape
        if n == 0:  # (a host array put on the device: no program)
            return jnp.asarray(np.zeros((0, self.vocab_size), bool))
        state = self.init_processor(n)
        for step in range(t):
            state = self.advance(state, prefixes[:, step], step, subset=subset,
                                 subset_index=subset_index)
        return self.allowed_tokens(state, t, subset=subset, subset_index=subset_index)

    @counted
    def beam_search(self, logits_fn: Callable, batch_size: int, beam_size: int, *, subset=None,
                    subset_index=None, start_token=0, carry=None,
                    reorder: Optional[Callable] = None, length_penalty: float = 0.0,
                    return_carry: bool = False, prior=None):
        """Constrained beam search through the exported modules: `init_beams`,
        `beam_step` at each step, `finalize`; beam_size (an int, or one
        width per step: a beam schedule) must be one the artifact was
        exported for (`beam_schedules`).

        logits_fn: ``(last_tokens int32 (B, M), step int, carry) -> (logits
        float (B, M, V), carry)``. reorder: ``fn(carry, parent int32 (B, M))
        -> carry``, the model state of each beam's parent (needed for a
        carry when beam_size > 1). start_token, length_penalty, subset,
        subset_index, prior (`prior`; with an artifact exported with
        export_priors=True): as `static_compiler.beam_search`. With an end token
        the search stops once every valid beam has ended (read on the host:
        no program). Its compilations count in `compilations()`, the
        model's own included (as the compiled set's `beam_search`, whose
        program holds the model). Returns a
        `DecodeResult`, or ``(result, carry)`` with return_carry. Raises
        DecodeInputError for bad arguments and a beam size not exported."""
        B, widths = check_search(logits_fn, batch_size, beam_size, carry, reorder,
                                 self.max_length)
        self.check_schedule(beam_size)
        check_no_length_penalty(prior, length_penalty)
        state = self.init_beams(B, widths[0], start_token)
        step = lambda s, logits, t: self.beam_step(s, logits, t, subset=subset,
                                                   subset_index=subset_index,
                                                   beam_size=widths[t + 1], prior=prior)
        state, carry = run_search(state, step, logits_fn, max_length=self.max_length,
                                  vocab_size=self.vocab_size, end_token=self.end_token,
                                  carry=carry, reorder=reorder, widths=widths,
                                  unfinished=_unfinished_on_host)
        result = self.finalize(state, length_penalty)
        return (result, carry) if return_carry else result
