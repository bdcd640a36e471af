"""Updating a saved artifact in place of a new compile
(`update_artifact`, `static_compiler.update_artifact`): the new version is
built from one snapshot read under the artifact's lock, with additions and
removals as `CompiledConstraints.update` makes them (`next_version`).
Removals alone (`update_removed`, `write_removed`) write a new version whose
tables and modules are hard-linked (or copied) from the version read, with
a new items/removed.npy and manifest, swapped in as `save` does;
`require_current` checks that no writer swapped another version in meanwhile.
"""

from __future__ import annotations

import dataclasses
import pathlib

from static_compiler.artifact.history import Made
from static_compiler.artifact.lock import lock_file, update_lock
from static_compiler.artifact.metadata import plan_from_metadata, summary_from_metadata
from static_compiler.artifact.read import read_items
from static_compiler.artifact.writer import NpyFile, _write_file, _write_then_swap, save_locked
from static_compiler.compiler_items import subsets
from static_compiler.errors import ArtifactBusyError, ConstraintSetError
from static_compiler.format import spec as fmt
from static_compiler.format.snapshot import Snapshot, open_snapshot, read_tables
from static_compiler.jax_support import placement as placement_lib
from static_compiler.lifecycle import next_version
from static_compiler.saved import compiled_from_snapshot


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


def table_trie(snap: Snapshot):
    """The `subsets.TableTrie` of an open snapshot's tables (memory-mapped),
    its summary checked against them (`metadata.summary_from_metadata`)."""
    where, metadata = f"artifact {str(snap.path)!r}", dataclasses.asdict(snap.manifest)
    tables = read_tables(snap)
    return subsets.TableTrie.of(plan_from_metadata(metadata, where)[0],
                                summary_from_metadata(metadata, tables, where), tables)


def write_removed(path, remove, keep_versions=None) -> dict:
    """`update_removed`'s work, for a caller that holds `update_lock`.
    The version replaced is kept (`artifact.history`: the last `keep_versions`), the
    new one recorded as an "update" with the returned report.

    The new version is built from the one snapshot read here and nothing
    else: the item index, the tables (to look up sequences, read as a
    `subsets.TableTrie`: the automaton is never rebuilt) and every
    unchanged file come from its open files (`Snapshot.link_into`: a hard
    link to, or copy of, the very file opened), never from the path again,
    so a version swapped in meanwhile cannot mix into it."""
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


def update_artifact(path, *, add=None, remove=None, mesh=None, attributes=None,
                    keep_versions=None) -> dict:
    """Writes a new version of the saved artifact at `path`.

    The new version holds the items `add` lists and not those `remove`
    picks (as `CompiledConstraints.update`); it is written atomically and
    under the artifact's lock (`artifact.update_lock`, which every writer
    of the path takes, `artifact.save` too: while another holds it this
    raises ArtifactBusyError at once; a crash leaves the old version). The
    new version is built from the one version read (a snapshot), never
    from files of one swapped in meanwhile.

    Removals alone hard-link tables and modules (`update_removed`).
    With additions that fit the reserved capacity, the tables are written
    anew at the same shapes and the module files are hard-linked unchanged, so a
    serving process's `reload()` keeps its deserialized modules; additions
    that do not fit export the modules anew (`reload()` then refuses the
    version: load it); for an artifact exported for a mesh that needs
    `mesh` (the same axes and sizes), else DecodeInputError.

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory.
    add : int array (n, L) or sequence of int sequences, optional
        Token sequences to add; with N input rows saved, they become items
        N, N + 1, ... (an item in both `add` and `remove` is removed).
    remove : bool array (N,) or token sequences, optional
        The items to remove: a mask over the artifact's N rows (with
        `add`, one of N + n entries, the n added rows last, is taken too),
        or sequences.
    mesh : jax.sharding.Mesh, optional
        For an artifact exported for a mesh whose additions outgrow its
        capacity: the mesh to export the new modules for.
    attributes : mapping of str to int, float, bool or str array (n,), optional
        For an artifact whose items have attributes: the added rows' value
        of every attribute (as `CompiledConstraints.update`); removals keep
        the columns.
    keep_versions : int, optional
        How many replaced versions to keep (`list_versions`,
        `rollback_artifact`): default $STATIC_COMPILER_KEEP_VERSIONS, else 5.

    Returns
    -------
    dict
        The `last_update` report (see `CompiledConstraints.update`), with
        "modules": "reused" or "exported" ("none" for a tables-only
        artifact, which stays so: `reexport_artifact` adds modules).

    Raises
    ------
    ConstraintSetError
        With neither `add` nor `remove`, and as `CompiledConstraints.update`
        (AttributeColumnError for missing or malformed attributes).
    ArtifactBusyError
        While another writer holds the artifact's lock.
    DecodeInputError
        For an artifact saved without an item index, and when the modules
        must be exported anew for a mesh and `mesh` is missing or differs.
    ArtifactFormatError, ArtifactChecksumError, ArtifactVersionError
        As `load`.
    """
    path = pathlib.Path(path)
    if add is None and remove is None:
        raise ConstraintSetError("update: nothing to do: pass add=... and/or remove=...")
    with update_lock(path):
        if add is None and attributes is None:
            return write_removed(path, remove, keep_versions)
        with open_snapshot(path) as snap:
            old = compiled_from_snapshot(snap)  # the new version builds on `snap` alone
            if old.items is None:  # raises the loader's error: no item index to update
                read_items(snap)
            # additions alone stream into the new files (`next_version.updated`)
            new = next_version.updated(old, add=add, remove=remove, attributes=attributes,
                                       streamed=remove is None)
            reuse = snap if new.plan == old.plan else None
            record = snap.manifest.mesh
            if reuse is None and record is not None:  # export anew for the same mesh
                where = placement_lib.placement_for(record, mesh, f"update: artifact "
                                                    f"{str(path)!r} (the additions outgrew its "
                                                    "capacity)")
                new = new.shard(mesh, where.axis, where.min_bytes)
            require_current(snap)  # a writer that skips the lock swapped nothing in
            tables_only = not snap.manifest.modules  # (saved without jax: stays so)
            report = dict(new.build.last_update, modules="none" if tables_only else
                          "reused" if reuse else "exported")
            save_locked(new, path, overwrite=True, reuse_modules=reuse,
                        modules=not tables_only, made=Made("update", report, keep_versions))
        return report
