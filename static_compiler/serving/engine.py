"""`ExportedEngine`: the served artifact's engine of
`decoding.decoder.Decoder` (`serving.Artifact`), its device work done by
the exported StableHLO modules: init, beam_step (and its subset / ranked / prior /
beam-schedule variants), mask and advance, each taking the step as a traced
int32 (one program for every step). `allowed` has no module: its prefixes
are replayed through advance (`decoder.replay_allowed`, the semantics of
`backend.decode.prefix.allowed`); `beam_search` steps the exported
beam_step from Python (`support.beam_loop`). Like `serving`, it needs only
jax, numpy and the serving modules of this package: no compiler module.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler.decoding.decoder import replay_allowed
from static_compiler.errors import DecodeInputError
from static_compiler.format import spec as fmt
from static_compiler.item_bits.liveness import checked_subset_index
from static_compiler.jax_support.beam_result import finalize_complete
from static_compiler.serving.runtime import Module
from static_compiler.support.arguments import check_beam_schedule, is_int
from static_compiler.support.decode_state import (
    SENTINEL_SCORE,
    BeamState,
    JaxStates,
    ProcessorState,
    check_logits,
    check_prefixes,
    check_start_tokens,
    check_step,
    check_token_values,
    check_tokens,
    int32_within,
    padded_columns,
)


class RankedArguments(tuple):
    """A ranked subset's arguments to the ``_ranked`` modules (the leaves of
    its `jax_support.ranked_arrays.RankedMask`, in pytree order)."""


class ExportedEngine(JaxStates):
    """The modules of one loaded artifact version on its tables. warmth:
    the `serving.warm.Warmth` (compile counter, subset padding) its
    reloads share."""

    pad_from = 1  # (after a warm-up every stack of up to K subsets, one included, is K)

    def __init__(self, path, manifest, tables: tuple, modules: dict, items, placement,
                 warmth, set_view=None):
        self.path, self.manifest, self.tables = path, manifest, tables
        self.set_view = set_view  # (the trie and order a ranked subset's ranges come from)
        self.modules, self.items, self.placement, self.warmth = modules, items, placement, warmth
        self.max_length, self.vocab_size = manifest.max_length, manifest.vocab_size
        self.end_token = manifest.end_token
        self.beam_sizes, self.beam_schedules = manifest.beam_sizes(), manifest.beam_schedules

    def pad_to(self) -> Optional[int]:
        return self.warmth.pad_to

    def counting(self):
        return self.warmth.counter.counting()

    def compilations(self) -> int:
        return self.warmth.counter.count

    # Modules and beam schedules

    def beam_module(self, kind: str, beam_size: int) -> Module:
        """The module `kind` for beam_size beams: an exported beam size's
        (or init_m1, the start of every beam schedule)."""
        if fmt.beam_module_name(kind, beam_size) not in self.modules:
            raise DecodeInputError(f"beam_size={beam_size}: this artifact exports beam sizes "
                                   f"{list(self.beam_sizes)} (compile with export_beam_sizes=... "
                                   "to add one)")
        return self.modules[fmt.beam_module_name(kind, beam_size)]

    def step_module(self, beam_size: int, beam_size_out: int, subset,
                    prior: bool = False) -> Module:
        """The module of a step from beam_size beams keeping beam_size_out
        (its subset / prior variant; subset "ranked": its ranked variant)."""
        if beam_size == beam_size_out:
            self.beam_module("beam_step", beam_size)  # (exported?)
            return self.modules[fmt.step_module_name(beam_size, beam_size, subset, prior)]
        name = fmt.step_module_name(beam_size, beam_size_out, subset, prior)
        if name not in self.modules:
            raise DecodeInputError(f"beam_step: beam_size={beam_size_out} from a state of "
                                   f"{beam_size} beams: this artifact has no module {name!r} "
                                   f"(its beam schedules: {self._schedules_text()}; compile "
                                   "with export_beam_sizes=(..., SCHEDULE) to add one)")
        return self.modules[name]

    def _schedules_text(self) -> str:
        return ", ".join(str(list(s)) for s in self.beam_schedules) or "none"

    def check_schedule(self, beam_size) -> tuple:
        """The widths of beam_size (an int, or one width per step: a beam
        schedule; `arguments.check_beam_schedule`) after checking that this
        artifact runs it: an exported beam size, or a schedule it was
        exported for. Raises DecodeInputError naming what it exports."""
        widths = check_beam_schedule(beam_size, self.max_length)
        schedule = widths[1:]
        if is_int(beam_size):
            self.beam_module("beam_step", beam_size)
        elif schedule not in self.beam_schedules:
            raise DecodeInputError(f"beam_size={list(schedule)}: this artifact was exported for "
                                   f"the beam schedules {self._schedules_text()} and the beam "
                                   f"sizes {list(self.beam_sizes)} (compile with "
                                   f"export_beam_sizes=(..., {tuple(schedule)}) to add it)")
        return widths

    # Arguments on the device

    def _step(self, step, where: str):
        return jnp.asarray(check_step(step, self.max_length, where, traced=True), jnp.int32)

    def _logits(self, logits, batch_shape: tuple, where: str):
        """float32 logits of the set's V tokens (a padded vocabulary's
        columns >= V cut off: `check_logits`)."""
        return jnp.asarray(check_logits(logits, batch_shape, self.vocab_size, where)
                           ).astype(jnp.float32)

    def place_subset(self, subset, subset_index, batch_size: int, where: str,
                     fingerprint: str) -> list:
        """The subset modules' extra arguments: the bits (put on the device,
        or mesh, once per subset: its `placements`), then subset_index; for
        a `RankedSubset`, the ranked modules' (`_place_ranked`)."""
        if self.items is None:
            raise DecodeInputError(f"{where}: artifact {str(self.path)!r} exports no subset "
                                   "modules (compile with export_subsets=True)")
        on = None if self.placement is None else self.placement.sharding(None)
        rank = sys.modules.get("static_compiler.item_bits.rank")  # (none made: not loaded)
        if rank is not None and isinstance(subset, rank.RankedSubset):
            return self._place_ranked(subset, subset_index, batch_size, where, fingerprint, on)
        index = checked_subset_index(subset, fingerprint, subset_index, batch_size, where)

        def put():
            live, ends = subset.placed(lambda w: jax.device_put(w, on))
            return [w for w in live + ends if w is not None]

        return [*subset.placements.get((on, subset.num_subsets), put),
                jnp.asarray(index, jnp.int32)]

    def _place_ranked(self, subset, subset_index, batch_size: int, where: str, fingerprint: str,
                      on) -> "RankedArguments":
        """The ``_ranked`` modules' extra arguments for a `RankedSubset`: the
        leaves of its `ranked_arrays.RankedMask` (the set's range tables put
        once per loaded set, the subset's rank bits once per subset)."""
        if not self.manifest.exports_ranked:
            raise DecodeInputError(f"{where}: subset is a RankedSubset: artifact "
                                   f"{str(self.path)!r} exports no ranked-subset modules (written "
                                   "before format version 16: `static-compiler re-export PATH` "
                                   "adds them; or pass subset(...) of the same selection)")
        from static_compiler.jax_support import ranked_arrays
        mask = ranked_arrays.ranked_mask(subset, ranked_arrays.set_ranges(self.set_view, on),
                                         fingerprint, subset_index, batch_size, where, on)
        leaves = ranked_arrays.ranked_leaves(mask)[0]
        module = self.modules["mask_ranked"]  # (checked once per subset and loaded module)
        subset.placements.get(("jax-ranked-checked", on, id(module)),
                              lambda: self._check_ranked(leaves, module, where))
        return RankedArguments(leaves)

    def _check_ranked(self, leaves: list, module: Module, where: str) -> bool:
        """True if `leaves` have the shapes the ranked modules take (the set's
        range tables as exported: another version's after additions); else
        DecodeInputError naming re-export."""
        want = [a for a in module.entry.args if a.name.startswith("ranked.")]
        for leaf, spec in zip(leaves, want):
            shape = tuple(np.shape(leaf))
            if len(shape) != len(spec.shape) or any(
                    isinstance(d, int) and d != n for d, n in zip(spec.shape, shape)):
                break
        else:
            if len(leaves) == len(want):
                return True
        raise DecodeInputError(f"{where}: artifact {str(self.path)!r}'s ranked-subset modules take "
                               "the range tables of the version they were exported with, and "
                               "this version's differ (items added since: "
                               f"{spec.name} {list(spec.shape)}, this version's "
                               f"{list(np.shape(leaf))}): `static-compiler re-export PATH` "
                               "exports them for it (or pass subset(...) of the same selection)")

    def _variant(self, live) -> str:
        """Which variant of a module reads `live`: "ranked" or "subset"."""
        return "ranked" if isinstance(live, RankedArguments) else "subset"

    def place_prior(self, prior, where: str):
        """The prior modules' extra argument: the prior's best terms, on
        the device (once per Prior)."""
        if not self.manifest.exports_priors:
            raise DecodeInputError(f"{where}: artifact {str(self.path)!r} exports no item-prior "
                                   "modules (compile with export_priors=True)")
        return prior.placements.get(("jax", None), lambda: jax.device_put(prior.best))

    # The verbs' device work

    def root(self, batch_size: int) -> ProcessorState:
        """Every row at the root, valid, not finished (host arrays put on
        the device: no program to compile)."""
        return ProcessorState(node=jnp.asarray(np.zeros((batch_size,), np.int32)),
                              valid=jnp.asarray(np.ones((batch_size,), bool)),
                              finished=jnp.asarray(np.zeros((batch_size,), bool)))

    def mask(self, logits, state, step, live):
        given, logits = logits, self._logits(logits, tuple(np.shape(state[0])[:1]), "mask")
        width = np.shape(given)[-1]  # (checked: the model's, >= V)
        step = self._step(step, "mask")
        if live is None:
            return padded_columns(self.modules["mask"](self.tables, logits, *state, step)[0],
                                  width)
        return padded_columns(self.modules["mask_" + self._variant(live)](
            self.tables, logits, *state, step, *live)[0], width)

    def allowed_tokens(self, state, step, live):
        step = check_step(step, self.max_length, "allowed_tokens", traced=True)
        zeros = np.zeros((int(np.shape(state[0])[0]), self.vocab_size), np.float32)
        return self.mask(zeros, state, step, live) != SENTINEL_SCORE

    def advance(self, state, tokens, step, live) -> ProcessorState:
        check_tokens(tokens, int(np.shape(state[0])[0]), "advance")
        tokens = jnp.asarray(int32_within(tokens, self.vocab_size))  # no int64 wraps to a token
        step = self._step(step, "advance")
        if live is None:
            return ProcessorState(*self.modules["advance"](self.tables, *state, tokens, step))
        return ProcessorState(*self.modules["advance_" + self._variant(live)](
            self.tables, *state, tokens, step, *live))

    def prefixes(self, prefixes, where: str) -> tuple:
        check_prefixes(prefixes, self.max_length, where)
        prefixes = np.asarray(prefixes)
        check_token_values("prefixes", prefixes, self.vocab_size, where)
        return prefixes, prefixes.shape[0]

    def allowed(self, prefixes, live):
        if prefixes.shape[0] == 0:  # (a host array put on the device: no program)
            return jnp.asarray(np.zeros((0, self.vocab_size), bool))
        return replay_allowed(self, prefixes, live)

    def init_beams(self, batch_size: int, beam_size: int, start_token) -> BeamState:
        start = check_start_tokens(start_token, batch_size, "init_beams")
        module = self.beam_module("init", beam_size)
        return BeamState(*module((), jnp.asarray(start)))

    def beam_step(self, state, logits, step, live, width: int, prior, where: str) -> BeamState:
        del where  # (named as the exported step: beam_step)
        B, M = np.shape(state.node)
        logits = self._logits(logits, (B, M), "beam_step")
        step = self._step(step, "beam_step")
        ranks = [] if prior is None else [prior]
        module = self.step_module(M, width, subset=live is not None and self._variant(live),
                                  prior=bool(ranks))
        return BeamState(*module(self.tables, *state, logits, step, *ranks, *(live or ())))

    def searcher(self, beam_size, widths: tuple) -> Callable:
        """The exported step of each width, after checking the artifact runs
        beam_size (`check_schedule`)."""
        self.check_schedule(beam_size)
        return lambda state, logits, t, live, prior: self.beam_step(
            state, logits, t, live, widths[t + 1], prior, "beam_search")

    def finalize(self, state, length_penalty: float):
        return finalize_complete(state, depth=self.manifest.depth, length_penalty=length_penalty)

