"""The records a `CompiledConstraints` is made of, so that its own public
names stay few: three frozen ones, `Lowered` (the plan, the tables and where
they live), `ExportOptions` (what `save` exports) and `BuildInfo` (how this
version was built), and `Computed`, what it works out on first use
(processors, its set view, an IR read back from its tables), held apart
from the frozen fields that are the set."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from static_compiler.errors import JAX_INSTALL, require
from static_compiler.ir import Automaton
from static_compiler.jax_support import placement as placement_lib
from static_compiler.lowered.plan import Plan, tables_nbytes
from static_compiler.rules.set_view import SetView


@dataclasses.dataclass(frozen=True, eq=False)
class Lowered:
    """The set lowered: the plan and the tables the decoders read, and
    where the tables live.

    `CompiledConstraints.lowered`; what `backend.decode`'s functions take
    (`plan` and `device_tables`, or the host `tables`). A new version that
    keeps the tables (`update` by removal) keeps this record, and with it
    the tables already put on the device.

    Attributes
    ----------
    plan : Plan
        The static decoding plan (hashable).
    tables : tuple of dict of str to numpy.ndarray
        One dict of host arrays per layer (see lowered.tables for names,
        shapes and dtypes).
    placement : MeshPlacement or None
        Where the tables live on a device mesh (`CompiledConstraints.shard`),
        or None for one device.
    device_tables : tuple of dict of str to jax.Array
        Property: `tables` on the device (placed by `placement`), put there
        once.
    nbytes : int
        Property: bytes of all tables the decoder reads.
    """

    plan: Plan
    tables: tuple
    placement: Optional[placement_lib.MeshPlacement] = None
    # the tables on the device once put there: [] before (not a field of the record)
    _on_device: list = dataclasses.field(default_factory=list, init=False, repr=False,
                                         compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of all tables the decoder reads."""
        return tables_nbytes(self.tables)

    @property
    def device_tables(self):
        """The tables as jax arrays on the default device (split or
        replicated by `placement`), put there once."""
        if not self._on_device:
            jax = require("jax", "device_tables (the tables on a jax device)", JAX_INSTALL)
            with jax.ensure_compile_time_eval():  # concrete even when first used under jit
                if self.placement is None:
                    placed = jax.device_put(self.tables)
                else:
                    placed = tuple({name: self.placement.place((t, name), arr)
                                    for name, arr in tabs.items()}
                                   for t, tabs in enumerate(self.tables))
            self._on_device.append(placed)
        return self._on_device[0]

    def bytes_per_device(self) -> int:
        """Bytes of the tables on each device (the largest share: all of
        them on one device, split ones / D after `CompiledConstraints.shard`),
        measured on `device_tables`."""
        import jax
        return sum(max(shard.data.nbytes for shard in arr.addressable_shards)
                   for arr in jax.tree_util.tree_leaves(self.device_tables))


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What `CompiledConstraints.save` exports: the options
    `compile_constraints(export_beam_sizes=..., export_tokens_per_beam=...,
    export_subsets=..., export_priors=...)` was given (checked there), or
    for a set read back by `load`, what its artifact was exported for.

    Attributes
    ----------
    beam_sizes : tuple of int or of int tuples
        Beam sizes `save` exports a beam_step module for, and beam
        schedules (one width per step) it exports the modules of.
    tokens_per_beam : int, tuple or None
        The tokens_per_beam `save` exports beam_step with.
    subsets : bool
        `save` also writes the item index and the modules' subset variants
        (serving restricts per request).
    priors : bool
        `save` also exports the step modules' item-prior variants (serving
        ranks by item priors: `serving.Artifact.prior`).
    """

    beam_sizes: tuple = (70,)
    tokens_per_beam: Optional[int] = None
    subsets: bool = False
    priors: bool = False


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """How a version of a set was built: the passes, the time each stage
    took, what the frontend read and what the `update` that made it did.

    Attributes
    ----------
    pipeline : str
        Canonical spec of the passes that ran (an `update` that compiles
        anew runs them again).
    timings : tuple of (str, float)
        (stage, seconds) pairs: frontend, each pass, lowering, update.
    frontend_stats : dict
        The IR the frontend produced, before the passes: {"states": int,
        "edges": int} (compare with `CompiledConstraints.ir` to see what
        the passes did, e.g. minimize), and for graph input "graph":
        `GraphStats.as_dict()` (graph nodes and edges, unreachable and dead
        nodes dropped, states before and after minimizing), and for a text
        catalogue "text": names, items, duplicates (names merged into
        another name's item because they encode to the same tokens),
        end_token and end_token_from ("argument" or "tokenizer"). Empty
        for a set read back by `load`.
    last_update : dict or None
        What the `update` that made this version did (see
        `CompiledConstraints.update`), or None.
    """

    pipeline: str = ""
    timings: tuple = ()
    frontend_stats: dict = dataclasses.field(default_factory=dict)
    last_update: Optional[dict] = None


NOT_YET = object()
"""`Computed.removal_specs` before the first decode worked them out."""


@dataclasses.dataclass(eq=False)
class Computed:
    """What a `CompiledConstraints` (frozen: its fields are the set) works
    out on first use, held in one explicit object: `shard` and `update`
    hand a new version the parts that stay valid for it.

    processors: batch size -> `StepProcessor` without a subset;
    set_view: the `SetView` (fingerprint, trie, bit layout, base subset), or None;
    removal_specs: batch size -> the removal-aware program's spec, None for a
      set that needs none, NOT_YET before the first decode;
    warmth: the compile counter and subset padding (`warm`), shared by versions;
    table_digests: (layer, name) -> sha256 of a set read back from an
      artifact (its files' checksums), so its fingerprint hashes no table;
    ir: the automaton read back from the tables of a set held in them
      (`CompiledConstraints.ir`), or None;
    rows_in_item_order: what a set read back's manifest records (format
      version 17: whether row i is item i, checked at load), or None.
    """

    processors: dict = dataclasses.field(default_factory=dict)
    set_view: Optional[SetView] = None
    removal_specs: Any = NOT_YET
    warmth: object = None
    table_digests: Optional[dict] = None
    ir: Optional[Automaton] = None
    rows_in_item_order: Optional[bool] = None
