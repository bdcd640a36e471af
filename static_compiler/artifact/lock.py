"""The writers' lock: an exclusive flock on `.NAME.lock` beside the artifact
(`lock_file`), which every writer of the path takes (`update_lock`: `save`,
`lifecycle.update` (`update_removed`, `update_artifact`), `lifecycle.upgrade`,
`lifecycle.versions.rollback_artifact`), so no two versions are ever built or swapped in at once.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

from static_compiler.errors import ArtifactBusyError
from static_compiler.format.snapshot import names_open_file
from static_compiler.format.spec import format_error


def _parent(path: pathlib.Path) -> pathlib.Path:
    return path.parent if str(path.parent) else pathlib.Path(".")


def lock_file(path) -> pathlib.Path:
    """The lock file of the artifact at `path` (`update_lock`): `.NAME.lock`
    beside it."""
    path = pathlib.Path(path)
    return _parent(path) / f".{path.name}.lock"


@contextlib.contextmanager
def update_lock(path):
    """An exclusive lock on writing the artifact at `path`, which every
    writer of it takes (`save`, `update_removed`, `update_artifact`),
    so no two versions are ever built or swapped in at once; raises
    ArtifactBusyError at once when another writer (of any process, or
    another thread) holds it.

    It is an flock on `lock_file(path)`. The holder removes the file as it
    lets go, so none is left beside the artifact; a writer that locked a
    file removed that way (it had opened it just before) starts over on the
    path's new one, so two writers never both hold the lock. A writer killed
    while holding it leaves the file, unlocked by the kernel, for the next.
    Raises ArtifactFormatError when the artifact's directory does not exist."""
    import fcntl

    path = pathlib.Path(path)
    lock = lock_file(path)
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:
            raise format_error(path, "expected a directory written by static_compiler."
                                     "artifact.save, found nothing (its parent directory "
                                     "does not exist)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if names_open_file(lock, fd):
                break
        except BlockingIOError:
            os.close(fd)
            raise ArtifactBusyError(
                f"artifact {str(path)!r} is being updated by another process (a save or an "
                f"update holds its lock {lock.name!r}); nothing was written: try again when it "
                "is done") from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before removed it as it let go: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
