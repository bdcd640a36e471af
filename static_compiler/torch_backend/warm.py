"""Warm-up of the torch backend (`TorchConstraints.warm`): every request
path run once on dummy inputs before traffic.

torch's eager ops compile nothing (no program is traced or lowered per
shape, unlike jax's): what a first call pays is torch's first-use costs
(kernel dispatch tables, allocator pools, lazily imported modules, the
item subsets' host kernels), the same for every later shape. So the warm-up
runs each path once per batch size and beam size and reports 0
compilations; `TorchConstraints.compilations()` is always 0. (A caller
who wraps these ops in ``torch.compile`` owns those compilations: dynamo
counts them, not this backend.) The report is every front door's
`decode_types.WarmReport`.
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.padding import check_max_subsets
from static_compiler.support import arguments
from static_compiler.support.decode_types import WarmReport


def _ints(name: str, values, allow_empty: bool) -> tuple:
    if arguments.is_int(values):
        values = (values,)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise DecodeInputError(f"warm: {name}={values!r}: expected ints >= 1")
    values = list(values)
    if not values and not allow_empty:
        raise DecodeInputError(f"warm: {name} is empty: expected ints >= 1")
    return tuple(sorted({arguments.check_int(name, v, low=1) for v in values}))


def _num_items(tc) -> Optional[int]:
    """The items of the set's item index (None without one)."""
    items = tc.set_view.items
    return None if items is None else items.num_items


def check_warm_arguments(tc, batch_sizes, beam_sizes, max_subsets) -> tuple:
    """(batch sizes, beam sizes and schedules, max_subsets) after checking
    them; raises DecodeInputError naming the bad value."""
    sizes = _ints("batch_sizes", batch_sizes, allow_empty=False)
    beams = tuple(sorted(arguments.check_warm_beam_sizes(beam_sizes, tc.max_length),
                         key=lambda m: (isinstance(m, tuple), m)))
    for B in sizes:
        for M in beams or (1,):
            arguments.check_beam_schedule(M, tc.max_length, B)
    k = check_max_subsets(max_subsets, tc.set_view, "warm")[0]  # (the bound every door keeps)
    return sizes, beams, k


def run_warm(tc, sizes: tuple, beams: tuple, max_subsets: int) -> WarmReport:
    """Runs init_processor / mask / advance at every step, allowed at every
    prefix length, and init_beams / beam_step (every step) / finalize for
    each beam size and schedule (from the start beam alone, each step's
    width), at each batch size, over every item and (max_subsets
    > 0) over an empty subset; the results are dropped. A set with an
    item index takes that empty subset even with max_subsets=0: the first
    `subset()` of a process loads the host kernels (numba's: seconds) and
    builds the set's trie and bit layout, which a request would otherwise
    pay (docs/integrations.md, the PyTorch backend)."""
    start, calls = time.perf_counter(), 0
    V, T = tc.vocab_size, tc.max_length
    empty = tc.subset(np.zeros(_num_items(tc), bool)) if _num_items(tc) is not None else None
    if not max_subsets:
        empty = None
    with torch.inference_mode():
        for B in sizes:
            kws = [{}] if empty is None else \
                [{}, dict(subset=empty, subset_index=np.zeros(B, np.int64))]
            tokens = torch.zeros(B, dtype=torch.int64, device=tc.device)
            for kw in kws:
                state = tc.init_processor(B)
                logits = torch.zeros((B, V), device=tc.device)
                for t in range(T):
                    tc.mask(logits, state, t, **kw)
                    state = tc.advance(state, tokens, t, **kw)
                    tc.allowed(torch.zeros((B, t), dtype=torch.int64, device=tc.device), **kw)
                    calls += 3
                calls += 1
                for M in beams:
                    widths = arguments.check_beam_schedule(M, T, B)
                    beams_state = tc.init_beams(B, widths[0])
                    for t in range(T):
                        logits = torch.zeros((B, widths[t], V), device=tc.device)
                        beams_state = tc.beam_step(beams_state, logits, t, beam_size=widths[t + 1],
                                                   **kw)
                    tc.finalize(beams_state)
                    calls += T + 2
    return WarmReport(0, calls, time.perf_counter() - start, sizes, beams,
                           max_subsets or None)
