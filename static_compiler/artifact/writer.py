"""Writing artifacts: `save` builds every file of the artifact
(`build_files`: the IR, names, item arrays, tables as `NpyFile`s, the
exported modules and the manifest, last) and writes them atomically
(`_write_then_swap`): into a temporary sibling directory, fsynced, then
swapped in at the path (`_swap_in`: one renameat2 exchange where the
system has it, else two renames), so a reader sees the old version or the
new one; `recover_stale` cleans up after writers that died. Every writer
holds the path's `lock.update_lock` while it writes.

The format (directory layout, manifest schema, version history, checksum
rules) is `format` and `manifest`, shared with the serving loader; the
security note is in `serving`.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.util
import os
import pathlib
import re
import shutil
import tempfile
from typing import Optional

import numpy as np

from static_compiler.artifact.files import (  # noqa: F401 (writer.NpyFile ...: the callers' names)
    LinkedFile,
    NpyFile,
    _file_entry,
    _fsync_dir,
    _npy_bytes,
    _write_file,
)
from static_compiler.artifact.history import Made, keep_count, keep_replaced, start_history
from static_compiler.artifact.lock import _parent, update_lock
from static_compiler.artifact.metadata import export_caps, export_plan, set_metadata
from static_compiler.errors import (
    JAX_INSTALL,
    ArtifactExistsError,
    ArtifactFormatError,
    ArtifactVersionError,
    DecodeInputError,
    installed,
    require,
)
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import ArraySpec, Manifest, TableEntry
from static_compiler.format.manifest_records import attributes_record
from static_compiler.format.snapshot import read_manifest
from static_compiler.item_bits.item_masks import rows_are_items
from static_compiler.jax_support.placement import placed_shape
from static_compiler.support import processes
from static_compiler.support.arrays import PieceArray
from static_compiler.support.decode_state import PAD_TOKEN, SENTINEL_SCORE


def build_files(compiled, reuse_modules=None, modules: bool = True) -> dict[str, object]:
    """{relative path: bytes, or an `NpyFile` for a table} of every file of
    the artifact, manifest last.

    modules: export the StableHLO modules (jax); False writes a tables-only
    artifact (format version 11: no modules, the jax fields null), what a
    process without jax saves: the torch backend and `sc.load` read it,
    `static-compiler re-export` adds its modules, those its manifest's
    export plan records (format version 15: `metadata.export_plan`, the
    beam sizes, schedules, caps and priors `compiled` asks for).

    reuse_modules: an open `snapshot.Snapshot` of a saved artifact
    whose modules serve `compiled` unchanged (a version with the same plan:
    an addition within the reserved capacity): their files (hard-linked: a
    kept version shares them) and manifest entries are reused instead of
    exporting again,
    so a serving process reloading the new version keeps its deserialized
    modules.

    Deterministic: the same compiled set and jax version give the same bytes
    (no timestamps; JSON with sorted keys)."""
    # (checked for a tables-only save too: its export plan is what re-export exports)
    caps = export_caps(compiled) if reuse_modules is None else None
    files = {fmt.IR_FILE: compiled.ir_text().encode("utf-8")}
    names = getattr(compiled, "names", None)
    if names is not None:
        files[fmt.NAMES_FILE] = names.to_jsonl()
    item_files = None
    items = getattr(compiled, "items", None)
    attributes = None if items is None else items.attributes
    if compiled.export_options.subsets:
        item_files = {}
        for key in fmt.ITEM_ARRAYS:
            arr = getattr(compiled.items, key)
            if arr is not None:
                item_files[key] = fmt.item_file(key)
                dtype = np.dtype(bool if key in fmt.BOOL_ITEM_ARRAYS else np.int32)
                files[item_files[key]] = NpyFile(
                    arr if isinstance(arr, PieceArray) and arr.dtype == dtype else
                    np.asarray(arr, dtype))
        for name, column in (attributes or {}).items():  # (values as they are: possibly lazy)
            files[fmt.attribute_file(name)] = NpyFile(column.values)
    elif items is not None and items.removal_tag:
        raise DecodeInputError("save: items were removed by an update, and an artifact keeps the "
                               "removal as item subsets: compile with export_subsets=True")
    elif attributes:
        raise DecodeInputError(f"save: the items carry attributes {list(attributes)}, which an "
                               "artifact keeps with its item index: compile with "
                               "export_subsets=True")
    tables = []
    for t, name in fmt.table_keys(compiled.lowered.tables):
        arr = compiled.lowered.tables[t][name]
        rel = fmt.table_file(t, name)
        files[rel] = NpyFile(arr)
        tables.append(TableEntry(t, name, rel, tuple(arr.shape), str(arr.dtype)))
    if reuse_modules is not None:
        entries, cc, versions = reused_modules(compiled, reuse_modules, files)
        mesh, subset_bits = reuse_modules.manifest.mesh, reuse_modules.manifest.subset_bits
        schedules = reuse_modules.manifest.beam_schedules
    else:
        where = compiled.lowered.placement
        mesh = None if where is None else where.to_json()
        subset_bits = fmt.SUBSET_BITS[-1]
        entries, cc, versions, schedules = {}, None, (None, None, None), ()
        if modules:
            entries, cc, versions = exporter().exported_modules(compiled, caps, files)
            schedules = tuple(s for s in compiled.export_options.beam_sizes
                              if not isinstance(s, int))
    fields = dict(
        jax_version=versions[0], jaxlib_version=versions[1], exported_at=versions[2],
        calling_convention_version=cc, platforms=fmt.PLATFORMS if entries else (),
        batch_dim=fmt.BATCH_DIM,
        pad_token=PAD_TOKEN, sentinel_score=SENTINEL_SCORE, pipeline=compiled.build.pipeline,
        **set_metadata(compiled), tables=tuple(tables), modules=entries,
        names_file=None if names is None else fmt.NAMES_FILE, item_files=item_files, mesh=mesh,
        subset_bits=subset_bits, beam_schedules=schedules,
        export_plan=None if entries else export_plan(compiled),
        # (format version 17: one pass over the row -> item map, 0.2 s at 1e9)
        rows_in_item_order=None if item_files is None else rows_are_items(compiled.items),
        attributes=attributes_record(attributes) if item_files is not None else None)
    listed = dict(files)
    seal = lambda: Manifest(**fields, files={rel: _file_entry(data) for rel, data in
                                             sorted(listed.items())}).seal()
    # With streamed files (an update of a large artifact) the manifest is made
    # after they are written, each hashed as it is written, not computed twice.
    streamed = any(isinstance(data, NpyFile) and data.streamed for data in files.values())
    files[fmt.MANIFEST_FILE] = seal if streamed else seal()
    return files


def exporter():
    """`artifact.export`, which needs jax: MissingDependencyError naming
    the install and the tables-only alternative where jax is not installed."""
    require("jax", "exporting an artifact's StableHLO modules",
            f"{JAX_INSTALL} (or save a tables-only artifact: save(path, modules=False), "
            "the default without jax)")
    from static_compiler.artifact import export
    return export


def save(compiled, path, *, overwrite: bool = False, reuse_modules=None,
         modules: Optional[bool] = None) -> pathlib.Path:
    """Writes `compiled` as an artifact directory at `path`, atomically.

    The files go into a temporary sibling directory, are fsynced, and the
    directory is renamed to `path`: readers never see a half-written
    artifact. With `overwrite=True` an existing artifact is renamed aside,
    the new one renamed in, then the old one kept as a version in
    `.NAME.versions/` (`artifact.history`: the last 5, or
    $STATIC_COMPILER_KEEP_VERSIONS); a save where no artifact is starts a
    new history (`history.start_history`: versions kept of an artifact
    deleted from `path` are deleted, never rolled back to); if anything fails
    before the swap, the old artifact is left untouched (and restored if the
    swap itself fails).

    Every writer of a path (this, `update_removed`,
    `update_artifact`) writes and swaps under its `update_lock`,
    so a save can never replace the version an update is building on while
    that update reads it. The export runs first, without the lock; when
    another writer holds the lock, save raises ArtifactBusyError at once and
    `path` is left as it was (as a second update does: it fails rather
    than waits, so a stuck writer never hangs a caller; try again).

    Raises ArtifactExistsError when `path` exists and `overwrite` is False,
    or when it exists and is not an artifact (we never delete other data);
    ArtifactBusyError as above; DecodeInputError for bad export_beam_sizes /
    export_tokens_per_beam. Returns the artifact path. modules=False: a
    tables-only artifact (`build_files`).
    """
    path = pathlib.Path(path)
    files = _files_to_save(compiled, path, overwrite, reuse_modules, modules)
    _parent(path).mkdir(parents=True, exist_ok=True)  # for the lock file
    with update_lock(path):
        _write_files(path, files, overwrite)
    return path


def save_locked(compiled, path, *, overwrite: bool = False, reuse_modules=None,
                modules: Optional[bool] = None, made: Made = Made("save")) -> pathlib.Path:
    """`save`, for a caller that already holds `update_lock(path)` (an update
    writing the version it built): the same checks and atomic write, without
    taking the lock again (a flock is per open file, so a second take would
    find the caller itself busy). made: the record of the new version
    (`history.Made`)."""
    path = pathlib.Path(path)
    _write_files(path, _files_to_save(compiled, path, overwrite, reuse_modules, modules),
                 overwrite, made)
    return path


def _files_to_save(compiled, path: pathlib.Path, overwrite: bool, reuse_modules,
                   modules: Optional[bool]) -> dict:
    """`build_files`, after the checks on `path` that fail before an export
    (ArtifactExistsError; `_swap_in` checks again when it replaces).
    modules None: exported where jax is installed, else tables only."""
    if modules is None:
        modules = installed("jax")
    elif not isinstance(modules, bool):
        raise DecodeInputError(f"save: modules={modules!r}: expected True, False or None")
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise _exists_error(path)
        _check_replaceable(path)
    return build_files(compiled, reuse_modules, modules)


def _write_files(path: pathlib.Path, files: dict, overwrite: bool,
                 made: Made = Made("save")) -> None:
    """Writes `files` (of `build_files`) as the artifact at `path`
    (`_write_then_swap`); the caller holds `update_lock(path)`."""
    def fill(tmp):
        for rel, data in files.items():
            _write_file(tmp, rel, data)

    _write_then_swap(path, fill, overwrite=overwrite, made=made)


def _exists_error(path: pathlib.Path) -> ArtifactExistsError:
    return ArtifactExistsError(f"artifact {str(path)!r} already exists: pass overwrite=True "
                               "(CLI: --force) to replace it")


def _check_replaceable(path: pathlib.Path) -> None:
    """ArtifactExistsError unless `path` is verifiably an artifact of ours: a
    directory (not a link) whose manifest parses as our format and lists
    exactly the files in it, so overwriting never deletes other data (a
    directory that merely holds a file named manifest.json)."""
    if path.is_symlink() or not path.is_dir() or not (path / fmt.MANIFEST_FILE).is_file():
        raise ArtifactExistsError(f"{str(path)!r} exists and is not an artifact (no "
                                  f"{fmt.MANIFEST_FILE}); refusing to replace it")
    try:
        read_manifest(path, verify_checksums=False)
    except (ArtifactFormatError, ArtifactVersionError) as e:
        raise ArtifactExistsError(f"{str(path)!r} exists and is not an artifact of ours that "
                                  f"can be replaced ({e}); refusing to delete it") from None


def recover_stale(path) -> list[str]:
    """Cleans up after writers of `path` that died (kill -9, power loss): their
    temporary directories beside it (`.NAME.tmp-PID-*`, whose PID is no
    longer running) are removed, and when `path` itself is missing because a
    writer died between the two renames of an overwrite, the artifact it had
    moved aside (`.NAME.old-PID-*`) is renamed back. Directories of live
    writers, and names without a PID, are left alone. Runs before every
    save and update; returns what it did, one line each."""
    path = pathlib.Path(path)
    parent = _parent(path)
    if not parent.is_dir():
        return []
    done = []
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp|old)-(\d+)-")
    stale = []
    for entry in sorted(parent.iterdir()):
        m = pattern.match(entry.name)
        if m and entry.is_dir() and not entry.is_symlink() and not processes.alive(int(m[2])):
            stale.append((m[1], entry))
    for kind, entry in stale:
        if kind == "old" and not path.exists() and (entry / fmt.MANIFEST_FILE).is_file():
            os.rename(entry, path)
            done.append(f"restored {entry.name} to {path.name}")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry.name}")
    return done


def _write_then_swap(path: pathlib.Path, fill, overwrite: bool = True,
                     made: Made = Made("save")) -> None:
    """`fill(tmp)` writes an artifact into a temporary sibling directory,
    which is fsynced and swapped in at `path` (`_swap_in`, which keeps the
    version it replaces, recording `made` for the new one); on any failure
    the temporary directory is removed and `path` is left as it was. With
    overwrite False the rename itself is the check that `path` is free (two
    writers racing for a new path: the second gets ArtifactExistsError)."""
    keep_count(made.keep)  # (a bad count fails before anything is written)
    parent = _parent(path)
    parent.mkdir(parents=True, exist_ok=True)
    recover_stale(path)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=parent))
    try:
        fill(tmp)
        for sub in (fmt.TABLES_DIR, fmt.MODULES_DIR, fmt.ITEMS_DIR):
            if (tmp / sub).is_dir():
                _fsync_dir(tmp / sub)
        _fsync_dir(tmp)
        _swap_in(tmp, path, parent, overwrite, made)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: pathlib.Path, path: pathlib.Path, parent: pathlib.Path,
             overwrite: bool = True, made: Made = Made("save")) -> None:
    """Renames `tmp` to `path`, replacing an existing artifact only with
    `overwrite` (see `save`); the replaced one is kept as a version
    (`history.keep_replaced`), `made` recorded as the new one's record."""
    if not overwrite or not path.exists():
        try:  # onto a path that must not exist: atomic, whoever renames first wins
            os.rename(tmp, path)
            _fsync_dir(parent)
            start_history(path, made)  # (versions of a deleted artifact there go)
            return
        except OSError as e:
            taken = path.exists() and e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR,
                                                  errno.ENOTDIR)
            if not taken:
                raise
            if not overwrite:
                raise _exists_error(path) from None
    _check_replaceable(path)  # again: what is there now is what gets replaced
    if _rename_exchange(tmp, path):
        # One atomic step: the path held the old artifact, now the new one;
        # `tmp` holds the old one (a stale .tmp- directory if we die here).
        _fsync_dir(parent)
        keep_replaced(path, tmp, made)
        return
    # No atomic exchange here (not Linux, or a filesystem without it): two
    # renames, and a kill between them leaves the old artifact moved aside
    # until `recover_stale` renames it back.
    old = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{os.getpid()}-", dir=parent))
    os.rmdir(old)
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    _fsync_dir(parent)
    keep_replaced(path, old, made)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _rename_exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Atomically swaps the directories at `a` and `b` (Linux renameat2 with
    RENAME_EXCHANGE), so a reader of `b` sees the one or the other at every
    instant. False, having done nothing, where the system or filesystem
    cannot; OSError for any other failure."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def reused_modules(compiled, reuse, files: dict) -> tuple[dict, int, tuple]:
    """The modules of the saved artifact `reuse` (an open Snapshot, open
    until `files` are written), hard-linked into `files` (`LinkedFile`),
    after checking that they take `compiled`'s tables; its ranked modules
    exported anew where `compiled`'s trie grew (`_ranked_anew`)."""
    path, manifest = reuse.path, reuse.manifest
    host = compiled.lowered.tables
    tables = [ArraySpec("", placed_shape(manifest.mesh, t, k, host[t][k].shape),
                        str(host[t][k].dtype))
              for t, k in fmt.table_keys(host)]
    for name, entry in manifest.modules.items():
        took = [(a.shape, a.dtype) for a in entry.args if a.name.startswith("table:")]
        if took and took != [(a.shape, a.dtype) for a in tables]:
            raise ArtifactVersionError(f"artifact {str(path)!r}: module {name!r} takes other "
                                       "tables than the new version has: export it anew")
        files[entry.file] = LinkedFile(reuse, entry.file)  # (the caller holds it open)
    entries = dict(manifest.modules)
    entries.update(_ranked_anew(compiled, manifest, files))
    return (entries, manifest.calling_convention_version,
            (manifest.jax_version, manifest.jaxlib_version, manifest.exported_at))


def _ranked_anew(compiled, manifest, files: dict) -> dict:
    """`export.ranked_modules_anew` where an addition grew the trie and jax is
    here; else {} (kept: without jax or on a mesh a ranked subset names re-export)."""
    outline = compiled.outline
    if not manifest.exports_ranked or manifest.mesh is not None or \
            (outline.num_sequences, outline.num_final_states) == \
            (manifest.num_sequences, manifest.num_final_states) or \
            importlib.util.find_spec("jax") is None:
        return {}
    return exporter().ranked_modules_anew(compiled, manifest, files, export_caps(compiled))

