"""Reading a saved set back as an automaton (`read_automaton`, for
`static-compiler verify` and `show-ir`: numpy tables only, no module is
executed; `read_names` for a text catalogue's names; `read_items` for its item
index), and `load_checked`:
the serving loader after the same check of its tables.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

from static_compiler.artifact.metadata import automaton_from_metadata
from static_compiler.errors import DecodeInputError
from static_compiler.format import snapshot
from static_compiler.format.snapshot_items import read_item_arrays
from static_compiler.ir import Automaton
from static_compiler.items.index import ItemIndex
from static_compiler.items.names import NameTable


def read_automaton(path, *, verify_checksums: bool = True) -> Automaton:
    """Rebuilds the compiled automaton (with its layouts) from an artifact's
    manifest and .npy tables alone, and verifies it (`ir.verify`).

    Raises the artifact format's errors for a damaged artifact, and
    IRVerificationError when the tables do not form a valid automaton."""
    with snapshot.open_snapshot(path, verify_checksums=verify_checksums) as snap:
        return _automaton_of(snap)


def _automaton_of(snap: snapshot.Snapshot) -> Automaton:
    """`read_automaton` of an open snapshot."""
    return automaton_from_metadata(dataclasses.asdict(snap.manifest), snapshot.read_tables(snap),
                                   where=f"artifact {str(snap.path)!r}")


def load_checked(path, *, verify_checksums: bool = True, device=None, mesh=None):
    """`serving.load`, after also checking, on the very files it loads, what
    `read_automaton` checks: the tables form a valid automaton that agrees
    with the manifest (`table_check.check_artifact`, the check behind every
    verify path: a trie's tables a chunk at a time). Checksums only catch
    damage; this also refuses tables edited with their checksums
    recomputed, which could otherwise decode sequences outside the set.

    Raises what `serving.load` raises, and IRVerificationError or
    ArtifactFormatError for tables that are not a valid automaton."""
    from static_compiler import serving
    from static_compiler.artifact.table_check import require_valid

    with serving.open_snapshot(pathlib.Path(path), verify_checksums=verify_checksums) as snap:
        require_valid(snap)
        return serving.load_from(snap, device=device, mesh=mesh)


def read_names(path, *, verify_checksums: bool = True) -> Optional[NameTable]:
    """The artifact's names (a text catalogue's `NameTable`), or None when
    it was compiled from token ids or written before format version 2."""
    with snapshot.open_snapshot(path, verify_checksums=verify_checksums) as snap:
        return snapshot.read_names(snap)


def read_items(snap: snapshot.Snapshot, where: str = "update"):
    """The artifact's `ItemIndex`; DecodeInputError when it was saved without."""
    arrays = read_item_arrays(snap)
    if arrays is None:
        raise DecodeInputError(f"{where}: artifact {str(snap.path)!r} has no item index "
                               "(compile with export_subsets=True to update it)")
    return ItemIndex(num_unique=snap.manifest.num_sequences, **arrays)
