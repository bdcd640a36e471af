"""The torch backend's part of the warm-up (`TorchConstraints.warm`): every
request path run once on dummy inputs before traffic. The warm-up itself is
every door's (`decoding.warm_up`); this module says what torch's paths are.

torch's eager ops compile nothing (no program is traced or lowered per
shape, unlike jax's): what a first call pays is torch's first-use costs
(kernel dispatch tables, allocator pools, lazily imported modules, the
item subsets' host kernels, the processor pair's on the CPU:
`host_kernels`), the same for every later shape. So the
warm-up reports 0 compilations; `TorchConstraints.compilations()` is
always 0. (A caller who wraps these ops in ``torch.compile`` owns those
compilations: dynamo counts them, not this backend.) A set with an item
index walks one subset even with max_subsets=0: the first `subset()` of a
process loads the host kernels (numba's: seconds) and builds the set's
trie and bit layout, which a request would otherwise pay (and a set
decodes through a subset once an update removed items); and one ranked
subset (`TorchConstraints.ranked_subset`, a door job per batch size:
the set's trie order and range tables, built on first use, ~0.1 s at
1e7 items).
"""

from __future__ import annotations

import numpy as np
import torch

from static_compiler.decoding import warm_up
from static_compiler.support import arguments


def warm(tc, batch_sizes, beam_sizes, max_subsets, background):
    """`TorchConstraints.warm`: every door's warm-up over torch's paths."""
    if tc._engine._host_for(None) is not None:  # (the host steps' kernels: loaded, or compiled once)
        from static_compiler.host_kernels import processor as host_kernels
        host_kernels.warm()
    return warm_up.warm(tc, _TorchPaths(tc), batch_sizes, beam_sizes, max_subsets, background)


class _TorchPaths(warm_up.WarmPaths):
    """Torch tensors on the set's device, in inference mode; any beam size
    or schedule `beam_search` takes; its search run with a model of zero
    logits."""

    def __init__(self, tc):
        self.tc = tc
        self.removals = tc._set_view.items is not None
        V, device = tc.vocab_size, tc.device

        def zero_model(last_tokens, step, carry):  # noqa: ARG001 (the model's signature)
            return torch.zeros(tuple(last_tokens.shape) + (V,), device=device), carry

        self.search_model = zero_model

    def zeros(self, shape: tuple, kind: str):
        dtype = torch.float32 if kind == "float" else torch.int64
        return torch.zeros(shape, dtype=dtype, device=self.tc.device)

    def beam_widths(self, beam_size, batch_size: int) -> tuple:
        return arguments.check_beam_schedule(beam_size, self.tc.max_length, batch_size)

    def own_jobs(self, batch_size: int, beam_sizes: tuple, subset_rows: int) -> list:
        """A ranked subset of no item made and read at every step (a set
        with an item index): its first use builds the set's trie order and
        range tables."""
        del beam_sizes, subset_rows  # (every path reads a ranked subset alike)
        tc = self.tc
        if not self.removals:
            return []

        def ranked():
            empty = tc.ranked_subset(np.zeros(tc._set_view.items.num_items, bool))
            state = tc.init_processor(batch_size)
            for t in range(tc.max_length):
                tc.allowed_tokens(state, t, subset=empty)
                state = tc.advance(state, self.zeros((batch_size,), "int"), t, subset=empty)

        return [ranked]

    def running(self):
        return torch.inference_mode()
