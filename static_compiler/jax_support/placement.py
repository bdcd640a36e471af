"""Where the decoder's tables live on a device mesh (issue 13, serving side).

One rule, shared by `CompiledConstraints.shard`, the artifact's export and
`serving.load(path, mesh=...)`: along one mesh axis of D devices, a table of
at least `min_bytes` and more than `PACKED_TABLE_ENTRIES` entries whose first
is split into D contiguous ranges of rows (states or edges), one per device;
every other table is replicated. A table whose rows do not divide by D is
first padded to a multiple of D with rows no decode reads as an edge or a
state (`padded`): row pointers with their last value (empty rows), dense
`next` rows with -1 (no child), exception ids with an id past every state
(never found), everything else with 0 (tokens and targets past the last
edge, states that do not accept), so a set needs no reserved capacity to
split evenly. Inside jit, XLA partitions each gather from a split table into
a local gather and one all-reduce, so decoding is bit-identical to one
device.

Per-device bytes = split bytes / D + replicated bytes (`bytes_per_device`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from static_compiler.errors import DecodeInputError

DEFAULT_MIN_BYTES = 1 << 20

PACKED_TABLE_ENTRIES = 1 << 16
"""The decoder packs a run of steps' tables into one (concatenated on every
call) while they hold at most this many entries
(`backend.kernels.PACK_MAX_ENTRIES`); a split table there would be gathered
whole on every step, so only tables with more entries are split."""


def padded_rows(rows: int, devices: int) -> int:
    """Rows a table of `rows` rows has once split across `devices` devices:
    padded up to a multiple of D."""
    if rows % devices:
        return rows + devices - rows % devices
    return rows


PAST_EVERY_STATE = (1 << 31) - 1
"""The id `padded` gives padding exception entries (`ex_states`): past every
state (state ids are int32 in the decoder), so no search finds it."""


def padding_value(name: str, arr: np.ndarray):
    """What `padded` fills table `name`'s padding rows with (see the module doc)."""
    if name == "indptr":
        return arr[-1]
    if name == "next":
        return -1
    if name == "ex_states":
        return min(PAST_EVERY_STATE, np.iinfo(arr.dtype).max)
    return 0


def is_split(name: str, shape: tuple, dtype, devices: int,  # noqa: ARG001 (the rule's signature)
             min_bytes: int) -> bool:
    """Whether the rule splits a table of this name, shape and dtype across
    `devices` devices (see the module docstring)."""
    if devices < 2 or len(shape) < 1 or np.prod(shape, dtype=np.int64) <= PACKED_TABLE_ENTRIES:
        return False
    rows = padded_rows(int(shape[0]), devices)
    nbytes = rows * int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    return rows % devices == 0 and nbytes >= min_bytes


def padded(name: str, arr: np.ndarray, rows: int) -> np.ndarray:
    """`arr` padded to `rows` rows of `padding_value(name, arr)`."""
    if arr.shape[0] == rows:
        return arr
    if arr.shape[0] > rows or arr.shape[0] == 0:
        raise DecodeInputError(f"table {name!r} has {arr.shape[0]} rows, its placement wants "
                               f"{rows}")
    pad = np.full((rows - arr.shape[0],) + arr.shape[1:], padding_value(name, arr), arr.dtype)
    return np.concatenate([arr, pad])


def device_bytes(name: str, shape: tuple, dtype, devices: int,  # noqa: ARG001 (as is_split)
                 split: bool) -> int:
    """Bytes one device holds of a table: all of them, or, split, its rows
    (padded to a multiple of D) / D."""
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    if not split:
        return int(shape[0]) * row_bytes if len(shape) else np.dtype(dtype).itemsize
    return padded_rows(int(shape[0]), devices) * row_bytes // devices


def bytes_per_device(tables: dict, devices: int, min_bytes: int = DEFAULT_MIN_BYTES) -> int:
    """Bytes one device holds of one layer's tables ({name: array}) under
    the rule: split ones / D (after padding) plus replicated ones."""
    return sum(device_bytes(name, arr.shape, arr.dtype, devices,
                            is_split(name, arr.shape, arr.dtype, devices, min_bytes))
               for name, arr in tables.items())


@dataclasses.dataclass(frozen=True)
class MeshPlacement:
    """Tables placed along `axis` of `mesh` (a `jax.sharding.Mesh`).

    split: the (layer, table name) keys split across the axis; the rest are
    replicated on every device of the mesh."""

    mesh: object
    axis: str
    split: frozenset
    min_bytes: int = DEFAULT_MIN_BYTES

    @property
    def devices(self) -> int:
        """D, the devices along the axis."""
        return int(self.mesh.shape[self.axis])

    @classmethod
    def of(cls, mesh, axis: str, tables, min_bytes: int = DEFAULT_MIN_BYTES) -> "MeshPlacement":
        """The rule applied to `tables` (one {name: array} per layer)."""
        shape = getattr(mesh, "shape", None)
        if not hasattr(shape, "keys"):
            raise DecodeInputError(f"mesh={mesh!r}: expected a jax.sharding.Mesh")
        if axis not in shape:
            raise DecodeInputError(f"mesh has axes {list(shape)}, not {axis!r}")
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, (int, np.integer)) or \
                min_bytes < 0:
            raise DecodeInputError(f"min_bytes={min_bytes!r}: expected an int >= 0")
        D = int(shape[axis])
        split = frozenset((t, name) for t, tabs in enumerate(tables) for name, arr in tabs.items()
                          if is_split(name, arr.shape, arr.dtype, D, int(min_bytes)))
        return cls(mesh, axis, split, int(min_bytes))

    def shape(self, key: tuple, shape: tuple) -> tuple:
        """The shape table `key` = (layer, name) of `shape` has once placed
        (split row pointers padded to a multiple of D)."""
        if key not in self.split:
            return tuple(shape)
        return (padded_rows(shape[0], self.devices),) + tuple(shape[1:])

    def sharding(self, key: Optional[tuple], ndim: int = 1):
        """The NamedSharding of table `key` ((layer, name); None: any other
        argument, replicated)."""
        from jax.sharding import NamedSharding, PartitionSpec
        if key is not None and key in self.split:
            return NamedSharding(self.mesh, PartitionSpec(self.axis, *([None] * (ndim - 1))))
        return NamedSharding(self.mesh, PartitionSpec())

    def place(self, key: tuple, arr: np.ndarray):
        """Table `key` = (layer, name), padded and put on the mesh."""
        import jax
        arr = np.asarray(arr)
        if key in self.split:
            arr = padded(key[1], arr, self.shape(key, arr.shape)[0])
        return jax.device_put(arr, self.sharding(key, arr.ndim))

    def to_json(self) -> dict:
        """The manifest's record of the mesh: axis names and sizes, the
        tables' axis and which tables are split ("layer{t}.{name}")."""
        return {"axes": [[str(name), int(size)] for name, size in self.mesh.shape.items()],
                "table_axis": self.axis,
                "split_tables": sorted(f"layer{t}.{name}" for t, name in self.split),
                "min_bytes": self.min_bytes}


def placed_shape(record: Optional[dict], layer: int, name: str, shape: tuple) -> tuple:
    """The shape a saved artifact's modules take table (layer, name) of
    `shape` in, under its manifest's mesh `record` (None: one device): a
    split table's rows padded as `padded_rows` pads them."""
    if record is None or f"layer{layer}.{name}" not in record["split_tables"]:
        return tuple(shape)
    D = dict(record["axes"])[record["table_axis"]]
    return (padded_rows(int(shape[0]), D),) + tuple(shape[1:])


def mesh_text(axes) -> str:
    """'{d: 8}' for [("d", 8)] (error messages)."""
    return "{" + ", ".join(f"{name}: {size}" for name, size in axes) + "}"


def placement_for(record: dict, mesh, where: str) -> MeshPlacement:
    """The placement a saved artifact's mesh record describes, on `mesh`,
    after checking that `mesh` has the same axes and sizes (jax.export
    records the device count; a module runs only on a mesh like its own).
    Raises DecodeInputError naming both meshes."""
    want = [(str(n), int(s)) for n, s in record["axes"]]
    shape = getattr(mesh, "shape", None)
    if not hasattr(shape, "items"):
        raise DecodeInputError(f"{where}: the artifact was exported for a mesh "
                               f"{mesh_text(want)}; got mesh={mesh!r}: expected a "
                               "jax.sharding.Mesh with those axes and sizes")
    got = [(str(n), int(s)) for n, s in shape.items()]
    if got != want:
        raise DecodeInputError(
            f"{where}: the artifact was exported for a mesh {mesh_text(want)} "
            f"({int(np.prod([s for _, s in want]))} devices); got a mesh {mesh_text(got)} "
            f"({int(np.prod([s for _, s in got]))} devices): load it on a mesh with the same "
            "axes and sizes, or save the set again from compiled.shard(mesh, axis)")
    split = frozenset((int(key[5:].split(".")[0]), key.split(".", 1)[1])
                      for key in record["split_tables"])
    return MeshPlacement(mesh, record["table_axis"], split, int(record["min_bytes"]))
