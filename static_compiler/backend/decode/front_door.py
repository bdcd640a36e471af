"""The decoding verbs of the compiled set (`CompiledConstraints`), the ones
every front door speaks with the same names, parameters and results (the
served artifact `artifact.serving.Artifact` and the torch backend
`torch_backend.TorchConstraints` too; the table is in docs/README.md):

=================  ==========================================================
`init_processor`   `ProcessorState` of B rows at the root
`mask`             logits float (B, V) -> float32 (B, V), SENTINEL_SCORE
                   where a token is not allowed (or its logit is NaN)
`allowed_tokens`   bool (B, V): the tokens each row may take at a step
`advance`          the `ProcessorState` after each row's token
`allowed`          prefixes int (N, t) -> bool (N, V), no per-row state
`init_beams`       `BeamState` (B, M) of a search from the root
`beam_step`        one beam-search step: the `BeamState` after it
`finalize`         the `DecodeResult` of a search's state
=================  ==========================================================

(`beam_search` is `CompiledConstraints.beam_search`, the compiled search of
`static_compiler.beam_search`.) Each verb checks its arguments, reads the
set's device tables and its subset bits (`live_mask`) and counts its
compilations (`counting`): what `CompiledConstraints` provides. The beam
verbs run what a served artifact's modules run (`beam_step_switch`, one
program for every step), so the two doors give bit-identical beams.

The decoder's modules (jax) are read through the package at call time:
a set compiles and saves without jax installed.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset
from static_compiler.rules.priors import check_prior
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    BeamState,
    DecodeResult,
    ProcessorState,
    check_beam_state,
    check_finite,
    check_int,
    check_logits,
    check_prefixes,
    check_processor_state,
    check_rows,
    check_start_tokens,
    check_step,
)


class DecodeVerbs:
    """The verb family of a compiled set (a mixin of `CompiledConstraints`:
    it reads `plan`, `device_tables`, `max_length`, `vocab_size`,
    `base_subset`, `fingerprint`, `_padded` and `counting`). subset / subset_index, everywhere: a
    `Subset` of this set (`subset`, `stack_subsets`) and each row's subset,
    ints (B,) (default: subset 0 for a single subset); without a subset,
    the items this version has not removed."""

    # The decoders' arguments: item subsets and priors, on the device

    def live_mask(self, subset: Optional[Subset], subset_index, batch_size: int,
                  where: str) -> Optional[decode.live.LiveMask]:
        """The decoder's `LiveMask` for `subset` (of this set) and the subset
        of each batch row, `subset_index` ints (batch_size,) (default: all
        rows subset 0, allowed only for a single subset)."""
        if subset is None:
            if subset_index is not None:
                raise DecodeInputError(f"{where}: subset_index without a subset")
            if self.base_subset is None:
                return None
            subset = self.base_subset
        else:  # (after warm(max_subsets=K), stacks of 2..K padded to K)
            subset, subset_index = self._padded(subset, subset_index, batch_size, where)
        return decode.live.subset_live_mask(subset, self.fingerprint, subset_index, batch_size, where)

    def live_prior(self, prior, where: str):
        """The decoder's `decode.prior.LivePrior` of `prior` (a Prior of
        this set, placed on the default device once), or None."""
        if prior is None:
            return None
        import jax

        check_prior(prior, self.fingerprint, where, "CompiledConstraints.prior")
        return decode.prior.LivePrior(prior.placements.get(("jax", None),
                                                           lambda: jax.device_put(prior.best)))

    # The logits-processor pair (see backend.decode.processor)

    def init_processor(self, batch_size: int) -> ProcessorState:
        """Every one of `batch_size` rows at the root, valid, not finished."""
        return decode.processor.init_processor_state(batch_size)

    def mask(self, logits, state: ProcessorState, step, *, subset=None, subset_index=None):
        """logits float (B, V) -> float32 (B, V): the logits of the tokens
        each row of `state` may take at `step` (an int in [0, max_length),
        or an int32 scalar, traced), SENTINEL_SCORE for the others and for
        NaN logits (see backend.decode.processor.mask)."""
        state = check_processor_state(state, "mask")
        live = self.live_mask(subset, subset_index, state.node.shape[0], "mask")
        with self.counting():
            return decode.processor.mask(self.plan, self.device_tables, logits, state, step, live)

    def allowed_tokens(self, state: ProcessorState, step, *, subset=None, subset_index=None):
        """bool (B, V): the tokens each row of `state` may take at `step`
        (`mask` of zero logits, kept where not SENTINEL_SCORE): a finished
        row only the end token, an invalid row nothing."""
        state = check_processor_state(state, "allowed_tokens")
        step = check_step(step, self.max_length, "allowed_tokens", traced=True)
        B = state.node.shape[0]
        live = self.live_mask(subset, subset_index, B, "allowed_tokens")
        with self.counting():
            zeros = np.zeros((B, self.vocab_size), np.float32)
            masked = decode.processor.mask(self.plan, self.device_tables, zeros, state, step, live)
            return masked != SENTINEL_SCORE

    def advance(self, state: ProcessorState, tokens, step, *, subset=None,
                subset_index=None) -> ProcessorState:
        """Moves each row along its token, ints (B,); a token the row may
        not take makes it invalid (see backend.decode.processor.advance)."""
        state = check_processor_state(state, "advance")
        live = self.live_mask(subset, subset_index, state.node.shape[0], "advance")
        with self.counting():
            return decode.processor.advance(self.plan, self.device_tables, state, tokens, step, live)

    def allowed(self, prefixes, *, subset=None, subset_index=None):
        """prefixes int (N, t), t in [0, max_length) -> bool (N, V): the tokens
        that may follow each prefix, with no per-row state (see
        backend.decode.prefix); subset_index: one subset per prefix row."""
        check_prefixes(prefixes, self.max_length, "allowed")  # (before its rows are counted)
        live = self.live_mask(subset, subset_index, np.shape(prefixes)[0], "allowed")
        with self.counting():
            return decode.prefix.allowed(self.plan, self.device_tables, prefixes, live)

    # Beam search, one step at a time (the whole search: `beam_search`)

    def init_beams(self, batch_size: int, beam_size: int, start_token=0) -> BeamState:
        """The `BeamState` (B, M) of a search from the root: only beam 0 of
        each row valid. start_token: the model's input at step 0, an int or
        ints (batch_size,)."""
        B, M = check_rows(batch_size, beam_size)
        start = check_start_tokens(start_token, B, "init_beams")
        with self.counting():
            return decode.step.init_beam_state(self.plan, B, M, start)

    def beam_step(self, state: BeamState, logits, step, *, subset=None, subset_index=None,
                  tokens_per_beam: Optional[int] = None, beam_size: Optional[int] = None,
                  prior=None) -> BeamState:
        """One beam-search step: state (B, M), logits float (B, M, V) for
        `state.last_tokens`, step an int in [0, max_length) or an int32
        scalar (a traced step outside that range appends nothing: the state
        comes back unchanged, parent the identity). tokens_per_beam: the
        most children a beam may contribute at this step (None: no cap).
        beam_size: the beams the new state keeps (a beam schedule's width
        at this step; None: M). prior: item priors (`prior`), as
        `beam_search` takes them. The new state's ``parent`` (B,
        beam_size) reorders per-beam model state."""
        state = check_beam_state(state, self.max_length, "beam_step")
        B, M = np.shape(state.node)
        logits = check_logits(logits, (B, M), self.vocab_size, "beam_step")
        step = check_step(step, self.max_length, "beam_step", traced=True)
        cap = check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        width = None if beam_size is None else check_rows(B, beam_size)[1]
        live = self.live_mask(subset, subset_index, B, "beam_step")
        ranking = self.live_prior(prior, "beam_step")
        decode.prior.check_live_prior(self.plan, ranking, 0.0)
        with self.counting():
            return decode.step.beam_step_program(self.device_tables, state, logits, step, live,
                                                 plan=self.plan, caps=(cap,) * self.max_length,
                                                 beam_size=None if width == M else width,
                                                 prior=ranking)

    def finalize(self, state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
        """(tokens, scores, valid, lengths) of a search's state, best first.
        Only complete sequences are valid (finalized before the last step,
        unfinished prefixes come back invalid); with a length penalty (the
        GNMT exponent) the beams are re-ranked by normalized score, which
        `scores` then hold."""
        state = check_beam_state(state, self.max_length, "finalize")
        penalty = check_finite("length_penalty", length_penalty)
        with self.counting():
            return decode.step.finalize_complete(state, depth=self.plan.depth,
                                                 length_penalty=penalty)

