"""The compiled set's warm-up (`CompiledConstraints.warm`) and compile count.

The warm-up itself is every door's (`decoding.warm_up`: one planner walking the
request paths through the public verbs, a `WarmReport` back); this module
adds what is the compiled set's own (`_CompiledPaths`):

* the step processors `processor(B)`: mask, advance and advance_and_mask
  at every step, and the same programs for the subsets' shapes;
* given the model (`logits_fn`, part of the decoders' programs: one fused
  XLA program each, which no dummy model can stand in for): `beam_search`
  at each (B, M) of `beam_sizes`, `greedy_decode` (greedy=True) and
  `sample` (a `sample_key`), compiled ahead (not run) with the options a
  loop will pass (carry and params of the same shapes);
* the removal-aware programs (what decodes run over once `update(remove=)`
  removed items: one subset row) for a set compiled with capacity, and
  those of `max_subsets` stacked subsets (`stack_subsets`): after the
  warm-up every stack of 2 to max_subsets subsets is padded to max_subsets
  (`CompiledConstraints._padded`: empty subsets appended, the same
  results), so the count never compiles again; one subset keeps its own
  shape (a removal's);
* with ranked=True, every path over ranked subsets (`ranked_subset`: one,
  and max_subsets stacked), the processors' and the decoders' programs
  too: a new ranked subset of a warmed stack size compiles nothing.

`compilations()` counts the XLA compilations run by the set's entry points
(jax's own compile events, `compile_events.CompileCounter`), so a server
can assert that requests after the warm-up compile nothing. A version made
by `update` (a removal, or an addition that fits the capacity) keeps the
plan, so it finds every warmed program compiled; it shares its set's count.
"""

from __future__ import annotations

import functools
import inspect
import threading
from concurrent.futures import Future
from typing import Union

from static_compiler.backend import decode
from static_compiler.decoding import warm_up
from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset, checked_subset_index
from static_compiler.item_bits.padding import pad_subsets
from static_compiler.jax_support.compile_events import CompileCounter
from static_compiler.jax_support.warmth import JaxPaths, Warmth
from static_compiler.support.arguments import check_beam_schedule
from static_compiler.support.decode_types import WarmReport

_lock = threading.Lock()
_FRONT_DOOR = ("batch_size", "beam_size", "subset", "also_compile")


def _options_of(decoder) -> set:
    return {name for name, p in inspect.signature(decoder).parameters.items()
            if p.kind == p.KEYWORD_ONLY and name not in _FRONT_DOOR}


class WarmUp:
    """The warm-up verb and compile count of `CompiledConstraints` (a mixin:
    the set's entry points count in `_counting()`)."""

    def compilations(self) -> int:
        """XLA compilations run so far by this set's entry points
        (`beam_search`, `greedy_decode`, `sample` over it, `mask`,
        `advance`, `allowed`, `accept_drafts`, its processors' calls and
        `warm`), counted from jax's compile events in the calling thread;
        shared with the versions `update` makes. A program read from jax's
        persistent cache is not a compilation."""
        return self._compile_counter().count

    def _compile_counter(self) -> CompileCounter:
        return self._warmth().counter

    def _warmth(self) -> Warmth:
        """The compile counter and subset padding bound this set shares
        with the versions `update` makes (the served artifact's `Warmth`)."""
        warmth = self._computed.warmth
        if warmth is None:
            with _lock:
                warmth = self._computed.warmth
                if warmth is None:
                    warmth = self._computed.warmth = Warmth(CompileCounter())
        return warmth

    def _padded(self, subset, subset_index, batch_size: int, where: str) -> tuple:
        """(subset, subset_index) as decoded: after `warm(max_subsets=K)`, a
        stack of 2 <= R < K subsets padded to K (`pad_subsets`: empty
        subsets appended, so one program serves every R; the padded stack
        is kept in the subset's `placements`), its index checked against R first; one
        subset (R = 1, a removal's shape) and other stacks as they are."""
        pad_to = self._warmth().pad_to
        if pad_to is None or not isinstance(subset, Subset) or \
                not 1 < subset.num_subsets < pad_to:
            return subset, subset_index
        index = checked_subset_index(subset, self.fingerprint, subset_index, batch_size, where)
        return subset.placements.get(("padded", pad_to), lambda: pad_subsets(subset, pad_to)), index

    def _counting(self):
        """A context manager in which the calling thread's XLA compilations
        count toward `compilations()`: what this set's entry points (and the
        module-level decoders over it) run in."""
        return self._compile_counter().counting()

    def warm(self, batch_sizes, *, beam_sizes=None, max_subsets: int = 0,
             background: bool = False, logits_fn=None, greedy: bool = False,
             sample_key=None, ranked: bool = False,
             **options) -> Union[WarmReport, Future[WarmReport]]:
        """Runs every request path once per shape before traffic (every
        door's warm-up, `static_compiler.decoding.warm_up`, plus this set's own
        programs: see the module doc of `static_compiler.warm`); afterwards
        calls within those shapes compile nothing (`compilations()` stays
        put), also on the versions `update` makes within capacity. Warming
        twice compiles nothing the second time.

        Parameters
        ----------
        batch_sizes : int or sequence of int
            Each B >= 1 a loop will run at (processor rows, decode batch).
        beam_sizes : sequence of int or of beam schedules, optional
            Each M >= 1 or beam schedule (one width per step) the beam
            verbs will run at (init_beams, beam_step, finalize), and with
            `logits_fn` `beam_search` too (None: none).
        max_subsets : int
            Also warm one subset and max_subsets stacked subsets;
            afterwards stacks of 2 to max_subsets are padded to max_subsets
            (empty subsets appended: the same results), so they compile
            nothing (0: none; a set compiled with capacity always gets its
            removal path, one subset). At most
            `item_bits.padding.PADDED_SUBSETS_MAX_BYTES` over one subset's
            bytes; the padding is kept only once every compile ran (a
            warm-up that raises changes nothing).
        background : bool
            Run on a thread and return a `concurrent.futures.Future` of the
            report at once (arguments are checked first, here).
        logits_fn : callable, optional
            The compiled set's own: the model the decoders will be called
            with (the same object: it is part of their programs); needs a
            decoder (beam_sizes, greedy or sample_key).
        greedy : bool
            Also compile `greedy_decode` (needs `logits_fn`).
        sample_key : jax PRNG key, optional
            Also compile `sample` with a key of this type (needs `logits_fn`).
        ranked : bool
            Also walk every path over ranked subsets (`ranked_subset`): one,
            and max_subsets stacked when max_subsets > 1 (ranked stacks are
            not padded: another stack size compiles its own programs once).
            Their programs are others than `subset`'s (the reads count
            ranges): off by default, it about doubles the subset paths'
            warm-up. Needs an item index.
        **options
            What the loop passes to the decoders (carry, carry_axes,
            params, tokens_per_beam, start_token, length_penalty,
            temperature, top_k ...): each decoder takes those it knows.

        Returns
        -------
        WarmReport or Future of one
            compilations: the XLA compilations the warm-up ran (which
            `compilations()` counts too); calls, seconds, batch_sizes,
            beam_sizes, subset_rows.

        Raises
        ------
        DecodeInputError
            For a bad size, greedy or sample_key without `logits_fn` (or a
            model with no decoder asked), an option no decoder takes, bad
            option values (as the decoders check them), max_subsets > 0 on
            a set without item subsets or past its bound.
        """
        paths = _CompiledPaths(self, logits_fn, greedy, sample_key, options, ranked)
        return warm_up.warm(self, paths, batch_sizes, beam_sizes, max_subsets, background)


class _CompiledPaths(JaxPaths):
    """The compiled set's part of the warm-up: jax arrays, and its own
    programs (step processors, the model-holding decoders)."""

    where = "warm"

    def __init__(self, compiled, logits_fn, greedy, sample_key, options: dict,
                 ranked: bool = False):
        for name, flag in (("greedy", greedy), ("ranked", ranked)):
            if not isinstance(flag, bool):
                raise DecodeInputError(f"warm: {name}={flag!r}: expected a bool")
        self.compiled, self.logits_fn = compiled, logits_fn
        self.greedy, self.sample_key, self.options = greedy, sample_key, options
        self.warmth = compiled._warmth()
        self.removals = compiled._removal_program(None, 1) is not None
        if ranked:  # (an item index: checked now, as ranked_subset checks it)
            compiled._set_view.checked_items("warm(ranked=True)")
        self.ranked_door = compiled if ranked else None
        beam_opts, sample_opts = _options_of(decode.beam_search), _options_of(decode.sample)
        unknown = sorted(set(options) - beam_opts - sample_opts)
        if unknown:
            raise DecodeInputError(f"warm: unknown option(s) {unknown}: expected some of "
                                   f"{sorted(beam_opts | sample_opts)}")
        if options.get("prior") is not None:  # (its values do not matter: its shape does)
            self.options = dict(options, prior=compiled._ranking(options["prior"], "warm"))

    def beam_widths(self, beam_size, batch_size: int) -> tuple:
        return check_beam_schedule(beam_size, self.compiled.max_length, batch_size)

    def own_jobs(self, batch_size: int, beam_sizes: tuple, subset_rows: int) -> list:
        """processor(B)'s programs, and the decoders compiled ahead with the
        model (their options checked now)."""
        compiled, B, model = self.compiled, batch_size, self.logits_fn
        decoders = bool(beam_sizes) or self.greedy or self.sample_key is not None
        if model is not None and not decoders or model is None and \
                (self.greedy or self.sample_key is not None):
            raise DecodeInputError(
                f"warm: logits_fn={model!r} with beam_sizes={beam_sizes}, greedy={self.greedy}, "
                f"sample_key={self.sample_key!r}: expected logits_fn exactly when a decoder is "
                "warmed (greedy, sample_key; beam_sizes also without it: the beam verbs)")
        specs = _subset_specs(compiled, B, subset_rows, self.removals)
        jobs = [functools.partial(compiled.processor(B).warm, specs)]
        ranked = self.ranked(B, subset_rows or 0)
        for subset, index in ranked:  # (each processor's own programs, run once)
            jobs.append(lambda s=subset, i=index: compiled.processor(B, subset=s,
                                                                    subset_index=i).warm())
        if model is None:
            return jobs
        specs = specs + tuple(compiled._live(s, i, B, "warm") for s, i in ranked)
        pick = lambda known: {k: v for k, v in self.options.items() if k in known}  # noqa: E731
        calls = [(decode.search.beam_search_compiles, (model,),
                  dict(pick(_options_of(decode.beam_search)), batch_size=B, beam_size=M))
                 for M in beam_sizes]
        if self.greedy:
            calls.append((decode.search.beam_search_compiles, (model,),
                          dict(pick(_options_of(decode.greedy_decode)), batch_size=B,
                               beam_size=1)))
        if self.sample_key is not None:
            calls.append((decode.search.sample_compiles, (model, self.sample_key),
                          dict(pick(_options_of(decode.sample)), batch_size=B)))
        for planner, args, kwargs in calls:  # (checks the options now)
            jobs.extend(planner(compiled.plan, compiled.lowered.device_tables, *args,
                                subsets=(None,) + specs, **kwargs))
        return jobs


def _subset_specs(compiled, batch_size: int, max_subsets: int, removals: bool) -> tuple:
    """The `LiveMask` shapes decodes at `batch_size` rows may meet: one
    subset row (a removal; a set with capacity, or max_subsets >= 1), and
    max_subsets stacked subsets (every stack of 2 to max_subsets is padded
    to it)."""
    counts = sorted({1} if removals or max_subsets else set()) + \
        ([max_subsets] if max_subsets > 1 else [])
    return tuple(decode.live.live_mask_spec(compiled.plan, batch_size, r) for r in counts)
