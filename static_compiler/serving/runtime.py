"""What the serving loader runs an artifact with: its modules, deserialized
and checked against their manifest entries (`deserialize`; a `Module`
checks every call against its calling convention before it reaches XLA),
and its tables, checked and put on a device or split across a mesh as the
manifest records (`table_placement`, `check_table_arguments`,
`put_tables`), with the item index (`item_index`). Like `serving`, it needs
only jax, numpy and the standard library, and of this package only
`errors`, the format modules, `placement` and `item_bits.liveness`.
"""

from __future__ import annotations

import datetime
import threading
import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from static_compiler.errors import ArtifactExpiryWarning, ArtifactVersionError, DecodeInputError
from static_compiler.format import snapshot, snapshot_items
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import ArraySpec, ModuleEntry
from static_compiler.format.normalize import current_tables
from static_compiler.items.index import ItemIndex
from static_compiler.jax_support.placement import MeshPlacement, mesh_text, placed_shape, placement_for


def running_versions() -> tuple[str, str]:
    """(jax version, jaxlib version) of this process."""
    import jax.lib  # (its __version__ is jaxlib's)

    return jax.__version__, getattr(jax.lib, "__version__", "unknown")


def current_platform() -> str:
    """The platform modules run on in this process: jax's default backend,
    with "gpu" told apart as "cuda" or "rocm"."""
    backend = jax.default_backend()
    if backend == "gpu":
        return "rocm" if "rocm" in jax.devices()[0].client.platform_version.lower() else "cuda"
    return backend


class Module:
    """One deserialized module with its calling convention; calls are checked
    against the convention before reaching XLA."""

    def __init__(self, name: str, exported: jax_export.Exported, entry: ModuleEntry,
                 replicated=None):
        self.name = name
        self.exported = exported
        self.entry = entry
        self._call = jax.jit(exported.call)
        self._replicated = replicated  # a module for a mesh: its other arguments' sharding
        self._pinned = (None, None)  # (the tables' device sharding, the call pinned to it)
        self._lock = threading.Lock()

    def _jitted(self, tables):
        """The jitted call for `tables`: on one device, every argument pinned
        to the tables' device (in_shardings), so an argument's placement
        (a numpy array, a device array put without a device, a module's or
        a model's output, committed to it) never makes another program; on
        a mesh (arguments put on it in `__call__`) and without tables
        (init modules), the plain jitted call."""
        if self._replicated is not None or not tables:
            return self._call
        sharding = getattr(tables[0], "sharding", None)
        held, call = self._pinned
        if held is None or held != sharding:
            if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
                return self._call
            with self._lock:  # (one jitted call, so two threads' first calls compile once)
                held, call = self._pinned
                if held is None or held != sharding:
                    call = jax.jit(self.exported.call, in_shardings=sharding)
                    self._pinned = (sharding, call)
        return call

    def __call__(self, tables, *args):
        specs = self.entry.args[len(tables):]
        if len(args) != len(specs):
            raise DecodeInputError(f"{self.name}: got {len(args)} arguments after the tables, "
                                   f"expected {len(specs)} ({[s.name for s in specs]})")
        dims: dict = {}  # symbolic dimension -> its size in this call (first seen)
        for value, spec in zip(args, specs):
            shape, dtype = tuple(np.shape(value)), str(jnp.result_type(value))
            want = spec.shape
            if len(shape) == len(want):
                for d, size in zip(want, shape):
                    if isinstance(d, str):
                        dims.setdefault(d, size)
            expect = tuple(dims.get(d, d) if isinstance(d, str) else d for d in want)
            if shape != expect or dtype != spec.dtype:
                raise DecodeInputError(
                    f"{self.name}: argument {spec.name!r} is {dtype}{list(shape)}, expected "
                    f"{spec.dtype}{list(expect)} (manifest shape {list(want)}, b = batch size, "
                    "r = stacked subsets)")
        if self._replicated is not None:  # every argument on the module's mesh
            args = jax.device_put(args, self._replicated)
        return self._jitted(tables)(*tables, *args)


def deserialize(snap: snapshot.Snapshot, name: str, entry: ModuleEntry,
                where: Optional[MeshPlacement] = None) -> Module:
    """Module `name`, checked against its manifest entry (`where`: the
    mesh it runs on, for an artifact exported for one)."""
    path, manifest = snap.path, snap.manifest
    other_jax = (manifest.jax_version, manifest.jaxlib_version) != running_versions()
    try:
        exported = jax_export.deserialize(bytearray(snap.read_bytes(entry.file)))
        if other_jax:  # parse its StableHLO now: a newer JAX's fails here, not at a first step
            exported.mlir_module()
    except Exception as e:  # jax raises several types for a damaged flatbuffer
        if other_jax:
            raise export_version_error(snap, entry.file, e) from None
        raise fmt.format_error(path, f"module {entry.file!r} cannot be deserialized "
                                     f"({type(e).__name__}: {e}); truncated or not a jax.export "
                                     "module") from None
    if exported.calling_convention_version != manifest.calling_convention_version:
        raise ArtifactVersionError(
            f"artifact {str(path)!r}: module {entry.file!r} has calling-convention version "
            f"{exported.calling_convention_version}, the manifest says "
            f"{manifest.calling_convention_version}")
    found = [(s.shape, s.dtype) for s in _avals(exported.in_avals)]
    want = [(s.shape, s.dtype) for s in entry.args]
    if found != want:
        as_json = lambda specs: [{"shape": list(shape), "dtype": dtype} for shape, dtype in specs]
        raise fmt.format_error(path, f"module {entry.file!r} takes {as_json(found)}, the "
                                     f"manifest's calling convention says {as_json(want)}")
    return Module(name, exported, entry, None if where is None else where.sharding(None))


def export_version_error(snap: snapshot.Snapshot, rel: str, err: Exception
                         ) -> ArtifactVersionError:
    """The ArtifactVersionError for module file `rel`, which this process's
    jax could not read (`err`), exported by another: names both versions,
    the export date and the fix."""
    manifest, path = snap.manifest, str(snap.path)
    jax_now, jaxlib_now = running_versions()
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return ArtifactVersionError(
        f"artifact {path!r}: module {rel!r} was exported by jax {manifest.jax_version} (jaxlib "
        f"{manifest.jaxlib_version}) on {manifest.exported_at or 'an unrecorded date'}, and this "
        f"process's jax {jax_now} (jaxlib {jaxlib_now}) cannot read it ({type(err).__name__}: "
        f"{first}). Renew its modules with this jax: `static-compiler re-export {path}` (the "
        "tables are kept; a serving process then loads it, or picks it up with reload()), or "
        f"serve it with jax {manifest.jax_version}")


def warn_if_export_ages(manifest, path, today: Optional[datetime.date] = None) -> None:
    """An `ArtifactExpiryWarning` when the modules' export date (format
    version 10's "exported_at") is within `format.EXPORT_WARN_DAYS` of
    jax.export's backward window, or past it; nothing for an unknown date."""
    if manifest.exported_at is None:
        return
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    expires = datetime.date.fromisoformat(fmt.export_expires(manifest.exported_at))
    if (expires - today).days > fmt.EXPORT_WARN_DAYS:
        return
    when = "passed" if today >= expires else f"is {(expires - today).days} days away"
    warnings.warn(ArtifactExpiryWarning(
        f"artifact {str(path)!r}: its modules were exported on {manifest.exported_at} by jax "
        f"{manifest.jax_version}; jax.export reads a module for about "
        f"{fmt.EXPORT_WINDOW_DAYS} days after its export, so JAX releases from about "
        f"{expires.isoformat()} ({when}) may refuse them: renew them with `static-compiler "
        f"re-export {path}`"), stacklevel=3)


def _avals(avals) -> list[ArraySpec]:
    return [ArraySpec("", tuple(d if isinstance(d, int) else str(d) for d in a.shape),
                      str(a.dtype)) for a in avals]


def table_placement(snap: snapshot.Snapshot, device, mesh) -> tuple:
    """(put(key, array) -> device array, MeshPlacement or None) for the
    artifact's tables: on one device, or split across `mesh` as its
    manifest records."""
    path, record = str(snap.path), snap.manifest.mesh
    if device is not None and not isinstance(device, jax.Device):
        raise DecodeInputError(f"load: device={device!r}: expected a jax.Device (e.g. "
                               "jax.devices()[0]) or None for the default device")
    if record is None:
        if mesh is not None:
            raise DecodeInputError(f"load: artifact {path!r} was exported for one device; got "
                                   f"mesh={mesh!r}: load it without mesh=, or save the set "
                                   "from compiled.shard(mesh, axis) to export it for a mesh")
        device = device if device is not None else jax.devices()[0]
        return (lambda key, arr: jax.device_put(arr, device)), None  # noqa: ARG005 (a placer's signature)
    if device is not None or mesh is None:
        given = f"got device={device!r}" if device is not None else "got no mesh"
        raise DecodeInputError(
            f"load: artifact {path!r} was exported for a mesh {mesh_text(record['axes'])}, "
            f"{given}: pass mesh=jax.sharding.Mesh(...) with those axes and sizes")
    where = placement_for(record, mesh, f"load: artifact {path!r}")
    return where.place, where


def check_table_arguments(snap: snapshot.Snapshot) -> None:
    """Every module takes the manifest's tables, in the shapes their
    placement gives them (`placement.placed_shape`)."""
    manifest = snap.manifest
    want = [(placed_shape(manifest.mesh, t.layer, t.name, tuple(t.shape)), t.dtype)
            for t in manifest.tables]
    for name, entry in sorted(manifest.modules.items()):
        took = [(tuple(a.shape), a.dtype) for a in entry.args if a.name.startswith("table:")]
        if took and took != want:
            raise fmt.format_error(snap.path, f"module {entry.file!r} takes tables "
                                              f"{took[:4]}..., the manifest's tables are "
                                              f"{want[:4]}... placed")


def put_tables(snap: snapshot.Snapshot, put, keep=None) -> tuple[list, tuple]:
    """(device arrays in argument order, host arrays per layer in the
    current shape: `normalize.current_tables`) of the artifact's tables,
    after checking the sequence count against them; put: (layer, name),
    array -> device array (`table_placement`); keep: device arrays to reuse
    (None where a table is read and put)."""
    manifest = snap.manifest
    arrays = snapshot.load_tables(snap)
    # the modules take the tables as written; the host reads them current (ex_bounds)
    host = current_tables(fmt.unflatten_tables([(t.layer, t.name) for t in manifest.tables],
                                               len(manifest.layers), arrays))
    manifest.check_sequence_count(host, snap.path)
    keep = keep or [None] * len(arrays)
    return [put((t.layer, t.name), np.asarray(a)) if k is None else k
            for k, a, t in zip(keep, arrays, manifest.tables)], host


def item_index(snap: snapshot.Snapshot) -> Optional[ItemIndex]:
    """The artifact's item index, or None when it was saved without subsets."""
    arrays = snapshot_items.read_item_arrays(snap)
    return None if arrays is None else ItemIndex(num_unique=snap.manifest.num_sequences,
                                                 **arrays)
