"""The served artifact's part of the warm-up (`serving.Artifact.warm`):
every program a server's requests can call, compiled before the first
request, so that afterwards no request within the warmed bounds compiles.
The warm-up itself is every door's (`decoding.warm_up`); this module says what
the artifact's paths are (`_ArtifactPaths`).

A request's programs are fixed by its shapes: the batch size B, the beam
size M (one exported module per M), and for item subsets R, the number of
stacked subsets (the bits are uint32 (R, words)). B and M are the server's
to fix; R varies per request, so after a warm-up with max_subsets=K every
stack of R <= K subsets is padded to one shape (`Warmth.padded_rows`: empty
subsets appended, subset_index unchanged, the same results), and R never
compiles again. An artifact with an item index always decodes through the
subset modules after an update removed items (with the subset of the items
left), so those are warmed even when K = 0 (R = 1 then). `beam_sizes=None`
warms every exported beam size and schedule; with item-prior modules the
beam paths are also walked with a prior of zeros.

The warm state (`jax_support.warmth.Warmth`: the compile counter and the padding bound) is
shared by every `reload()` of one loaded artifact, as its modules are: a
version after removals or additions within capacity (same modules, same
table shapes) runs the programs already compiled. Like `serving`, this
module needs only jax, numpy and the standard library.
"""

from __future__ import annotations

import functools

import numpy as np

from static_compiler.decoding import warm_up
from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.padding import (  # noqa: F401 (the bound, here since the served warm-up)
    PADDED_SUBSETS_MAX_BYTES,
    check_max_subsets,
    pad_subsets,
    subset_bytes,
)
from static_compiler.jax_support.warmth import JaxPaths
from static_compiler.support.arguments import check_rows


def counted(method):
    """An Artifact method whose XLA compilations count in its `Warmth`'s
    counter (module calls and eager jnp ops alike; the calling thread's)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._warmth.counter.counting():
            return method(self, *args, **kwargs)

    return call


def warm(art, batch_sizes, beam_sizes, max_subsets, background, ranked=False):
    """`Artifact.warm`: every door's warm-up over the artifact's paths."""
    return warm_up.warm(art, _ArtifactPaths(art, ranked), batch_sizes, beam_sizes, max_subsets,
                        background)


class _ArtifactPaths(JaxPaths):
    """The artifact's paths: its exported beam sizes and schedules, the
    subset modules after removals, the processor modules if exported, the
    served search (a host model of zero logits: the model is not part of
    its programs), the prior modules; host and device logits."""

    def __init__(self, art, ranked: bool = False):
        if not isinstance(ranked, bool):
            raise DecodeInputError(f"warm: ranked={ranked!r}: expected a bool")
        self.art = art
        self.where = f"warm (artifact {str(art.path)!r})"
        self.warmth = art._warmth
        self.default_beams = tuple(int(m) for m in art.beam_sizes) + \
            tuple(tuple(int(w) for w in s) for s in art.beam_schedules)
        self.removals = art.items is not None
        self.processor = "mask" in art._modules
        self.search_model = _host_model(art.vocab_size)
        self.prior = _zero_prior(art) if art.manifest.exports_priors else None
        if ranked and not art.manifest.exports_ranked:
            raise DecodeInputError(f"{self.where}: ranked=True, but the artifact exports no "
                                   "ranked-subset modules (written before format version 16: "
                                   "`static-compiler re-export PATH` adds them)")
        self.ranked_door = art if ranked else None

    def beam_widths(self, beam_size, batch_size: int) -> tuple:
        widths = self.art._check_schedule(beam_size)
        check_rows(batch_size, max(widths))
        return widths


def _zero_prior(art):
    """A `rules.priors.Prior` of zeros for `art` (its shape is what the prior
    modules compile for)."""
    from static_compiler.lowered.plan import prior_size
    from static_compiler.rules.priors import Prior
    plan = art._set_view.facts.plan
    return Prior(np.zeros(prior_size(plan), np.float32), 0.0, "", art.fingerprint)


def _host_model(vocab_size: int):
    """A model of zero logits made on the host (numpy): running the served
    `beam_search` with it compiles only what the search itself runs."""
    def logits_fn(last_tokens, step, carry):  # noqa: ARG001 (the model's signature)
        return np.zeros(tuple(np.shape(last_tokens)) + (vocab_size,), np.float32), carry

    return logits_fn
