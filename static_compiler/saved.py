"""The artifact round trip of the library: `load` reads a saved
artifact back into a `CompiledConstraints`, `update_artifact` writes a new
version of it (additions and removals) in place."""

from __future__ import annotations

import dataclasses

from static_compiler.compiled import CompiledConstraints
from static_compiler.errors import ConstraintSetError
from static_compiler.live.liveness import warm_kernels_in_background
from static_compiler.support import placement as placement_lib


def load(path, *, verify_checksums: bool = True,
                  check_automaton: bool = False) -> CompiledConstraints:
    """The compiled set a saved artifact holds.

    Read from its manifest and tables (numpy, memory-mapped; no module is
    run): plan, tables, pipeline, export options, names and item index as
    saved, and the manifest's summary of the automaton (counts, branch
    histograms, layouts: `metadata.summary_from_metadata`), checked against
    the tables a chunk at a time. The automaton itself is never rebuilt:
    subsets, removals, additions, `show-ir` and a new save read the tables
    (as for a set built from `Shards`), so a set of 1e9 items loads in
    bounded memory. `ir` reads it back when asked for. For updating a saved
    set in the library (`update_artifact`).

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory (`CompiledConstraints.save`).
    verify_checksums : bool
        Check every file against the manifest's checksums.
    check_automaton : bool
        Also check that the tables form a valid automaton that agrees with
        the manifest, refusing tables edited with their checksums
        recomputed: the check behind every verify path
        (`artifact.table_check.check_artifact`, as `static-compiler verify`
        and the serving loader's `load_checked` run it: a trie's tables a
        chunk at a time, bounded memory; a minimized set rebuilt whole and
        verified). The automaton is not kept: `ir` reads it back when asked.

    Returns
    -------
    CompiledConstraints
        The saved set, tables as numpy arrays (one dict per layer), one
        device (no `placement`), `export_subsets` set when the artifact
        holds an item index.

    Raises
    ------
    ArtifactFormatError
        For a missing or malformed artifact (manifest, plan, files).
    IRVerificationError
        With check_automaton, when its tables do not form a valid automaton
        (naming the layer and state) or accept another number of sequences
        than the manifest records.
    ArtifactChecksumError
        For a file whose checksum differs from the manifest's.
    ArtifactVersionError
        For an artifact of an unsupported format version.
    """
    from static_compiler.artifact import snapshot
    from static_compiler.artifact.format import artifact_path
    from static_compiler.artifact.table_check import require_valid

    with snapshot.open_snapshot(artifact_path(path, "load"),
                                verify_checksums=verify_checksums) as snap:
        if check_automaton:
            require_valid(snap)
        return _compiled_from_snapshot(snap)


def _compiled_from_snapshot(snap) -> CompiledConstraints:
    """`load` of an open `artifact.snapshot.Snapshot` (every array
    read from its open files)."""
    from static_compiler.artifact import snapshot
    from static_compiler.artifact.metadata import export_options, plan_from_metadata, summary_from_metadata
    from static_compiler.artifact.update import read_items

    manifest = snap.manifest
    where, metadata = f"artifact {str(snap.path)!r}", dataclasses.asdict(manifest)
    plan, _ = plan_from_metadata(metadata, where)
    tables = tuple(snapshot.read_tables(snap))
    summary = summary_from_metadata(metadata, tables, where)
    items = None if manifest.item_files is None else read_items(snap)
    if items is not None:  # (numba's start-up, off the first subset's path)
        warm_kernels_in_background()
    names = snapshot.read_names(snap)
    compiled = CompiledConstraints(
        summary=summary, plan=plan, tables=tables, pipeline=manifest.pipeline, names=names,
        items=items, export_subsets=items is not None, **export_options(manifest))
    # the tables' file checksums are their digests (`subsets.set_fingerprint`):
    # its fingerprint then reads no table
    compiled.computed.table_digests = {
        (entry.layer, entry.name): manifest.files[entry.file].sha256
        for entry in manifest.tables if entry.file in manifest.files and
        tuple(entry.shape) == tuple(getattr(tables[entry.layer].get(entry.name), "shape", ()))}
    return compiled


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

    Removals alone hard-link tables and modules (`artifact.update_removed`).
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
    import pathlib

    from static_compiler.artifact import snapshot
    from static_compiler.artifact.lock import update_lock
    from static_compiler.artifact.update import read_items, require_current, write_removed
    from static_compiler.artifact.history import Made
    from static_compiler.artifact.writer import save_locked
    from static_compiler.live import versions

    path = pathlib.Path(path)
    if add is None and remove is None:
        raise ConstraintSetError("update: nothing to do: pass add=... and/or remove=...")
    with update_lock(path):
        if add is None and attributes is None:
            return write_removed(path, remove, keep_versions)
        with snapshot.open_snapshot(path) as snap:
            old = _compiled_from_snapshot(snap)  # the new version builds on `snap` alone
            if old.items is None:  # raises the loader's error: no item index to update
                read_items(snap)
            # additions alone stream into the new files (`versions.updated`)
            new = versions.updated(old, add=add, remove=remove, attributes=attributes,
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
            report = dict(new.last_update, modules="none" if tables_only else
                          "reused" if reuse else "exported")
            save_locked(new, path, overwrite=True, reuse_modules=reuse,
                        modules=not tables_only, made=Made("update", report, keep_versions))
        return report


def upgrade_artifact(path, *, mesh=None) -> dict:
    """Rewrites an artifact of an older format version into the current one.

    Atomically and under the artifact's writers' lock
    (`static_compiler.artifact.upgrade`): an artifact whose only old parts
    are manifest keys, branch histograms or its item index keeps its
    tables and modules (hard-linked; a serving `reload()` picks the new
    version up); one whose modules take an older table or bit layout is
    read back and its modules are exported anew.

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory.
    mesh : jax.sharding.Mesh, optional
        For an artifact exported for a mesh whose modules must be exported
        anew: the mesh (the same axes and sizes) to export them for.

    Returns
    -------
    dict
        {"path", "from_version", "to_version", "branches" (the COMPAT rows
        it needed), "upgraded" (False: it was current, nothing written),
        "modules": "kept" or "exported"}.

    Raises
    ------
    ArtifactFormatError, ArtifactChecksumError
        For a missing or damaged artifact (nothing is written).
    ArtifactVersionError
        For a version outside the window (too new: written by a newer
        release; too old: upgrade it with an older release first).
    ArtifactBusyError
        While another writer holds the artifact's lock.
    DecodeInputError
        For a mesh artifact whose modules are exported anew without `mesh`.
    """
    from static_compiler.artifact import upgrade
    return upgrade.upgrade(path, read_back=_compiled_from_snapshot, mesh=mesh)


def reexport_artifact(path, *, mesh=None, beam_sizes=None) -> dict:
    """Exports an artifact's modules anew with the running jax, keeping its tables.

    For an artifact whose modules another JAX exported and this one cannot
    read (`serving.load` raises ArtifactVersionError naming both versions),
    or whose export date nears the end of jax.export's six-month window
    (`serving.load` warns with ArtifactExpiryWarning). Atomically and under
    the artifact's writers' lock (`static_compiler.artifact.upgrade.reexport`):
    the set is read back from its tables and its modules exported for the
    same beam sizes, caps, subsets and mesh; the tables, items, names and IR
    dump are hard-linked unchanged, so a serving `reload()` reads the new
    modules beside the tables it holds. An artifact of an older format
    version is upgraded on the way (its tables written in the current shape).
    A tables-only artifact (saved without jax, or with save(modules=False):
    format version 11) gets its modules here: those its manifest's export
    plan records (format version 15: the export_beam_sizes, beam schedules,
    export_tokens_per_beam and export_priors of the set saved), as a save
    with modules would have exported them, or for `beam_sizes`; the
    manifest then lists what was exported (beam sizes, schedules, priors).

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory.
    mesh : jax.sharding.Mesh, optional
        For an artifact exported for a mesh: the mesh (the same axes and
        sizes) to export its modules for.
    beam_sizes : tuple of int or of int tuples, optional
        For a tables-only artifact, the beam sizes and beam schedules (one
        width per step) to export modules for, in place of those its export
        plan records (default: the plan's; (70,), as `compile_constraints`,
        for one saved before format version 15, which records none); an
        artifact with modules keeps its own (DecodeInputError when given).

    Returns
    -------
    dict
        {"path", "from_jax", "from_jaxlib", "from_exported_at" (None when
        not recorded), "jax", "jaxlib", "exported_at" (the new modules'),
        "upgraded" (whether the format version changed too), "from_version",
        "to_version", "tables_only" (whether it had no modules)}.

    Raises
    ------
    ArtifactFormatError, ArtifactChecksumError
        For a missing or damaged artifact (nothing is written).
    ArtifactVersionError
        For a format version outside the window.
    ArtifactBusyError
        While another writer holds the artifact's lock.
    DecodeInputError
        For an artifact exported for a mesh without `mesh` (or with a mesh
        of other axes or sizes).
    """
    from static_compiler.artifact import upgrade
    return upgrade.reexport(path, read_back=_compiled_from_snapshot, mesh=mesh,
                            beam_sizes=beam_sizes)


def list_versions(path) -> list[dict]:
    """The versions of a saved artifact: the current one, then those kept.

    Every writer that replaces the artifact at `path` (a save with
    overwrite, `update_artifact`, `upgrade_artifact`, `reexport_artifact`,
    `rollback_artifact`) keeps the version it replaced in the hidden
    directory `.NAME.versions/` beside it (`artifact.versions`): the last 5,
    or $STATIC_COMPILER_KEEP_VERSIONS, or a call's `keep_versions`.

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory.

    Returns
    -------
    list of dict
        Newest first (the current version, then the kept ones), each
        {"id" (int, growing with every version written), "when" (UTC ISO
        time it was written), "sha256" (of its manifest.json), "operation"
        (what made it: "save", "update", "upgrade", "re-export",
        "rollback"; None when not recorded), "report" (an update's report
        dict, a rollback's {"to", "restored"}; else None), "num_sequences",
        "current" (bool), "damaged" (None, or for a kept version whose
        manifest cannot be read, why: its "sha256" and "num_sequences" are
        then None, and `rollback_artifact` refuses it)}. One damaged kept
        version never fails the listing of the others.

    Raises
    ------
    ArtifactFormatError
        When `path` holds no artifact.
    """
    from static_compiler.artifact import versions
    return versions.list_versions(path)


def rollback_artifact(path, to=None, *, keep_versions=None) -> dict:
    """Swaps a kept version of an artifact back in at its path, atomically.

    Under the artifact's writers' lock, the kept version (`list_versions`)
    is renamed back to `path` in one step (as a save swaps a new version
    in: a reader sees the one or the other); the version it replaces is
    kept in turn, so a rollback is undone by another `rollback_artifact()`.
    A serving process's `Artifact.reload()` then returns the rolled-back
    version (the object serving before keeps serving its own). The kept
    version is checked first as `load` checks an artifact (manifest, file
    set, sizes, checksums): a damaged one is never swapped in.

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory.
    to : int or str, optional
        The id of the kept version to restore (as `list_versions` gives;
        "000003" or 3); default the newest kept one (the previous version).
    keep_versions : int, optional
        How many replaced versions to keep (as `update_artifact`).

    Returns
    -------
    dict
        The new current version's record (as a `list_versions` row, without
        num_sequences): operation "rollback", report {"to": the id restored,
        "restored": that version's own record}.

    Raises
    ------
    DecodeInputError
        When no version is kept to roll back to, or `to` names none of the
        kept ones (the message lists those that exist), or is not an id.
    ArtifactBusyError
        While another writer holds the artifact's lock (nothing changes).
    ArtifactFormatError
        When `path` holds no artifact.
    ArtifactFormatError, ArtifactChecksumError, ArtifactVersionError
        When the kept version is damaged (a missing, unreadable or altered
        file; a format outside the window), naming the version and what is
        wrong; the current version stays.
    """
    from static_compiler.artifact import versions
    return versions.rollback(path, to, keep_versions=keep_versions)
