"""A partitioned build's work directories (`frontend.partitioned`): each
records its owner (host, pid, start time) in OWNER_FILE, and a build
removes those of builds that died (SIGKILL) in the same parent directory
(`remove_stale_builds`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket

from static_compiler.support import processes

WORK_PREFIX = "static-compiler-build-"
OWNER_FILE = "owner"


def current_owner() -> str:
    """What a work directory's OWNER_FILE holds: "host pid start"."""
    return f"{socket.gethostname()} {os.getpid()} {processes.start_time(os.getpid()) or '-'}"


def _owner_died(owner: str) -> bool:
    """Whether the build an OWNER_FILE names (`current_owner`) is no longer
    running: it ran on this host, and its pid is not running or now names
    a process started at another time. Another host's build (a shared file
    system) or one not read whole is taken as running."""
    fields = owner.split()
    if len(fields) != 3 or fields[0] != socket.gethostname() or not fields[1].isdigit():
        return False
    pid = int(fields[1])
    if pid == 0:
        return False
    try:
        if not processes.alive(pid):
            return True
    except OverflowError:  # not a pid
        return False
    start = processes.start_time(pid)
    return fields[2] != "-" and start is not None and start != fields[2]


def remove_stale_builds(parent: pathlib.Path) -> list[str]:
    """Removes the work directories in `parent` of builds that died without
    cleaning up (SIGKILL, power loss: their `finally` never ran), as
    `artifact.recover_stale` does for artifacts: `WORK_PREFIX*`
    directories whose OWNER_FILE names a process gone (`_owner_died`).
    Those without one (older builds, or one being created now) and those
    of live builds are left alone. Returns the names removed."""
    removed = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(WORK_PREFIX) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            owner = (entry / OWNER_FILE).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if _owner_died(owner):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed
