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
* `prefix`: `allowed`, a stateless mask from each row's tokens so far, for
  engines that own the beam search.

The state and result types and the argument validators live in
`static_compiler.support.decode_state`, shared with the serving loader.
The package exports what a user calls (`__all__`: the drivers, the step and
processor functions, the carry helpers, the result types); everything else
is imported from its module (``decode.live.LiveMask``).

How one step runs. Every entry point ends in one of the three candidate
paths of `candidates` (a beam's candidate transitions at a step); which one
depends on whether the step is a Python int when tracing and on how many
steps share a program:

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
`beam_step_switch` (the exported        traced int32    a `lax.switch` over the runs of
modules, `serving.Artifact.beam_step`)                  `step_segments`, each run as `beam_search`
                                                        runs it (`run_candidates`)
`mask_switch`, `advance_switch`,        traced int32    a `lax.switch` over the steps, grouped
`allowed`, `accept_drafts`                              where kernels repeat
                                                        (`step.switch_over_groups`,
                                                        `switch_over_steps`), each branch the
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

from static_compiler.backend.decode.carry import BeamAxis, reorder_carry
from static_compiler.backend.decode.prefix import allowed
from static_compiler.backend.decode.processor import (StepProcessor, advance, advance_switch,
                                                      init_processor_state, mask, mask_switch)
from static_compiler.backend.decode.search import beam_search, greedy_decode, sample
from static_compiler.backend.decode.speculative import accept_drafts
from static_compiler.backend.decode.step import (beam_step, beam_step_switch, finalize,
                                                 init_beam_state)
from static_compiler.support.decode_state import (MIN_VALID_SCORE, PAD_TOKEN, SENTINEL_SCORE,
                                                  BeamState, DecodeResult, ProcessorState)

__all__ = [
    # drivers around the model
    "beam_search", "greedy_decode", "sample",
    # one beam step at a time (a static step, or a traced one: `_switch`)
    "init_beam_state", "beam_step", "beam_step_switch", "finalize",
    # the logits-processor pair, and the stateless prefix mask
    "init_processor_state", "mask", "mask_switch", "advance", "advance_switch", "StepProcessor",
    "allowed", "accept_drafts",
    # the model's per-beam state
    "BeamAxis", "reorder_carry",
    # types and constants of the results
    "BeamState", "ProcessorState", "DecodeResult", "PAD_TOKEN", "SENTINEL_SCORE",
    "MIN_VALID_SCORE",
]
