"""Constrained decoding over lowered tables: beam search, greedy, sampling and
a logits-processor pair (`mask` / `advance`) for custom loops.

Everything here is pure jax with static shapes, usable eagerly and inside a
user's own `jax.jit`; the plan is static, the tables are arguments. One
concern per module:

* `logprobs`: NaN-free log_softmax, read lazily, and candidate scores;
* `candidates`: every beam's candidate transitions at one step;
* `selection`: the best beams of each batch row;
* `step`: one beam-search step (static or traced step) and the final ranking;
* `search`: the drivers (beam search, sampling, greedy) around the model,
  runs of similar steps compiled as loops;
* `carry`: the user's per-beam model state, declared and reordered;
* `processor`: the `mask` / `advance` pair for custom loops;
* `speculative`: how many draft tokens stay inside the set.
* `live`: item subsets, liveness bits read per candidate;
* `ranked`: ranked subsets (`ranked_subset`), item ranges counted per
  candidate over rank bits (`live` dispatches on the form);
* `prior`: item priors, each candidate ranked with the best prior below it;
* `prefix`: `allowed`, a stateless mask from each row's tokens so far, for
  engines that own the beam search;
* `engine`: the compiled set's engine under `decoding.decoder.Decoder`.

Public: the package's names and `prefix` (`padded_prefix_mask`, for engines that
own the search); the other modules are internal.
The package exports what a user calls (`__all__`, 14 names): the drivers,
`init_beam_state` / `beam_step` / `finalize`, the processor pair `mask` /
`advance` (with `init_processor_state` and `StepProcessor`), `allowed`,
`accept_drafts` and the carry helpers. The state and result types and
constants (`TYPES`: `BeamState`, `ProcessorState`, `DecodeResult`,
`PAD_TOKEN`, `SENTINEL_SCORE`, `MIN_VALID_SCORE`) import from the package
too, but are not calls; they live in `static_compiler.support.decode_types`
and the argument validators in `support.decode_state`, shared with the
serving loader.
Everything else is imported from its module (``decode.live.LiveMask``).

How one step runs. `beam_step`, `mask` and `advance` take the step as an
int (a program specialised for that step) or as a traced int32 scalar (one
program for every step: they dispatch to `step.beam_step_switch`,
`processor.mask_switch`, `processor.advance_switch`, which the exported
modules call directly). Every entry point ends in one of the three
candidate paths of `candidates` (a beam's candidate transitions at a step);
which one depends on whether the step is a Python int when tracing and on
how many steps share a program:

======================================  ==============  =============================================
entry point                             step            candidates from
======================================  ==============  =============================================
`beam_step`, `mask`, `advance`,         a Python int    `step_candidates` at t: the layer's own
`StepProcessor`                                         kernel (`kernels.expand`; a mixed layer's
                                                        best children, `mixed_children`)
`beam_search`, `greedy_decode`,         runs of steps   per run of `step.step_segments` (a loop;
`sample`                                (a loop each)   one step each where `search.unrolled`):
                                                        `step.run_candidates` picks (1) one step:
                                                        `step_candidates`; (2) tables small enough
                                                        to pack (`kernels.PACK_MAX_ENTRIES`):
                                                        `packed_step_candidates`, one gather for
                                                        every step of the run; (3) else a
                                                        `lax.switch` over the steps (over
                                                        `GroupedRun` groups where steps share a
                                                        kernel): `switched_step_candidates`
                                                        (gathers only) where `switched` (no dense
                                                        rows, no mixed layer), else
                                                        `step_candidates` per branch
                                                        (`switch_steps`)
`beam_step` (`step.beam_step_switch`;   traced int32    a `lax.switch` over the runs of
the exported modules,                                   `step_segments`, each run as `beam_search`
`serving.Artifact.beam_step`)                           runs it (`run_candidates`)
`mask`, `advance`                       traced int32    a `lax.switch` over the steps, grouped
(`processor.mask_switch`,                               where kernels repeat
`advance_switch`), `allowed`,                           (`step.switch_over_groups`,
`accept_drafts`                                         `switch_over_steps`), each branch the
                                                        static path (`step_candidates` at t)
======================================  ==============  =============================================

Every path gives the same valid columns in the same order, so they decode
bit-identically (tests/backend/test_packed_runs.py, tests/backend/test_processor.py).

Beam-search semantics (tested bit-for-bit against a numpy oracle):

* log-probabilities are ``log_softmax`` of the logits over the full
  vocabulary; a NaN logit is an invalid token; +inf logits share all the
  probability; tokens whose log-probability is -inf are invalid;
* step 0 expands beam 0 of each batch row only (all beams start at the root),
  to its top ``beam_size`` valid children whatever ``tokens_per_beam`` is (the
  paper's rule; a per-step schedule of caps applies as given);
* from step 1 each live beam expands to its valid children (or its top
  ``tokens_per_beam`` of them); the top ``beam_size`` candidates per row
  survive, sorted by score descending, ties broken by lower parent beam, then
  lower token id (the end token's candidate comes after a beam's other
  children);
* with an end token, a beam in an accepting state may take the end token and
  is then finished: it keeps its score, stops expanding, and competes with
  live beams for the ``beam_size`` places; decoding runs ``depth + 1`` steps;
* beams that cannot be filled (fewer valid sequences than beams) have
  ``valid=False``, score `SENTINEL_SCORE` and tokens `PAD_TOKEN` throughout;
* a valid candidate's score is ``max(parent score + log-prob,
  MIN_VALID_SCORE)`` in float32: huge negative finite logits (or a float32
  overflow of the sum) never push a valid sequence below an invalid one.
"""

from static_compiler.support.decode_types import (  # noqa: F401
    MIN_VALID_SCORE,
    PAD_TOKEN,
    SENTINEL_SCORE,
    BeamState,
    DecodeResult,
    ProcessorState,
)
from static_compiler.support.lazy import lazy_exports

# Names import their module on first use: `compiled` and `warm` name this
# package at import, and the compiler runs without jax (only decoding needs it).
_EXPORTS = {
    "beam_search": "search", "greedy_decode": "search", "sample": "search",
    "init_beam_state": "step", "beam_step": "step", "finalize": "step",
    "init_processor_state": "processor", "mask": "processor", "advance": "processor",
    "StepProcessor": "processor", "allowed": "prefix", "accept_drafts": "speculative",
    "BeamAxis": "carry", "reorder_carry": "carry",
}
_SUBMODULES = frozenset({"candidates", "carry", "engine", "live", "logprobs", "prefix",
                         "prior", "processor", "programs", "ranked", "search", "selection",
                         "speculative", "step"})
_lazy_getattr, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)

__all__ = [
    # drivers around the model
    "beam_search", "greedy_decode", "sample",
    # one beam step at a time (the step an int, or a traced int32 scalar)
    "init_beam_state", "beam_step", "finalize",
    # the logits-processor pair (the step an int, or a traced int32 scalar),
    # the stateless prefix mask, the draft check
    "init_processor_state", "mask", "advance", "StepProcessor", "allowed", "accept_drafts",
    # the model's per-beam state
    "BeamAxis", "reorder_carry",
]

TYPES = ("BeamState", "ProcessorState", "DecodeResult", "PAD_TOKEN", "SENTINEL_SCORE",
         "MIN_VALID_SCORE")
"""The types and constants of the states and results, importable from the
package (defined in `static_compiler.support.decode_types`) but not in
`__all__`: they are not calls."""


def __getattr__(name: str):
    """A public name or submodule, imported on first use. The traced-step
    functions (`step.beam_step_switch`, `processor.mask_switch`,
    `processor.advance_switch`) live in their modules only: the verb
    (`beam_step`, `mask`, `advance`) takes a traced step itself."""
    try:
        return _lazy_getattr(name)
    except ModuleNotFoundError as err:  # decoding needs jax; compiling does not
        if (err.name or "").split(".")[0] not in ("jax", "jaxlib"):
            raise
        from static_compiler.errors import JAX_INSTALL, require
        require("jax", f"decoding (static_compiler.backend.decode.{name})",
                f"{JAX_INSTALL} (or decode with the torch backend: "
                "static_compiler.torch_backend.TorchConstraints, which needs numpy and "
                "torch only)")
        raise
