"""The manifest's schema: manifest.json as frozen dataclasses (`Manifest`,
with an entry per table, module and file), parsed with typed errors that
name the artifact, the key, what was expected and what was found, and
checked for agreement with itself (`Manifest.check_plan`). Standard
library and numpy only; the keys each format version adds are in the
history in `format`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Optional

import numpy as np

from static_compiler.format import manifest_records as records
from static_compiler.format.spec import (
    BEAM_MODULE_KINDS,
    COMPAT,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    PRIOR_KINDS,
    RESIZE_KINDS,
    STEP_KINDS,
    SUBSET_BITS,
    beam_module_name,
    beam_modules,
    format_error,
    is_ranked_module,
    ranked_module_name,
    require,
    seal_manifest,
    step_module_name,
    subset_module_name,
)


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
    written before the step-0 rule record the exported int or None); a
    resize module (`format.RESIZE_KINDS`, format version 13) also records
    the beams it keeps, beam_size_out."""

    file: str
    kind: str
    platforms: tuple
    args: tuple
    results: tuple
    beam_size: Optional[int] = None
    tokens_per_beam: Optional[int] = None
    beam_size_out: Optional[int] = None

    def to_json(self) -> dict:
        out = {"file": self.file, "kind": self.kind, "platforms": list(self.platforms),
               "args": [a.to_json() for a in self.args],
               "results": [r.to_json() for r in self.results]}
        if self.beam_size is not None:
            out["beam_size"] = self.beam_size
        if self.beam_size_out is not None:
            out["beam_size_out"] = self.beam_size_out
        if self.kind in STEP_KINDS:
            out["tokens_per_beam"] = self.tokens_per_beam
        return out

    @classmethod
    def from_json(cls, name: str, obj, path) -> "ModuleEntry":
        where = f"modules[{name!r}]"
        kind = require(obj, "kind", str, where, path)
        beam_size = tokens_per_beam = beam_size_out = None
        if kind in BEAM_MODULE_KINDS:
            beam_size = require(obj, "beam_size", int, where, path)
            if kind in RESIZE_KINDS:
                beam_size_out = require(obj, "beam_size_out", int, where, path)
            if name != beam_module_name(kind, beam_size, beam_size_out):
                raise format_error(path, f"module {name!r} records kind {kind!r} and beam size "
                                         f"{beam_size}, expected the name "
                                         f"{beam_module_name(kind, beam_size, beam_size_out)}")
        if kind in STEP_KINDS and "tokens_per_beam" in obj:
            tokens_per_beam = require(obj, "tokens_per_beam", (int, type(None), list), where, path)
        specs = lambda key: tuple(ArraySpec.from_json(a, f"{where}[{key!r}][{i}]", path)
                                  for i, a in enumerate(require(obj, key, list, where, path)))
        return cls(file=require(obj, "file", str, where, path), kind=kind,
                   platforms=tuple(require(obj, "platforms", list, where, path)),
                   args=specs("args"), results=specs("results"), beam_size=beam_size,
                   tokens_per_beam=tokens_per_beam, beam_size_out=beam_size_out)


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


_OPTIONAL = (str, type(None))
_SCALARS = (("jax_version", _OPTIONAL), ("jaxlib_version", _OPTIONAL),
            ("calling_convention_version", (int, type(None))),
            ("batch_dim", str), ("pad_token", int), ("sentinel_score", float), ("pipeline", str),
            ("vocab_size", int), ("max_length", int), ("depth", int),
            ("end_token", (int, type(None))), ("num_sequences", int), ("num_final_states", int))


def _has_key(version: int, key: str) -> bool:
    """Whether a manifest of format `version` has `key`, which format
    version COMPAT[key].last_version + 1 added (older ones read its
    default: `format.COMPAT`)."""
    return version > COMPAT[key].last_version


@dataclasses.dataclass(frozen=True)
class Manifest:
    """manifest.json, typed. `plan_steps` (the backend's static plan, one dict
    per layer) and `layers` (per-layer statistics, layout text and table
    names) are plain JSON objects; with the tables they determine the
    automaton (`static_compiler.target.raising.automaton_from_tables`)."""

    jax_version: Optional[str]
    jaxlib_version: Optional[str]
    calling_convention_version: Optional[int]
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
    exported_at: Optional[str] = None
    attributes: Optional[dict] = None
    beam_schedules: tuple = ()
    export_plan: Optional[dict] = None
    rows_in_item_order: Optional[bool] = None
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
        values = {"names_file": self.names_file, "mesh": self.mesh,
                  "subset_bits": self.subset_bits, "exported_at": self.exported_at,
                  "attributes": self.attributes,
                  "beam_schedules": [list(s) for s in self.beam_schedules],
                  "export_plan": None if self.export_plan is None else {
                      "beam_sizes": list(self.export_plan["beam_sizes"]),
                      "beam_schedules": [list(s) for s in self.export_plan["beam_schedules"]],
                      "tokens_per_beam": list(self.export_plan["tokens_per_beam"]),
                      "priors": self.export_plan["priors"]},
                  "rows_in_item_order": self.rows_in_item_order,
                  "item_files": None if self.item_files is None else dict(sorted(
                      self.item_files.items()))}
        out.update({key: value for key, value in values.items()
                    if _has_key(self.format_version, key)})
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
            # each key absent from older versions: its format.COMPAT row (the
            # version it came in, the date its branch goes)
            names_file=(require(obj, "names_file", (str, type(None)), where, path)
                        if _has_key(version, "names_file") else None),
            item_files=(require(obj, "item_files", (dict, type(None)), where, path)
                        if _has_key(version, "item_files") else None),
            mesh=(records.mesh_record(require(obj, "mesh", (dict, type(None)), where, path),
                                      path)
                  if _has_key(version, "mesh") else None),
            subset_bits=(require(obj, "subset_bits", str, where, path)
                         if _has_key(version, "subset_bits") else SUBSET_BITS[0]),
            exported_at=(records.iso_date(
                require(obj, "exported_at", (str, type(None)), where, path), path)
                if _has_key(version, "exported_at") else None),
            attributes=(records.checked_attributes_record(
                require(obj, "attributes", (dict, type(None)), where, path), path)
                if _has_key(version, "attributes") else None),
            beam_schedules=(records.schedules_record(
                require(obj, "beam_schedules", list, where, path), scalars["max_length"], path)
                if _has_key(version, "beam_schedules") else ()),
            export_plan=(records.export_plan_record(
                require(obj, "export_plan", (dict, type(None)), where, path),
                scalars["max_length"], path)
                if _has_key(version, "export_plan") else None),
            rows_in_item_order=(require(obj, "rows_in_item_order", (bool, type(None)), where,
                                        path)
                                if _has_key(version, "rows_in_item_order") else None),
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
                [(f"item_files[{k!r}]", rel) for k, rel in (out.item_files or {}).items()] + \
                [(f"attributes[{k!r}]", a["file"]) for k, a in (out.attributes or {}).items()]:
            if rel not in out.files:
                raise format_error(path, f"{what} names file {rel!r}, which is not among the "
                                         f"manifest's files {sorted(out.files)}")
        exporter = (out.jax_version, out.jaxlib_version, out.calling_convention_version)
        if not (out.modules and None not in exporter) and not (
                not out.modules and version >= 11 and
                all(field is None for field in exporter + (out.exported_at,))):
            raise format_error(path, f"{MANIFEST_FILE}: {len(out.modules)} modules with "
                                     f"jax_version {out.jax_version!r}, jaxlib_version "
                                     f"{out.jaxlib_version!r}, calling_convention_version "
                                     f"{out.calling_convention_version!r} and exported_at "
                                     f"{out.exported_at!r}: expected modules with all of "
                                     "them set (or, from format version 11, no modules and "
                                     "all of them null: a tables-only artifact)")
        if out.export_plan is not None and out.modules:
            raise format_error(path, f"{MANIFEST_FILE}: an export_plan beside "
                                     f"{len(out.modules)} modules: expected it null (the "
                                     "modules say what was exported; only a tables-only "
                                     "artifact records its plan)")
        if out.rows_in_item_order is not None and out.item_files is None:
            raise format_error(path, f"{MANIFEST_FILE}: rows_in_item_order is "
                                     f"{out.rows_in_item_order} without an item index "
                                     "(item_files null): expected null")
        if out.attributes is not None and out.item_files is None:
            raise format_error(path, f"{MANIFEST_FILE}: attributes {sorted(out.attributes)} "
                                     "without an item index (item_files null)")
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

    @property
    def tables_only(self) -> bool:
        """Whether the artifact holds no modules (format version 11: saved
        without jax): the torch backend and `sc.load` read it; a jax
        serving process needs `static-compiler re-export` first."""
        return not self.modules

    @functools.cached_property
    def exports_priors(self) -> bool:
        """Whether its step modules have item-prior variants (format version
        13, compile_constraints(export_priors=True)); read once (each prior
        step checks it)."""
        return any(m.kind in PRIOR_KINDS for m in self.modules.values())

    @functools.cached_property
    def exports_ranked(self) -> bool:
        """Whether its modules have ranked-subset variants (format version
        16: ``mask_ranked``, ``beam_step_ranked_m{M}`` ...; an artifact
        written before, or upgraded without `static-compiler re-export`,
        has none)."""
        return any(is_ranked_module(name) for name in self.modules)

    def missing_modules(self) -> list[str]:
        """Modules every artifact must have that this manifest does not list:
        mask, advance, init_m{M} for each beam_step_m{M}, the modules of
        each beam schedule (`format.beam_modules`), and with item priors
        every step module's prior variant."""
        inits, steps = beam_modules(self.beam_sizes() + self.beam_schedules)
        expected = {"mask", "advance"} | {beam_module_name("init", m) for m in inits} | \
            {step_module_name(m, w, prior=prior) for m, w in steps
             for prior in ((False, True) if self.exports_priors else (False,))}
        if self.item_files is not None:  # subsets: every module's subset variant
            plain = [name for name in expected if not name.startswith("init")]
            expected |= {subset_module_name(name) for name in plain}
            if self.exports_ranked:  # (and its ranked variant, where one is exported)
                expected |= {ranked_module_name(name) for name in plain}
        return sorted(expected - set(self.modules))
