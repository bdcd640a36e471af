"""An artifact's kept versions listed (`list_versions`) and swapped back in
(`rollback_artifact`), over the version history every writer records
(`history`: `.NAME.versions/` beside the artifact). `list_versions` lists a
kept version it cannot read as damaged; `rollback_artifact` checks the version it
restores as `load` does (`check_kept`) and swaps it in with the writer's
atomic swap, under the path's `lock.update_lock`."""

from __future__ import annotations

import pathlib
import shutil

from static_compiler.artifact import writer
from static_compiler.artifact.history import (
    ARTIFACT_DIR,
    CURRENT_FILE,
    RECORD_FILE,
    Made,
    keep_count,
    kept_ids,
    next_id,
    read_record,
    record_of,
    versions_dir,
)
from static_compiler.artifact.lock import _parent, update_lock
from static_compiler.errors import ArtifactError, ArtifactFormatError, DecodeInputError
from static_compiler.format import spec as fmt
from static_compiler.format.snapshot import open_snapshot, read_manifest


def list_versions(path) -> list[dict]:
    """The versions of a saved artifact: the current one, then those kept.

    Every writer that replaces the artifact at `path` (a save with
    overwrite, `update_artifact`, `upgrade_artifact`, `reexport_artifact`,
    `rollback_artifact`) keeps the version it replaced in the hidden
    directory `.NAME.versions/` beside it (`artifact.history`): the last 5,
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
    path = fmt.artifact_path(path, "versions")
    vdir = versions_dir(path)
    if not (path / fmt.MANIFEST_FILE).is_file():
        raise fmt.format_error(path, f"no artifact there (no {fmt.MANIFEST_FILE})")
    kept = [(vdir / f"{i:06d}", i) for i in reversed(kept_ids(vdir))]
    current = record_of(path, read_record(vdir / CURRENT_FILE), next_id(vdir))
    out = [dict(current, current=True, damaged=None,
                num_sequences=read_manifest(path, verify_checksums=False).num_sequences)]
    for home, i in kept:
        try:
            manifest = read_manifest(home / ARTIFACT_DIR, verify_checksums=False)
            record = record_of(home / ARTIFACT_DIR, read_record(home / RECORD_FILE), i)
        except (ArtifactError, OSError) as e:
            record = read_record(home / RECORD_FILE) or {}
            out.append({"id": i, "when": record.get("when"), "sha256": None,
                        "operation": record.get("operation"), "report": record.get("report"),
                        "current": False, "num_sequences": None, "damaged": _why(e)})
            continue
        out.append(dict(record, id=i, current=False, damaged=None,
                        num_sequences=manifest.num_sequences))
    return out


def _why(error: BaseException) -> str:
    """What is wrong with a kept version, from the error its reader raised."""
    return f"{type(error).__name__}: {error}"


def check_kept(path: pathlib.Path, version: int) -> None:
    """Checks kept `version` of the artifact at `path` as `load` checks an
    artifact (manifest, file set, sizes and checksums, format window) before
    `rollback_artifact` swaps it in; a damaged one raises the reader's error class
    (ArtifactFormatError, ArtifactChecksumError, ArtifactVersionError)
    naming the version and what is wrong, and saying the current version
    stays."""
    home = versions_dir(path) / f"{version:06d}" / ARTIFACT_DIR
    try:
        with open_snapshot(home):
            return
    except (ArtifactError, OSError) as e:
        cls = type(e) if isinstance(e, ArtifactError) else ArtifactFormatError
        raise cls(f"rollback: kept version {version:06d} of artifact {str(path)!r} is damaged "
                  f"({_why(e)}); nothing was swapped: the current version stays (roll back "
                  "to another kept version: `static-compiler versions` lists them)") from None


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
    path = fmt.artifact_path(path, "rollback")
    keep_count(keep_versions)  # (a bad count fails before anything moves)
    with update_lock(path):
        vdir = versions_dir(path)
        ids = kept_ids(vdir)
        if not (path / fmt.MANIFEST_FILE).is_file():
            raise fmt.format_error(path, f"no artifact there (no {fmt.MANIFEST_FILE})")
        if not ids:
            raise DecodeInputError(f"rollback: artifact {str(path)!r} has no previous version "
                                   f"to roll back to (none kept in {vdir.name!r})")
        if to is None:
            target = ids[-1]
        else:
            target = _version_id(to)
            if target not in ids:
                raise DecodeInputError(
                    f"rollback: artifact {str(path)!r} has no kept version {to!r}: the kept "
                    f"versions are {', '.join(f'{i:06d}' for i in reversed(ids))}")
        home = vdir / f"{target:06d}"
        check_kept(path, target)  # (a damaged version is never swapped in)
        restored = record_of(home / ARTIFACT_DIR, read_record(home / RECORD_FILE), target)
        report = {"to": target, "restored": restored}
        writer._swap_in(home / ARTIFACT_DIR, path, _parent(path),
                        made=Made("rollback", report, keep_versions))
        shutil.rmtree(home, ignore_errors=True)  # its record, now in the current one's report
        return dict(read_record(vdir / CURRENT_FILE) or {}, current=True)


def _version_id(to) -> int:
    """A version id given as an int or its digits ("3", "000003")."""
    if isinstance(to, int) and not isinstance(to, bool) and to > 0:
        return to
    if isinstance(to, str) and to.strip().isdigit() and int(to) > 0:
        return int(to)
    raise DecodeInputError(f"rollback: to={to!r}: expected a version id (an int > 0, as "
                           "list_versions gives)")
