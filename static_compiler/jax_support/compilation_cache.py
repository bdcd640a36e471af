"""JAX's persistent compilation cache, on in one call.

    import static_compiler as sc
    sc.enable_compilation_cache()          # ~/.cache/static-compiler/jax-<version>

With the cache on, a program another process (or an earlier run) compiled
is read from disk instead of compiled again: a served artifact's first
`beam_step`, `sc.beam_search`'s programs, the CLI's `decode`. The cache
holds executables: whoever can write to its directory can make this process
run their code, so it must be trusted (per user, per host, or a read-only
copy shipped with a server's image; never a directory shared with writers
you do not trust). The CLI turns it on by default (`--no-compilation-cache`
or STATIC_COMPILER_NO_CACHE=1 turn it off).

jax and the standard library only; jax is imported on the first
`enable_compilation_cache` call, not by this module's import (without jax,
that call raises MissingDependencyError naming the install).
"""

from __future__ import annotations

import math
import numbers
import os
import pathlib
import sys
import tempfile
import threading
from typing import Optional, Union

from static_compiler.errors import JAX_INSTALL, CompilationCacheError, require

NO_CACHE_ENV = "STATIC_COMPILER_NO_CACHE"
"""Set to 1 (or true / yes / on), the CLI and the main job leave the cache off."""

CACHE_DIR_ENV = "STATIC_COMPILER_CACHE_DIR"
"""The cache directory the CLI and the main job use instead of the default."""

_lock = threading.Lock()
_enabled: list = [None]  # [(path, min_compile_time_secs)] once enabled in this process


def jax_version() -> str:
    """The installed jax's version, without importing jax when it is not
    loaded yet (the CLI's --help names the directory)."""
    if sys.modules.get("jax") is not None:
        return sys.modules["jax"].__version__
    from importlib import metadata

    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        return "unknown"


def default_cache_dir() -> pathlib.Path:
    """$STATIC_COMPILER_CACHE_DIR when set, else $XDG_CACHE_HOME (or
    ~/.cache) / static-compiler / jax-<jax version>: one directory per jax
    version (a cache entry is only valid for the jax and XLA that wrote it)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return pathlib.Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "static-compiler" / f"jax-{jax_version()}"


def disabled_by_environment() -> bool:
    """Whether STATIC_COMPILER_NO_CACHE asks to leave the cache off."""
    return os.environ.get(NO_CACHE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def enabled_dir() -> Optional[str]:
    """The directory `enable_compilation_cache` turned on in this process, else None."""
    return None if _enabled[0] is None else _enabled[0][0]


def enable_compilation_cache(path: Union[str, os.PathLike, None] = None, *,
                             min_compile_time_secs: float = 0.0,
                             read_only: bool = False) -> str:
    """Turn on JAX's persistent compilation cache and return its directory.

    Every program compiled after the call (that took at least
    `min_compile_time_secs` to compile) is written to the directory, and a
    program found there is read instead of compiled: a second process's
    first `beam_step` or `beam_search` becomes a read. Calling again with the
    same arguments does nothing; with another directory, the cache moves
    there. The cache holds executables: use only a directory that no
    untrusted user can write to (per user, per host, or a read-only copy
    shipped with a server's image).

    Parameters
    ----------
    path : str or os.PathLike, optional
        The cache directory, created (mode 0o700) if missing. Default:
        ``default_cache_dir()``, $STATIC_COMPILER_CACHE_DIR when set, else
        $XDG_CACHE_HOME (or ~/.cache) / static-compiler / jax-<jax version>.
    min_compile_time_secs : float, optional
        Programs that compiled faster are not written (default 0.0: all).
    read_only : bool, optional
        Use an existing directory without writing to it (a cache shipped
        read-only with an image): found programs are read, nothing is written.

    Returns
    -------
    str
        The cache directory, absolute.

    Raises
    ------
    CompilationCacheError
        The path is not a str or os.PathLike of a str (bytes, an int), is a
        file, cannot be created or is not writable (with read_only: is not
        an existing readable directory); min_compile_time_secs is not a
        finite number >= 0 (a bool, NaN); read_only is not a bool. Raised
        before anything is configured or created.
    MissingDependencyError
        jax is not installed (the cache holds jax's programs).
    """
    where = _checked_arguments(path, min_compile_time_secs, read_only)
    require("jax", "enable_compilation_cache (jax's persistent compilation cache)",
            f"{JAX_INSTALL} (the torch backend compiles nothing and needs no cache)")
    _check_directory(where, read_only)
    threshold = float("inf") if read_only else float(min_compile_time_secs)
    key = (str(where), threshold)
    with _lock:
        if _enabled[0] == key:
            return str(where)
        import jax
        from jax.experimental.compilation_cache import compilation_cache as jax_cache

        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", str(where))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        # jax decides once per process, at its first compile, whether the
        # cache is used: start over, so a process that compiled before this
        # call (or used another directory) reads and writes here from now on.
        jax_cache.reset_cache()
        _enabled[0] = key
    return str(where)


def _checked_arguments(path, min_compile_time_secs, read_only) -> pathlib.Path:
    """The cache directory `path` names, absolute; CompilationCacheError
    naming the parameter, its value and what was expected for any argument
    of the wrong type or range."""
    where = "enable_compilation_cache"
    if isinstance(min_compile_time_secs, bool) or \
            not isinstance(min_compile_time_secs, numbers.Real) or \
            not math.isfinite(min_compile_time_secs) or min_compile_time_secs < 0:
        raise CompilationCacheError(f"{where}: min_compile_time_secs={min_compile_time_secs!r}: "
                                    "expected a finite number >= 0 (seconds)")
    if not isinstance(read_only, bool):
        raise CompilationCacheError(f"{where}: read_only={read_only!r}: expected True or False")
    if path is None:
        return default_cache_dir().absolute()
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        raise CompilationCacheError(f"{where}: path={path!r}: expected a directory as a "
                                    "non-empty str or os.PathLike of a str (or None: "
                                    f"{default_cache_dir()})")
    return pathlib.Path(text).expanduser().absolute()


def _check_directory(where: pathlib.Path, read_only: bool) -> None:
    what = f"compilation cache directory {str(where)!r}"
    if where.exists() and not where.is_dir():
        raise CompilationCacheError(f"{what}: expected a directory, found a file")
    if read_only:
        if not where.is_dir() or not os.access(where, os.R_OK | os.X_OK):
            raise CompilationCacheError(f"{what}: a read-only cache must be an existing readable "
                                        "directory (a cache written by an earlier run)")
        return
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".probe-"):
            pass
    except OSError as err:
        raise CompilationCacheError(f"{what}: expected a writable directory ({err.strerror or err}"
                                    "); use another path, open a cache shipped read-only as "
                                    "read-only, or turn the cache off") from None
