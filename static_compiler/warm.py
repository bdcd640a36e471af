"""Warming a compiled set up: compile ahead every program a decoding loop
over it will call, and count what its entry points compile.

jax compiles a program the first time it meets a static configuration (a
batch size, a beam size, a model function, a step of the processor): a
server's first request of each shape waits for XLA. `WarmUp.warm` compiles
those programs before traffic, for the shapes named, and `compilations()`
counts the XLA compilations run by the set's entry points (jax's own
compile events, `compile_events.CompileCounter`), so a server can assert
that requests after the warm-up compile nothing. What `warm` covers:

* the processor pair `processor(B)`: mask, advance and advance_and_mask at
  every step (run once on dummy float32 logits and int32 tokens);
* with eager=True, the op-by-op loop: `mask` / `allowed_tokens` /
  `advance` at every step on the state `advance` returned (and at a
  step given as a device int32 scalar) and `allowed`
  (their ops compile once per shape: each step's, and `allowed`'s each
  prefix length, at B rows), and `init_beams` / `finalize` at each beam
  size (the length penalty is traced: one program for every value);
* given the model (`logits_fn`, part of the decoders' programs):
  `beam_search` at each (B, M) of `beam_sizes`, `greedy_decode`
  (greedy=True) and `sample` (a `sample_key`), compiled ahead (not run)
  with the options a loop will pass (carry and params of the same shapes);
* the removal-aware programs (what decodes run over once `update(remove=)`
  removed items: one subset row) for a set compiled with capacity, and
  those of `max_subsets` stacked subsets (`stack_subsets`): after the
  warm-up every stack of 2 to max_subsets subsets is padded to max_subsets
  (`CompiledConstraints._padded`, the served artifact's `pad_subsets`:
  empty subsets appended, the same results), so the count never compiles
  again; one subset keeps its own shape (a removal's).

A version made by `update` (a removal, or an addition that fits the
capacity) keeps the plan, so it finds every warmed program compiled; it
shares its set's count.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Optional

import numpy as np

from static_compiler.artifact.warm import Warmth
from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError
from static_compiler.live.liveness import Subset, checked_subset_index
from static_compiler.live.padding import check_max_subsets, pad_subsets
from static_compiler.support.arguments import check_warm_beam_sizes
from static_compiler.support.compile_events import CompileCounter
from static_compiler.support.decode_state import check_int, check_rows

_lock = threading.Lock()
_FRONT_DOOR = ("batch_size", "beam_size", "subset", "also_compile")


def _options_of(decoder) -> set:
    return {name for name, p in inspect.signature(decoder).parameters.items()
            if p.kind == p.KEYWORD_ONLY and name not in _FRONT_DOOR}


class WarmUp:
    """The warm-up verb and compile count of `CompiledConstraints` (a mixin:
    the set's entry points count in `counting()`)."""

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
        warmth = self.computed.warmth
        if warmth is None:
            with _lock:
                warmth = self.computed.warmth
                if warmth is None:
                    warmth = self.computed.warmth = Warmth()
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

    def counting(self):
        """A context manager in which the calling thread's XLA compilations
        count toward `compilations()`: what this set's entry points (and the
        module-level decoders over it) run in."""
        return self._compile_counter().counting()

    def warm(self, batch_sizes, *, beam_sizes=(), logits_fn=None, greedy: bool = False,
             sample_key=None, max_subsets: int = 0, eager: bool = False,
             background: bool = False, **options):
        """Compiles ahead what a decoding loop over this set will call, for
        each batch size B of `batch_sizes` (see the module doc of
        `static_compiler.warm` for the list); afterwards calls within those
        shapes compile nothing (`compilations()` stays put), also on the
        versions `update` makes within capacity. Warming twice compiles
        nothing the second time.

        Parameters
        ----------
        batch_sizes : int or sequence of int
            Each B >= 1 a loop will run at (processor rows, decode batch).
        beam_sizes : sequence of int or of beam schedules
            Each M >= 1 `beam_search` will run at, or beam schedule (one
            width per step) it will run (needs `logits_fn`).
        logits_fn : callable, optional
            The model the decoders will be called with (the same object:
            it is part of their programs).
        greedy : bool
            Also compile `greedy_decode` (needs `logits_fn`).
        sample_key : jax PRNG key, optional
            Also compile `sample` with a key of this type (needs `logits_fn`).
        max_subsets : int
            Also compile every program for one subset and for max_subsets
            stacked subsets; afterwards stacks of 2 to max_subsets are
            padded to max_subsets (empty subsets appended: the same
            results), so they compile nothing (0: none; a set compiled
            with capacity always gets its removal program, one subset row).
            At most `live.padding.PADDED_SUBSETS_MAX_BYTES` over one
            subset's bytes; the padding starts only once every compile
            ran (a warm-up that raises changes nothing).
        eager : bool
            Also run the op-by-op `mask` / `advance` (each step) and
            `allowed` (each prefix length) once at each B: their jax ops
            compile once per shape, some hundreds of small programs (a
            loop that uses `processor(B)` needs none of them).
        background : bool
            Run on a thread and return a `Warming` handle at once (arguments
            are checked first, here).
        **options
            What the loop passes to the decoders (carry, carry_axes,
            params, tokens_per_beam, start_token, length_penalty,
            temperature, top_k ...): each decoder takes those it knows.

        Returns
        -------
        int or Warming
            The XLA compilations the warm-up ran, or (background) a handle
            whose `wait()` returns them.

        Raises
        ------
        DecodeInputError
            For a bad size, a decoder asked without `logits_fn` (or a model
            with no decoder asked), an option no decoder takes, bad option
            values (as the decoders check them), max_subsets > 0 on a set
            without item subsets or past its bound.
        """
        if not isinstance(background, bool):
            raise DecodeInputError(f"warm: background={background!r}: expected a bool")
        jobs, pad_to = _plan(self, batch_sizes, beam_sizes, logits_fn, greedy, sample_key,
                             max_subsets, eager, options)
        run = functools.partial(_run, self._warmth(), jobs, pad_to)
        return Warming(run) if background else run()


class Warming:
    """A warm-up running on a thread (`warm(..., background=True)`)."""

    def __init__(self, run):
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._target, args=(run,), daemon=True,
                                        name="static-compiler-warm")
        self._thread.start()

    def _target(self, run):
        try:
            self._result = run()
        except BaseException as err:  # re-raised by wait()
            self._error = err

    def done(self) -> bool:
        """Whether the warm-up has finished (or failed)."""
        return not self._thread.is_alive()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the warm-up (at most `timeout` seconds: then
        TimeoutError) and returns its compilations; re-raises its error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"warm: still compiling after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


def _run(warmth: Warmth, jobs: list, pad_to: int) -> int:
    """Runs the planned compiles in this thread, counted by the set's
    counter and by one of its own (the count returned: this warm-up's
    compilations alone, whatever other threads compile meanwhile); only
    once they all ran are stacks of 2..pad_to padded to pad_to (all or
    nothing: a warm-up that raised leaves the set as it was)."""
    mine = CompileCounter()
    with warmth.counter.counting(), mine.counting():
        for job in jobs:
            job()
    if pad_to > 1:
        warmth.raise_pad_to(pad_to)
    return mine.count


def _sizes(name: str, sizes, allow_empty: bool) -> tuple:
    if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
        sizes = (sizes,)
    if not isinstance(sizes, (tuple, list, range, np.ndarray)) or (not allow_empty and
                                                                   len(sizes) == 0):
        raise DecodeInputError(f"warm: {name}={sizes!r}: expected "
                               f"{'a' if allow_empty else 'a non-empty'} sequence of ints >= 1")
    return tuple(dict.fromkeys(check_int(name, m, low=1) for m in sizes))


def _plan(compiled, batch_sizes, beam_sizes, logits_fn, greedy, sample_key, max_subsets,
          eager, options: dict) -> list:
    """Checks warm's arguments (DecodeInputError) and returns its compiles
    as zero-argument callables, nothing compiled yet, and the stacked
    subsets stacks of 2 or more are padded to once they all ran."""
    sizes = _sizes("batch_sizes", batch_sizes, allow_empty=False)
    check_rows(*sizes)
    beams = check_warm_beam_sizes(beam_sizes, compiled.max_length)
    max_subsets = check_max_subsets(max_subsets, compiled.set_view, "warm")[0]
    for name, flag in (("greedy", greedy), ("eager", eager)):
        if not isinstance(flag, bool):
            raise DecodeInputError(f"warm: {name}={flag!r}: expected a bool")
    decoders = bool(beams) or greedy or sample_key is not None
    if decoders != (logits_fn is not None):
        raise DecodeInputError(
            f"warm: logits_fn={logits_fn!r} with beam_sizes={beams}, greedy={greedy}, "
            f"sample_key={sample_key!r}: expected logits_fn exactly when a decoder is warmed")
    beam_opts, sample_opts = _options_of(decode.beam_search), _options_of(decode.sample)
    greedy_opts = _options_of(decode.greedy_decode)
    unknown = sorted(set(options) - beam_opts - sample_opts)
    if unknown:
        raise DecodeInputError(f"warm: unknown option(s) {unknown}: expected some of "
                               f"{sorted(beam_opts | sample_opts)}")
    if max_subsets > 1:  # (a larger bound warmed before stays: its programs are compiled)
        max_subsets = max(max_subsets, compiled._warmth().pad_to or 0)
    if options.get("prior") is not None:  # (its values do not matter: its shape does)
        options = dict(options, prior=compiled._ranking(options["prior"], "warm"))
    pick = lambda known: {k: v for k, v in options.items() if k in known}
    plan, tables = compiled.plan, compiled.device_tables
    jobs = []
    for B in sizes:
        specs = _subset_specs(compiled, B, max_subsets)
        jobs.append(functools.partial(compiled.processor(B).warm, specs))
        if eager:
            jobs.append(functools.partial(_eager, compiled, B, specs, beams))
        calls = [(decode.search.beam_search_compiles, (logits_fn,),
                  dict(pick(beam_opts), batch_size=B, beam_size=M)) for M in beams]
        if greedy:
            calls.append((decode.search.beam_search_compiles, (logits_fn,),
                          dict(pick(greedy_opts), batch_size=B, beam_size=1)))
        if sample_key is not None:
            calls.append((decode.search.sample_compiles, (logits_fn, sample_key),
                          dict(pick(sample_opts), batch_size=B)))
        for planner, args, kwargs in calls:  # (checks the options now)
            jobs.extend(planner(plan, tables, *args, subsets=(None,) + specs, **kwargs))
    return jobs, max_subsets


def _subset_specs(compiled, batch_size: int, max_subsets: int) -> tuple:
    """The `LiveMask` shapes decodes at `batch_size` rows may meet: one
    subset row (a removal; a set with capacity, or max_subsets >= 1), and
    max_subsets stacked subsets (every stack of 2 to max_subsets is padded
    to it)."""
    expects_removals = compiled._removal_program(None, batch_size) is not None
    counts = sorted({1} if expects_removals or max_subsets else set()) + \
        ([max_subsets] if max_subsets > 1 else [])
    return tuple(decode.live.live_mask_spec(compiled.plan, batch_size, r) for r in counts)


def _eager(compiled, batch_size: int, specs: tuple, beams: tuple = ()) -> None:
    """Runs the op-by-op `mask`, `allowed_tokens`, `advance` (each step,
    on the state the previous `advance` returned, and at a step given as a
    device int32 scalar: one program for every step) and `allowed` (each prefix length) once at `batch_size` rows,
    over every item and, when removals are expected (`specs`), over a
    subset of every item (the shapes of a version's decodes after a
    removal), and over the stack every stack of stacked subsets is padded
    to (the last of `specs`); and `init_beams` / `finalize` (its length
    penalty traced) at each beam size of `beams` (a schedule's last width)."""
    import jax

    T, V = compiled.max_length, compiled.vocab_size
    subsets = [(None, None)]
    if specs:
        one = compiled.subset(np.ones(compiled.items.num_items, bool))
        subsets.append((one, None))
        rows = max(w.shape[0] for w in specs[-1].live + specs[-1].ends if w is not None)
        if rows > 1:
            subsets.append((pad_subsets(one, rows), np.zeros(batch_size, np.int32)))
    logits = np.zeros((batch_size, V), np.float32)
    tokens = np.zeros((batch_size,), np.int32)
    for subset, index in subsets:
        kw = {"subset": subset, "subset_index": index}
        state = compiled.init_processor(batch_size)
        for t in range(T):
            compiled.mask(logits, state, t, **kw)
            compiled.allowed_tokens(state, t, **kw)
            compiled.allowed(np.zeros((batch_size, t), np.int32), **kw)
            state = compiled.advance(state, tokens, t, **kw)
        step = jax.device_put(np.int32(0))  # a step on the device
        for st in (compiled.init_processor(batch_size), state):
            compiled.mask(logits, st, step, **kw)
            compiled.allowed_tokens(st, step, **kw)
            compiled.advance(st, tokens, step, **kw)
    for M in beams:
        width = M if isinstance(M, int) else M[-1]
        compiled.finalize(compiled.init_beams(batch_size, width))
