"""One warm-up for every front door: `warm(batch_sizes, *, beam_sizes=None,
max_subsets=0, background=False)` on the compiled set, the served artifact
and the torch backend, returning a `WarmReport` (a Future of one in the
background), planned here once.

A door's first request of each shape pays what the shape needs first: XLA
compiling its programs on the JAX doors, first-use costs on torch (kernel
tables, allocator pools, the item subsets' host kernels). `warm` pays it
before traffic by walking every request path once on dummy inputs through
the door's own public verbs (`contract.Decoding`), so that a later call of
those shapes compiles nothing (`compilations()` stays put). Per batch size
B, over every item, over one subset (R = 1: the path a set decodes through
once an update removed items, where the door says it has one, and every
path when max_subsets > 0) and, for max_subsets = K > 1, over K stacked
subsets:

* the processor loop: `init_processor`, then `mask`, `allowed_tokens`,
  `allowed` (that prefix length) and `advance` at every step on the state
  the previous `advance` returned; on the JAX doors again at a step given
  as a device int32 scalar (one program for every step);
* per beam size M or beam schedule: `init_beams` (a schedule's start
  beam), `beam_step` at every step (a schedule's width each) with host
  logits and, on the JAX doors, device logits, `finalize`; and
  `beam_search` with a model of zero logits where the door's search does
  not hold the model in its program (the compiled set's does: its own
  hook compiles it ahead with the caller's model);
* with an item prior of zeros where the door has prior programs;
* the door's own programs (`WarmPaths.own_jobs`: the compiled set's step
  processors and decoders).

Everything is checked before anything runs, background or not. After the
warm-up every stack of up to K subsets decodes padded to K (`Warmth.
padding_to`, the door's verbs pad), all or nothing: a warm-up that raises
leaves the padding as it was. A door adds only its `WarmPaths` (how its
arrays are made, which paths it has), so the next door gets the warm-up by
writing one. numpy and the standard library only: the JAX doors' warm state
and arrays (`Warmth`, `JaxPaths`: the compile counter, jax's device arrays)
are `static_compiler.jax_support.warmth`, so the serving binary and a
torch-only process import this module alike.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.padding import check_max_subsets, pad_subsets
from static_compiler.support import arguments
from static_compiler.support.decode_types import WarmReport


class WarmPaths(abc.ABC):
    """What one door adds to the warm-up (a subclass per door; the defaults
    are a door of numpy arrays that compiles nothing).

    Attributes
    ----------
    where : str
        The door, for error messages ("warm (artifact 'x.sc')").
    warmth : Warmth or None
        Its compile count and padding bound (`jax_support.warmth.Warmth`;
        None: nothing compiles).
    default_beams : tuple
        What `beam_sizes=None` warms (the artifact: its exported sizes).
    removals : bool
        The set decodes through one subset after an update removed items:
        that path (R = 1) is warmed even with max_subsets=0.
    processor : bool
        The door runs the processor verbs (an artifact exported them).
    search_model : callable or None
        A model of zero logits the door's `beam_search` is run with (None:
        the door warms its search itself, in `own_jobs`).
    prior : optional
        An item prior of zeros the beam paths are also walked with.
    """

    where: str = "warm"
    warmth: Any = None  # a jax_support.warmth.Warmth (a JAX door's)
    default_beams: tuple = ()
    removals: bool = False
    processor: bool = True
    search_model: Optional[Callable] = None
    prior: Any = None

    def zeros(self, shape: tuple, kind: str) -> Any:
        """Zeros of `shape` as the door takes them: kind "float" (float32
        logits) or "int" (tokens, prefixes, subset indices)."""
        return np.zeros(shape, np.float32 if kind == "float" else np.int32)

    def logits_forms(self) -> tuple:
        """Functions giving the forms of logits the beam steps are walked
        with (host; on the JAX doors also the device)."""
        return (lambda x: x,)

    def device_step(self, step: int) -> Any:  # noqa: ARG002 (a door's hook)
        """`step` as a device scalar (one program for every step), or None
        where the door has no such form."""
        return None

    def ready(self, value: Any) -> Any:
        """Waits until `value` is computed (jax's dispatch is asynchronous)."""
        return value

    @abc.abstractmethod
    def beam_widths(self, beam_size, batch_size: int) -> tuple:
        """The widths the door's search runs `beam_size` with (max_length + 1
        ints; `arguments.check_beam_schedule`), after checking the door
        runs it (DecodeInputError naming it)."""

    def own_jobs(self, batch_size: int, beam_sizes: tuple,  # noqa: ARG002 (a door's hook)
                 subset_rows: int) -> list:  # noqa: ARG002
        """The door's own compiles at `batch_size` for `beam_sizes`
        (zero-argument callables, arguments checked now), `subset_rows` the
        widest stack walked."""
        return []

    def ranked(self, batch_size: int, subset_rows: int) -> list:  # noqa: ARG002 (a door's hook)
        """The ranked subsets the walk also takes at `batch_size` rows, as
        (subset, subset_index) pairs (a door that compiles per subset
        form: the JAX doors' ``warm(..., ranked=True)``)."""
        return []

    def running(self):
        """A context the walk runs in (torch: inference mode)."""
        return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A warm-up's checked arguments."""

    batch_sizes: tuple
    beam_sizes: tuple  # ints and schedules (tuples), ints first
    max_subsets: int
    empty: Any  # a subset of no item (what the subset paths walk), or None


def warm(door, paths: WarmPaths, batch_sizes, beam_sizes, max_subsets, background):
    """`warm` of every door: checks the arguments (DecodeInputError, before
    anything runs), plans the door's own jobs (their checks too), then runs
    the walk here or on a thread: a `WarmReport`, or a Future of one."""
    plan = _check(door, paths, batch_sizes, beam_sizes, max_subsets, background)
    rows = plan.max_subsets
    if rows and paths.warmth is not None:  # (a larger bound warmed before stays: compiled)
        rows = max(rows, paths.warmth.pad_to or 0)
    jobs = [job for B in plan.batch_sizes for job in paths.own_jobs(B, plan.beam_sizes, rows)]
    run = lambda: _run(door, paths, plan, rows, jobs)  # noqa: E731
    return in_background(run, "static-compiler-warm") if background else run()


def in_background(run: Callable[[], Any], name: str) -> concurrent.futures.Future:
    """`run()` on a daemon thread: a Future of its result (a warm-up's
    report) at once (its `result()` waits, and raises what `run` raised)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(run())
            except BaseException as err:  # handed to whoever waits on the future
                future.set_exception(err)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def _check(door, paths: WarmPaths, batch_sizes, beam_sizes, max_subsets, background) -> _Plan:
    where = paths.where
    sizes = [batch_sizes] if arguments.is_int(batch_sizes) else batch_sizes
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise DecodeInputError(f"{where}: batch_sizes={batch_sizes!r}: expected an int >= 1 or "
                               "ints >= 1 (the batch sizes requests will use)")
    sizes = list(sizes)
    if not sizes:
        raise DecodeInputError(f"{where}: batch_sizes is empty: expected ints >= 1")
    sizes = tuple(sorted({arguments.check_rows(arguments.check_int("batch_size", b, low=1))[0]
                          for b in sizes}))
    beams = paths.default_beams if beam_sizes is None else \
        arguments.check_warm_beam_sizes(beam_sizes, door.max_length)
    for m in beams:
        for B in sizes:
            try:
                paths.beam_widths(m, B)
            except DecodeInputError as err:
                raise DecodeInputError(f"{where}: beam_sizes entry {m!r}: {err}") from None
    beams = tuple(sorted(beams, key=lambda m: (isinstance(m, tuple), m)))
    if not isinstance(background, (bool, np.bool_)):
        raise DecodeInputError(f"{where}: background={background!r}: expected a bool")
    k, empty = check_max_subsets(max_subsets, door._set_view, where)
    if empty is None and paths.removals:
        items = door._set_view.items
        empty = door.subset(np.zeros(items.num_items, bool)) if items is not None else None
    return _Plan(sizes, beams, k, empty)


def _run(door, paths: WarmPaths, plan: _Plan, rows: int, jobs: list) -> WarmReport:
    """Runs the door's own jobs and the walk, counted by the door's counter
    and by one of this warm-up's own (the report's count: its compilations
    alone, whatever other threads compile meanwhile), with the padding
    bound raised for the run and kept only if it all ran."""
    start, calls = time.perf_counter(), 0
    with contextlib.ExitStack() as stack:
        mine = None
        if paths.warmth is not None:
            mine = stack.enter_context(paths.warmth.counted())
            if plan.empty is not None and (rows or paths.removals):
                rows = stack.enter_context(paths.warmth.padding_to(max(rows, 1)))
        stack.enter_context(paths.running())
        for job in jobs:
            job()
            calls += 1
        for B in plan.batch_sizes:
            calls += _walk(door, paths, plan, B, rows)
    subset_rows = (rows or 1) if plan.empty is not None else None
    return WarmReport(0 if mine is None else mine.count, calls, time.perf_counter() - start,
                      plan.batch_sizes, plan.beam_sizes, subset_rows)


def _subsets(paths: WarmPaths, plan: _Plan, B: int, rows: int) -> list:
    """The subset arguments walked at B rows: none, one subset of no item,
    and `rows` such subsets stacked (rows > 1)."""
    kws: list = [{}]
    if plan.empty is not None:
        kws.append({"subset": plan.empty})
        if rows > 1:
            kws.append({"subset": pad_subsets(plan.empty, rows),
                        "subset_index": paths.zeros((B,), "int")})
    kws.extend({"subset": subset, "subset_index": index} for subset, index in paths.ranked(B, rows))
    return kws


def _walk(door, paths: WarmPaths, plan: _Plan, B: int, rows: int) -> int:
    """Every request path at B rows once, through the door's public verbs;
    returns the calls made."""
    T, V, calls = door.max_length, door.vocab_size, 0
    kws = _subsets(paths, plan, B, rows)
    if paths.processor:
        logits, tokens = paths.zeros((B, V), "float"), paths.zeros((B,), "int")
        for kw in kws:
            state = door.init_processor(B)
            for t in range(T):
                door.mask(logits, state, t, **kw)
                door.allowed_tokens(state, t, **kw)
                paths.ready(door.allowed(paths.zeros((B, t), "int"), **kw))
                state = door.advance(state, tokens, t, **kw)
            calls += 1 + 4 * T
            step = paths.device_step(0)
            if step is not None:
                for st in (door.init_processor(B), state):
                    door.mask(logits, st, step, **kw)
                    door.allowed_tokens(st, step, **kw)
                    paths.ready(door.advance(st, tokens, step, **kw))
                calls += 1 + 2 * 3
    beam_kws = kws + ([dict(kw, prior=paths.prior) for kw in kws] if paths.prior is not None
                      else [])
    for M in plan.beam_sizes:
        widths = paths.beam_widths(M, B)
        for kw in beam_kws:
            for form in paths.logits_forms():
                state = door.init_beams(B, widths[0])
                for t in range(T):
                    width = {} if isinstance(M, int) else {"beam_size": widths[t + 1]}
                    logits = form(paths.zeros((B, widths[t], V), "float"))
                    state = door.beam_step(state, logits, t, **width, **kw)
                paths.ready(door.finalize(state))
                calls += T + 2
            if paths.search_model is not None:
                paths.ready(door.beam_search(paths.search_model, B, M, **kw))
                calls += 1
    return calls
