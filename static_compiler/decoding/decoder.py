"""`Decoder`: the verb family every front door speaks (the table is in
docs/README.md), written once over an `Engine`, the device work of one
backend.

=================  ==========================================================
`init_processor`   the processor state of B rows at the root
`mask`             logits float (B, V) -> float32 (B, V), SENTINEL_SCORE
                   where a token is not allowed (or its logit is NaN)
`allowed_tokens`   bool (B, V): the tokens each row may take at a step
`advance`          the processor state after each row's token
`allowed`          prefixes int (N, t) -> bool (N, V), no per-row state
`init_beams`       `BeamState` (B, M) of a search from the root
`beam_step`        one beam-search step: the `BeamState` after it
`finalize`         the `DecodeResult` of a search's state
`beam_search`      a whole search, stepped from Python (`support.beam_loop`)
=================  ==========================================================

and the item rules (`subset`, `ranked_subset`, `prior`, `attributes`,
`fingerprint`) over the door's `rules.set_view.SetView` (whose `base_subset()` every call runs
over when no subset is given: the items updates have not removed). The decoder checks
what needs no array type (batch and beam sizes, widths, the length penalty,
a search's callables), resolves the item subset of a call (the version's
base subset when none is given; after `warm(max_subsets=K)` a stack padded
to K, `item_bits.padding.pad_subsets`), checks priors, and runs the engine inside
its compile count. The engine converts and checks its own arrays (numpy /
jax or torch) and runs the device work. numpy only: the serving binary and
torch-only processes import it.
"""

from __future__ import annotations

import abc
import functools
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset, checked_subset_index
from static_compiler.item_bits.padding import pad_subsets
from static_compiler.rules.priors import check_no_length_penalty, check_prior
from static_compiler.support.arguments import check_finite, check_rows
from static_compiler.support.beam_loop import check_search, run_search

if TYPE_CHECKING:  # (made on demand: a serving process never loads the rank module)
    from static_compiler.item_bits.rank import RankedSubset


class Engine(Protocol):
    """The device work of one backend under a `Decoder`. States, logits,
    tokens and prefixes are the engine's arrays; `live` is the engine's
    form of a call's subset bits (`place_subset`) or None (every item);
    `prior` the engine's form of item priors (`place_prior`) or None."""

    @property
    def max_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def end_token(self) -> Optional[int]: ...

    @property
    def pad_from(self) -> Optional[int]:
        """The fewest stacked subsets padded after `warm(max_subsets=K)`
        (stacks of pad_from <= R < K are decoded as K); None: the engine
        never pads."""

    def pad_to(self) -> Optional[int]:
        """K of the last `warm(max_subsets=K)`, or None."""

    def counting(self) -> ContextManager:
        """A context in which the calling thread's compilations count."""

    def compilations(self) -> int:
        """The compilations counted so far."""

    def place_subset(self, subset, subset_index, batch_size: int, where: str,
                     fingerprint: str) -> Any:
        """The subset bits of a call of batch_size rows, subset_index (None:
        subset 0) picking each row's subset, after checking them."""

    def place_prior(self, prior, where: str) -> Any:
        """A checked `rules.priors.Prior` as the engine reads it."""

    def processor_state(self, state, where: str) -> tuple:
        """(state, B) after checking a processor state."""

    def beam_state(self, state, where: str) -> tuple:
        """(state, B, M) after checking a `BeamState`."""

    def root(self, batch_size: int) -> Any:
        """The processor state of batch_size rows at the root."""

    def mask(self, logits, state, step, live) -> Any: ...

    def allowed_tokens(self, state, step, live) -> Any: ...

    def advance(self, state, tokens, step, live) -> Any: ...

    def prefixes(self, prefixes, where: str) -> tuple:
        """(prefixes, N) after checking them (an engine may take options of
        its own, as the door passes them)."""

    def allowed(self, prefixes, live) -> Any:
        """bool (N, V); an engine with no program of its own replays the
        prefixes through advance (`replay_allowed`)."""

    def init_beams(self, batch_size: int, beam_size: int, start_token) -> Any: ...

    def beam_step(self, state, logits, step, live, width: int, prior, where: str) -> Any: ...

    def searcher(self, beam_size, widths: tuple) -> Callable:
        """step(state, logits, t, live, prior) -> state of a search with
        these widths (checking the options once)."""

    def unfinished(self, state) -> bool:
        """Whether some valid beam of `state` has not ended."""

    def finalize(self, state, length_penalty: float) -> Any: ...

    def host_result(self, result) -> Any:
        """A decoding result as `NameTable.texts` reads it."""


def replay_allowed(engine: Engine, prefixes, live):
    """`allowed` of an engine that has no program for it: the prefixes
    (N, t, checked) replayed through `advance` from the root, then
    `allowed_tokens` at step t (the semantics of
    `backend.decode.prefix.allowed`)."""
    n, t = prefixes.shape
    state = engine.root(n)
    for step in range(t):
        state = engine.advance(state, prefixes[:, step], step, live)
    return engine.allowed_tokens(state, t, live)


class Decoder(abc.ABC):
    """The verbs of a front door over its engine. A door provides
    `_engine` (its `Engine`), `_set_view` (its items' `SetView`) and `names`
    (a text catalogue's `NameTable`, or None). subset / subset_index,
    everywhere: a `Subset` of this set (`subset`, `stack_subsets`) and each
    row's subset, ints (B,) (default: subset 0 for a single subset);
    without a subset, the items this version has not removed."""

    _set_view: Any
    names: Any

    @property
    @abc.abstractmethod
    def _engine(self) -> Engine:
        """The door's engine (each door gives its own)."""

    # Item rules (the door's SetView)

    @property
    def fingerprint(self) -> str:
        """Content hash of the set (its plan and tables, or an artifact's IR
        text) and of the items an update removed (`ItemIndex.removal_tag`):
        subsets and priors of this set carry it."""
        return self._set_view.fingerprint

    @property
    def attributes(self):
        """The items' attribute columns (name -> `items.attributes.Column`,
        one value per input row; an artifact's memory-mapped), or None when
        the set has none."""
        items = self._set_view.items
        return None if items is None else items.attributes

    def subset(self, selection=None, *, where=None, masks=None) -> Subset:
        """The items of this set that `selection` picks, as a `Subset` to
        decode over (the verbs' and `beam_search`'s ``subset=``), with no
        recompile.

        selection: bool (N,) over the input rows (item i is row i of the
        input; duplicate rows are one item), or (a compiled set) token
        sequences (a 2-D int array or a list of sequences), each of which
        must be in the set. Or `where`: a filter expression over the items'
        attributes (``"in_stock and category in ('shoes', 'hats') and not
        seen"``, text or built with `static_compiler.attr`), with `masks`
        the named bool (N,) item masks it reads (``{"seen": mask}``):
        docs/business-rules.md. Needs an item index (an artifact saved with
        export_subsets=True: DecodeInputError otherwise). Raises
        ConstraintSetError for a mask of another shape or dtype, a sequence
        not in the set, and a set whose items share states (minimized,
        graph or IR input); FilterExpressionError for a bad expression
        (naming the position and the attribute)."""
        return self._set_view.pick(selection, where, masks, f"{type(self).__name__}.subset")

    def ranked_subset(self, selection=None, *, where=None, masks=None) -> "RankedSubset":
        """The items of this set that `selection` picks, as a ranked subset
        to decode over with every verb (``subset=``, a `subset_index` per
        batch row for stacked ones): the same results as `subset` of the
        same selection, bit for bit, made in the time of the selection's
        item bits (no pass over the trie's states: about a millisecond at
        1e7 items for a mask over a sorted input, where `subset` walks the
        trie for tens; docs/business-rules.md). Decoding reads, per
        candidate, whether its state has a selected item below it (a range
        count over the bits: `torch_backend.rank_kernels`,
        `backend.decode.ranked`), which costs a step more than `subset`'s
        bits: a subset decoded many times (a named rule) is cheaper per
        step as `subset`.

        selection: bool (N,) over the input rows, or (R, N): R subsets
        stacked, one per batch row through subset_index (`sc.stack_subsets`
        stacks ranked subsets made apart); token sequences where `subset`
        takes them; or `where` / `masks`: a filter as `subset` takes it.
        Removed items are never in it. A `rank.RankedSubset` of this version
        (its fingerprint): another set's or version's is refused when
        decoding (DecodeInputError). Every door decodes over it: the
        compiled set, the torch door, and a served artifact through its
        ``_ranked`` modules (format version 16; an older artifact refuses
        it with DecodeInputError naming ``static-compiler re-export``).
        A set whose input rows are its items in trie order (sorted, no
        duplicates: `frontend.datasets.write_synthetic_shards`'
        in_trie_order) packs a mask or a filter's rows in place, with no
        scatter through the row -> item map.

        Raises as `subset`."""
        where_ = f"{type(self).__name__}.ranked_subset"
        view = self._set_view
        view.checked_items(where_)
        return view.ranked(selection, where, masks, where_)

    def prior(self, column: str, weight: float = 1.0, selection=None, *, where=None,
              masks=None):
        """Item priors (soft constraints) from the float or int attribute
        `column`, for `beam_search(..., prior=...)` / `beam_step`: each item
        ranks by its log-probability plus weight x its value, each prefix by
        its log-probability plus the best of that term over the live items
        below it (an optimistic look-ahead, so an item a rule boosts is not
        pruned early). Live items: those `selection` (bool (N,) over the
        input rows) or the filter `where` (with `masks`) picks, as `subset`
        takes them (default every item), less removed ones; others rank
        after every live one. Computed on the host in O(items + states),
        no recompile. A `rules.priors.Prior`; decoding with it through an
        artifact needs one exported with export_priors=True. Raises
        ConstraintSetError for a set without items (or whose items share
        states), AttributeColumnError for a missing or non-numeric column
        or a value that is not finite, DecodeInputError for a weight that
        is not a finite float (docs/business-rules.md, "Item priors")."""
        return self._set_view.prior(column, weight, selection, where, masks,
                                   f"{type(self).__name__}.prior")

    # A call's subset and prior, as the engine reads them

    def _live(self, subset, subset_index, batch_size: int, where: str):
        """The engine's subset bits for a call of batch_size rows: `subset`
        (or, none given, the version's base subset; None when nothing was
        removed) with each row's subset_index; after `warm(max_subsets=K)`,
        a stack of pad_from <= R < K subsets (the base subset too) padded to K (empty subsets
        appended: one program serves every R; the padded stack kept in the
        subset's `placements`), its index checked against R first."""
        engine = self._engine
        if subset is None:
            if subset_index is not None:
                raise DecodeInputError(f"{where}: subset_index without a subset")
            subset = self._set_view.base_subset()
            if subset is None:
                return None
        if isinstance(subset, Subset) and engine.pad_from is not None:
            pad_to = engine.pad_to()
            if pad_to is not None and engine.pad_from <= subset.num_subsets < pad_to:
                subset_index = checked_subset_index(subset, self.fingerprint, subset_index,
                                                    batch_size, where)
                subset = subset.placements.get(("padded", pad_to),
                                               functools.partial(pad_subsets, subset, pad_to))
        return engine.place_subset(subset, subset_index, batch_size, where, self.fingerprint)

    def _ranking(self, prior, where: str):
        """The engine's form of `prior` (a Prior of this set), or None."""
        if prior is None:
            return None
        check_prior(prior, self.fingerprint, where, f"{type(self).__name__}.prior")
        return self._engine.place_prior(prior, where)

    # The logits-processor verbs

    def init_processor(self, batch_size: int):
        """The processor state of `batch_size` rows: every row at the root,
        valid, not finished."""
        return self._engine.root(check_rows(batch_size)[0])

    def mask(self, logits, state, step, *, subset=None, subset_index=None):
        """logits float (B, V) -> float32 (B, V): the logits of the tokens
        each row of `state` may take at `step` (an int in [0, max_length);
        on the jax doors also an int32 scalar, traced), SENTINEL_SCORE for
        the others and for NaN logits. A model vocabulary wider than V keeps
        its width, the columns >= V SENTINEL_SCORE."""
        engine = self._engine
        with engine.counting():
            state, B = engine.processor_state(state, "mask")
            return engine.mask(logits, state, step, self._live(subset, subset_index, B, "mask"))

    def allowed_tokens(self, state, step, *, subset=None, subset_index=None):
        """bool (B, V): the tokens each row of `state` may take at `step`
        (`mask` of zero logits, kept where not SENTINEL_SCORE): a finished
        row only the end token, an invalid row nothing."""
        return self._allowed_tokens(state, step, subset, subset_index, "allowed_tokens")

    def _allowed_tokens(self, state, step, subset, subset_index, where: str):
        engine = self._engine
        with engine.counting():
            state, B = engine.processor_state(state, where)
            return engine.allowed_tokens(state, step, self._live(subset, subset_index, B, where))

    def advance(self, state, tokens, step, *, subset=None, subset_index=None):
        """Moves each row along its token, ints (B,); a token the row may
        not take makes it invalid. Returns the new processor state."""
        engine = self._engine
        with engine.counting():
            state, B = engine.processor_state(state, "advance")
            return engine.advance(state, tokens, step,
                                  self._live(subset, subset_index, B, "advance"))

    def allowed(self, prefixes, *, subset=None, subset_index=None):
        """prefixes int (N, t), t in [0, max_length) -> bool (N, V): the
        tokens that may follow each prefix, with no per-row state (a
        finished prefix allows the end token, one outside the set
        nothing); subset_index: one subset per prefix row. Raises
        DecodeInputError for a token outside [0, V)."""
        return self._allowed(prefixes, subset, subset_index)

    def _allowed(self, prefixes, subset, subset_index, **options):
        engine = self._engine
        with engine.counting():
            prefixes, n = engine.prefixes(prefixes, "allowed", **options)
            return engine.allowed(prefixes, self._live(subset, subset_index, n, "allowed"))

    # Beam search

    def init_beams(self, batch_size: int, beam_size: int, start_token=0):
        """The `BeamState` (B, M) of a search from the root: only beam 0 of
        each row valid. start_token: the model's input at step 0, an int or
        ints (batch_size,)."""
        B, M = check_rows(batch_size, beam_size)
        engine = self._engine
        with engine.counting():
            return engine.init_beams(B, M, start_token)

    def beam_step(self, state, logits, step, *, subset=None, subset_index=None,
                  beam_size: Optional[int] = None, prior=None):
        """One beam-search step: state (B, M), logits float (B, M, V) for
        `state.last_tokens`, step an int in [0, max_length) (on the jax
        doors also an int32 scalar: a traced step outside that range appends
        nothing, the state comes back unchanged, parent the identity).
        beam_size: the beams the new state keeps (a beam schedule's width at
        this step; None: M). prior: item priors (`prior`), as `beam_search`
        takes them. The new state's ``parent`` (B, beam_size) reorders
        per-beam model state."""
        return self._beam_step(state, logits, step, subset, subset_index, beam_size, prior)

    def _beam_step(self, state, logits, step, subset, subset_index, beam_size, prior,
                   where: str = "beam_step", **options):
        engine = self._engine
        with engine.counting():
            state, B, M = engine.beam_state(state, "beam_step")
            width = M if beam_size is None else check_rows(B, beam_size)[1]
            live = self._live(subset, subset_index, B, "beam_step")
            ranking = self._ranking(prior, "beam_step")
            return engine.beam_step(state, logits, step, live, width, ranking, where, **options)

    def finalize(self, state, length_penalty: float = 0.0):
        """(tokens, scores, valid, lengths) of a search's state, best first.
        Only complete sequences are valid (finalized before the last step,
        unfinished prefixes come back invalid, SENTINEL_SCORE); with a
        length penalty (the GNMT exponent) the beams are re-ranked by
        normalized score, which `scores` then hold."""
        engine = self._engine
        with engine.counting():
            state = engine.beam_state(state, "finalize")[0]
            return engine.finalize(state, check_finite("length_penalty", length_penalty))

    def beam_search(self, logits_fn: Callable, batch_size: int, beam_size: int, *, subset=None,
                    subset_index=None, start_token=0, carry=None,
                    reorder: Optional[Callable] = None, length_penalty: float = 0.0,
                    return_carry: bool = False, prior=None):
        """Constrained beam search stepped from Python: `init_beams`,
        `beam_step` at each step, `finalize`.

        logits_fn: ``(last_tokens (B, M), step int, carry) -> (logits float
        (B, M, V), carry)``. beam_size: an int, or one width per step (a
        beam schedule). reorder: ``fn(carry, parent (B, M)) -> carry``, the
        model state of each beam's parent (needed for a carry when beam_size
        > 1). start_token, length_penalty, subset, subset_index, prior: as
        `static_compiler.beam_search`. With an end token the search stops
        once every valid beam has ended (the result is the same). Its
        compilations count in `compilations()`, the model's own included.
        Returns a `DecodeResult`, or ``(result, carry)`` with return_carry."""
        return self._search(logits_fn, batch_size, beam_size, subset, subset_index, start_token,
                            carry, reorder, length_penalty, return_carry, prior)

    def _search(self, logits_fn, batch_size, beam_size, subset, subset_index, start_token,
                carry, reorder, length_penalty, return_carry, prior, **options):
        engine = self._engine
        with engine.counting():
            B, widths = check_search(logits_fn, batch_size, beam_size, carry, reorder,
                                     engine.max_length)
            step = engine.searcher(beam_size, widths, **options)
            penalty = check_finite("length_penalty", length_penalty)
            live = self._live(subset, subset_index, B, "beam_search")
            ranking = self._ranking(prior, "beam_search")
            check_no_length_penalty(ranking, penalty)
            state, carry = run_search(engine.init_beams(B, widths[0], start_token),
                                      lambda s, logits, t: step(s, logits, t, live, ranking),
                                      logits_fn, max_length=engine.max_length,
                                      vocab_size=engine.vocab_size, end_token=engine.end_token,
                                      carry=carry, reorder=reorder, widths=widths,
                                      unfinished=engine.unfinished)
            result = engine.finalize(state, penalty)
        return (result, carry) if return_carry else result

    # Names and compilations

    def _no_names(self) -> str:
        """texts' message for a set without names."""
        return ("texts: this set has no names (compiled from token ids, not from names with a "
                "tokenizer)")

    def texts(self, result, *, prompt_length: Optional[int] = None) -> list:
        """The names a decoding result of this text catalogue holds (e.g.
        `finalize`'s): lists (batch) of lists (beams) of str, None where a
        beam is invalid; or, for token id rows int (N, T) (Hugging Face
        ``generate``'s output, `prompt_length` prompt tokens in front), one
        name per row, None where a row holds no complete item (see
        `NameTable.texts`). Raises DecodeInputError for a set without names."""
        if self.names is None:
            raise DecodeInputError(self._no_names())
        engine = self._engine
        return self.names.texts(engine.host_result(result), prompt_length=prompt_length,
                                end_token=engine.end_token, max_length=engine.max_length)

    def compilations(self) -> int:
        """The compilations this door's calls ran (warm-ups included)."""
        return self._engine.compilations()
