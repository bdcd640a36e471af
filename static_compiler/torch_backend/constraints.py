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

import numpy as np
import torch

from static_compiler.artifact import format as artifact_format
from static_compiler.artifact import snapshot, snapshot_items
from static_compiler.artifact.manifest import Manifest
from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset, checked_subset_index
from static_compiler.items.attributes import ItemAttributes
from static_compiler.items.index import ItemIndex
from static_compiler.rules.priors import check_no_length_penalty, check_prior
from static_compiler.rules.set_view import SetView
from static_compiler.support import arguments
from static_compiler.support.beam_loop import check_search, run_search
from static_compiler.support.decode_types import SENTINEL_SCORE, BeamState, DecodeResult, WarmReport
from static_compiler.support.deprecation import warn_deprecated
from static_compiler.target.plan import Plan, PlanFacts, live_beam_bounds, prior_offsets
from static_compiler.torch_backend import beam, checks, ops
from static_compiler.torch_backend import warm as warming
from static_compiler.torch_backend.kernels import LiveBits
from static_compiler.torch_backend.ops import TorchState
from static_compiler.torch_backend.tables import TorchPlan, torch_plan, torch_tables


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


class TorchConstraints(PlanFacts):
    """A compiled set's plan and tables as torch tensors, with the decoding
    operations as torch ops (no jax at call time).

    Build it with `load` (a saved artifact, read with numpy only) or
    `from_compiled` (a `CompiledConstraints`). Every operation is
    vectorized over the rows at a static step (a Python int), reads no
    tensor value back to the host and branches on none, so it runs under
    ``torch.compile(fullgraph=True)`` (pass subsets as `live_bits` with a
    tensor subset_index there; a `Subset` with a numpy index is checked on
    the host).

    Attributes
    ----------
    plan : TorchPlan
        The static plan (vocab_size, steps, end_token).
    tables : tuple of dict of str to torch.Tensor
        One dict per layer, int32 (bool ``accepting``), on `device`.
    device : torch.device
    fingerprint : str
        The set's fingerprint: subsets must carry it.
    base_subset : Subset or None
        All items but those an update removed (None if none was): what
        every call decodes over when no subset is given.
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
        self.tables = tables
        self.device = checks.check_device(device, "TorchConstraints")
        self.set_view = set_view  # (subsets, fingerprint, base subset: numpy, on the host)
        base = set_view.base_subset()
        self._base_bits = None if base is None else live_bits(base, self.device)

    @property
    def fingerprint(self) -> str:
        return self.set_view.fingerprint

    @property
    def base_subset(self) -> Optional[Subset]:
        return self.set_view.base_subset()

    @property
    def attributes(self) -> Optional[ItemAttributes]:
        """The items' attribute columns (name -> `items.attributes.Column`,
        one value per input row; an artifact's memory-mapped), or None."""
        items = self.set_view.items
        return None if items is None else items.attributes

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
        trie) the new one shares (`reload`)."""
        manifest = snap.manifest
        host = snapshot.read_tables(snap)  # (memory-mapped: read where used)
        arrays = snapshot_items.read_item_arrays(snap)
        names = snapshot.read_names(snap)
        items = None if arrays is None else ItemIndex(num_unique=manifest.num_sequences, **arrays)
        built = same.set_view if same is not None and same.set_view.tables else None
        view = SetView.of_artifact(manifest, host, items,
                                   manifest.files[artifact_format.IR_FILE].sha256,
                                   source=f"artifact {str(path)!r}", missing=DecodeInputError,
                                   built=built)
        tables = same.tables if same is not None else torch_tables(host, device)
        loaded = cls(torch_plan(view.facts), tables, view, device=device, names=names)
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
        view = getattr(compiled, "set_view", None)  # (this layer never imports the compiler)
        if isinstance(compiled, TorchConstraints) or not isinstance(view, SetView) or \
                not isinstance(getattr(compiled, "plan", None), Plan):
            raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected the "
                                   "CompiledConstraints of sc.compile_constraints")
        device = checks.check_device(device, "TorchConstraints.from_compiled")
        # (the view is shared: one trie, layout and base subset)
        return cls(torch_plan(view.facts), torch_tables(compiled.tables, device), view,
                   device=device, names=compiled.names)

    # Item subsets

    def subset(self, selection=None, *, where=None, masks=None) -> Subset:
        """The items `selection` picks (bool (N,) over the input rows; for a
        compiled set also token sequences), as a `Subset` for the `subset=`
        arguments.
        Or `where`: a filter expression over the items' attributes
        (``"in_stock and category in ('shoes', 'hats') and not seen"``,
        text or built with `static_compiler.attr`), with `masks` the named
        bool (N,) item masks it reads (``{"seen": mask}``): docs/business-rules.md.
        Needs an item index (``export_subsets=True`` for an artifact);
        raises DecodeInputError otherwise (ConstraintSetError for a compiled
        set), FilterExpressionError for a bad expression."""
        return self.set_view.pick(selection, where, masks, "TorchConstraints.subset")

    def prior(self, column: str, weight: float = 1.0, selection=None, *, where=None,
              masks=None):
        """Item priors from the float or int attribute `column`, for
        `beam_search(..., prior=...)`: `CompiledConstraints.prior`'s (the
        same `rules.priors.Prior`, computed on the host with numpy)."""
        return self.set_view.prior(column, weight, selection, where, masks,
                                   "TorchConstraints.prior")

    def prior_best(self, prior, where: str) -> Optional[torch.Tensor]:
        """float32 (S,) on this backend's device: the best weighted prior
        below each state of `prior` (a Prior of this set), placed once; None
        for None. Raises DecodeInputError for another set's prior."""
        if prior is None:
            return None
        check_prior(prior, self.fingerprint, where, "TorchConstraints.prior")
        return prior.placements.get(("torch", str(self.device)),
                                    lambda: torch.from_numpy(prior.best).to(self.device))

    def subset_bits(self, subset, subset_index, n: int, where: str):
        """The subset bits a call of n rows reads: (LiveBits, rows int64
        (n,)) each row's subset, or None (every item of the set). subset: a
        `Subset` of this set or its `live_bits`, or None (the set's live
        items); subset_index: ints (n,) (a tensor stays on the device), or
        None (subset 0 for every row). Raises DecodeInputError for a subset
        of another set or an index of the wrong shape, naming `where`."""
        if subset is None:
            if subset_index is not None:
                raise DecodeInputError(f"{where}: subset_index without a subset")
            if self._base_bits is None:
                return None
            return self._base_bits, torch.zeros(n, dtype=torch.int64, device=self.device)
        if isinstance(subset, LiveBits):
            if not isinstance(subset_index, torch.Tensor):
                raise DecodeInputError(f"{where}: with live bits, pass subset_index as an int "
                                       f"tensor ({n},)")
            checks.check_subset_rows(subset_index, n, where)
            return subset, subset_index.to(self.device, torch.int64)
        if isinstance(subset_index, torch.Tensor):
            checks.check_subset_rows(subset_index, n, where)
            # the subset's set is checked; the index's values stay on the device
            checked_subset_index(subset, self.fingerprint, np.zeros(n, np.int32), n, where)
            return live_bits(subset, self.device), subset_index.to(self.device, torch.int64)
        index = checked_subset_index(subset, self.fingerprint, subset_index, n, where)
        return (live_bits(subset, self.device),
                torch.from_numpy(np.asarray(index, np.int64)).to(self.device))

    # Operations: the verbs of every front door (docs/README.md)

    def init_processor(self, batch_size: int) -> TorchState:
        """`TorchState` of `batch_size` rows at the root (int64 node, bool
        valid, bool finished, each (batch_size,)) on this set's device."""
        return ops.init_state(arguments.check_rows(batch_size)[0], self.device)

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
            return self._allowed_at(logits, old_step, subset, subset_index, "mask")
        allowed = self._allowed_at(state, step, subset, subset_index, "mask")
        x = checks.check_logits(logits, tuple(allowed.shape[:1]), self.vocab_size,
                                f"mask(step={step})").to(self.device).float()
        return checks.padded_columns(torch.where(allowed & ~torch.isnan(x), x, SENTINEL_SCORE),
                                     logits.shape[-1])

    def allowed_tokens(self, state: TorchState, step: int, *, subset=None,
                       subset_index=None) -> torch.Tensor:
        """bool (B, V): the tokens each row of `state` may take at `step`
        (an int in [0, max_length)): a finished row only the end token, an
        invalid row nothing. subset: a `Subset` of this set (or its
        `live_bits`), subset_index ints (B,) one subset per row (default:
        subset 0 for a single subset); without one, the set's live items."""
        return self._allowed_at(state, step, subset, subset_index, "allowed_tokens")

    def _allowed_at(self, state, step, subset, subset_index, where: str) -> torch.Tensor:
        step = checks.check_step(step, self.max_length, where)
        state = checks.check_state(state, where)
        sub = self.subset_bits(subset, subset_index, state[0].shape[0], where)
        return ops.mask_at(self.plan, self.tables, state, step, sub)

    def advance(self, state: TorchState, tokens, step: int, *, subset=None,
                subset_index=None) -> TorchState:
        """Moves each row along its token, ints (B,); a token the row does
        not allow (see `mask`) makes the row invalid. Returns the new
        `TorchState`."""
        step = checks.check_step(step, self.max_length, "advance")
        state = checks.check_state(state, "advance")
        B = state[0].shape[0]
        tokens = checks.as_tensor("tokens", tokens, self.device, f"advance(step={step})")
        checks.check_tokens(tokens, B, f"advance(step={step})")
        sub = self.subset_bits(subset, subset_index, B, "advance")
        return ops.advance_at(self.plan, self.tables, state, tokens, step, sub)

    def allowed(self, prefixes, *, subset=None, subset_index=None,
                check_values: bool = True) -> torch.Tensor:
        """prefixes int (N, t), t in [0, max_length) -> bool (N, V): the
        tokens that may follow each prefix, with no per-row state (the
        semantics of `static_compiler.backend.decode.prefix.allowed`:
        finished prefixes allow the end token, unknown ones nothing).
        check_values: raise DecodeInputError for a token outside [0, V)
        (reads the prefixes back to the host; skipped under torch.compile);
        False: such a row allows nothing."""
        prefixes = checks.as_tensor("prefixes", prefixes, self.device, "allowed")
        checks.check_prefixes(prefixes, self.max_length, "allowed")
        if check_values and not torch.compiler.is_compiling():
            checks.check_token_values("prefixes", prefixes, self.vocab_size, "allowed")
        sub = self.subset_bits(subset, subset_index, prefixes.shape[0], "allowed")
        if prefixes.shape[0] == 0:
            return torch.zeros((0, self.vocab_size), dtype=torch.bool, device=self.device)
        return ops.prefix_mask(self.plan, self.tables, prefixes, sub)

    # Beam search

    def init_beams(self, batch_size: int, beam_size: int, start_token=0) -> BeamState:
        """The `BeamState` (torch tensors, int64 ints) of a search from the
        root: beam 0 of each of batch_size rows valid. start_token: the
        model's input at step 0, an int or ints (batch_size,)."""
        B, M = arguments.check_rows(batch_size, beam_size)
        if arguments.is_int(start_token) and -2 ** 31 <= start_token < 2 ** 31:
            start = torch.full((B,), int(start_token), dtype=torch.int64, device=self.device)
        else:  # checked with numpy (not traceable: pass an int under torch.compile)
            start = torch.from_numpy(arguments.check_start_tokens(start_token, B, "init_beams")
                                     .astype(np.int64)).to(self.device)
        return beam.init_beams(self.plan, B, M, start)

    def beam_step(self, state: BeamState, logits: torch.Tensor, step: int, *,
                  tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
                  subset=None, subset_index=None, beam_size: Optional[int] = None,
                  prior=None) -> BeamState:
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
        `beam_search` takes them. Returns the new `BeamState`; its
        ``parent`` int64 (B, beam_size) reorders per-beam model state."""
        step = checks.check_step(step, self.max_length, "beam_step")
        state = checks.check_beam_state(state, self.max_length, "beam_step")
        B, M = state.node.shape
        logits = checks.check_logits(logits, (B, M), self.vocab_size, f"beam_step (step {step})")
        cap = arguments.check_int("tokens_per_beam", tokens_per_beam, low=1, allow_none=True)
        live = arguments.check_int("live_beams", live_beams, low=1, allow_none=True)
        width = M if beam_size is None else arguments.check_rows(B, beam_size)[1]
        sub = self.subset_bits(subset, subset_index, B, "beam_step")
        best = self.prior_best(prior, "beam_step")
        ranking = None if best is None else beam.PriorTerms(best, prior_offsets(self.plan))
        return beam.beam_step(self.plan, self.tables, state, logits.to(self.device), step, cap,
                              live, sub, width, ranking)

    def finalize(self, state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
        """The `DecodeResult` of a search's state: only complete sequences
        valid (finalized before the last step, unfinished prefixes come back
        invalid); with a length penalty (the GNMT exponent) the beams
        re-ranked by normalized score."""
        state = checks.check_beam_state(state, self.max_length, "finalize")
        penalty = arguments.check_finite("length_penalty", length_penalty)
        return beam.finalize(beam.completed(state, self.plan.depth), penalty)

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
        B, widths = check_search(logits_fn, batch_size, beam_size, carry, reorder,
                                 self.max_length)
        caps = arguments.check_tokens_per_beam(tokens_per_beam, self.max_length)
        length_penalty = arguments.check_finite("length_penalty", length_penalty)
        sub = self.subset_bits(subset, subset_index, B, "beam_search")
        best = self.prior_best(prior, "beam_search")
        check_no_length_penalty(best, length_penalty)
        bounds = live_beam_bounds(self.plan, widths, caps)
        advance = beam.compiled_steps(self) if compile else \
            (lambda *args: beam.beam_step(self.plan, self.tables, *args))
        ranking = None if best is None else beam.PriorTerms(best, prior_offsets(self.plan))

        def step_fn(state, logits, step):
            logits = checks.check_logits(logits, tuple(state.node.shape), self.vocab_size,
                                         f"beam_search (step {step})")
            return advance(state, logits.to(self.device), step, caps[step], bounds[step], sub,
                           widths[step + 1], ranking)

        state, carry = run_search(self.init_beams(B, widths[0], start_token), step_fn,
                                  logits_fn, max_length=self.max_length,
                                  vocab_size=self.vocab_size, end_token=self.end_token,
                                  carry=carry, reorder=reorder, widths=widths)
        result = beam.finalize(state, length_penalty)
        return (result, carry) if return_carry else result


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
        taken here at any max_subsets); the results of later calls are
        unchanged. Returns a `WarmReport` (compilations 0, the calls made,
        seconds, ...), or with background=True a `concurrent.futures.Future`
        of one at once (run on a thread; the arguments checked first,
        here). Raises DecodeInputError for a batch size that is not an int
        >= 1, a beam size or schedule `beam_search` would refuse,
        max_subsets < 0, or max_subsets > 0 on a set without item subsets
        or past `item_bits.padding.PADDED_SUBSETS_MAX_BYTES` over one subset's
        bytes."""
        return warming.warm(self, batch_sizes, beam_sizes, max_subsets, background)

    def compilations(self) -> int:
        """Always 0: this backend's ops are eager torch ops, which trace and
        compile no program per shape (jax's front doors count their XLA
        compilations here); a caller's own ``torch.compile`` around them
        is counted by dynamo, not here."""
        return 0

    def texts(self, result, *, prompt_length: Optional[int] = None) -> list:
        """The names a decoding result of this text catalogue holds (e.g.
        `beam_search`'s, tensors on any device): lists (batch) of lists
        (beams) of str, None where a beam is invalid; or one name per row
        of token ids (N, T) (``generate``'s output, `prompt_length` prompt
        tokens in front), None where a row holds no complete item
        (`NameTable.texts`). Raises DecodeInputError for a set compiled
        from token ids."""
        if self.names is None:
            raise DecodeInputError("texts: this set has no names (compiled from token ids, "
                                   "not from names with a tokenizer)")
        if isinstance(result, tuple) and len(result) == len(DecodeResult._fields):
            host = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x
            result = DecodeResult(*(host(x) for x in result))
        return self.names.texts(result, prompt_length=prompt_length, end_token=self.end_token,
                                max_length=self.max_length)
