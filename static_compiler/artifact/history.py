"""An artifact's version history on disk: every writer that replaces the artifact at
PATH (`save` with overwrite, updates, `upgrade`, `re-export`, `rollback`)
keeps the version it replaced instead of deleting it, in the hidden sibling
directory `.NAME.versions/` (`versions_dir`):

    .NAME.versions/current.json       the record of the version at PATH
    .NAME.versions/000003/artifact/   a kept version: the artifact as it was
                                      (the swapped-out directory, renamed)
    .NAME.versions/000003/version.json  its record

A record is {"id", "when" (UTC ISO), "sha256" (of the version's
manifest.json: its seal), "operation" ("save", "update", "upgrade",
"re-export", "rollback"; None when not recorded: an artifact written before
versions were kept), "report" (the update's report dict, rollback's
{"to", "restored"}; else None)}. Ids grow with every version written (the
current one holds the highest), never reused. The last `keep_versions`
kept versions stay (default `DEFAULT_KEEP`, or the environment variable
`KEEP_ENV`; 0 keeps none); older ones are deleted after the swap
(`keep_replaced`). Every function here runs under the path's
`lock.update_lock`, held by the writer that calls it. The writer's swap
(`writer._swap_in`) records every version here; listing the versions and
rolling back to one are `versions`, above the writer.

A save that puts an artifact where none was starts a new history
(`start_history`: the versions of an artifact deleted from PATH are
deleted).

A writer killed between its swap and `keep_replaced` loses the version it
replaced (its temporary directory is removed by `writer.recover_stale`),
never the current one; a current.json that does not match the manifest at
PATH is read as "not recorded".
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import shutil
from typing import Optional

from static_compiler.artifact.lock import _parent
from static_compiler.errors import DecodeInputError
from static_compiler.format import spec as fmt

DEFAULT_KEEP = 5
"""How many replaced versions an artifact keeps when neither the call nor
`KEEP_ENV` says."""

KEEP_ENV = "STATIC_COMPILER_KEEP_VERSIONS"
"""The environment variable giving the number of versions to keep (an int >= 0)."""

CURRENT_FILE = "current.json"
RECORD_FILE = "version.json"
ARTIFACT_DIR = "artifact"
OPERATIONS = ("save", "update", "upgrade", "re-export", "rollback")
_ID = re.compile(r"\d{6,}")


@dataclasses.dataclass(frozen=True)
class Made:
    """What a writer records for the version it swaps in: the operation
    (one of OPERATIONS), its report (a JSON-able dict, or None) and how many
    replaced versions to keep (None: `keep_count`'s default)."""
    operation: str
    report: Optional[dict] = None
    keep: Optional[int] = None


def versions_dir(path) -> pathlib.Path:
    """`.NAME.versions` beside the artifact at `path`."""
    path = pathlib.Path(path)
    return _parent(path) / f".{path.name}.versions"


def keep_count(keep: Optional[int] = None) -> int:
    """`keep`, else the environment's `KEEP_ENV`, else DEFAULT_KEEP;
    DecodeInputError for anything but an int >= 0."""
    where = "keep_versions"
    if keep is None:
        raw = os.environ.get(KEEP_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_KEEP
        where = f"${KEEP_ENV}"
        try:
            keep = int(raw)
        except ValueError:
            raise DecodeInputError(f"{where}={raw!r}: expected an int >= 0") from None
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise DecodeInputError(f"{where}={keep!r}: expected an int >= 0")
    return keep


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _seal_sha256(artifact: pathlib.Path) -> str:
    return hashlib.sha256((artifact / fmt.MANIFEST_FILE).read_bytes()).hexdigest()


def read_record(file: pathlib.Path) -> Optional[dict]:
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_json(file: pathlib.Path, record: dict) -> None:
    """Writes `record` to `file` atomically (a temporary file renamed over it)."""
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, sort_keys=True, indent=1, default=_jsonable)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)


def _jsonable(value):
    """numpy scalars and arrays, tuples and sets in a report, as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def kept_ids(vdir: pathlib.Path) -> list[int]:
    """The ids of the kept versions (directories holding an artifact), oldest first."""
    if not vdir.is_dir():
        return []
    return sorted(int(p.name) for p in vdir.iterdir()
                  if _ID.fullmatch(p.name) and (p / ARTIFACT_DIR).is_dir())


def record_of(artifact: pathlib.Path, record: Optional[dict], default_id: int) -> dict:
    """`record` when it describes the artifact directory `artifact` (the same
    manifest), else one saying what is known: its id, manifest and time."""
    sha = _seal_sha256(artifact)
    if record is not None and record.get("sha256") == sha and isinstance(record.get("id"), int):
        return record
    when = datetime.datetime.fromtimestamp((artifact / fmt.MANIFEST_FILE).stat().st_mtime,
                                           datetime.timezone.utc)
    return {"id": default_id, "when": when.isoformat(timespec="seconds"), "sha256": sha,
            "operation": None, "report": None}


def next_id(vdir: pathlib.Path, *taken: int) -> int:
    current = read_record(vdir / CURRENT_FILE) or {}
    ids = [*kept_ids(vdir), *taken, current.get("id") if isinstance(current.get("id"), int)
           else 0]
    return max(ids, default=0) + 1


def record_current(path: pathlib.Path, made: Made, replaced: Optional[int] = None) -> dict:
    """Writes the record of the version now at `path` (made by `made`) as
    `current.json`, with the next id; returns it."""
    vdir = versions_dir(path)
    vdir.mkdir(exist_ok=True)
    record = {"id": next_id(vdir, *(() if replaced is None else (replaced,))), "when": _now(),
              "sha256": _seal_sha256(path), "operation": made.operation, "report": made.report}
    _write_json(vdir / CURRENT_FILE, record)
    return record


def start_history(path: pathlib.Path, made: Made) -> dict:
    """After a writer put a new artifact at `path` where none was (a first
    save, or a save after the artifact there was deleted): the versions
    left in `.NAME.versions/` belong to the artifact that was deleted, not
    to this one, so they are deleted (with its current.json) and the new
    artifact's history starts at it. Deleting, not skipping, them: a kept
    version is only ever reached through the artifact it was replaced in
    (`rollback` of the path), so one whose artifact is gone would be a
    version of another set reachable by a rollback of this one, and disk
    never given back. They stay (copy one out by hand) until a new artifact
    is saved at the path. Overwrites, updates, upgrades, re-exports and
    rollbacks replace an artifact that is there and keep its history
    (`keep_replaced`). Returns the new record (`record_current`)."""
    vdir = versions_dir(path)
    for stale in kept_ids(vdir):
        shutil.rmtree(vdir / f"{stale:06d}", ignore_errors=True)
    (vdir / CURRENT_FILE).unlink(missing_ok=True)
    return record_current(path, made)


def keep_replaced(path: pathlib.Path, replaced: pathlib.Path, made: Made) -> None:
    """After a writer swapped a new version in at `path`: the version it
    replaced (now at `replaced`, a directory beside it) is kept as
    `.NAME.versions/ID/artifact` (renamed, not copied) with its record, the
    new version's record written, and kept versions beyond the last
    `keep_count(made.keep)` deleted (0: `replaced` is deleted)."""
    keep = keep_count(made.keep)
    vdir = versions_dir(path)
    vdir.mkdir(exist_ok=True)
    old = record_of(replaced, read_record(vdir / CURRENT_FILE), next_id(vdir))
    if keep:
        home = vdir / f"{old['id']:06d}"
        shutil.rmtree(home, ignore_errors=True)  # (a remainder of a writer killed here)
        home.mkdir()
        os.rename(replaced, home / ARTIFACT_DIR)
        _write_json(home / RECORD_FILE, old)
    else:
        shutil.rmtree(replaced, ignore_errors=True)
    record_current(path, made, replaced=old["id"])
    for stale in kept_ids(vdir)[:-keep or None]:
        shutil.rmtree(vdir / f"{stale:06d}", ignore_errors=True)
