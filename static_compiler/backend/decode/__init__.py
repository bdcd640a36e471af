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

from static_compiler.backend.decode.candidates import (StepCandidates, candidate_columns,
                                                       mixed_children, step_candidates)
from static_compiler.backend.decode.live import (LiveMask, live_mask_spec, subset_live_mask,
                                                 subset_widths)
from static_compiler.backend.decode.logprobs import LogProbs, add_logprob, safe_log_softmax, scored
from static_compiler.backend.decode.processor import (StepProcessor, advance, advance_switch,
                                                      init_processor_state, mask, mask_switch)
from static_compiler.backend.decode.carry import BeamAxis, reorder_carry, resolve_carry_axes
from static_compiler.backend.decode.prefix import allowed
from static_compiler.backend.decode.search import beam_search, greedy_decode, live_beam_bounds, sample
from static_compiler.backend.decode.selection import Selection, select_beams
from static_compiler.backend.decode.speculative import accept_drafts
from static_compiler.backend.decode.step import (apply_choice, beam_step, beam_step_switch, finalize,
                                                 init_beam_state, length_normalized,
                                                 step_segments, switch_over_steps)
from static_compiler.support.decode_state import (MIN_VALID_SCORE, PAD_TOKEN, SENTINEL_SCORE, BeamState,
                                          DecodeResult, ProcessorState)

__all__ = [
    "BeamAxis", "BeamState", "DecodeResult", "LiveMask", "LogProbs", "MIN_VALID_SCORE", "PAD_TOKEN",
    "ProcessorState", "SENTINEL_SCORE", "Selection", "StepCandidates", "StepProcessor", "accept_drafts",
    "add_logprob", "advance", "allowed", "advance_switch", "apply_choice", "beam_search", "beam_step",
    "beam_step_switch", "candidate_columns", "finalize", "greedy_decode", "init_beam_state",
    "init_processor_state", "length_normalized", "live_beam_bounds", "mask", "mask_switch",
    "mixed_children", "reorder_carry", "resolve_carry_axes", "safe_log_softmax", "sample",
    "live_mask_spec", "scored", "select_beams", "step_candidates", "step_segments",
    "subset_live_mask", "subset_widths", "switch_over_steps",
]
