"""Updating a saved artifact in place of a new compile: removals
(`update_removed`, `write_removed`) write a new version whose tables and
modules are hard-linked (or copied) from the version read, with a new
items/removed.npy and manifest, swapped in as `save` does; `read_items` and
`require_current` serve the library's updates too
(`saved.update_artifact`).
"""

from __future__ import annotations

import dataclasses
import pathlib

from static_compiler.artifact import format as fmt
from static_compiler.artifact.lock import lock_file, update_lock
from static_compiler.artifact.snapshot import Snapshot, open_snapshot, read_tables
from static_compiler.artifact.snapshot_items import read_item_arrays
from static_compiler.artifact.history import Made
from static_compiler.artifact.writer import NpyFile, _write_file, _write_then_swap
from static_compiler.errors import ArtifactBusyError, DecodeInputError


def require_current(snap: Snapshot, what: str = "update") -> None:
    """ArtifactBusyError unless `snap.path` still names the version `snap`
    opened. Writers that take `update_lock` never replace it under an
    update; this catches one that does not (an older release, a copy by
    hand) before the update swaps its version over that writer's."""
    if not snap.is_current():
        raise ArtifactBusyError(
            f"{what}: artifact {str(snap.path)!r} was replaced while the update was reading it "
            f"(by a writer that does not take its lock {lock_file(snap.path).name!r}); nothing "
            "was written: try again")


def update_removed(path, remove) -> dict:
    """Writes a new version of the artifact at `path` without the items
    `remove` picks (a bool mask (N,) over the rows it was compiled from, or
    token sequences), atomically and under `update_lock`: the tables and
    modules are hard-linked (or copied) unchanged from the version it read
    (`write_removed`), items/removed.npy and the manifest are new, and the
    directory is swapped in as `save` does, so a reader sees the old version
    or the new one, and a crash leaves the old.

    Returns {"removed", "already_removed", "absent"} (sequences not in the
    set are counted, not an error). Raises ConstraintSetError for rows that
    cannot be sequences of the set (a token outside the vocabulary, the end
    token inside, another length than a fixed-length set's: as additions),
    DecodeInputError for an artifact saved without subsets,
    ArtifactBusyError at once while another writer (a save or an update)
    holds the lock."""
    path = pathlib.Path(path)
    with update_lock(path):
        return write_removed(path, remove)


def read_items(snap: Snapshot, where: str = "update"):
    """The artifact's `ItemIndex`; DecodeInputError when it was saved without."""
    from static_compiler.frontend.items import ItemIndex

    arrays = read_item_arrays(snap)
    if arrays is None:
        raise DecodeInputError(f"{where}: artifact {str(snap.path)!r} has no item index "
                               "(compile with export_subsets=True to update it)")
    return ItemIndex(num_unique=snap.manifest.num_sequences, **arrays)


def table_trie(snap: Snapshot):
    """The `subsets.TableTrie` of an open snapshot's tables (memory-mapped),
    its summary checked against them (`metadata.summary_from_metadata`)."""
    from static_compiler.artifact.metadata import plan_from_metadata, summary_from_metadata
    from static_compiler.live import subsets

    where, metadata = f"artifact {str(snap.path)!r}", dataclasses.asdict(snap.manifest)
    tables = read_tables(snap)
    return subsets.TableTrie.of(plan_from_metadata(metadata, where)[0],
                                summary_from_metadata(metadata, tables, where), tables)


def write_removed(path, remove, keep_versions=None) -> dict:
    """`update_removed`'s work, for a caller that holds `update_lock`.
    The version replaced is kept (`versions`: the last `keep_versions`), the
    new one recorded as an "update" with the returned report.

    The new version is built from the one snapshot read here and nothing
    else: the item index, the tables (to look up sequences, read as a
    `subsets.TableTrie`: the automaton is never rebuilt) and every
    unchanged file come from its open files (`Snapshot.link_into`: a hard
    link to, or copy of, the very file opened), never from the path again,
    so a version swapped in meanwhile cannot mix into it."""
    from static_compiler.live import subsets

    path = pathlib.Path(path)
    with open_snapshot(path) as snap:
        manifest, items = snap.manifest, read_items(snap)
        removed, report = subsets.removal(items, remove, lambda: table_trie(snap))
        rel = fmt.item_file("removed")
        data = NpyFile(removed)  # written and hashed in chunks (1 GB at 1e9)
        files = dict(manifest.files)
        files[rel] = data.entry()
        new = dataclasses.replace(manifest, item_files={**manifest.item_files, "removed": rel},
                                  files=files, format_version=fmt.FORMAT_VERSION)

        def fill(tmp):
            for name in manifest.files:
                if name not in (rel, fmt.MANIFEST_FILE):
                    snap.link_into(name, tmp / name)
            _write_file(tmp, rel, data)
            _write_file(tmp, fmt.MANIFEST_FILE, new.seal())
            require_current(snap)

        _write_then_swap(path, fill, made=Made("update", report, keep_versions))
    return report
