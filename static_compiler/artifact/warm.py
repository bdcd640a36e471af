"""Warm-up of a served artifact (`serving.Artifact.warm`): every program a
server's requests can call, compiled before the first request, so that
afterwards no request within the warmed bounds compiles.

A request's programs are fixed by its shapes: the batch size B, the beam
size M (one exported module per M), and for item subsets R, the number of
stacked subsets (the bits are uint32 (R, words)). B and M are the server's
to fix; R varies per request, so after a warm-up with max_subsets=K every
stack of R <= K subsets is padded to one shape (`padded_rows`: empty subsets
appended, subset_index unchanged, the same results), and R never compiles
again. An artifact with an item index always decodes through the subset
modules after an update removed items (with the subset of the items left),
so those are warmed even when K = 0 (R = 1 then).

The warm state (`Warmth`: the compile counter and the padding bound) is
shared by every `reload()` of one loaded artifact, as its modules are: a
version after removals or additions within capacity (same modules, same
table shapes) runs the programs already compiled. Like `serving`, this
module needs only jax, numpy and the standard library.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import threading
import time
from typing import Optional

import numpy as np

from static_compiler.errors import DecodeInputError
from static_compiler.live.liveness import Subset
from static_compiler.live.padding import (  # noqa: F401 (the bound, here since the served warm-up)
    PADDED_SUBSETS_MAX_BYTES,
    check_max_subsets,
    pad_subsets,
    subset_bytes,
)
from static_compiler.support.compile_events import CompileCounter
from static_compiler.support.decode_state import check_rows
from static_compiler.support.decode_types import WarmReport


class Warmth:
    """What one loaded artifact and all its reloads share: `counter`, the
    XLA compilations their calls caused (`Artifact.compilations`), and
    `pad_to`, the number of stacked subsets every stack of R <= pad_to is
    padded to (None before a warm-up: stacks go as they are)."""

    def __init__(self):
        self.counter = CompileCounter()
        self.pad_to: Optional[int] = None
        self._lock = threading.Lock()

    def raise_pad_to(self, num: int) -> int:
        """Sets pad_to to at least `num`; returns it (a later warm-up with a
        smaller bound keeps the larger one: its programs are compiled)."""
        with self._lock:
            self.pad_to = max(num, self.pad_to or 0)
            return self.pad_to

    @contextlib.contextmanager
    def padding_to(self, num: int):
        """`raise_pad_to(num)` for a warm-up that must be all or nothing:
        if the block raises, pad_to goes back to what it was (unless
        another warm-up raised it meanwhile), so a failed warm-up leaves
        requests decoding as before. Yields the bound."""
        with self._lock:
            before = self.pad_to
            self.pad_to = after = max(num, before or 0)
        try:
            yield after
        except BaseException:
            with self._lock:
                if self.pad_to == after:
                    self.pad_to = before
            raise

    def padded_rows(self, num_subsets: int) -> int:
        """The stacked subsets a stack of `num_subsets` is decoded as."""
        pad = self.pad_to
        return pad if pad is not None and num_subsets <= pad else num_subsets



def counted(method):
    """An Artifact method whose XLA compilations count in its `Warmth`'s
    counter (module calls and eager jnp ops alike; the calling thread's)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._warmth.counter.counting():
            return method(self, *args, **kwargs)

    return call


def check_warm_arguments(art, batch_sizes, beam_sizes, max_subsets, background) -> tuple:
    """(batch sizes, beam sizes, max_subsets) as tuples of ints / an int,
    after checking them; raises DecodeInputError naming the bad value."""
    where = f"warm (artifact {str(art.path)!r})"
    sizes = [batch_sizes] if isinstance(batch_sizes, (int, np.integer)) else batch_sizes
    try:
        sizes = list(sizes)
    except TypeError:
        raise DecodeInputError(f"{where}: batch_sizes={batch_sizes!r}: expected ints >= 1 (the "
                               "batch sizes requests will use)") from None
    if not sizes:
        raise DecodeInputError(f"{where}: batch_sizes is empty: expected ints >= 1")
    sizes = tuple(sorted({check_rows(b)[0] for b in sizes}))
    beams = art.beam_sizes + art.beam_schedules if beam_sizes is None else \
        ([beam_sizes] if isinstance(beam_sizes, (int, np.integer)) else beam_sizes)
    try:
        widths = [art._check_schedule(m) for m in beams]
    except TypeError:
        raise DecodeInputError(f"{where}: beam_sizes={beam_sizes!r}: expected ints from the "
                               f"exported beam sizes {list(art.beam_sizes)} or beam schedules "
                               f"from {[list(s) for s in art.beam_schedules]}") from None
    except DecodeInputError as err:
        raise DecodeInputError(f"{where}: {err}") from None
    # an int per beam size, a tuple per schedule (one width per step)
    beams = tuple(sorted({int(m) if isinstance(m, (int, np.integer)) else
                          tuple(int(w) for w in m) for m in beams},
                         key=lambda m: (isinstance(m, tuple), m)))
    for b in sizes:
        for w in widths:
            check_rows(b, max(w))
    if not isinstance(background, (bool, np.bool_)):
        raise DecodeInputError(f"{where}: background={background!r}: expected a bool")
    k, empty = check_max_subsets(max_subsets, art.set_view, where)
    if empty is None and art.items is not None:  # (K = 0: R = 1 is warmed, see the module doc)
        empty = art.subset(np.zeros(art.items.num_items, bool))
    return sizes, beams, k, empty


def warm(art, batch_sizes, beam_sizes, max_subsets, background):
    """`Artifact.warm`: checks the arguments, then runs `run_warm` here or
    on a thread (a Future of its WarmReport), with the padding bound
    raised for its run and kept only if it succeeds (all or nothing)."""
    sizes, beams, k, empty = check_warm_arguments(art, batch_sizes, beam_sizes, max_subsets,
                                                  background)

    def run():
        if empty is None:
            return run_warm(art, sizes, beams, None, None)
        with art._warmth.padding_to(max(k, 1)) as rows:
            return run_warm(art, sizes, beams, rows, empty)

    if not background:
        return run()
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(run())
            except BaseException as err:  # handed to whoever waits on the future
                future.set_exception(err)

    threading.Thread(target=work, name="static-compiler-warm-artifact", daemon=True).start()
    return future


def _zero_prior(art):
    """A `live.priors.Prior` of zeros for `art` (its shape is what the prior
    modules compile for)."""
    from static_compiler.live.priors import Prior
    from static_compiler.target.plan import prior_size
    plan = art.set_view.facts.plan
    return Prior(np.zeros(prior_size(plan), np.float32), 0.0, "", art.fingerprint)


def _host_model(vocab_size: int):
    """A model of zero logits made on the host (numpy): running the served
    `beam_search` with it compiles only what the search itself runs."""
    def logits_fn(last_tokens, step, carry):  # noqa: ARG001 (the model's signature)
        return np.zeros(tuple(np.shape(last_tokens)) + (vocab_size,), np.float32), carry

    return logits_fn


def run_warm(art, sizes: tuple, beams: tuple, rows: Optional[int],
             empty: Optional[Subset]) -> WarmReport:
    """Runs every request-path call once per shape on dummy inputs (zeros;
    `empty`, a subset of no item, padded to `rows` stacked subsets; with
    item-prior modules, a prior of zeros), through the public methods, so
    their eager conversions (step, logits, finalize) compile too: per B,
    each beam size or schedule step by step (host and device logits) and
    through `beam_search` (its end-token loop), and the processor loop
    (init_processor, mask, allowed_tokens, advance at every step, each on
    the state the previous advance returned) with `allowed` at every prefix
    length. The report's count is the compilations run inside it, which
    `compilations()` counts too."""
    import jax  # running an artifact's modules; the rest of this module needs no jax

    start, calls, counter = time.perf_counter(), 0, CompileCounter()
    V, T = art.vocab_size, art.max_length
    zeros = _zero_prior(art) if art.manifest.exports_priors else None
    model = _host_model(V)
    with art._warmth.counter.counting(), counter.counting():
        for B in sizes:
            index = np.zeros(B, np.int32)
            subset_kw = [{}] if empty is None else [{}, dict(subset=empty, subset_index=index)]
            step_kw = subset_kw + ([dict(kw, prior=zeros) for kw in subset_kw] if zeros else [])
            for M in (m for m in beams if isinstance(m, tuple)):
                for kw in step_kw:  # a schedule: each of its steps' modules, in turn
                    for lg in (np.zeros, lambda shape: jax.device_put(np.zeros(shape))):
                        state = art.init_beams(B, 1)  # (a schedule's start beam)
                        for t, width in enumerate(M):
                            logits = lg((B, state.node.shape[1], V)).astype(np.float32)
                            state = art.beam_step(state, logits, t, beam_size=width, **kw)
                            calls += 1
                        jax.block_until_ready(art.finalize(state))
                        calls += 2
            for M in (m for m in beams if not isinstance(m, tuple)):
                state = art.init_beams(B, M)
                logits = np.zeros((B, M, V), np.float32)
                for kw in step_kw:
                    for lg in (logits, jax.device_put(logits)):  # host and device logits
                        after = art.beam_step(state, lg, 0, **kw)
                        jax.block_until_ready(art.finalize(after))
                        calls += 2
                calls += 1
            for M in beams:  # the served search: its loop (the end token's check) and steps
                for kw in step_kw:
                    jax.block_until_ready(art.beam_search(model, B, M, **kw))
                    calls += 1
            if "mask" in art._modules:
                for kw in subset_kw:
                    pstate = art.init_processor(B)
                    for t in range(T):
                        masked = art.mask(np.zeros((B, V), np.float32), pstate, t, **kw)
                        jax.block_until_ready(art.allowed_tokens(pstate, t, **kw))
                        pstate = art.advance(pstate, np.argmax(np.asarray(masked), -1), t, **kw)
                        jax.block_until_ready(art.allowed(np.zeros((B, t), np.int32), **kw))
                        calls += 4
    return WarmReport(counter.count, calls, time.perf_counter() - start, sizes, beams, rows)
