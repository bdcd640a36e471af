"""`JaxEngine`: the in-process jax engine of `decoding.decoder.Decoder`,
the device work of the compiled set's verbs (`CompiledConstraints`): the
processor pair (`processor`), the stateless mask from prefixes (`prefix`),
the beam step that a served artifact's modules run too
(`step.beam_step_program`, one program for every step, so the two doors
give bit-identical beams) and `finalize`.

The decoder's modules (jax) are read through the package at call time:
a set compiles and saves without jax installed.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, Optional

import numpy as np

from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    JaxStates,
    check_int,
    check_logits,
    check_prefixes,
    check_start_tokens,
    check_step,
    check_token_values,
    is_traced,
)


@functools.lru_cache(maxsize=None)
def _padded_allowed():
    """`prefix.padded_prefix_mask` jitted (the plan static): jax is
    imported on first use."""
    import jax

    def allowed(plan, tables, prefixes, length, subset):  # (a program of its own)
        return decode.prefix.padded_prefix_mask(plan, tables, prefixes, length, subset)

    return jax.jit(allowed, static_argnums=(0,))


class JaxEngine(JaxStates):
    """The device work of a compiled set: `plan`, its device tables
    (`tables()`, placed on first use) and its `Warmth` (`warmth()`: the
    compile counter and subset padding its versions share); set_view: its
    `rules.set_view.SetView` (`set_view()`), for ranked subsets, or None
    (a set without items: ranked subsets refused)."""

    pad_from = 2  # (one subset keeps its own shape: a removal's, warmed with the set)

    def __init__(self, plan, tables: Callable, warmth: Callable,
                 set_view: Optional[Callable] = None):
        self.plan = plan
        self._tables = tables
        self._warmth = warmth
        self._set_view = set_view
        self.max_length, self.vocab_size = plan.max_length, plan.vocab_size
        self.end_token = plan.end_token

    @property
    def tables(self):
        return self._tables()

    def pad_to(self):
        return self._warmth().pad_to

    def counting(self):
        return self._warmth().counter.counting()

    def compilations(self) -> int:
        return self._warmth().counter.count

    def place_subset(self, subset, subset_index, batch_size: int, where: str, fingerprint: str):
        """The decoder's `LiveMask`; for a `rank.RankedSubset` of this set
        (`ranked_subset`), its `ranked.RankedMask` over the set's ranges
        (made once per set view: `ranked.set_ranges`)."""
        rank = sys.modules.get("static_compiler.item_bits.rank")  # (none made: not loaded)
        if rank is not None and isinstance(subset, rank.RankedSubset):
            if self._set_view is None:
                raise DecodeInputError(f"{where}: a ranked subset, but this set has no item "
                                       "index (ranked subsets are a set's with item subsets)")
            return decode.ranked.ranked_mask(subset, decode.ranked.set_ranges(self._set_view()),
                                             fingerprint, subset_index, batch_size, where)
        return decode.live.subset_live_mask(subset, fingerprint, subset_index, batch_size, where)

    def place_prior(self, prior, where: str):
        """The decoder's `LivePrior`, placed on the default device once."""
        del where  # (every prior of this set fits)
        import jax
        return decode.prior.LivePrior(prior.placements.get(("jax", None),
                                                           lambda: jax.device_put(prior.best)))

    def root(self, batch_size: int):
        return decode.processor.init_processor_state(batch_size)

    def mask(self, logits, state, step, live):
        return decode.processor.mask(self.plan, self.tables, logits, state, step, live)

    def allowed_tokens(self, state, step, live):
        step = check_step(step, self.max_length, "allowed_tokens", traced=True)
        zeros = np.zeros((state.node.shape[0], self.vocab_size), np.float32)
        return decode.processor.mask(self.plan, self.tables, zeros, state, step, live) \
            != SENTINEL_SCORE

    def advance(self, state, tokens, step, live):
        return decode.processor.advance(self.plan, self.tables, state, tokens, step, live)

    def prefixes(self, prefixes, where: str) -> tuple:
        check_prefixes(prefixes, self.max_length, where)
        return prefixes, np.shape(prefixes)[0]

    def allowed(self, prefixes, live):
        """Concrete prefixes: padded to max_length on the host and masked by
        one program for every length (`prefix.padded_prefix_mask`, bit for
        bit `prefix.allowed`; per row count and subset shape, so a loop over
        growing prefixes compiles once); traced ones (inside the caller's
        jit) and no rows: `prefix.allowed`, one program per length."""
        if is_traced(prefixes) or not np.shape(prefixes)[0]:
            return decode.prefix.allowed(self.plan, self.tables, prefixes, live)
        tokens = np.asarray(prefixes)  # (prefix.allowed reads them back to check too)
        check_token_values("prefixes", tokens, self.vocab_size, "allowed")
        n, t = tokens.shape
        decode.live.check_live_mask(self.plan, live, n, "allowed")
        padded = np.zeros((n, self.max_length), np.int32)
        padded[:, :t] = tokens  # (in [0, V): checked)
        return _padded_allowed()(self.plan, self.tables, padded, np.int32(t), live)

    def init_beams(self, batch_size: int, beam_size: int, start_token):
        start = check_start_tokens(start_token, batch_size, "init_beams")
        return decode.step.init_beam_state(self.plan, batch_size, beam_size, start)

    def beam_step(self, state, logits, step, live, width: int, prior, where: str,
                  tokens_per_beam=None):
        """tokens_per_beam: the most children a beam may contribute at this
        step (None: no cap)."""
        B, M = np.shape(state.node)
        logits = check_logits(logits, (B, M), self.vocab_size, where)
        step = check_step(step, self.max_length, where, traced=True)
        cap = check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        decode.prior.check_live_prior(self.plan, prior, 0.0)
        return decode.step.beam_step_program(self.tables, state, logits, step, live,
                                             plan=self.plan, caps=(cap,) * self.max_length,
                                             beam_size=None if width == M else width,
                                             prior=prior)

    def searcher(self, beam_size, widths: tuple, tokens_per_beam=None) -> Callable:
        """A search stepped from Python over `beam_step` (the compiled
        set's own `beam_search` is one compiled program instead)."""
        del beam_size  # (any widths: `widths`)
        return lambda state, logits, t, live, prior: self.beam_step(
            state, logits, t, live, widths[t + 1], prior, "beam_search",
            tokens_per_beam=tokens_per_beam)

    def finalize(self, state, length_penalty: float):
        return decode.step.finalize_complete(state, depth=self.plan.depth,
                                             length_penalty=length_penalty)

