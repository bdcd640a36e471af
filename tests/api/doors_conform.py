"""The front doors against the contract, checked by the type checker: mypy
(pyproject's [tool.mypy] files, scripts/lint.sh in CI) fails here if a door
class stops being a `contract.FrontDoor` (a verb missing, a parameter
renamed, moved, given another default or a narrower type, another result
type). `tests/api/test_verbs.py` runs `front_doors` on the loaded doors and
checks that this file stays in mypy's list."""

from __future__ import annotations

from static_compiler.compiled import CompiledConstraints
from static_compiler.contract import Decoding, FrontDoor, ItemRules
from static_compiler.serving import Artifact
from static_compiler.torch_backend.constraints import TorchConstraints


def front_doors(compiled: CompiledConstraints, artifact: Artifact,
                torch: TorchConstraints) -> list[FrontDoor]:
    """The three doors, each assignable to the contract (the assignment is
    the check)."""
    decoding: list[Decoding] = [compiled, artifact, torch]
    items: list[ItemRules] = [compiled, artifact, torch]
    assert len(decoding) == len(items)
    return [compiled, artifact, torch]
