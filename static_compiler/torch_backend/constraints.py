"""`TorchConstraints`: a compiled constraint set decoded with torch.

    tc = TorchConstraints.load("sids.sc", device="cuda")   # no jax imported
    state = tc.init_processor(rows)
    for step in range(tc.max_length):
        logits = tc.mask(model(...), state, step)      # float32, SENTINEL_SCORE where not allowed
        tokens = pick(logits)
        state = tc.advance(state, tokens, step)

or, for an engine that hands over each row's tokens so far (Hugging Face
``generate``): ``tc.allowed(prefixes)``. The semantics are those of the JAX
backend's `mask` / `allowed_tokens` / `advance` / `allowed`, bit for bit
(tests/torch_backend/test_torch_backend.py), including the set's removals (an updated
set's live items) and item subsets.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Optional, Union

import torch

from static_compiler.decoding.decoder import Decoder
from static_compiler.errors import DecodeInputError
from static_compiler.format import snapshot, snapshot_items
from static_compiler.format import spec as artifact_format
from static_compiler.format.manifest import Manifest
from static_compiler.items.index import ItemIndex
from static_compiler.lowered.plan import Plan, PlanFacts
from static_compiler.rules.set_view import SetView
from static_compiler.support.decode_types import BeamState, WarmReport
from static_compiler.support.deprecation import warn_deprecated
from static_compiler.torch_backend import beam, checks, rank_kernels
from static_compiler.torch_backend import warm as warming
from static_compiler.torch_backend.engine import TorchEngine
from static_compiler.torch_backend.ops import ProcessorStep, TorchState
from static_compiler.torch_backend.tables import TorchPlan, torch_plan, torch_tables


def _table_files(manifest) -> list:
    """Each table's (layer, name, file entry: size and sha256) in `manifest`:
    equal for two versions whose tables are the same bytes."""
    return [(t.layer, t.name, manifest.files[t.file]) for t in manifest.tables]


class _OldMask:
    """The default of `TorchConstraints.mask`'s state and step: left out,
    the call is the deprecated ``mask(state, step)``."""

    def __repr__(self):
        return "<the deprecated mask(state, step)>"


_OLD_MASK = _OldMask()


class TorchConstraints(PlanFacts, Decoder):
    """A compiled set's plan and tables as torch tensors, with the decoding
    operations as torch ops (no jax at call time).

    Build it with `load` (a saved artifact, read with numpy only) or
    `from_compiled` (a `CompiledConstraints`). Its verbs are the
    `decoding.decoder.Decoder`'s over `engine.TorchEngine`. Every operation is
    vectorized over the rows at a static step (a Python int), reads no
    tensor value back to the host and branches on none, so it runs under
    ``torch.compile(fullgraph=True)`` (pass subsets as `live_bits` with a
    tensor subset_index there; a `Subset` with a numpy index is checked on
    the host).

    Attributes
    ----------
    plan : TorchPlan
        The static plan (vocab_size, steps, end_token).
    device : torch.device
    fingerprint : str
        The set's fingerprint: subsets must carry it.
    names : NameTable or None
        A text catalogue's names (`texts` reads them), else None.
    attributes : ItemAttributes or None
        Property: the items' attribute columns, else None.
    """

    path = None
    """The artifact this set was loaded from (`load`), which `reload` re-reads;
    None for `from_compiled`."""
    _manifest: Optional[Manifest] = None
    """The manifest of the version loaded (`load`), which `reload` compares."""

    def __init__(self, plan: TorchPlan, tables: tuple, set_view: SetView, *, device=None,
                 names=None):
        self.names = names
        self.plan = plan
        self._tables = tables  # one dict per layer, int32 (bool accepting), on device
        self.device = checks.check_device(device, "TorchConstraints")
        self._set_view = set_view  # (subsets, fingerprint, base subset: numpy, on the host)
        device = self.device
        ranges = None if set_view.items is None else (
            lambda: rank_kernels.range_tensors(set_view.trie(), set_view.trie_order(),
                                               set_view.fingerprint, device))
        self._ops = TorchEngine(plan, tables, device, set_view.base_subset(), ranges)

    @property
    def _engine(self) -> TorchEngine:
        return self._ops

    def __repr__(self):
        return (f"TorchConstraints(vocab_size={self.vocab_size}, max_length={self.max_length}, "
                f"end_token={self.end_token}, device={self.device})")

    # Construction

    @classmethod
    def load(cls, path, device=None, *, verify_checksums: bool = True) -> "TorchConstraints":
        """The set saved at `path` (``compiled.save(path)``), its tables read
        through the numpy-only snapshot readers and put on `device` once
        (default: the CPU). Neither jax nor the compiler is imported.
        Raises ArtifactFormatError / ArtifactChecksumError /
        ArtifactVersionError as `serving.load` does for a damaged artifact,
        DecodeInputError for a device this torch cannot use."""
        path = artifact_format.artifact_path(path, "TorchConstraints.load")
        device = checks.check_device(device, "TorchConstraints.load")
        with snapshot.open_snapshot(path, verify_checksums=verify_checksums) as snap:
            return cls._of_snapshot(snap, path, device)

    @classmethod
    def _of_snapshot(cls, snap, path, device, same: Optional["TorchConstraints"] = None
                     ) -> "TorchConstraints":
        """The set of the open snapshot `snap` of the artifact at `path`;
        `same`: a loaded version with the same tables, whose tensors (and
        trie, and its trie order and range tensors once made) the new one
        shares (`reload`)."""
        manifest = snap.manifest
        host = snapshot.read_tables(snap)  # (memory-mapped: read where used)
        arrays = snapshot_items.read_item_arrays(snap)
        names = snapshot.read_names(snap)
        items = None if arrays is None else ItemIndex(num_unique=manifest.num_sequences, **arrays)
        built = same._set_view if same is not None and same._set_view.tables else None
        view = SetView.of_artifact(manifest, host, items,
                                   manifest.files[artifact_format.IR_FILE].sha256,
                                   source=f"artifact {str(path)!r}", missing=DecodeInputError,
                                   built=built)
        tables = same._tables if same is not None else torch_tables(host, device)
        loaded = cls(torch_plan(view.facts), tables, view, device=device, names=names)
        made = None if same is None else same._engine.range_table
        if made is not None and view.items is not None:  # (its range tensors, renamed)
            loaded._engine.range_table = made._replace(fingerprint=view.fingerprint)
        loaded.path, loaded._manifest = path, manifest
        return loaded

    def reload(self, *, verify_checksums: bool = True) -> "TorchConstraints":
        """The artifact at this set's path as it is on disk now, for the next
        decode: the served `Artifact.reload` contract. Double buffering: this
        object keeps decoding the version it loaded (a search in progress
        finishes on it); swap in the returned one between two decodes, in
        one assignment (``tc = tc.reload()``). Returns self when nothing
        changed; after removals or a rollback that left the tables as they
        were (only the item index and manifest changed) the new object
        shares this one's tensors on the device. The version on disk is
        checked as `load` checks it, all of one snapshot: on any error
        (ArtifactFormatError / ArtifactChecksumError / ArtifactVersionError
        for a damaged, missing or unreadable version) nothing changes and
        this object keeps serving. Subsets and priors are per version: take
        them again from the returned object when its items changed. Raises
        DecodeInputError for a set made by `from_compiled` (it has no
        artifact to re-read)."""
        if self.path is None or self._manifest is None:
            raise DecodeInputError("reload: this TorchConstraints was made by from_compiled, "
                                   "not loaded from an artifact: there is no path to re-read "
                                   "(TorchConstraints.load(path) loads a saved set)")
        with snapshot.open_snapshot(self.path, verify_checksums=verify_checksums) as snap:
            manifest = snap.manifest
            if manifest.seal() == self._manifest.seal():
                return self
            same = self if _table_files(manifest) == _table_files(self._manifest) else None
            return type(self)._of_snapshot(snap, self.path, self.device, same)

    @classmethod
    def from_compiled(cls, compiled, device=None) -> "TorchConstraints":
        """The set `compiled` (a `CompiledConstraints`), its numpy tables
        put on `device` once (default: the CPU)."""
        view = getattr(compiled, "_set_view", None)  # (this layer never imports the compiler)
        if isinstance(compiled, TorchConstraints) or not isinstance(view, SetView) or \
                not isinstance(getattr(compiled, "plan", None), Plan):
            raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected the "
                                   "CompiledConstraints of sc.compile_constraints")
        device = checks.check_device(device, "TorchConstraints.from_compiled")
        # (the view is shared: one trie, layout and base subset)
        return cls(torch_plan(view.facts), torch_tables(compiled.lowered.tables, device), view,
                   device=device, names=compiled.names)

    # The verbs: `Decoder`'s, with the options of this backend

    def mask(self, logits: torch.Tensor, state: TorchState | _OldMask = _OLD_MASK,
             step: int | _OldMask = _OLD_MASK, *, subset=None, subset_index=None) -> torch.Tensor:
        """logits float (B, V) -> float32 (B, V): the logits of the tokens each
        row of `state` may take at `step` (see `allowed_tokens`), SENTINEL_SCORE
        for the others and for NaN logits: the JAX front doors' `mask`, bit
        for bit. The two-argument form ``mask(state, step)`` (bool (B, V))
        is deprecated and goes in 0.2.0 (2027-03-01): it warns and returns
        `allowed_tokens(state, step)`."""
        if state is _OLD_MASK or step is _OLD_MASK:  # mask(state, step), mask(state, step=t)
            warn_deprecated("TorchConstraints.mask(state, step)",
                            "TorchConstraints.allowed_tokens(state, step) (mask(logits, state, "
                            "step) returns masked logits)")
            old_step = state if step is _OLD_MASK else step
            return self._allowed_tokens(logits, old_step, subset, subset_index, "mask")
        return super().mask(logits, state, step, subset=subset, subset_index=subset_index)

    def processor_step(self, state: TorchState, step: int, *, tokens=None, columns=None,
                       subset=None, subset_index=None) -> ProcessorStep:
        """The processor pair fused for an engine that masks its rows, samples,
        and masks them again: with `tokens` (ints (B,), those the rows of
        `state` took at step - 1), `advance` first; then `allowed_tokens`
        at `step`. Returns a `ProcessorStep` (state at `step`, allowed bool
        (B, V), columns). Pass the returned state and columns to the next
        call (with its tokens, at step + 1): its advance then reads the
        candidates this call read instead of the tables again (vLLM's
        processor: one call per group of rows and step). columns: the
        previous call's, or None (the advance reads the tables). The
        results are `advance`'s and `allowed_tokens`', bit for bit. Raises
        DecodeInputError for columns of another state, step or subset."""
        engine = self._engine
        state, B = engine.processor_state(state, "processor_step")
        return engine.processor_step(state, step, tokens, columns,
                                     self._live(subset, subset_index, B, "processor_step"))

    def allowed(self, prefixes, *, subset=None, subset_index=None,
                check_values: bool = True) -> torch.Tensor:
        """prefixes int (N, t), t in [0, max_length) -> bool (N, V): the
        tokens that may follow each prefix, with no per-row state (the
        semantics of `static_compiler.backend.decode.prefix.allowed`:
        finished prefixes allow the end token, unknown ones nothing).
        check_values: raise DecodeInputError for a token outside [0, V)
        (reads the prefixes back to the host; skipped under torch.compile);
        False: such a row allows nothing."""
        return self._allowed(prefixes, subset, subset_index, check_values=check_values)

    def beam_step(self, state: BeamState, logits: torch.Tensor, step: int, *,
                  tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
                  subset=None, subset_index=None, beam_size: Optional[int] = None,
                  prior=None, log_probs: bool = False) -> BeamState:
        """One constrained beam-search step at static `step` in [0,
        max_length): the JAX backend's `beam_step` (its semantics in
        `static_compiler.backend.decode`), with no host synchronisation.

        logits: float (B, M, V) for the beams of `state` (fed
        ``state.last_tokens``); tokens_per_beam: the most children a beam
        may contribute at this step (None: no cap); live_beams: a static
        promise that only beams [0, live_beams) can be valid (`beam_search`
        passes the bound, saving the expansion of the others); subset,
        subset_index: as `mask`, one subset per batch row; beam_size: the
        beams the new state keeps (a beam schedule's width at this step;
        None: M, as many as `state` has); prior: item priors (`prior`), as
        `beam_search` takes them; log_probs: `logits` already are
        log-probabilities, log_softmax over the full vocabulary (an engine's,
        such as vLLM's raw log-probs, needed only at the tokens the beams
        may take: -inf elsewhere), used as given (the same step as from the
        logits they came from). Returns the new `BeamState`; its
        ``parent`` int64 (B, beam_size) reorders per-beam model state."""
        return self._beam_step(state, logits, step, subset, subset_index, beam_size, prior,
                               tokens_per_beam=tokens_per_beam, live_beams=live_beams,
                               log_probs=log_probs)

    def beam_search(self, logits_fn: Callable, batch_size: int, beam_size: int, *,
                    tokens_per_beam=None, start_token=0, carry=None, reorder=None,
                    length_penalty: float = 0.0, subset=None, subset_index=None,
                    return_carry: bool = False, compile: bool = False, prior=None):
        """Constrained beam search in torch: the tokens, validity and lengths
        of `static_compiler.beam_search` on the same model (scores to float32
        rounding: torch's log_softmax is not XLA's bit for bit).

        beam_size: an int, or one width per step (a beam schedule, e.g. (16,
        32, 64, 64): the search starts from the start beam alone, step t
        keeps beam_size[t] beams, the model sees the beams the step before
        kept: 1 at step 0). logits_fn: ``(last_tokens int64 (B, M),
        step int, carry) -> (logits float (B, M, V), carry)``; step is a
        Python int. reorder:
        ``fn(carry, parent int64 (B, M)) -> carry``, the model state of each
        beam's parent (KV caches); needed for a carry when beam_size > 1.
        tokens_per_beam, start_token, length_penalty, subset, subset_index:
        as `static_compiler.beam_search`. With an end token, the search stops
        once every valid beam has ended (one host read of a bool per step;
        the result is the same). compile: run each step past its
        log_softmax as a ``torch.compile`` program (`beam.CompiledSteps`,
        kept on this object: each step, options and shape compiles once, at
        first use; the same result). prior: item priors (`prior`), as
        `static_compiler.beam_search` takes them.
        Returns a `DecodeResult` of torch tensors (int64 tokens (B, M, T)),
        or ``(result, carry)`` with return_carry.
        """
        return self._search(logits_fn, batch_size, beam_size, subset, subset_index, start_token,
                            carry, reorder, length_penalty, return_carry, prior,
                            tokens_per_beam=tokens_per_beam,
                            programs=beam.compiled_steps(self) if compile else None)

    # Warm-up

    def warm(self, batch_sizes, *, beam_sizes=None, max_subsets: int = 0,
             background: bool = False
             ) -> Union[WarmReport, Future[WarmReport]]:
        """Runs each request path once on dummy inputs at each batch size of
        `batch_sizes` (ints >= 1), every door's warm-up
        (`static_compiler.decoding.warm_up`): init_processor / mask /
        allowed_tokens / advance at every step, allowed at every prefix
        length, and init_beams / beam_step / finalize and beam_search for
        each beam size or beam schedule of `beam_sizes` (ints >= 1, or
        max_length widths each, as `beam_search` takes them; None: none),
        over every item and, for a set with an item index, over a subset
        (and max_subsets stacked subsets). torch compiles nothing here
        (eager ops), so this pays only the first-use costs: torch's, and
        for a set with an item index the first `subset()`'s (the subsets'
        host kernels and the set's bit layout, 0.5-4 s once per process;
        taken here at any max_subsets) and the first `ranked_subset()`'s
        (the set's trie order and range tables); the results of later calls are
        unchanged. Returns a `WarmReport` (compilations 0, the calls made,
        seconds, ...), or with background=True a `concurrent.futures.Future`
        of one at once (run on a thread; the arguments checked first,
        here). Raises DecodeInputError for a batch size that is not an int
        >= 1, a beam size or schedule `beam_search` would refuse,
        max_subsets < 0, or max_subsets > 0 on a set without item subsets
        or past `item_bits.padding.PADDED_SUBSETS_MAX_BYTES` over one subset's
        bytes."""
        return warming.warm(self, batch_sizes, beam_sizes, max_subsets, background)
