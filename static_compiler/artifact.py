"""Writing artifacts (`save`), and reading a saved set back as an automaton
(`read_automaton`, for `static-compiler verify` and `show-ir`: numpy tables
only, no module is executed; `read_names` for a text catalogue's names).

The format (directory layout, manifest schema, version history, checksum
rules) is `static_compiler.artifact_format`, shared with the serving loader;
the security note is in `static_compiler.serving`.

`save` exports, with `jax.export` for ("cpu", "cuda", "tpu") at once and a
symbolic batch dimension ``b``, the modules (tables are arguments, never
constants, so the module bytes do not grow with the set):

============  =================================================================
init_m{M}     (start_tokens int32[b]) -> BeamState fields (b, M, ...)
beam_step_m{M}  (*tables, *BeamState fields, logits float32[b, M, V], step int32[])
              -> BeamState fields; `decode.beam_step_switch` with the per-step
              caps of export_tokens_per_beam (`export_caps`)
mask          (*tables, logits float32[b, V], node, valid, finished, step)
              -> masked logits float32[b, V]
advance       (*tables, node, valid, finished, tokens int32[b], step)
              -> node, valid, finished
============  =================================================================
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import dataclasses
import functools
import hashlib
import io
import os
import pathlib
import re
import shutil
import tempfile
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from static_compiler import artifact_format as fmt
from static_compiler import processes
from static_compiler.backend import decode
from static_compiler.backend.lowering import Plan, StepPlan, automaton_from_tables
from static_compiler.decode_state import (PAD_TOKEN, SENTINEL_SCORE, BeamState, ProcessorState,
                                          check_tokens_per_beam)
from static_compiler.errors import (ArtifactBusyError, ArtifactExistsError, ArtifactFormatError,
                                    ArtifactVersionError, DecodeInputError)
from static_compiler.ir import Automaton, Layout
from static_compiler.mapped import release_pages
from static_compiler.placement import placed_shape


# ---------------------------------------------------------------------------
# Export


def _spec(shape, dtype, sharding=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def export_modules(compiled) -> dict[str, tuple[jax_export.Exported, list[str], list[str]]]:
    """Exports the modules of `compiled`.

    Returns {name: (jax.export.Exported, argument names, result names)} in
    the order `save` writes them."""
    plan: Plan = compiled.plan
    keys = fmt.table_keys(compiled.tables)
    num_layers = len(compiled.tables)
    n = len(keys)
    # On a mesh (`compiled.shard`) the modules are exported for it: split
    # tables (row pointers padded) along its axis, every other argument
    # replicated; jax.export records the shardings and the device count.
    where = getattr(compiled, "placement", None)
    spec = functools.partial(_spec, sharding=None if where is None else where.sharding(None))

    def table_spec(t, k):
        arr = compiled.tables[t][k]
        if where is None:
            return _spec(arr.shape, arr.dtype)
        return _spec(where.shape((t, k), arr.shape), arr.dtype, where.sharding((t, k), arr.ndim))

    table_specs = [table_spec(t, k) for t, k in keys]
    table_names = [f"table:layer{t}.{k}" for t, k in keys]
    b, r = jax_export.symbolic_shape(f"{fmt.BATCH_DIM}, {fmt.SUBSET_DIM}")
    T, V = plan.max_length, plan.vocab_size
    step_spec = spec((), jnp.int32)
    caps = export_caps(compiled)
    state_names = [f"state.{f}" for f in BeamState._fields]
    proc_names = [f"state.{f}" for f in ProcessorState._fields]
    unflatten = functools.partial(fmt.unflatten_tables, keys, num_layers)
    # name -> (function of (args, LiveMask or None), specs, argument names, result names)
    base = {}
    for M in sorted(set(compiled.export_beam_sizes)):
        state_specs = [spec((b, M, T), jnp.int32), spec((b, M), jnp.float32)] + \
            [spec((b, M), dt) for dt in (jnp.int32, bool, bool, jnp.int32, jnp.int32, jnp.int32)]

        def init(a, subset, M=M):
            return tuple(decode.init_beam_state(plan, a[0].shape[0], M, a[0]))

        def step_fn(a, subset):
            return tuple(decode.beam_step_switch(plan, unflatten(a[:n]), BeamState(*a[n:n + 8]),
                                                 a[n + 8], a[n + 9], caps, subset))

        base[fmt.beam_module_name("init", M)] = (init, [spec((b,), jnp.int32)],
                                                 ["start_tokens"], state_names)
        base[fmt.beam_module_name("beam_step", M)] = (
            step_fn, table_specs + state_specs + [spec((b, M, V), jnp.float32), step_spec],
            table_names + state_names + ["logits", "step"], state_names)

    proc_specs = [spec((b,), jnp.int32), spec((b,), bool), spec((b,), bool)]

    def mask_fn(a, subset):
        return (decode.mask_switch(plan, unflatten(a[:n]), a[n], ProcessorState(*a[n + 1:n + 4]),
                                   a[n + 4], subset),)

    def advance_fn(a, subset):
        return tuple(decode.advance_switch(plan, unflatten(a[:n]), ProcessorState(*a[n:n + 3]),
                                           a[n + 3], a[n + 4], subset))

    base["mask"] = (mask_fn, table_specs + [spec((b, V), jnp.float32)] + proc_specs + [step_spec],
                    table_names + ["logits"] + proc_names + ["step"], ["masked_logits"])
    base["advance"] = (advance_fn, table_specs + proc_specs + [spec((b,), jnp.int32), step_spec],
                       table_names + proc_names + ["tokens", "step"], proc_names)

    def export(fn, specs):
        with _no_source_locations():
            return jax_export.export(jax.jit(fn), platforms=fmt.PLATFORMS)(*specs)

    modules = {name: (export(lambda *a, fn=fn: fn(a, None), specs), names, results)
               for name, (fn, specs, names, results) in base.items()}
    if getattr(compiled, "export_subsets", False):
        live_w, ends_w = decode.subset_widths(plan)
        sub_specs = [spec((r, w), jnp.uint32) for w in live_w] + \
            [spec((r, w), jnp.uint32) for w in ends_w if w is not None] + [spec((b,), jnp.int32)]
        sub_names = [f"subset.live{d + 1}" for d in range(len(live_w))] + \
            [f"subset.ends{d}" for d, w in enumerate(ends_w) if w is not None] + ["subset_index"]
        k = len(sub_specs)

        def with_subset(fn, *a):
            it = iter(a[-k:])
            live = tuple(next(it) for _ in live_w)
            ends = tuple(None if w is None else next(it) for w in ends_w)
            return fn(a[:-k], decode.LiveMask(live, ends, next(it)))

        for name, (fn, specs, names, results) in base.items():
            if not name.startswith("init"):
                modules[fmt.subset_module_name(name)] = (
                    export(functools.partial(with_subset, fn), specs + sub_specs),
                    names + sub_names, results)
    return modules


@contextlib.contextmanager
def _no_source_locations():
    """Lowers without Python source locations, so module bytes depend neither
    on the call site nor on where the package is installed (deterministic,
    and no build-machine paths end up in artifacts)."""
    keys = ("jax_traceback_in_locations_limit", "jax_include_full_tracebacks_in_locations")
    saved = [getattr(jax.config, key) for key in keys]
    jax.config.update(keys[0], 0)
    jax.config.update(keys[1], False)
    try:
        yield
    finally:
        for key, value in zip(keys, saved):
            jax.config.update(key, value)


def aval_specs(avals, names: list[str]) -> tuple[fmt.ArraySpec, ...]:
    """ArraySpecs of abstract values (symbolic dims as strings, e.g. "b")."""
    return tuple(fmt.ArraySpec(name, tuple(d if isinstance(d, int) else str(d) for d in a.shape),
                               str(a.dtype)) for name, a in zip(names, avals))


# ---------------------------------------------------------------------------
# Save


def export_caps(compiled) -> tuple[Optional[int], ...]:
    """The per-step caps the beam_step modules apply (`check_tokens_per_beam`
    of export_tokens_per_beam), after checking export_beam_sizes; raises
    DecodeInputError naming the export option that is wrong."""
    sizes = compiled.export_beam_sizes
    if not sizes or any(isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1
                        for m in sizes):
        raise DecodeInputError(f"export_beam_sizes={sizes!r}: expected a non-empty tuple of "
                               "ints >= 1")
    try:
        return check_tokens_per_beam(compiled.export_tokens_per_beam, compiled.plan.max_length)
    except DecodeInputError as e:
        raise DecodeInputError(f"export_tokens_per_beam: {e}") from None


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


class NpyFile:
    """The bytes `np.save` writes for `arr`, produced in chunks of about
    CHUNK_BYTES: a table is hashed and written without a copy of it in
    memory (a memory-mapped one is read a chunk at a time). Compares equal
    to another NpyFile or to bytes with the same content."""

    CHUNK_BYTES = 1 << 24

    def __init__(self, arr: np.ndarray):
        self.arr = arr
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
        self.header = buf.getvalue()

    @property
    def size(self) -> int:
        return len(self.header) + self.arr.nbytes

    def chunks(self):
        yield self.header
        flat = self.arr.reshape(-1)
        size = max(1, self.arr.itemsize)
        step = max(1, self.CHUNK_BYTES // size)
        for start in range(0, flat.shape[0], step):
            yield np.ascontiguousarray(flat[start:start + step]).tobytes()
            release_pages(flat, start * size, (start + step) * size)  # (a mapped table's)

    def entry(self) -> fmt.FileEntry:
        digest = hashlib.sha256()
        for chunk in self.chunks():
            digest.update(chunk)
        return fmt.FileEntry(size=self.size, sha256=digest.hexdigest())

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks())

    def __eq__(self, other):
        if isinstance(other, (bytes, bytearray, NpyFile)):
            return bytes(self) == bytes(other)
        return NotImplemented

    __hash__ = None


def _file_entry(data) -> fmt.FileEntry:
    return data.entry() if isinstance(data, NpyFile) else fmt.FileEntry.of_bytes(data)


def _write_file(root: pathlib.Path, rel: str, data) -> None:
    """Writes `data` (bytes, or an `NpyFile` in chunks) to root / rel."""
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        for chunk in (data.chunks() if isinstance(data, NpyFile) else (data,)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_files(compiled, reuse_modules=None) -> dict[str, object]:
    """{relative path: bytes, or an `NpyFile` for a table} of every file of
    the artifact, manifest last.

    reuse_modules: an open `artifact_format.Snapshot` of a saved artifact
    whose modules serve `compiled` unchanged (a version with the same plan:
    an addition within the reserved capacity): their files and manifest
    entries are copied
    instead of exporting again, so a serving process reloading the new
    version keeps its deserialized modules.

    Deterministic: the same compiled set and jax version give the same bytes
    (no timestamps; JSON with sorted keys)."""
    caps = export_caps(compiled)
    files = {fmt.IR_FILE: compiled.ir_text().encode("utf-8")}
    names = getattr(compiled, "names", None)
    if names is not None:
        files[fmt.NAMES_FILE] = names.to_jsonl()
    item_files = None
    items = getattr(compiled, "items", None)
    if getattr(compiled, "export_subsets", False):
        item_files = {}
        for key in fmt.ITEM_ARRAYS:
            arr = getattr(compiled.items, key)
            if arr is not None:
                item_files[key] = fmt.item_file(key)
                files[item_files[key]] = NpyFile(
                    np.asarray(arr, bool if key == "removed" else np.int32))
    elif items is not None and items.removal_tag:
        raise DecodeInputError("save: items were removed by an update, and an artifact keeps the "
                               "removal as item subsets: compile with export_subsets=True")
    tables = []
    for t, name in fmt.table_keys(compiled.tables):
        arr = compiled.tables[t][name]
        rel = fmt.table_file(t, name)
        files[rel] = NpyFile(arr)
        tables.append(fmt.TableEntry(t, name, rel, tuple(arr.shape), str(arr.dtype)))
    if reuse_modules is None:
        modules, cc, versions = _exported_modules(compiled, caps, files)
        where = getattr(compiled, "placement", None)
        mesh = None if where is None else where.to_json()
        subset_bits = fmt.SUBSET_BITS[-1]
    else:
        modules, cc, versions = _reused_modules(compiled, reuse_modules, files)
        mesh, subset_bits = reuse_modules.manifest.mesh, reuse_modules.manifest.subset_bits
    manifest = fmt.Manifest(
        jax_version=versions[0], jaxlib_version=versions[1], calling_convention_version=cc, platforms=fmt.PLATFORMS, batch_dim=fmt.BATCH_DIM,
        pad_token=PAD_TOKEN, sentinel_score=SENTINEL_SCORE, pipeline=compiled.pipeline,
        **set_metadata(compiled), tables=tuple(tables), modules=modules,
        names_file=None if names is None else fmt.NAMES_FILE, item_files=item_files, mesh=mesh,
        subset_bits=subset_bits, files={rel: _file_entry(data) for rel, data in sorted(files.items())})
    files[fmt.MANIFEST_FILE] = manifest.seal()
    return files


def _exported_modules(compiled, caps, files: dict) -> tuple[dict, int, tuple]:
    """Exports `compiled`'s modules into `files`: (manifest entries by name,
    calling-convention version, (jax, jaxlib) versions)."""
    modules = {}
    cc_versions = set()
    for name, (exported, arg_names, result_names) in export_modules(compiled).items():
        rel = fmt.module_file(name)
        files[rel] = bytes(exported.serialize())
        cc_versions.add(exported.calling_convention_version)
        kind, _, beams = name.rpartition("_m")
        per_beam = kind in fmt.BEAM_MODULE_KINDS
        modules[name] = fmt.ModuleEntry(
            file=rel, kind=kind if per_beam else name, platforms=tuple(exported.platforms),
            args=aval_specs(exported.in_avals, arg_names),
            results=aval_specs(exported.out_avals, result_names),
            beam_size=int(beams) if per_beam else None,
            tokens_per_beam=list(caps) if kind in fmt.STEP_KINDS else None)
    (cc,) = cc_versions
    return modules, cc, (jax.__version__, _jaxlib_version())


def _reused_modules(compiled, reuse, files: dict) -> tuple[dict, int, tuple]:
    """The modules of the saved artifact `reuse` (an open Snapshot), copied
    into `files`, after checking that they take `compiled`'s tables."""
    path, manifest = reuse.path, reuse.manifest
    tables = [fmt.ArraySpec("", placed_shape(manifest.mesh, t, k, compiled.tables[t][k].shape),
                            str(compiled.tables[t][k].dtype))
              for t, k in fmt.table_keys(compiled.tables)]
    for name, entry in manifest.modules.items():
        took = [(a.shape, a.dtype) for a in entry.args if a.name.startswith("table:")]
        if took and took != [(a.shape, a.dtype) for a in tables]:
            raise ArtifactVersionError(f"artifact {str(path)!r}: module {name!r} takes other "
                                       "tables than the new version has: export it anew")
        files[entry.file] = reuse.read_bytes(entry.file)
    return (dict(manifest.modules), manifest.calling_convention_version,
            (manifest.jax_version, manifest.jaxlib_version))


def set_metadata(compiled) -> dict[str, object]:
    """The manifest fields that describe the compiled set: vocab_size,
    max_length, depth, end_token, num_sequences, num_final_states,
    plan_steps (the static plan) and layers (per-layer statistics, layout
    text and table names). With the tables they determine the automaton
    (`automaton_from_tables`)."""
    plan: Plan = compiled.plan
    ir = compiled.outline  # (counts and layouts: a set lowered from pieces keeps its IR unread)
    layers = []
    for t, (stats, layer) in enumerate(zip(compiled.layer_stats(), ir.layers)):
        layers.append({**stats, "layout_text": layer.layout.to_text(),
                       "tables": sorted(compiled.tables[t])})
    return {"vocab_size": plan.vocab_size, "max_length": plan.max_length, "depth": plan.depth,
            "end_token": plan.end_token, "num_sequences": ir.num_sequences,
            "num_final_states": ir.num_final_states,
            "plan_steps": tuple(dataclasses.asdict(s) for s in plan.steps), "layers": tuple(layers)}


def _jaxlib_version() -> str:
    import jaxlib
    return getattr(jaxlib, "__version__", "unknown")


def save(compiled, path, *, overwrite: bool = False, reuse_modules=None) -> pathlib.Path:
    """Writes `compiled` as an artifact directory at `path`, atomically.

    The files go into a temporary sibling directory, are fsynced, and the
    directory is renamed to `path`: readers never see a half-written
    artifact. With `overwrite=True` an existing artifact is renamed aside,
    the new one renamed in, then the old one deleted; if anything fails
    before the swap, the old artifact is left untouched (and restored if the
    swap itself fails).

    Every writer of a path (this, `update_removed`,
    `compiler.update_artifact`) writes and swaps under its `update_lock`,
    so a save can never replace the version an update is building on while
    that update reads it. The export runs first, without the lock; when
    another writer holds the lock, save raises ArtifactBusyError at once and
    `path` is left as it was (as a second update does: it fails rather
    than waits, so a stuck writer never hangs a caller; try again).

    Raises ArtifactExistsError when `path` exists and `overwrite` is False,
    or when it exists and is not an artifact (we never delete other data);
    ArtifactBusyError as above; DecodeInputError for bad export_beam_sizes /
    export_tokens_per_beam. Returns the artifact path.
    """
    path = pathlib.Path(path)
    files = _files_to_save(compiled, path, overwrite, reuse_modules)
    _parent(path).mkdir(parents=True, exist_ok=True)  # for the lock file
    with update_lock(path):
        _write_files(path, files, overwrite)
    return path


def save_locked(compiled, path, *, overwrite: bool = False, reuse_modules=None) -> pathlib.Path:
    """`save`, for a caller that already holds `update_lock(path)` (an update
    writing the version it built): the same checks and atomic write, without
    taking the lock again (a flock is per open file, so a second take would
    find the caller itself busy)."""
    path = pathlib.Path(path)
    _write_files(path, _files_to_save(compiled, path, overwrite, reuse_modules), overwrite)
    return path


def _files_to_save(compiled, path: pathlib.Path, overwrite: bool, reuse_modules) -> dict:
    """`build_files`, after the checks on `path` that fail before an export
    (ArtifactExistsError; `_swap_in` checks again when it replaces)."""
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise _exists_error(path)
        _check_replaceable(path)
    return build_files(compiled, reuse_modules)


def _write_files(path: pathlib.Path, files: dict, overwrite: bool) -> None:
    """Writes `files` (of `build_files`) as the artifact at `path`
    (`_write_then_swap`); the caller holds `update_lock(path)`."""
    def fill(tmp):
        for rel, data in files.items():
            _write_file(tmp, rel, data)

    _write_then_swap(path, fill, overwrite=overwrite)


def _parent(path: pathlib.Path) -> pathlib.Path:
    return path.parent if str(path.parent) else pathlib.Path(".")


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
        fmt.read_manifest(path, verify_checksums=False)
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


def _write_then_swap(path: pathlib.Path, fill, overwrite: bool = True) -> None:
    """`fill(tmp)` writes an artifact into a temporary sibling directory,
    which is fsynced and swapped in at `path` (`_swap_in`); on any failure
    the temporary directory is removed and `path` is left as it was. With
    overwrite False the rename itself is the check that `path` is free (two
    writers racing for a new path: the second gets ArtifactExistsError)."""
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
        _swap_in(tmp, path, parent, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: pathlib.Path, path: pathlib.Path, parent: pathlib.Path,
             overwrite: bool = True) -> None:
    """Renames `tmp` to `path`, replacing an existing artifact only with
    `overwrite` (see `save`)."""
    if not overwrite or not path.exists():
        try:  # onto a path that must not exist: atomic, whoever renames first wins
            os.rename(tmp, path)
            _fsync_dir(parent)
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
        shutil.rmtree(tmp, ignore_errors=True)
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
    shutil.rmtree(old, ignore_errors=True)


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


# ---------------------------------------------------------------------------
# The writers' lock, and updating a saved artifact (removals)


def lock_file(path) -> pathlib.Path:
    """The lock file of the artifact at `path` (`update_lock`): `.NAME.lock`
    beside it."""
    path = pathlib.Path(path)
    return _parent(path) / f".{path.name}.lock"


@contextlib.contextmanager
def update_lock(path):
    """An exclusive lock on writing the artifact at `path`, which every
    writer of it takes (`save`, `update_removed`, `compiler.update_artifact`),
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
            raise fmt.format_error(path, "expected a directory written by static_compiler."
                                         "artifact.save, found nothing (its parent directory "
                                         "does not exist)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fmt.names_open_file(lock, fd):
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


def require_current(snap: fmt.Snapshot, what: str = "update") -> None:
    """ArtifactBusyError unless `snap.path` still names the version `snap`
    opened. Writers that take `update_lock` never replace it under an
    update; this catches one that does not (an older release, a copy by
    hand) before the update swaps its version over that writer's."""
    if not snap.is_current():
        raise ArtifactBusyError(
            f"{what}: artifact {str(snap.path)!r} was replaced while the update was reading it "
            f"(by a writer that does not take its lock {lock_file(snap.path).name!r}); nothing "
            "was written: try again")


def update_removed(path, remove) -> dict:
    """Writes a new version of the artifact at `path` without the items
    `remove` picks (a bool mask (N,) over the rows it was compiled from, or
    token sequences), atomically and under `update_lock`: the tables and
    modules are hard-linked (or copied) unchanged from the version it read
    (`write_removed`), items/removed.npy and the manifest are new, and the
    directory is swapped in as `save` does, so a reader sees the old version
    or the new one, and a crash leaves the old.

    Returns {"removed", "already_removed", "absent"} (sequences not in the
    set are counted, not an error). Raises DecodeInputError for an artifact
    saved without subsets, ArtifactBusyError at once while another writer
    (a save or an update) holds the lock."""
    path = pathlib.Path(path)
    with update_lock(path):
        return write_removed(path, remove)


def read_items(snap: fmt.Snapshot, where: str = "update"):
    """The artifact's `ItemIndex`; DecodeInputError when it was saved without."""
    from static_compiler.live.liveness import ItemIndex

    arrays = fmt.read_item_arrays(snap)
    if arrays is None:
        raise DecodeInputError(f"{where}: artifact {str(snap.path)!r} has no item index "
                               "(compile with export_subsets=True to update it)")
    return ItemIndex(num_unique=snap.manifest.num_sequences, **arrays)


def write_removed(path, remove) -> dict:
    """`update_removed`'s work, for a caller that holds `update_lock`.

    The new version is built from the one snapshot read here and nothing
    else: the item index, the automaton (to look up sequences) and every
    unchanged file come from its open files (`Snapshot.link_into`: a hard
    link to, or copy of, the very file opened), never from the path again,
    so a version swapped in meanwhile cannot mix into it."""
    from static_compiler.live import subsets

    path = pathlib.Path(path)
    with fmt.open_snapshot(path) as snap:
        manifest, items = snap.manifest, read_items(snap)
        removed, report = subsets.removal(items, remove, lambda: _automaton_of(snap))
        rel = fmt.item_file("removed")
        data = _npy_bytes(removed)
        files = dict(manifest.files)
        files[rel] = fmt.FileEntry.of_bytes(data)
        new = dataclasses.replace(manifest, item_files={**manifest.item_files, "removed": rel},
                                  files=files, format_version=fmt.FORMAT_VERSION)

        def fill(tmp):
            for name in manifest.files:
                if name not in (rel, fmt.MANIFEST_FILE):
                    snap.link_into(name, tmp / name)
            _write_file(tmp, rel, data)
            _write_file(tmp, fmt.MANIFEST_FILE, new.seal())
            require_current(snap)

        _write_then_swap(path, fill)
    return report


# ---------------------------------------------------------------------------
# Reading the set back (numpy only; no module is executed)


def read_automaton(path, *, verify_checksums: bool = True) -> Automaton:
    """Rebuilds the compiled automaton (with its layouts) from an artifact's
    manifest and .npy tables alone, and verifies it (`ir.verify`).

    Raises the artifact format's errors for a damaged artifact, and
    IRVerificationError when the tables do not form a valid automaton."""
    with fmt.open_snapshot(path, verify_checksums=verify_checksums) as snap:
        return _automaton_of(snap)


def _automaton_of(snap: fmt.Snapshot) -> Automaton:
    """`read_automaton` of an open snapshot."""
    return automaton_from_metadata(dataclasses.asdict(snap.manifest), fmt.read_tables(snap),
                                   where=f"artifact {str(snap.path)!r}")


def load_checked(path, *, verify_checksums: bool = True, device=None, mesh=None):
    """`serving.load`, after also checking, on the very files it loads, what
    `read_automaton` checks: the tables form a valid automaton that agrees
    with the manifest (O(table size)). Checksums only catch damage; this
    also refuses tables edited with their checksums recomputed, which could
    otherwise decode sequences outside the set.

    Raises what `serving.load` raises, and IRVerificationError or
    ArtifactFormatError for tables that are not a valid automaton."""
    from static_compiler import serving

    with serving.open_snapshot(pathlib.Path(path), verify_checksums=verify_checksums) as snap:
        _automaton_of(snap)
        return serving.load_from(snap, device=device, mesh=mesh)


def plan_from_metadata(metadata: dict, where: str = "tables") -> tuple[Plan, list]:
    """(Plan, per-layer Layouts) that `metadata` (the fields of
    `set_metadata`, as the manifest holds them) records."""
    try:
        steps = tuple(StepPlan(**step) for step in metadata["plan_steps"])
        layouts = [Layout.from_text(info["layout_text"]) for info in metadata["layers"]]
    except (TypeError, KeyError, ValueError) as e:
        raise ArtifactFormatError(f"{where}: plan_steps or layers do not describe a plan "
                                  f"({type(e).__name__}: {e})") from None
    return Plan(vocab_size=metadata["vocab_size"], steps=steps,
                end_token=metadata["end_token"]), layouts


def automaton_from_metadata(metadata: dict, tables, where: str = "tables") -> Automaton:
    """The automaton that `metadata` (the fields of `set_metadata`, as the
    manifest holds them) and `tables` (one dict of numpy arrays per layer)
    describe; see `lowering.automaton_from_tables`."""
    plan, layouts = plan_from_metadata(metadata, where)
    counts = [(info.get("states"), info.get("edges")) for info in metadata["layers"]]
    return automaton_from_tables(plan, layouts, tables, where=where,
                                 num_final_states=metadata["num_final_states"],
                                 num_sequences=metadata["num_sequences"], counts=counts)


def read_names(path, *, verify_checksums: bool = True) -> Optional[fmt.NameTable]:
    """The artifact's names (a text catalogue's `NameTable`), or None when
    it was compiled from token ids or written before format version 2."""
    with fmt.open_snapshot(path, verify_checksums=verify_checksums) as snap:
        return fmt.read_names(snap)
