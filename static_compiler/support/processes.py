"""Which processes are still running, for cleaning up after writers that
died (SIGKILL, power loss): an artifact's temporary directories
(`artifact.recover_stale`) and a partitioned build's work directories
(`frontend.build_dirs.remove_stale_builds`). Standard library only, so a
build's worker processes import no jax for it."""

from __future__ import annotations

import os
from typing import Optional


def alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def start_time(pid: int) -> Optional[str]:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat's
    field 22: Linux), or None where unknown; with the pid it names one
    process, not whichever later reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat.rsplit(b")", 1)[1].split()[19].decode()  # (after the command name)
    except (OSError, IndexError):
        return None
