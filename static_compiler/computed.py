"""`Computed`: what a `CompiledConstraints` works out on first use
(processors, its set view, an IR read back from its tables), held
apart from the frozen fields that are the set."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from static_compiler.ir import Automaton
from static_compiler.rules.set_view import SetView

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
      (`CompiledConstraints.ir`), or None.
    """

    processors: dict = dataclasses.field(default_factory=dict)
    set_view: Optional[SetView] = None
    removal_specs: Any = NOT_YET
    warmth: object = None
    table_digests: Optional[dict] = None
    ir: Optional[Automaton] = None
