"""The decoding drivers: beam search, sampling and greedy decoding, each one
jitted program that runs every step over the tables, calling the user's model
for logits and reordering its per-beam carry.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from static_compiler.backend.decode.carry import (
    UNDECLARED,
    check_same_structure,
    reorder_carry,
    resolve_carry_axes,
)
from static_compiler.backend.decode.live import LiveMask, check_live_mask
from static_compiler.backend.decode.logprobs import LogProbs, add_logprob
from static_compiler.backend.decode.prior import LivePrior, check_live_prior
from static_compiler.backend.decode.programs import bounded_jit
from static_compiler.backend.decode.step import (
    apply_choice,
    finalize,
    first_alone_for,
    init_beam_state,
    run_candidates,
    run_inputs,
    run_live_bound,
    run_step,
    step_segments,
)
from static_compiler.backend.kernels import take_last
from static_compiler.errors import DecodeInputError
from static_compiler.jax_support.beam_result import penalty_value
from static_compiler.lowered import plan as plan_lib
from static_compiler.lowered.plan import Plan
from static_compiler.support.arguments import check_beam_schedule, model_output
from static_compiler.support.decode_state import (
    DecodeResult,
    check_callable,
    check_finite,
    check_int,
    check_logits,
    check_rows,
    check_start_tokens,
    check_tokens_per_beam,
)


class _NoParams:
    def __repr__(self):
        return "NO_PARAMS"


NO_PARAMS = _NoParams()
"""The default of `params`: logits_fn takes no params argument."""


def live_beam_bounds(plan: Plan, beam_size, tokens_per_beam=None) -> tuple[int, ...]:
    """Static bound per step on the beams that can be valid in a search
    from `init_beam_state` (`lowered.plan.live_beam_bounds`; beam_size and
    tokens_per_beam as `beam_search` takes them): it binds at step 1 and on
    small branch factors, and `beam_step`'s live_beams skips the beams past
    it."""
    return plan_lib.live_beam_bounds(plan, check_beam_schedule(beam_size, plan.max_length),
                                     check_tokens_per_beam(tokens_per_beam, plan.max_length))


def _call_model(logits_fn, params, with_params: bool, last_tokens, step, carry, vocab_size: int,
                where: str):
    """(logits, new_carry) from `logits_fn` for last_tokens int32 (B, M),
    after checking that it returned that pair (`arguments.model_output`)."""
    out = logits_fn(params, last_tokens, step, carry) if with_params \
        else logits_fn(last_tokens, step, carry)
    return model_output(out, tuple(last_tokens.shape) + (vocab_size,), where)


UNROLL_BACKENDS = ("gpu",)
"""Backends whose beam searches over a fixed-length set run every step inline
(one straight program) rather than as loops over runs of steps: a GPU reads
a while loop's predicate and a conditional's branch index back on the host
each iteration, which cost the 8-step decode ~0.35 ms of 1.2 ms on an H200
(docs/benchmarks.md, "On an H200"). On the CPU the loops compile faster and
run as fast; on a TPU loops stay on the device. Sampling keeps its loops:
its draws depend on the candidate columns, which inline steps lay out
differently, and a key should draw the same sequence on every backend."""


def unrolled(plan: Plan) -> bool:
    """Whether this process's beam searches over `plan` run every step inline (see
    `UNROLL_BACKENDS`); a set with an end token keeps its while loop, which
    stops once every beam has ended."""
    return plan.end_token is None and jax.default_backend() in UNROLL_BACKENDS


def _segments(plan: Plan, caps: tuple, live: tuple, widths: tuple, tables, unroll: bool,
              subset=None):
    """`step_segments` (over `subset`: `first_alone_for`), or each step alone
    when `unroll`."""
    if unroll:
        return tuple((t,) for t in range(plan.max_length))
    return step_segments(plan, caps, live, widths, tables, first_alone_for(subset))


@bounded_jit(static_argnames=("plan", "logits_fn", "batch_size", "widths", "caps",
                              "axes", "reorder", "with_params", "unroll"))
def _beam_search(plan, tables, carry, start_tokens, params, subset, prior, length_penalty, *,
                 logits_fn, batch_size, widths, caps, axes, reorder, with_params, unroll):
    state = init_beam_state(plan, batch_size, widths[0], start_tokens)
    live = plan_lib.live_beam_bounds(plan, widths, caps)

    def one_step(steps, run_tabs, run_sub, step, state, carry):
        logits, new_carry = _call_model(logits_fn, params, with_params, state.last_tokens,
                                        step, carry, plan.vocab_size,
                                        f"beam_search (step {steps[0]})")
        check_same_structure(carry, new_carry, f"step {steps[0]}")
        state = run_step(plan, run_tabs, state, logits, steps, step, caps[steps[0]],
                         run_live_bound(live, steps), run_sub, widths[steps[0] + 1], prior)
        return state, reorder_carry(new_carry, state.parent, axes, reorder)

    state, carry = _run_segments(plan, tables, subset, one_step,
                                 _segments(plan, caps, live, widths, tables, unroll, subset),
                                 state, carry, widths)
    return finalize(state, length_penalty), carry


def _run_segments(plan: Plan, tables, subset, one_step: Callable, segments, state, carry,
                  widths: Optional[tuple] = None):
    """Runs `one_step(steps, tables, subset, step, state, carry) ->
    (state, carry)` over every step: a run of one step inline, longer runs
    as a loop over the run's tables and subset bits (`run_inputs`: packed
    once before the loop); with an end token, each run as a while loop that
    stops once no beam is live, but a step where the beam schedule changes
    the width (its own run; widths: `check_beam_schedule`'s) inline, so the
    state has the schedule's final width (finished beams carry over
    unchanged: the result is the same)."""
    for steps in segments:
        tabs, sub = run_inputs(plan, tables, subset, steps)
        step_fn = functools.partial(one_step, steps, tabs, sub)
        resizes = widths is not None and widths[steps[0]] != widths[steps[0] + 1]
        if plan.end_token is not None and not resizes:
            state, carry = _until_finished(step_fn, steps, state, carry)
        elif len(steps) == 1:
            state, carry = step_fn(jnp.int32(steps[0]), state, carry)
        else:
            body = lambda t, loop, step_fn=step_fn: step_fn(t, *loop)
            state, carry = lax.fori_loop(steps[0], steps[-1] + 1, body, (state, carry))
    return state, carry


def _until_finished(step_fn, steps: tuple[int, ...], state, carry):
    """The run of `steps` as a while loop that stops once no beam is live
    (every valid beam has taken the end token): the steps left would only
    carry finished beams over unchanged, in the same order, so stopping is
    exact and saves their model calls."""
    def cond(loop):
        t, state, _ = loop
        return (t <= steps[-1]) & jnp.any(state.valid & ~state.finished)

    def body(loop):
        t, state, carry = loop
        state, carry = step_fn(t, state, carry)
        return t + 1, state, carry

    _, state, carry = lax.while_loop(cond, body, (jnp.int32(steps[0]), state, carry))
    return state, carry


def beam_search(plan: Plan, tables, logits_fn: Callable, *, batch_size: int, beam_size: int,
                tokens_per_beam=None, start_token=0, carry=None, carry_axes=UNDECLARED,
                reorder: Optional[Callable] = None, params=NO_PARAMS,
                length_penalty: float = 0.0, return_carry: bool = False,
                subset: Optional[LiveMask] = None, also_compile: Optional[LiveMask] = None,
                prior: Optional[LivePrior] = None):
    """Constrained beam search (see module doc for the exact semantics).

    Args:
      logits_fn: ``(last_tokens int32 (B, M), step, carry) -> (logits float
        (B, M, V), carry)``, or ``(params, last_tokens, step, carry)`` when
        `params` is given. step is an int32 scalar, traced inside the loops
        that run runs of similar steps: use it in jnp code, never in Python
        control flow. The returned carry keeps the carry's structure, shapes
        and dtypes.
      tokens_per_beam: None; an int, the most children each beam contributes
        from step 1 on (step 0 expands the start beam to its top beam_size
        children); or one entry per step (None or an int), applied as given.
      start_token: the model's input at step 0: an int, or ints (B,) one per row.
      carry: the model's state (any pytree), threaded through logits_fn.
      carry_axes: which axis of each carry leaf holds the beams, a pytree
        prefix of carry like jax.vmap's in_axes: an int (beams flattened as
        B*M there, b * M + m), `BeamAxis(a, split=True)` ((B, M) on axes a,
        a + 1), or None (not per beam: never touched). Declared leaves are
        reordered by each step's parent beams. A carry with leaves must be
        declared (or `reorder` given) unless beam_size is 1.
      reorder: instead of carry_axes, ``fn(carry, parent int32 (B, M)) -> carry``.
      params: passed to logits_fn as a traced argument (new values of the
        same shapes reuse the compiled search).
      length_penalty: GNMT exponent for re-ranking the final beams (0: off);
        traced: every value runs the same program.
      return_carry: also return the final carry: ``(result, carry)``. With
        an end token, decoding stops once every valid beam has ended (the
        result is the same), so the model ran for fewer steps.
      subset: a `LiveMask`: each batch row decodes over its item subset
        only (see static_compiler.compiler_items.subsets), exactly as over a set compiled
        from those items; None: every item.
      also_compile: a `LiveMask` of `jax.ShapeDtypeStruct`s (`live_mask_spec`):
        when this search compiles its program, also compile (not run) the
        program of the same search over a subset of those shapes, so that a
        later removal (which decodes over the items left) finds it compiled.
      prior: a `decode.prior.LivePrior` (item priors,
        `CompiledConstraints.prior`): each item ranks by its log-probability
        plus weight x prior, each prefix by its log-probability plus the
        best weighted prior below it; the final scores hold the sum. Not
        with a length penalty.
    """
    call = _beam_search_call(plan, tables, logits_fn, batch_size=batch_size,
                             beam_size=beam_size, tokens_per_beam=tokens_per_beam,
                             start_token=start_token, carry=carry, carry_axes=carry_axes,
                             reorder=reorder, params=params, length_penalty=length_penalty,
                             subset=subset, prior=prior)
    result, out_carry = _beam_search(**call, also_compile=_as_subset(also_compile))
    return (result, out_carry) if return_carry else result


def _beam_search_call(plan: Plan, tables, logits_fn: Callable, *, batch_size: int,
                      beam_size: int, tokens_per_beam=None, start_token=0, carry=None,
                      carry_axes=UNDECLARED, reorder: Optional[Callable] = None,
                      params=NO_PARAMS, length_penalty: float = 0.0,
                      subset: Optional[LiveMask] = None,
                      prior: Optional[LivePrior] = None) -> dict:
    """`_beam_search`'s arguments (static ones included) for a `beam_search`
    call, after checking every argument: DecodeInputError before anything
    is traced or compiled."""
    batch_size = check_rows(batch_size)[0]
    widths = check_beam_schedule(beam_size, plan.max_length, batch_size)
    check_live_mask(plan, subset, batch_size, "beam_search")
    caps = check_tokens_per_beam(tokens_per_beam, plan.max_length)
    start_tokens = check_start_tokens(start_token, batch_size, "beam_search")
    length_penalty = check_finite("length_penalty", length_penalty)
    check_callable("logits_fn", logits_fn)
    check_live_prior(plan, prior, length_penalty)
    traced_penalty = penalty_value(length_penalty)  # (one program for every value)
    axes = resolve_carry_axes(carry, carry_axes, batch_size, widths[0], reorder, max(widths))
    with_params = params is not NO_PARAMS
    return dict(plan=plan, tables=tables, carry=carry, start_tokens=start_tokens,
                params=params if with_params else None, subset=subset, prior=prior,
                logits_fn=logits_fn, batch_size=int(batch_size), widths=widths, caps=caps,
                length_penalty=traced_penalty, axes=axes, reorder=reorder,
                with_params=with_params, unroll=unrolled(plan))


def beam_search_compiles(plan: Plan, tables, logits_fn: Callable, *, subsets=(None,),
                         return_carry: bool = False,  # noqa: ARG001 (beam_search's options)
                         **options) -> list:
    """The compiles of `beam_search(plan, tables, logits_fn, **options)`'s
    program, one zero-argument callable per entry of `subsets` (None: every
    item; a `LiveMask` of arrays or of `live_mask_spec`'s ShapeDtypeStructs:
    over a subset of those shapes), each compiling it without running it.
    The arguments are checked now (DecodeInputError), nothing is traced
    until a callable runs. A later call with the same options (carry and
    params of the same shapes) compiles nothing. return_carry changes no
    program."""
    call = _beam_search_call(plan, tables, logits_fn, **options)
    return [functools.partial(_beam_search.compile_ahead, **{**call, "subset": live})
            for live in subsets]


@bounded_jit(static_argnames=("plan", "logits_fn", "batch_size", "temperature", "top_k"))
def _sample(plan, tables, key, carry, start_tokens, subset, *, logits_fn, batch_size, temperature,
            top_k):
    state = init_beam_state(plan, batch_size, 1, start_tokens)

    def one_step(steps, run_tabs, run_sub, step, state, carry_and_key):
        carry, key = carry_and_key
        logits, new_carry = _call_model(logits_fn, None, False, state.last_tokens, step, carry,
                                        plan.vocab_size, f"sample (step {steps[0]})")
        check_same_structure(carry, new_carry, f"step {steps[0]}")
        logits = check_logits(logits, (batch_size, 1), plan.vocab_size,
                              f"sample (step {steps[0]})")
        cand = run_candidates(plan, run_tabs, steps, step, state.node, state.valid,
                              state.finished, LogProbs.of(logits), subset=run_sub)
        # Shifted by the best valid log-prob first, so the best weight is 0 and
        # a tiny temperature cannot overflow every weight to -inf.
        best = jnp.max(jnp.where(cand.valid, cand.logprob, -jnp.inf), axis=-1, keepdims=True)
        weights = jnp.where(cand.valid, (cand.logprob - best) / temperature, -jnp.inf)
        if top_k is not None and top_k < weights.shape[-1]:
            kth = lax.top_k(weights, top_k)[0][..., -1:]
            weights = jnp.where(weights >= kth, weights, -jnp.inf)
        key, sub = jax.random.split(key)
        # Stays (finished rows) are the only valid candidate there; their weight 0/T is finite.
        col = jax.random.categorical(sub, jnp.where(jnp.isnan(weights), -jnp.inf, weights), axis=-1)
        col = col.astype(jnp.int32)
        valid = take_last(cand.valid, col[..., None])[..., 0]
        lp = take_last(cand.logprob, col[..., None])[..., 0]
        parent = jnp.zeros((batch_size, 1), jnp.int32)
        state = apply_choice(plan, state, cand, parent, col, add_logprob(state.scores, lp), valid,
                             step)
        return state, (new_carry, key)

    T = plan.max_length
    state, _ = _run_segments(plan, tables, subset, one_step,
                             step_segments(plan, (None,) * T, (1,) * T, 1, tables), state,
                             (carry, key))
    return finalize(state)


def _check_key(key) -> None:
    """DecodeInputError unless `key` is a jax PRNG key: a typed key array of
    shape (), or raw key data uint32 (2,) (`jax.random.PRNGKey`)."""
    dtype = getattr(key, "dtype", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    if typed and key.shape == ():
        return
    if not typed and dtype == jnp.uint32 and getattr(key, "shape", None) == (2,):
        return
    raise DecodeInputError(f"sample: key={key!r}: expected a jax PRNG key "
                           "(jax.random.key(seed), or jax.random.PRNGKey(seed))")


def sample(plan: Plan, tables, logits_fn: Callable, key, *, batch_size: int,
           temperature: float = 1.0, top_k: Optional[int] = None, start_token=0,
           carry=None, subset: Optional[LiveMask] = None,
           also_compile: Optional[LiveMask] = None) -> DecodeResult:
    """Samples one sequence per batch row from the constrained distribution.

    At each step the valid tokens' log-probabilities (log_softmax over the
    full vocabulary) are divided by `temperature`, optionally restricted to
    the `top_k` best, and one is drawn. Scores are the summed (untempered)
    log-probabilities. logits_fn gets last_tokens (B, 1) and returns (B, 1, V);
    as in `beam_search`, step is an int32 scalar, traced inside the loops
    that run runs of similar steps, and the carry keeps its shapes. Results
    have a beam axis of size 1; `subset` and `also_compile` as in `beam_search`."""
    call = _sample_call(plan, tables, logits_fn, key, batch_size=batch_size,
                        temperature=temperature, top_k=top_k, start_token=start_token,
                        carry=carry, subset=subset)
    return _sample(**call, also_compile=_as_subset(also_compile))


def _sample_call(plan: Plan, tables, logits_fn: Callable, key, *, batch_size: int,
                 temperature: float = 1.0, top_k: Optional[int] = None, start_token=0,
                 carry=None, subset: Optional[LiveMask] = None) -> dict:
    """`_sample`'s arguments for a `sample` call, after checking every
    argument (before anything is traced or compiled)."""
    batch_size = check_rows(batch_size)[0]
    check_live_mask(plan, subset, batch_size, "sample")
    top_k = check_int("top_k", top_k, low=1, allow_none=True)
    start_tokens = check_start_tokens(start_token, batch_size, "sample")
    temperature = check_finite("temperature", temperature)
    if not temperature > 0:
        raise DecodeInputError(f"temperature={temperature!r}: expected a finite float > 0")
    if temperature < np.finfo(np.float32).tiny:  # XLA flushes float32 subnormals to 0
        raise DecodeInputError(f"temperature={temperature!r}: expected at least "
                               f"{np.finfo(np.float32).tiny} (the smallest normal float32)")
    check_callable("logits_fn", logits_fn)
    _check_key(key)
    return dict(plan=plan, tables=tables, key=key, carry=carry, start_tokens=start_tokens,
                subset=subset, logits_fn=logits_fn, batch_size=int(batch_size),
                temperature=temperature, top_k=top_k)


def sample_compiles(plan: Plan, tables, logits_fn: Callable, key, *, subsets=(None,),
                    **options) -> list:
    """`beam_search_compiles` for `sample` (the key's type and shape matter,
    not its value)."""
    call = _sample_call(plan, tables, logits_fn, key, **options)
    return [functools.partial(_sample.compile_ahead, **{**call, "subset": live})
            for live in subsets]


def _as_subset(also_compile: Optional[LiveMask]) -> Optional[dict]:
    """A decoder's also_compile LiveMask as `BoundedJit`'s argument swap."""
    return None if also_compile is None else {"subset": also_compile}


def greedy_decode(plan: Plan, tables, logits_fn: Callable, *, batch_size: int,
                  start_token=0, carry=None, params=NO_PARAMS, return_carry: bool = False,
                  subset: Optional[LiveMask] = None, also_compile: Optional[LiveMask] = None):
    """The most likely valid token at every step: beam search with one beam
    (so the carry needs no beam axes)."""
    return beam_search(plan, tables, logits_fn, batch_size=batch_size, beam_size=1,
                       start_token=start_token, carry=carry, params=params,
                       return_carry=return_carry, subset=subset, also_compile=also_compile)
