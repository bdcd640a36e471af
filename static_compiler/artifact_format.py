"""The artifact format: one definition shared by the writer
(`static_compiler.artifact`) and the reader (`static_compiler.serving`).

Standard library and numpy only. It holds the format version with its dated
history, the directory layout and file-set rules, the manifest's schema as
frozen dataclasses (parsed with typed errors that name the artifact, the key,
what was expected and what was found), and the checksum rules.

An artifact is a directory:

* ``manifest.json``: a `Manifest` (sorted keys, one-space indent), sealed
  with its own sha256 (`MANIFEST_DIGEST_KEY`);
* ``ir.txt``: the IR dump (rows elided for large sets);
* ``names.jsonl`` (version 2, text catalogues only): a `NameTable`, one JSON
  object per item, ``{"name": str, "tokens": [int, ...]}`` plus ``"aliases":
  [str, ...]`` when other names encode to the same tokens, sorted by tokens
  (a prefix before its extensions); lines end in a line feed alone, and
  U+0085, U+2028 and U+2029 are written as JSON escapes (the reader splits
  on line feeds only, so a file an older writer wrote them raw in reads
  too); the manifest's ``names_file`` names it (null when the set was
  compiled from token ids);
* ``tables/layer{t}.{name}.npy``: the lookup tables (``np.load(...,
  mmap_mode="r")`` works), in the order ``manifest.tables`` lists them, which
  is every module's table-argument order (`table_keys`);
* ``modules/{name}.jaxexport``: `jax.export` serialized modules, lowered for
  `PLATFORMS` together, polymorphic in the batch dimension `BATCH_DIM`:
  ``init_m{M}`` and ``beam_step_m{M}`` per exported beam size M, ``mask`` and
  ``advance``. Each module's entry gives its arguments' names, shapes and
  dtypes in call order; every module but ``init_m{M}`` takes all tables
  first and the step (int32 scalar) last.

Nothing else may be in the directory: the files on disk must be exactly those
the manifest lists, each with the recorded size and sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import stat
from typing import Optional

import numpy as np

from static_compiler.errors import (ArtifactChecksumError, ArtifactFormatError,
                                    ArtifactVersionError, DecodeInputError)

# ---------------------------------------------------------------------------
# Versions. The writer writes FORMAT_VERSION; readers accept
# [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION]. History:
#   1 (2026-11-29): manifest.json, ir.txt, tables/*.npy, modules/*.jaxexport;
#     modules init_m{M}, beam_step_m{M}, mask, advance; batch dimension "b".
#   2 (2026-12-01): text catalogues: optional names.jsonl (the items' names and
#     token ids) and the manifest key "names_file" (its path, or null). A
#     version 1 artifact reads as one without names.
#   3 (2026-12-01): item subsets: optional items/*.npy (where each input row
#     ends in the trie: row_item, and for variable-length sets item_depth and
#     item_state), the manifest key "item_files" ({name: path}, or null), and
#     with them the modules beam_step_subset_m{M}, mask_subset and
#     advance_subset (a module's arguments, then the subsets' bits with a
#     second symbolic dimension "r", then subset_index int32[b]); after an
#     update, items/removed.npy (bool, the unique sequences taken out).
#     Versions 1 and 2 read as artifacts without subsets.
#   4 (2026-12-01): tables on a device mesh: the manifest key "mesh" (null for
#     one device, else {"axes": [[name, size], ...], "table_axis": name,
#     "split_tables": ["layer{t}.{name}", ...], "min_bytes": int}); the
#     modules were exported for that mesh (jax.export records the device
#     count and shardings) and take the split row pointers padded to a
#     multiple of the axis size (`placement`). The table files are the
#     same as for one device. Versions 1 to 3 read as one-device artifacts.
#   5 (2026-12-01): the manifest key "subset_bits", how the subset modules
#     take an item subset's bits: "dense_slots" (this writer: the children of
#     a dense_rows step t as slot bits, num_states[t] * ceil(V / 32) words per
#     subset, in (state, token) order; see `liveness`) or "per_state" (one bit
#     per state at every depth, as versions 3 and 4 took them; an update
#     that keeps a version 3 or 4 artifact's modules keeps it). Versions 1 to
#     4 read as "per_state".
#   6 (2026-12-02): a near_unary layer's exceptions hold their row starts and
#     branches in two tables, layer{t}.ex_starts (X,) of the state dtype and
#     layer{t}.ex_branch (X,) of the narrowest unsigned dtype holding the
#     layer's max branch, instead of layer{t}.ex_bounds (X, 2) [start, end)
#     rows: 9 bytes an exception instead of 12 at int32 (0.65 -> 0.49 bytes
#     per item at 1e9 items). Versions 1 to 5 keep ex_bounds: their own
#     modules take it, and the library reads both; an update that keeps an
#     older artifact's modules keeps its tables' names (the manifest lists
#     each layer's tables).
FORMAT_NAME = "static-compiler-artifact"
FORMAT_VERSION = 6
MIN_FORMAT_VERSION = 1
MAX_FORMAT_VERSION = 6
SUBSET_BITS = ("per_state", "dense_slots")
"""The values of the manifest's "subset_bits" (format version 5); this
writer's is the last."""

# ---------------------------------------------------------------------------
# Layout.
MANIFEST_FILE = "manifest.json"
IR_FILE = "ir.txt"
NAMES_FILE = "names.jsonl"
ITEMS_DIR = "items"
ITEM_ARRAYS = ("row_item", "item_depth", "item_state", "removed")
"""The arrays of `liveness.ItemIndex` an artifact may hold (item_depth and
item_state for variable-length sets only, removed after an update), one
.npy file each under ITEMS_DIR."""
TABLES_DIR = "tables"
MODULES_DIR = "modules"
MODULE_SUFFIX = ".jaxexport"

PLATFORMS = ("cpu", "cuda", "tpu")
"""Platforms every module is lowered for."""

BATCH_DIM = "b"
"""Name of the symbolic batch dimension in module shapes."""

SUBSET_DIM = "r"
"""Name of the symbolic dimension of stacked item subsets (subset modules)."""

MANIFEST_DIGEST_KEY = "manifest_sha256"
"""Key of the manifest's own checksum: sha256 of `manifest_bytes` of the
manifest without this key."""

BEAM_MODULE_KINDS = ("init", "beam_step", "beam_step_subset")
"""Module kinds exported once per beam size, named ``{kind}_m{M}``."""

STEP_KINDS = ("beam_step", "beam_step_subset")
"""Module kinds that record the per-step caps they apply."""

_HASH_CHUNK = 1 << 20


def table_file(layer: int, name: str) -> str:
    """Relative path of table `name` of `layer`."""
    return f"{TABLES_DIR}/layer{layer}.{name}.npy"


def module_file(name: str) -> str:
    """Relative path of module `name`."""
    return f"{MODULES_DIR}/{name}{MODULE_SUFFIX}"


def beam_module_name(kind: str, beam_size: int) -> str:
    """``{kind}_m{beam_size}``: the name of a per-beam-size module."""
    return f"{kind}_m{beam_size}"


def subset_module_name(name: str) -> str:
    """The name of module `name`'s item-subset variant: ``mask_subset``,
    ``beam_step_subset_m{M}``."""
    kind, sep, beams = name.rpartition("_m")
    return f"{kind}_subset_m{beams}" if sep and kind in BEAM_MODULE_KINDS else f"{name}_subset"


def item_file(name: str) -> str:
    """Relative path of item array `name` (one of ITEM_ARRAYS)."""
    return f"{ITEMS_DIR}/{name}.npy"


def table_keys(tables) -> list[tuple[int, str]]:
    """[(layer, name)] of every table in `tables` (one dict per layer), in
    module argument order: by layer, then by name."""
    return [(t, name) for t, layer in enumerate(tables) for name in sorted(layer)]


def unflatten_tables(keys: list[tuple[int, str]], num_layers: int, flat) -> tuple[dict, ...]:
    """The inverse of flattening by `table_keys`: one dict per layer."""
    out = [{} for _ in range(num_layers)]
    for (t, name), arr in zip(keys, flat):
        out[t][name] = arr
    return tuple(out)


# ---------------------------------------------------------------------------
# Checksums and the file set.


def _file_sha256(f) -> str:
    """Hex sha256 of an open binary file from its start, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    f.seek(0)
    for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path) -> str:
    """Hex sha256 of the file at `path`."""
    with open(path, "rb") as f:
        return _file_sha256(f)


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


def manifest_bytes(manifest: dict) -> bytes:
    """The canonical bytes of a manifest (sorted keys, one-space indent)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def seal_manifest(manifest: dict) -> bytes:
    """manifest.json bytes with the manifest's own checksum added."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST_KEY}
    return manifest_bytes({**body, MANIFEST_DIGEST_KEY: hashlib.sha256(
        manifest_bytes(body)).hexdigest()})


# ---------------------------------------------------------------------------
# Schema.


def format_error(path, message: str) -> ArtifactFormatError:
    """An ArtifactFormatError naming the artifact at `path`."""
    return ArtifactFormatError(f"artifact {str(path)!r}: {message}")


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def require(mapping, key: str, types, where: str, path):
    """mapping[key], which must exist and be of `types` (a bool is not an int
    unless bool is listed). Raises ArtifactFormatError naming the key."""
    if not isinstance(mapping, dict) or key not in mapping:
        raise format_error(path, f"{where} has no key {key!r}")
    value = mapping[key]
    if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
        names = " or ".join(t.__name__ for t in _as_tuple(types))
        raise format_error(path, f"{where}[{key!r}] is {value!r} ({type(value).__name__}), "
                                 f"expected {names}")
    return value


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """One module argument or result: name, shape (ints, `BATCH_DIM` for the
    batch), dtype name."""

    name: str
    shape: tuple
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, obj, where: str, path) -> "ArraySpec":
        return cls(name=require(obj, "name", str, where, path),
                   shape=tuple(require(obj, "shape", list, where, path)),
                   dtype=require(obj, "dtype", str, where, path))


@dataclasses.dataclass(frozen=True)
class TableEntry:
    """One table file: its layer, name, file, shape and dtype."""

    layer: int
    name: str
    file: str
    shape: tuple
    dtype: str

    def to_json(self) -> dict:
        return {"layer": self.layer, "name": self.name, "file": self.file,
                "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, obj, where: str, path) -> "TableEntry":
        return cls(layer=require(obj, "layer", int, where, path),
                   name=require(obj, "name", str, where, path),
                   file=require(obj, "file", str, where, path),
                   shape=tuple(require(obj, "shape", list, where, path)),
                   dtype=require(obj, "dtype", str, where, path))


@dataclasses.dataclass(frozen=True)
class ModuleEntry:
    """One exported module: its file, kind (`BEAM_MODULE_KINDS`, "mask" or
    "advance"), platforms, calling convention (args and results in order),
    and for per-beam-size modules the beam size (and, for beam_step, the
    per-step caps it applies: a list of None or ints, one per step; artifacts
    written before the step-0 rule record the exported int or None)."""

    file: str
    kind: str
    platforms: tuple
    args: tuple
    results: tuple
    beam_size: Optional[int] = None
    tokens_per_beam: Optional[int] = None

    def to_json(self) -> dict:
        out = {"file": self.file, "kind": self.kind, "platforms": list(self.platforms),
               "args": [a.to_json() for a in self.args],
               "results": [r.to_json() for r in self.results]}
        if self.beam_size is not None:
            out["beam_size"] = self.beam_size
        if self.kind in STEP_KINDS:
            out["tokens_per_beam"] = self.tokens_per_beam
        return out

    @classmethod
    def from_json(cls, name: str, obj, path) -> "ModuleEntry":
        where = f"modules[{name!r}]"
        kind = require(obj, "kind", str, where, path)
        beam_size = tokens_per_beam = None
        if kind in BEAM_MODULE_KINDS:
            beam_size = require(obj, "beam_size", int, where, path)
            if name != beam_module_name(kind, beam_size):
                raise format_error(path, f"module {name!r} records kind {kind!r} and beam size "
                                         f"{beam_size}, expected the name "
                                         f"{beam_module_name(kind, beam_size)}")
        if kind in STEP_KINDS and "tokens_per_beam" in obj:
            tokens_per_beam = require(obj, "tokens_per_beam", (int, type(None), list), where, path)
        specs = lambda key: tuple(ArraySpec.from_json(a, f"{where}[{key!r}][{i}]", path)
                                  for i, a in enumerate(require(obj, key, list, where, path)))
        return cls(file=require(obj, "file", str, where, path), kind=kind,
                   platforms=tuple(require(obj, "platforms", list, where, path)),
                   args=specs("args"), results=specs("results"), beam_size=beam_size,
                   tokens_per_beam=tokens_per_beam)


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """Size in bytes and hex sha256 of one file of the artifact."""

    size: int
    sha256: str

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, obj, where: str, path) -> "FileEntry":
        return cls(size=require(obj, "size", int, where, path),
                   sha256=require(obj, "sha256", str, where, path))

    @classmethod
    def of_bytes(cls, data: bytes) -> "FileEntry":
        return cls(size=len(data), sha256=hashlib.sha256(data).hexdigest())


_SCALARS = (("jax_version", str), ("jaxlib_version", str), ("calling_convention_version", int),
            ("batch_dim", str), ("pad_token", int), ("sentinel_score", float), ("pipeline", str),
            ("vocab_size", int), ("max_length", int), ("depth", int),
            ("end_token", (int, type(None))), ("num_sequences", int), ("num_final_states", int))


def _mesh_record(record: Optional[dict], path) -> Optional[dict]:
    """The manifest's "mesh" value, checked (see the version history)."""
    if record is None:
        return None
    where = f"{MANIFEST_FILE}['mesh']"
    axes = require(record, "axes", list, where, path)
    if not axes or any(not isinstance(a, list) or len(a) != 2 or not isinstance(a[0], str)
                       or isinstance(a[1], bool) or not isinstance(a[1], int) or a[1] < 1
                       for a in axes) or len({a[0] for a in axes}) != len(axes):
        raise format_error(path, f"{where}['axes'] is {axes!r}: expected [[name, size >= 1], "
                                 "...] with distinct names")
    axis = require(record, "table_axis", str, where, path)
    if axis not in {a[0] for a in axes}:
        raise format_error(path, f"{where}['table_axis'] {axis!r} is not one of the axes "
                                 f"{[a[0] for a in axes]}")
    split = require(record, "split_tables", list, where, path)
    if any(not isinstance(k, str) or not re.fullmatch(r"layer\d+\.[a-z_]+", k) for k in split):
        raise format_error(path, f"{where}['split_tables'] is {split!r}: expected "
                                 "[\"layer{t}.{name}\", ...]")
    min_bytes = require(record, "min_bytes", int, where, path)
    return {"axes": [[a[0], a[1]] for a in axes], "table_axis": axis,
            "split_tables": sorted(split), "min_bytes": min_bytes}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """manifest.json, typed. `plan_steps` (the backend's static plan, one dict
    per layer) and `layers` (per-layer statistics, layout text and table
    names) are plain JSON objects; with the tables they determine the
    automaton (`static_compiler.backend.lowering.automaton_from_tables`)."""

    jax_version: str
    jaxlib_version: str
    calling_convention_version: int
    platforms: tuple
    batch_dim: str
    pad_token: int
    sentinel_score: float
    pipeline: str
    vocab_size: int
    max_length: int
    depth: int
    end_token: Optional[int]
    num_sequences: int
    num_final_states: int
    plan_steps: tuple
    layers: tuple
    tables: tuple
    modules: dict
    files: dict
    names_file: Optional[str] = None
    item_files: Optional[dict] = None
    mesh: Optional[dict] = None
    subset_bits: str = SUBSET_BITS[-1]
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        """The JSON object (without the manifest's own checksum)."""
        out = {key: getattr(self, key) for key, _ in _SCALARS}
        out.update(format=self.format, format_version=self.format_version,
                   platforms=list(self.platforms), plan_steps=list(self.plan_steps),
                   layers=list(self.layers), tables=[t.to_json() for t in self.tables],
                   modules={name: m.to_json() for name, m in sorted(self.modules.items())},
                   files={rel: f.to_json() for rel, f in sorted(self.files.items())})
        if self.format_version >= 2:
            out["names_file"] = self.names_file
        if self.format_version >= 3:
            out["item_files"] = None if self.item_files is None else dict(sorted(
                self.item_files.items()))
        if self.format_version >= 4:
            out["mesh"] = self.mesh
        if self.format_version >= 5:
            out["subset_bits"] = self.subset_bits
        return out

    def seal(self) -> bytes:
        """The bytes of manifest.json."""
        return seal_manifest(self.to_json())

    @classmethod
    def from_json(cls, obj: dict, path) -> "Manifest":
        """Checks every key's type; raises ArtifactFormatError naming the key."""
        where = MANIFEST_FILE
        scalars = {key: require(obj, key, types, where, path) for key, types in _SCALARS}
        files = require(obj, "files", dict, where, path)
        modules = require(obj, "modules", dict, where, path)
        version = require(obj, "format_version", int, where, path)
        out = cls(
            **scalars,
            format=require(obj, "format", str, where, path),
            format_version=version,
            names_file=(require(obj, "names_file", (str, type(None)), where, path)
                        if version >= 2 else None),
            item_files=(require(obj, "item_files", (dict, type(None)), where, path)
                        if version >= 3 else None),
            mesh=(_mesh_record(require(obj, "mesh", (dict, type(None)), where, path), path)
                  if version >= 4 else None),
            subset_bits=(require(obj, "subset_bits", str, where, path) if version >= 5
                         else SUBSET_BITS[0]),
            platforms=tuple(require(obj, "platforms", list, where, path)),
            plan_steps=tuple(require(obj, "plan_steps", list, where, path)),
            layers=tuple(require(obj, "layers", list, where, path)),
            tables=tuple(TableEntry.from_json(t, f"tables[{i}]", path)
                         for i, t in enumerate(require(obj, "tables", list, where, path))),
            modules={name: ModuleEntry.from_json(name, m, path)
                     for name, m in sorted(modules.items())},
            files={rel: FileEntry.from_json(f, f"files[{rel!r}]", path)
                   for rel, f in sorted(files.items())})
        for what, rel in [(f"tables[{i}]", t.file) for i, t in enumerate(out.tables)] + \
                [(f"modules[{n!r}]", m.file) for n, m in out.modules.items()] + \
                [("names_file", rel) for rel in [out.names_file] if rel is not None] + \
                [(f"item_files[{k!r}]", rel) for k, rel in (out.item_files or {}).items()]:
            if rel not in out.files:
                raise format_error(path, f"{what} names file {rel!r}, which is not among the "
                                         f"manifest's files {sorted(out.files)}")
        if out.subset_bits not in SUBSET_BITS:
            raise format_error(path, f"{MANIFEST_FILE}['subset_bits'] is {out.subset_bits!r}: "
                                     f"expected one of {list(SUBSET_BITS)}")
        if out.mesh is not None:
            tables = {f"layer{t.layer}.{t.name}" for t in out.tables}
            unknown = sorted(set(out.mesh["split_tables"]) - tables)
            if unknown:
                raise format_error(path, f"{MANIFEST_FILE}['mesh'] splits {unknown}, which are "
                                         "not among the tables")
        out.check_plan(path)
        return out

    def check_plan(self, path) -> None:
        """The set's metadata agrees with itself and with the tables' shapes:
        depth = plan steps = layers; max_length = depth (+ 1 with an end
        token); the end token is a token; each step's next states are the
        next step's states, the root is one state, the final states fit the
        last step; every table has the shape its step's kind and state count
        give it. ArtifactFormatError naming the field otherwise (a manifest
        edited after the fact decoded the tables under another plan)."""
        depth, steps = self.depth, self.plan_steps
        problem = None
        counts = [(st.get("num_states"), st.get("num_next_states")) if isinstance(st, dict)
                  else (None, None) for st in steps]
        if not depth >= 1 or len(steps) != depth or len(self.layers) != depth:
            problem = (f"depth {depth}, {len(steps)} plan_steps and {len(self.layers)} layers: "
                       "expected one step and one layer per depth")
        elif self.max_length != depth + (self.end_token is not None):
            problem = (f"max_length {self.max_length} with depth {depth} and end_token "
                       f"{self.end_token}: expected {depth + (self.end_token is not None)}")
        elif self.end_token is not None and not 0 <= self.end_token < self.vocab_size:
            problem = f"end_token {self.end_token} is not a token in [0, {self.vocab_size})"
        elif any(not isinstance(n, int) or n < 0 for pair in counts for n in pair):
            problem = "plan_steps need int num_states and num_next_states >= 0"
        elif counts[0][0] != 1 or any(counts[t][1] != counts[t + 1][0]
                                       for t in range(depth - 1)):
            problem = (f"plan_steps' state counts {counts} do not chain (root: 1 state; each "
                       "step's next states are the next step's states)")
        elif not 0 <= self.num_final_states <= counts[-1][1] or self.num_sequences < 1:
            problem = (f"num_final_states {self.num_final_states} / num_sequences "
                       f"{self.num_sequences} do not fit the last step's "
                       f"{counts[-1][1]} next states")
        if problem is None:
            problem = self._table_shape_problem(counts)
        if problem is not None:
            raise format_error(path, f"{MANIFEST_FILE}: {problem}")

    def check_sequence_count(self, tables, path) -> None:
        """For a trie (every step numbers its targets implicitly), the
        sequence count is the final states plus the accepting ones:
        ArtifactFormatError when `num_sequences` says otherwise. tables: one
        dict of arrays per layer (`read_tables`); O(states)."""
        if any(st.get("explicit_targets", True) for st in self.plan_steps):
            return  # states shared between sequences: no cheap count
        count = self.num_final_states + sum(int(np.count_nonzero(t["accepting"]))
                                            for t in tables if "accepting" in t)
        if count != self.num_sequences:
            raise format_error(path, f"{MANIFEST_FILE}: num_sequences {self.num_sequences}, but "
                                     f"the tables end {count} sequences")

    def _table_shape_problem(self, counts) -> Optional[str]:
        """The first table whose shape disagrees with its step, or None."""
        V = self.vocab_size
        for table in self.tables:
            if not 0 <= table.layer < self.depth:
                return f"table {table.file!r} is for layer {table.layer}, outside the depth"
            S = counts[table.layer][0]
            kind = self.plan_steps[table.layer].get("kind")
            want = {"next": (S, V), "accepting": (S,),
                    "indptr": (S + 1,)}.get(table.name)
            if table.name == "tokens" and kind == "unary":
                want = (S,)
            if want is not None and tuple(table.shape) != want:
                return (f"table {table.file!r} has shape {list(table.shape)}; layer "
                        f"{table.layer}'s step ({kind}, {S} states) gives it {list(want)}")
        return None

    def beam_sizes(self) -> tuple[int, ...]:
        """Beam sizes with an exported beam_step module, ascending."""
        return tuple(sorted(m.beam_size for m in self.modules.values() if m.kind == "beam_step"))

    def missing_modules(self) -> list[str]:
        """Modules every artifact must have that this manifest does not list:
        mask, advance, and init_m{M} for each beam_step_m{M}."""
        expected = {"mask", "advance"} | {beam_module_name("init", m) for m in self.beam_sizes()}
        if self.item_files is not None:  # subsets: every module's subset variant
            expected |= {subset_module_name(name) for name in expected if not name.startswith("init")}
        return sorted(expected - set(self.modules))


# ---------------------------------------------------------------------------
# Text catalogues: names.jsonl.


_LINE_BREAK_ESCAPES = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""str.translate table for names.jsonl: the line breaks str.splitlines
knows that JSON allows raw in a string (U+0085, U+2028, U+2029) -> their
JSON escapes. The others (U+000A to U+000D, U+001C to U+001E) are control
characters, which json.dumps escapes itself."""


@dataclasses.dataclass(frozen=True, eq=False)
class NameTable:
    """The names of a text catalogue's items, and their token ids.

    Items here are the catalogue's unique token sequences, in the order the
    compiled set numbers them (row u is unique sequence u of its
    `liveness.ItemIndex`; the item index maps each name given to its row).

    Attributes:
      names: one name per item (the first of the names that encode to its tokens).
      tokens: int32 (items, width): the items' token ids, -1 past an item's
        end, rows sorted (a prefix before its extensions) and unique.
      aliases: per item, the other names that encode to the same tokens (in
        input order; usually empty).
    """

    names: tuple
    tokens: np.ndarray
    aliases: tuple

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"NameTable({len(self)} names, up to {self.tokens.shape[1]} tokens)"

    @property
    def lengths(self) -> np.ndarray:
        """int64 (items,): tokens per item."""
        return (self.tokens >= 0).sum(axis=1)

    def _index(self) -> dict:
        """{row bytes: item}, built on first use."""
        index = self.__dict__.get("_by_tokens")
        if index is None:
            index = {row.tobytes(): i for i, row in enumerate(self.tokens)}
            object.__setattr__(self, "_by_tokens", index)
        return index

    def _rows(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """tokens int (n, T) and lengths (n,) -> int32 (n, width) in the
        table's padding (-1 past each length); rows longer than the widest item
        are all -2, which matches no item."""
        width = self.tokens.shape[1]
        out = np.full((tokens.shape[0], width), -1, np.int32)
        take = min(width, tokens.shape[1])
        out[:, :take] = tokens[:, :take]
        out[np.arange(width)[None, :] >= lengths[:, None]] = -1
        out[lengths > width] = -2
        return out

    def name_of(self, tokens) -> Optional[str]:
        """The name of the item with these token ids (end token excluded), or None."""
        row = np.asarray(tokens, np.int64).reshape(1, -1)
        i = self._index().get(self._rows(row, np.asarray([row.shape[1]]))[0].tobytes())
        return None if i is None else self.names[i]

    def texts(self, result) -> list:
        """The names a decoding result holds: nested lists shaped like
        `result.valid` (batch, beams) of str, None where a beam is invalid.

        `result` has `tokens` int (..., T), `valid` bool (...) and `lengths`
        int (...), e.g. a DecodeResult. Raises DecodeInputError when the
        shapes disagree or a valid beam holds a sequence that is no item (a
        result from another set)."""
        tokens = np.asarray(result.tokens)
        valid = np.asarray(result.valid, bool)
        lengths = np.asarray(result.lengths)
        if tokens.ndim < 1 or tokens.shape[:-1] != valid.shape or lengths.shape != valid.shape:
            raise DecodeInputError(
                f"texts: tokens {list(tokens.shape)}, valid {list(valid.shape)} and lengths "
                f"{list(lengths.shape)} do not describe one result (expected tokens (..., T) "
                "with valid and lengths (...))")
        flat = tokens.reshape(-1, tokens.shape[-1]).astype(np.int64)
        rows = self._rows(flat, lengths.reshape(-1).astype(np.int64))
        index = self._index()
        out = []
        for i, (ok, row) in enumerate(zip(valid.reshape(-1), rows)):
            item = index.get(row.tobytes()) if ok else None
            if ok and item is None:
                at = tuple(int(x) for x in np.unravel_index(i, valid.shape))
                seq = [int(t) for t in flat[i, :int(lengths.reshape(-1)[i])]]
                raise DecodeInputError(f"texts: beam {at} holds tokens {seq}, which are no item "
                                       f"of this catalogue of {len(self)} names (a result of "
                                       "another set?)")
            out.append(None if item is None else self.names[item])
        shaped = np.empty(len(out), dtype=object)
        shaped[:] = out
        return shaped.reshape(valid.shape).tolist()

    def to_jsonl(self) -> bytes:
        """The bytes of names.jsonl: UTF-8, one object per item, sorted keys,
        each line ended by a line feed alone. JSON leaves U+0085, U+2028 and
        U+2029 raw inside strings, but line-splitting readers (str.splitlines,
        many JSON Lines tools) break lines there, so they are written escaped
        (`_LINE_BREAK_ESCAPES`); the bytes depend on the table alone."""
        lines = []
        for name, row, aliases in zip(self.names, self.tokens, self.aliases):
            obj = {"name": name, "tokens": [int(t) for t in row if t >= 0]}
            if aliases:
                obj["aliases"] = list(aliases)
            line = json.dumps(obj, ensure_ascii=False, sort_keys=True)
            lines.append(line.translate(_LINE_BREAK_ESCAPES) + "\n")
        return "".join(lines).encode("utf-8")

    @classmethod
    def from_jsonl(cls, data: bytes, path, rel: str = NAMES_FILE) -> "NameTable":
        """Parses names.jsonl; raises ArtifactFormatError naming the line.

        Lines are split on line feeds only (a final one ends the last
        line), not on every Unicode line break as str.splitlines does: a
        name holding U+0085, U+2028 or U+2029 raw (as writers before the
        escapes wrote it) is inside its JSON string, not a line end."""
        names, rows, aliases = [], [], []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise format_error(path, f"{rel} is not UTF-8 ({e})") from None
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            where = f"{rel} line {number}"
            try:
                obj = json.loads(line, parse_constant=_reject_constant)
            except ValueError as e:
                raise format_error(path, f"{where} is not JSON ({e})") from None
            name = require(obj, "name", str, where, path)
            tokens = require(obj, "tokens", list, where, path)
            more = obj.get("aliases", [])
            if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                     for t in tokens):
                raise format_error(path, f"{where}: tokens {tokens!r} are not a non-empty list "
                                         "of token ids")
            if not isinstance(more, list) or not all(isinstance(a, str) for a in more):
                raise format_error(path, f"{where}: aliases {more!r} are not a list of str")
            names.append(name)
            rows.append(tokens)
            aliases.append(tuple(more))
        width = max((len(r) for r in rows), default=1)
        matrix = np.full((len(rows), width), -1, np.int32)
        for i, r in enumerate(rows):
            matrix[i, :len(r)] = r
        return cls(tuple(names), matrix, tuple(aliases))


def read_names(snap: "Snapshot") -> Optional[NameTable]:
    """The artifact's `NameTable`, or None when it has none (a set compiled
    from token ids, or a version 1 artifact). Raises ArtifactFormatError when
    the file does not parse or its item count differs from the manifest's."""
    manifest, path = snap.manifest, snap.path
    if manifest.names_file is None:
        return None
    table = NameTable.from_jsonl(snap.read_bytes(manifest.names_file), path,
                                 manifest.names_file)
    if len(table) != manifest.num_sequences:
        raise format_error(path, f"{manifest.names_file} holds {len(table)} names, the manifest "
                                 f"records {manifest.num_sequences} sequences")
    return table


# ---------------------------------------------------------------------------
# Item subsets: items/*.npy.


def read_item_arrays(snap: "Snapshot") -> Optional[dict]:
    """{name: array} of the artifact's item index (`ITEM_ARRAYS`, as
    `liveness.ItemIndex` takes them; files verified with the rest), or None
    when it was saved without subsets. Raises ArtifactFormatError when an
    array is unreadable or disagrees with the manifest's set (ids out of
    range, depths or states outside the set)."""
    manifest, path = snap.manifest, snap.path
    if manifest.item_files is None:
        return None
    arrays = {}
    for key, rel in manifest.item_files.items():
        if key not in ITEM_ARRAYS:
            raise format_error(path, f"item_files names {key!r}, expected one of "
                                     f"{list(ITEM_ARRAYS)}")
        arrays[key] = snap.npy(rel, mmap=False)
    if "row_item" not in arrays or ("item_depth" in arrays) != ("item_state" in arrays):
        raise format_error(path, f"item_files {sorted(arrays)}: expected row_item, and "
                                 "item_depth with item_state (a variable-length set)")
    n = manifest.num_sequences
    row_item, depth, state = arrays["row_item"], arrays.get("item_depth"), arrays.get("item_state")
    removed = arrays.get("removed")
    problem = None
    if removed is not None and (removed.dtype != bool or removed.shape != (n,)):
        problem = f"removed must be bool ({n},)"
    elif row_item.ndim != 1 or row_item.dtype.kind != "i" or \
            (row_item.size and (row_item.min() < 0 or row_item.max() >= n)):
        problem = f"row_item must be ints in [0, {n}) (the set's {n} sequences)"
    elif depth is None and n != manifest.num_final_states:
        problem = "a fixed-length set's items must be its final states"
    elif depth is not None:
        sizes = [s["num_states"] for s in manifest.plan_steps] + [manifest.num_final_states]
        if depth.shape != (n,) or state.shape != (n,) or depth.min(initial=1) < 1 or \
                depth.max(initial=1) > manifest.depth or \
                (state < 0).any() or (state >= np.asarray(sizes)[depth]).any():
            problem = (f"item_depth / item_state must be ({n},) depths in [1, {manifest.depth}] "
                       "and state ids within their depth")
    if problem:
        raise format_error(path, f"items: {problem}")
    return {"row_item": row_item, "item_depth": depth, "item_state": state, "removed": removed}


# ---------------------------------------------------------------------------
# Reading.


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


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

    path: the artifact's path as given; manifest: its `Manifest`. The
    version directory opened stays open (`is_current`, `link_into`)."""

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
    format version is in [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION]; the
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
        return Snapshot(path, Manifest.from_json(body, path), opened, os.dup(dir_fd))
    except BaseException:
        for f in opened.values():
            f.close()
        raise


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
        raise ArtifactVersionError(
            f"artifact {str(path)!r}: format version {version} is outside the range this reader "
            f"supports [{MIN_FORMAT_VERSION}, {MAX_FORMAT_VERSION}]; use a static_compiler "
            "release that reads it, or re-save the artifact")
    cc = require(raw, "calling_convention_version", int, MANIFEST_FILE, path)
    if calling_conventions is not None:
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
    """`load_tables` as one dict of arrays per layer, keyed by table name."""
    manifest = snap.manifest
    keys = [(t.layer, t.name) for t in manifest.tables]
    return unflatten_tables(keys, len(manifest.layers), load_tables(snap, mmap))
