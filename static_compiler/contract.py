"""The verb family every front door speaks, declared in code: the source of
truth for docs/README.md's verb table.

A front door is one way to decode a set: the compiled set
(`CompiledConstraints`), the served artifact (`serving.Artifact`)
and the torch backend (`torch_backend.TorchConstraints`) today. Each is
structurally a `FrontDoor`: `Decoding` (the processor pair, `allowed`, the
beam verbs, `beam_search`, `texts`, `warm`, `compilations`) and
`ItemRules` (per-request item subsets and priors over the set's items and
attributes). A door may add keyword-only options of its own, with
defaults (the compiled set's `tokens_per_beam`, torch's `live_beams`);
the parameters below are those every door has, with these names, kinds
and defaults. `tests/api/test_verbs.py` checks each door against these
classes at run time and the type checker (mypy, `tests/api/doors_conform.py`)
statically.

Arrays are the door's own: numpy or jax arrays on the JAX doors, torch
tensors on the torch backend, hence `Any`. Standard library only (the
types named below are imported for the type checker alone), so a serving
binary or a torch-only process imports it as it is.
"""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union, runtime_checkable

from static_compiler.support.decode_types import BeamState, DecodeResult, ProcessorState, WarmReport

if TYPE_CHECKING:
    from static_compiler.item_bits.liveness import Subset

__all__ = ["Decoding", "FrontDoor", "ItemRules", "members"]


@runtime_checkable
class Decoding(Protocol):
    """The decoding verbs (docs/README.md's table, in its order)."""

    @property
    def vocab_size(self) -> int:
        """V: tokens 0..V-1."""

    @property
    def max_length(self) -> int:
        """T: tokens per sequence, the end token included where there is one."""

    @property
    def end_token(self) -> Optional[int]:
        """The token that ends a sequence, or None (fixed-length sets)."""

    def init_processor(self, batch_size: int) -> ProcessorState:
        """The processor state of `batch_size` rows at the root."""

    def mask(self, logits: Any, state: ProcessorState, step: Any, *,
             subset: Optional[Subset] = None, subset_index: Any = None) -> Any:
        """float32 (B, V) logits, SENTINEL_SCORE where a token is not allowed."""

    def allowed_tokens(self, state: ProcessorState, step: Any, *,
                       subset: Optional[Subset] = None, subset_index: Any = None) -> Any:
        """bool (B, V): the tokens each row may take at `step`."""

    def advance(self, state: ProcessorState, tokens: Any, step: Any, *,
                subset: Optional[Subset] = None, subset_index: Any = None) -> ProcessorState:
        """The state after each row took its token of `tokens` (B,)."""

    def allowed(self, prefixes: Any, *, subset: Optional[Subset] = None,
                subset_index: Any = None) -> Any:
        """bool (N, V): the tokens allowed after each prefix (N, t), no state."""

    def init_beams(self, batch_size: int, beam_size: int, start_token: Any = 0) -> BeamState:
        """The beam state of `batch_size` rows, `beam_size` beams, before step 0."""

    def beam_step(self, state: BeamState, logits: Any, step: Any, *,
                  subset: Optional[Subset] = None, subset_index: Any = None,
                  beam_size: Optional[int] = None, prior: Any = None) -> BeamState:
        """One constrained beam step over (B, M, V) logits."""

    def finalize(self, state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
        """The complete sequences of `state`, best first."""

    def beam_search(self, logits_fn: Any, batch_size: int, beam_size: Any, *,
                    subset: Optional[Subset] = None, subset_index: Any = None) -> Any:
        """A whole constrained search (`DecodeResult`, or with its carry)."""

    def texts(self, result: Any, *, prompt_length: Optional[int] = None) -> list:
        """The names a decoding result holds (a text catalogue)."""

    def warm(self, batch_sizes: Any, *, beam_sizes: Any = None, max_subsets: int = 0,
             background: bool = False) -> Union[WarmReport, Future[WarmReport]]:
        """Runs every request path once per shape before traffic: a
        `WarmReport`, or in the background a Future of one."""

    def compilations(self) -> int:
        """XLA compilations this door's calls ran (0 on torch)."""


@runtime_checkable
class ItemRules(Protocol):
    """The item verbs: which set this is, its names and attributes, and the
    per-request subsets and priors over its items."""

    @property
    def fingerprint(self) -> str:
        """The set's hash (a subset or prior of another set is refused)."""

    @property
    def names(self) -> Any:
        """The set's `NameTable` (a text catalogue), or None."""

    @property
    def attributes(self) -> Any:
        """The items' attribute columns (`ItemAttributes`), or None."""

    def subset(self, selection: Any = None, *, where: Optional[str] = None,
               masks: Any = None) -> Subset:
        """A `Subset` of this set's items: a mask, sequences or a filter."""

    def ranked_subset(self, selection: Any = None, *, where: Optional[str] = None,
                      masks: Any = None) -> Any:
        """What `subset` takes, as a `rank.RankedSubset`: its item bits alone."""

    def prior(self, column: str, weight: float = 1.0, selection: Any = None, *,
              where: Optional[str] = None, masks: Any = None) -> Any:
        """An item prior from an attribute column, for `beam_step` / `beam_search`."""


@runtime_checkable
class FrontDoor(Decoding, ItemRules, Protocol):
    """Both: what every front door is."""


def members(protocol: type) -> dict:
    """name -> `inspect.Signature` of each method of `protocol` (without
    self), or None for an attribute (a read-only property): the contract a
    door is checked against, in declaration order."""
    out: dict = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls is Protocol:
            continue
        for name, value in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                out[name] = None
            elif callable(value):
                sig = inspect.signature(value)
                out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out
