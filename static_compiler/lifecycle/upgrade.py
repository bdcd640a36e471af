"""`upgrade_artifact` and `reexport_artifact` (`static-compiler upgrade
PATH`, `static-compiler re-export PATH`): the artifact renewed in place.
`upgrade_artifact`: an artifact of an older format version
(or one holding an older shape that an update kept: `normalize.needed_branches`)
rewritten into `format.FORMAT_VERSION`, so none is stranded when the window
(`format.MIN_FORMAT_VERSION`) moves past its version and a `format.COMPAT`
branch is deleted.

Written as every writer writes: under the path's `lock.update_lock`, into a
temporary directory swapped in at once (`writer._write_then_swap`), built
from one snapshot, so a failure anywhere leaves the original as it was.
Where the modules take the tables as they are (only manifest keys, branch
histograms or the item index are older) the tables and modules are
hard-linked unchanged, so a serving process's `reload()` picks the new
version up; where they take an older table or bit layout (ex_bounds,
per-state subset bits) the set is read back and its modules exported anew
(`saved.compiled_from_snapshot`, `load`'s reader; `writer.save_locked`): the tables' content
is the same, ex_bounds held as ex_starts / ex_branch (load that version
with `serving.load`).

`reexport_artifact` renews the modules alone: the set is read back from its tables
and its modules exported by the running jax, beside the same tables (a
serving `reload()` reads the new modules), for an artifact whose modules
another JAX exported (`runtime.export_version_error`) or whose export date
nears the end of jax.export's window (`format.EXPORT_WINDOW_DAYS`).
"""

from __future__ import annotations

import dataclasses
import pathlib

from static_compiler.artifact.history import Made
from static_compiler.artifact.lock import update_lock
from static_compiler.artifact.metadata import export_caps
from static_compiler.artifact.writer import NpyFile, _write_file, _write_then_swap, exporter, save_locked
from static_compiler.errors import DecodeInputError
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import FileEntry
from static_compiler.format.snapshot import Snapshot, open_snapshot
from static_compiler.format.snapshot_items import read_item_arrays, rows_in_item_order
from static_compiler.jax_support import placement as placement_lib
from static_compiler.lifecycle.update import require_current
from static_compiler.saved import compiled_from_snapshot

EXPORTED_ANEW = frozenset({"ex_bounds", "per_state"})
"""COMPAT rows whose artifacts' modules take an older table or bit layout:
upgrading them exports the modules anew."""


def upgrade_artifact(path, *, mesh=None) -> dict:
    """Rewrites an artifact of an older format version into the current one.

    Atomically and under the artifact's writers' lock
    (`static_compiler.lifecycle.upgrade`): an artifact whose only old parts
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
    path = fmt.artifact_path(path, "upgrade")
    with update_lock(path):
        with open_snapshot(path) as snap:
            manifest = snap.manifest
            needed = list(snap.compat)  # as written (the snapshot reads it in today's shape)
            report = {"path": str(path), "from_version": manifest.format_version,
                      "to_version": fmt.FORMAT_VERSION, "branches": needed}
            if manifest.format_version == fmt.FORMAT_VERSION and not needed:
                return {**report, "upgraded": False, "modules": "kept"}
            if EXPORTED_ANEW & set(needed):
                _export_anew(snap, _read_back_placed(snap, mesh, "upgrade"))
                return {**report, "upgraded": True, "modules": "exported"}
            _rewrite_keeping_modules(snap)
            return {**report, "upgraded": True, "modules": "kept"}


def reexport_artifact(path, *, mesh=None, beam_sizes=None) -> dict:
    """Exports an artifact's modules anew with the running jax, keeping its tables.

    For an artifact whose modules another JAX exported and this one cannot
    read (`serving.load` raises ArtifactVersionError naming both versions),
    or whose export date nears the end of jax.export's six-month window
    (`serving.load` warns with ArtifactExpiryWarning). Atomically and under
    the artifact's writers' lock (`static_compiler.lifecycle.upgrade`):
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
    path = fmt.artifact_path(path, "re-export")
    with update_lock(path):
        with open_snapshot(path) as snap:
            manifest = snap.manifest
            report = {"path": str(path), "from_jax": manifest.jax_version,
                      "from_jaxlib": manifest.jaxlib_version,
                      "from_exported_at": manifest.exported_at,
                      "tables_only": manifest.tables_only}
            if beam_sizes is not None and not manifest.tables_only:
                raise DecodeInputError(
                    f"re-export: beam_sizes={beam_sizes!r} for artifact {str(path)!r}, whose "
                    f"modules serve beam sizes {list(manifest.beam_sizes())}: re-export keeps "
                    "them (beam sizes are chosen once, for a tables-only artifact; re-save "
                    "the set with other export_beam_sizes instead)")
            compiled = _read_back_placed(snap, mesh, "re-export")
            if beam_sizes is not None:
                compiled = compiled._new_version(export_options=dataclasses.replace(
                    compiled.export_options, beam_sizes=tuple(beam_sizes)))
            # (version 15 is today's shape but for the ranked modules, which the
            # modules' rewrite adds: the tables stay hard-linked)
            upgraded = manifest.format_version not in (
                fmt.FORMAT_VERSION, fmt.RANKED_MODULES_VERSION - 1) or bool(snap.compat)
            if upgraded:
                _export_anew(snap, compiled, "re-export")
            else:
                _rewrite_modules(snap, compiled)
        with open_snapshot(path) as snap:
            new = snap.manifest
            return {**report, "jax": new.jax_version, "jaxlib": new.jaxlib_version,
                    "exported_at": new.exported_at, "upgraded": upgraded,
                    "from_version": manifest.format_version, "to_version": new.format_version}


def _rewrite_modules(snap: Snapshot, compiled) -> None:
    """The new version: `compiled`'s modules exported by this jax, the
    other files hard-linked unchanged, the manifest naming the new modules,
    the beam schedules they serve, versions and export date (no export
    plan: the modules say it; the caller holds the lock)."""
    manifest = snap.manifest
    files: dict = {}
    modules, cc, versions = exporter().exported_modules(compiled, export_caps(compiled), files)
    version = manifest.format_version
    ranked = [name for name in modules if fmt.is_ranked_module(name)]
    if ranked and version < fmt.RANKED_MODULES_VERSION - 1:  # (`upgrade` first: other shapes)
        for name in ranked:
            files.pop(modules.pop(name).file)
    elif ranked:  # the ranked modules are new (version 16) and the rest the same: added
        version = max(version, fmt.RANKED_MODULES_VERSION)
    took = {name: [(a.shape, a.dtype) for a in e.args if a.name.startswith("table:")]
            for name, e in modules.items() if not fmt.is_ranked_module(name)}
    had = {name: [(a.shape, a.dtype) for a in e.args if a.name.startswith("table:")]
           for name, e in manifest.modules.items() if not fmt.is_ranked_module(name)}
    if manifest.modules and (took.keys() != had.keys() or took != had):
        raise fmt.format_error(snap.path, "re-export: the set read back from the tables exports "
                                          f"other modules ({sorted(modules)}) than the artifact "
                                          f"holds ({sorted(manifest.modules)}) or takes other "
                                          "tables; re-save the set instead")
    old_modules = {e.file for e in manifest.modules.values()}
    entries = {rel: e for rel, e in manifest.files.items() if rel not in old_modules}
    entries.update({rel: FileEntry.of_bytes(data) for rel, data in files.items()})
    schedules = tuple(s for s in compiled.export_options.beam_sizes if not isinstance(s, int))
    new = dataclasses.replace(manifest, format_version=version, modules=modules,
                              calling_convention_version=cc,
                              platforms=fmt.PLATFORMS, beam_schedules=schedules, export_plan=None,
                              jax_version=versions[0], jaxlib_version=versions[1],
                              exported_at=versions[2], files=dict(sorted(entries.items())))

    _swap_in(snap, new, [rel for rel in entries if rel not in files], files, "re-export")


def _read_back_placed(snap: Snapshot, mesh, what: str):
    """The set read back from `snap`, sharded for `mesh` as it was saved
    (an artifact exported for a mesh needs that mesh to export for)."""
    compiled = compiled_from_snapshot(snap)  # tables and items in the current shape
    record = snap.manifest.mesh
    if record is not None:
        where = placement_lib.placement_for(record, mesh, f"{what}: artifact "
                                            f"{str(snap.path)!r} (its modules are exported anew)")
        compiled = compiled.shard(mesh, where.axis, where.min_bytes)
    return compiled


def _rewrite_keeping_modules(snap: Snapshot) -> None:
    """The new version: the same tables and modules (hard-linked), the
    manifest as the snapshot reads it (every layer's branch histogram) at
    FORMAT_VERSION, the item index in its current form, and whether its
    rows are its items (read from it where the manifest did not record it)."""
    manifest = snap.manifest
    item_files, new_files, dropped = manifest.item_files, {}, set()
    arrays = None if item_files is None else read_item_arrays(snap)
    if item_files is not None and "state_item" in item_files:  # COMPAT["state_item"]
        dropped.add(item_files["state_item"])
        item_files = {k: v for k, v in item_files.items() if k != "state_item"}
        for key in ("state_inserted_at", "state_inserted_item"):  # (read as insertions)
            item_files[key] = fmt.item_file(key)
            new_files[item_files[key]] = NpyFile(arrays[key])
    in_order = manifest.rows_in_item_order  # (recorded from version 17 on: else read now)
    if arrays is not None and in_order is None:
        in_order = rows_in_item_order(arrays["row_item"], arrays["stale_rows"],
                                      manifest.num_sequences)
    files = {rel: entry for rel, entry in manifest.files.items() if rel not in dropped}
    files.update({rel: data.entry() for rel, data in new_files.items()})
    new = dataclasses.replace(manifest, format_version=fmt.FORMAT_VERSION, item_files=item_files,
                              subset_bits=fmt.SUBSET_BITS[-1], files=files,
                              rows_in_item_order=in_order)

    kept = [rel for rel in manifest.files if rel not in dropped and rel not in new_files]
    _swap_in(snap, new, kept, new_files, "upgrade")


def _swap_in(snap: Snapshot, manifest, kept: list, written: dict, what: str) -> None:
    """The new version swapped in over `snap`'s path (the caller holds the
    lock): the files `kept` hard-linked from `snap`, those `written` (rel ->
    bytes or NpyFile) and `manifest` written, after checking that `snap` is
    still the version on disk."""
    def fill(tmp: pathlib.Path) -> None:
        for rel in kept:
            snap.link_into(rel, tmp / rel)
        for rel, data in written.items():
            _write_file(tmp, rel, data)
        _write_file(tmp, fmt.MANIFEST_FILE, manifest.seal())
        require_current(snap, what)

    _write_then_swap(snap.path, fill, made=Made(what))


def _export_anew(snap: Snapshot, compiled, what: str = "upgrade") -> None:
    """The new version: `compiled`, the set read back from `snap` (tables
    in the current shape; `_read_back_placed`), its modules exported anew,
    saved over the path (the caller holds the lock; `what` made it:
    "upgrade" or "re-export")."""
    require_current(snap, what)
    save_locked(compiled, snap.path, overwrite=True, modules=True if what == "re-export" else None,
                made=Made(what))
