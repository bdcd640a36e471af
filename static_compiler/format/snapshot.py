"""Reading an artifact: `open_snapshot` opens its directory and every file
the manifest lists once, checks them (format and versions, the manifest's
own checksum, the file set, sizes and sha256), and returns a `Snapshot`,
from whose open files everything is then read: the manifest
(`read_manifest`), the tables (`load_tables`, `read_tables`), a text
catalogue's names (`read_names`) and the item index (`read_item_arrays`,
with its attributes: `read_attributes`).
Standard library and numpy only; shared by the writers (updates build from
a snapshot) and the serving loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import stat
from typing import Optional

import numpy as np

from static_compiler.errors import ArtifactChecksumError, ArtifactVersionError
from static_compiler.format.manifest import FileEntry, Manifest
from static_compiler.format.names import read_names_jsonl
from static_compiler.format.normalize import (
    check_window,
    current_tables,
    needed_branches,
    with_branch_counts,
)
from static_compiler.format.spec import (
    _HASH_CHUNK,
    FORMAT_NAME,
    MANIFEST_DIGEST_KEY,
    MANIFEST_FILE,
    MAX_FORMAT_VERSION,
    MIN_FORMAT_VERSION,
    _file_sha256,
    _reject_constant,
    format_error,
    manifest_bytes,
    require,
    unflatten_tables,
    version_error,
)
from static_compiler.items.names import NameTable

# ---------------------------------------------------------------------------
# Reading.


SNAPSHOT_ATTEMPTS = 5
"""Times `open_snapshot` starts over when the directory at the path is
replaced (an overwrite's swap) while it is being opened."""


class _Replaced(Exception):
    """The directory at the path is no longer the one being read."""


def names_open_file(path, fd: int) -> bool:
    """Whether `path` names the file or directory open as `fd`: the same
    device and inode. How a snapshot, the
    writers' lock and a hard link tell that a path was not swapped under
    them."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class Snapshot:
    """One artifact directory, every file of it opened once.

    `open_snapshot` opens the directory, and through that handle every file
    the manifest lists, before it checks or reads anything; checksums are
    computed on, and tables, modules, names and items read from, those open
    files. So everything read comes from one version: an overwrite that
    swaps the directory, or removes the old one, after that changes nothing
    here (this package never writes a file in place). Close it (or use
    `with`) when done; arrays and bytes it returned stay valid.

    path: the artifact's path as given; manifest: its `Manifest`, in the
    current shape (`normalize`: every layer's branch histogram); compat:
    the `format.COMPAT` rows the artifact as written needs (set by
    `open_snapshot`). The version directory opened stays open
    (`is_current`, `link_into`)."""

    compat: list = ()  # (each snapshot `open_snapshot` opens sets its own list)

    def __init__(self, path: pathlib.Path, manifest: "Manifest", files: dict,
                 dir_fd: Optional[int] = None):
        self.path = path
        self.manifest = manifest
        self._files = files  # rel -> open binary file
        self._dir_fd = dir_fd  # the version directory (owned: closed by `close`)

    def is_current(self) -> bool:
        """Whether `path` still names the version directory this snapshot
        opened (no writer has swapped another version in since)."""
        return self._dir_fd is not None and names_open_file(self.path, self._dir_fd)

    def link_into(self, rel: str, dest) -> None:
        """Puts the file `rel`, as this snapshot opened it, at the new path
        `dest` (its directory is created): a hard link to the very file that
        is open (through the opened directory, checked to be the same
        inode), else a copy of the open file's bytes, fsynced. The artifact
        path is never looked up again, so an update that builds a new
        version from this snapshot cannot take a file of a version that an
        overwrite swapped in meanwhile (nor lose one that it deleted: the
        open file still reads)."""
        f = self._file(rel)
        dest = pathlib.Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if self._dir_fd is not None and os.link in os.supports_dir_fd:
            try:
                os.link(rel, dest, src_dir_fd=self._dir_fd, follow_symlinks=False)
            except OSError:
                pass  # deleted with its directory, another filesystem, no links: copy it
            else:
                if names_open_file(dest, f.fileno()):
                    return
                os.unlink(dest)  # not the file opened: never take it
        f.seek(0)
        with open(dest, "wb") as out:
            shutil.copyfileobj(f, out, _HASH_CHUNK)
            out.flush()
            os.fsync(out.fileno())

    def _file(self, rel: str):
        f = self._files.get(rel)
        if f is None:
            raise format_error(self.path, f"{rel!r} is not a file of this artifact")
        f.seek(0)
        return f

    def read_bytes(self, rel: str) -> bytes:
        """The whole file `rel` (a path relative to the artifact)."""
        return self._file(rel).read()

    def npy(self, rel: str, mmap: bool = True) -> np.ndarray:
        """The .npy file `rel` as an array, memory-mapped (read-only) unless
        mmap is False; ArtifactFormatError when it is not a plain .npy."""
        f = self._file(rel)
        try:
            version = np.lib.format.read_magic(f)
            header = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if header is None or not mmap:
                f.seek(0)
                return np.lib.format.read_array(f, allow_pickle=False)
            shape, fortran, dtype = header(f)
            if dtype.hasobject:
                raise ValueError("object arrays are not allowed")
            if not shape or 0 in shape:
                return np.zeros(shape, dtype)
            return np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                             order="F" if fortran else "C")
        except (ValueError, OSError) as e:
            raise format_error(self.path, f"{rel} is not a readable .npy file ({e})") from None

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_snapshot(path, *, verify_checksums: bool = True,
                  calling_conventions: Optional[tuple[int, int, str]] = None) -> Snapshot:
    """Opens the artifact at `path` as a `Snapshot` and checks it against
    its manifest.

    Checks, in this order: the manifest is a JSON object of our format; the
    format version is in the window [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION]
    and so is every older shape it holds (`normalize.check_window`); the
    jax.export calling-convention version is in [lo, hi] when
    `calling_conventions` = (lo, hi, runtime name) is given; the manifest's
    own sha256; the files on disk are exactly those the manifest lists, none
    a symbolic link; each has the listed size and (unless `verify_checksums`
    is False) sha256; every key has its schema type.

    When an overwrite replaces the directory while it is being opened, it
    starts over on the new one (up to SNAPSHOT_ATTEMPTS times), so the
    snapshot is all of one version or an error.

    Raises ArtifactFormatError, ArtifactVersionError or ArtifactChecksumError,
    each naming the artifact, the file, what was expected and what was found.
    """
    path = pathlib.Path(path)
    for _ in range(SNAPSHOT_ATTEMPTS):
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise format_error(path, "expected a directory written by static_compiler.artifact."
                                     "save, found nothing") from None
        except NotADirectoryError:
            raise format_error(path, "expected a directory written by static_compiler.artifact."
                                     "save, found a file") from None
        except OSError as e:
            raise format_error(path, f"cannot open the directory ({e.strerror})") from None
        try:
            return _snapshot(path, dir_fd, verify_checksums, calling_conventions)
        except _Replaced:
            continue
        finally:
            os.close(dir_fd)
    raise format_error(path, f"the directory was replaced {SNAPSHOT_ATTEMPTS} times while it "
                             "was being opened (concurrent saves with overwrite=True); try again")


def _replaced(path: pathlib.Path, dir_fd: int) -> bool:
    """Whether `path` no longer names the directory open as `dir_fd`."""
    try:
        now = os.stat(path)
    except OSError:
        return True
    held = os.fstat(dir_fd)
    return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def _open_at(path: pathlib.Path, dir_fd: int, rel: str):
    """The file `rel` of the directory `dir_fd`, open for binary reading
    (not following a symbolic link); _Replaced when it is gone because the
    directory was swapped out."""
    try:
        fd = os.open(rel, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
    except FileNotFoundError:
        if _replaced(path, dir_fd):
            raise _Replaced from None
        raise format_error(path, f"missing file {rel!r}") from None
    except OSError as e:
        raise format_error(path, f"cannot open {rel!r} ({e.strerror})") from None
    return os.fdopen(fd, "rb")


def _snapshot(path: pathlib.Path, dir_fd: int, verify_checksums: bool,
              calling_conventions) -> Snapshot:
    with _open_at(path, dir_fd, MANIFEST_FILE) as f:
        data = f.read()
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, NaN/Infinity
        raise format_error(path, f"{MANIFEST_FILE} is not valid UTF-8 JSON ({e})") from None
    except RecursionError:
        raise format_error(path, f"{MANIFEST_FILE} is nested too deeply to be a manifest") \
            from None
    body = _checked_manifest_body(path, raw, calling_conventions)
    files = require(raw, "files", dict, MANIFEST_FILE, path)
    try:
        on_disk = _list_files_at(dir_fd, path)
    except FileNotFoundError:  # a directory emptied under the walk
        raise _Replaced from None
    missing = sorted(set(files) - set(on_disk))
    extra = sorted(set(on_disk) - set(files))
    if missing and _replaced(path, dir_fd):
        raise _Replaced
    if missing:
        raise format_error(path, f"missing file(s) {missing} listed in {MANIFEST_FILE}")
    if extra:
        raise format_error(path, f"extra file(s) {extra} not listed in {MANIFEST_FILE} "
                                 f"(expected exactly {sorted(files)})")
    opened = {}
    try:
        for rel in sorted(files):
            entry = FileEntry.from_json(files[rel], f"files[{rel!r}]", path)
            f = opened[rel] = _open_at(path, dir_fd, rel)
            found = os.fstat(f.fileno()).st_size
            if found != entry.size:
                what = "truncated" if found < entry.size else "longer than recorded"
                raise ArtifactChecksumError(
                    f"artifact {str(path)!r}: file {rel!r} is {what}: {found} bytes, expected "
                    f"{entry.size}")
            if verify_checksums:
                actual = _file_sha256(f)
                if actual != entry.sha256:
                    raise ArtifactChecksumError(
                        f"artifact {str(path)!r}: file {rel!r} has sha256 {actual}, expected "
                        f"{entry.sha256} (the file is corrupted)")
        manifest = Manifest.from_json(body, path)
        check_window(manifest, path)
        snap = Snapshot(path, manifest, opened, os.dup(dir_fd))
    except BaseException:
        for f in opened.values():
            f.close()
        raise
    snap.compat = needed_branches(manifest)
    if "branch_counts" in snap.compat:  # COMPAT["branch_counts"]: read from the tables
        try:
            snap.manifest = with_branch_counts(manifest, read_tables(snap), path)
        except BaseException:
            snap.close()
            raise
    return snap


def _checked_manifest_body(path: pathlib.Path, raw, calling_conventions) -> dict:
    """The manifest without its own digest, after checking the format, the
    versions and the digest."""
    if not isinstance(raw, dict):
        raise format_error(path, f"{MANIFEST_FILE} holds a {type(raw).__name__}, "
                                 "expected a JSON object")
    fmt = raw.get("format")
    if fmt != FORMAT_NAME:
        raise format_error(path, f"{MANIFEST_FILE} format is {fmt!r}, expected {FORMAT_NAME!r}")
    version = require(raw, "format_version", int, MANIFEST_FILE, path)
    if not MIN_FORMAT_VERSION <= version <= MAX_FORMAT_VERSION:
        raise version_error(path, version)
    cc = require(raw, "calling_convention_version", (int, type(None)), MANIFEST_FILE, path)
    if calling_conventions is not None and cc is not None:  # (None: tables only, no modules)
        lo, hi, runtime = calling_conventions
        if not lo <= cc <= hi:
            raise ArtifactVersionError(
                f"artifact {str(path)!r}: jax.export calling-convention version {cc} cannot run "
                f"on {runtime}, which supports [{lo}, {hi}] (the artifact was written by jax "
                f"{raw.get('jax_version', '?')}); re-save it with this jax or use a matching one")
    digest = require(raw, MANIFEST_DIGEST_KEY, str, MANIFEST_FILE, path)
    body = {k: v for k, v in raw.items() if k != MANIFEST_DIGEST_KEY}
    actual = hashlib.sha256(manifest_bytes(body)).hexdigest()
    if actual != digest:
        raise ArtifactChecksumError(
            f"artifact {str(path)!r}: {MANIFEST_FILE} content has sha256 {actual}, its "
            f"{MANIFEST_DIGEST_KEY} says {digest} (the manifest is corrupted)")
    return body


def read_manifest(path, *, verify_checksums: bool = True,
                  calling_conventions: Optional[tuple[int, int, str]] = None) -> Manifest:
    """The manifest of the artifact at `path`, after the checks of
    `open_snapshot` (for metadata only: read files through a snapshot, so
    they are of the version this manifest describes)."""
    with open_snapshot(path, verify_checksums=verify_checksums,
                       calling_conventions=calling_conventions) as snap:
        return snap.manifest


def load_tables(snap: Snapshot, mmap: bool = True) -> list[np.ndarray]:
    """The tables as numpy arrays (memory-mapped by default), in argument
    order, each checked against the manifest's shape and dtype."""
    out = []
    for entry in snap.manifest.tables:
        arr = snap.npy(entry.file, mmap)
        if arr.shape != tuple(entry.shape) or str(arr.dtype) != entry.dtype:
            raise format_error(snap.path, f"table {entry.file!r} holds {arr.dtype}"
                                          f"{list(arr.shape)}, the manifest says {entry.dtype}"
                                          f"{list(entry.shape)}")
        out.append(arr)
    return out


def read_tables(snap: Snapshot, mmap: bool = True) -> tuple[dict, ...]:
    """`load_tables` as one dict of arrays per layer, keyed by table name,
    in the current shape (`normalize.current_tables`: what the library and
    the torch backend decode with; the modules take `load_tables`)."""
    manifest = snap.manifest
    keys = [(t.layer, t.name) for t in manifest.tables]
    return current_tables(unflatten_tables(keys, len(manifest.layers), load_tables(snap, mmap)))


def _list_files_at(dir_fd: int, path) -> list[str]:
    """Relative POSIX paths of every file under the directory `dir_fd`
    (sorted), excluding the manifest; ArtifactFormatError for a symbolic
    link anywhere inside (it could point outside the artifact)."""
    out = []
    for dirpath, dirnames, filenames, at in os.fwalk(".", dir_fd=dir_fd):
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(dirpath, name)).replace(os.sep, "/")
            if stat.S_ISLNK(os.stat(name, dir_fd=at, follow_symlinks=False).st_mode):
                raise format_error(path, f"{rel!r} is a symbolic link: an artifact holds only "
                                         "its own files")
            if name in filenames and rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


# ---------------------------------------------------------------------------
# Text catalogues (names.jsonl) and item subsets (items/*.npy).


def read_names(snap: Snapshot) -> Optional[NameTable]:
    """The artifact's `NameTable`, or None when it has none (a set compiled
    from token ids, or a version 1 artifact). Raises ArtifactFormatError when
    the file does not parse or its item count differs from the manifest's."""
    manifest, path = snap.manifest, snap.path
    if manifest.names_file is None:
        return None
    table = read_names_jsonl(snap.read_bytes(manifest.names_file), path, manifest.names_file)
    if len(table) != manifest.num_sequences:
        raise format_error(path, f"{manifest.names_file} holds {len(table)} names, the manifest "
                                 f"records {manifest.num_sequences} sequences")
    return table
