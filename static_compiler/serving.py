"""Serving loader for saved artifacts; it needs only jax, numpy and the
standard library, and of this package only `errors` (so a serving binary can
ship it with little else).

    from static_compiler import serving
    art = serving.load("fresh_items.static")     # verifies files, sizes, sha256, versions
    state = art.init_state(batch_size=2, beam_size=70)
    for step in range(art.max_length):
        logits = model(state.last_tokens)         # float (B, M, V)
        state = art.beam_step(state, logits, step)
    tokens, scores, valid, lengths = art.finalize(state)

SECURITY. A deserialized StableHLO module is a program: executing it runs
code chosen by whoever wrote the artifact. Load artifacts only from a trusted
source. The sha256 checksums in the manifest guard against corruption
(truncated copies, flipped bits), NOT against an attacker, who can rewrite
the manifest along with the files.

The artifact directory (written by `static_compiler.artifact.save`):

* ``manifest.json``: format name and version, jax/jaxlib versions, the
  jax.export calling-convention version, platforms, vocab size, max length,
  end token, per-layer layouts, pipeline spec, item count, the calling
  convention of every module, and the sha256 and size of every other file;
* ``ir.txt``: the IR dump (rows elided for large sets);
* ``tables/layer{t}.{name}.npy``: the lookup tables (``np.load(...,
  mmap_mode="r")`` works), in the order ``manifest["tables"]`` lists them;
* ``modules/{name}.jaxexport``: `jax.export` serialized modules, lowered for
  cpu, cuda and tpu together, polymorphic in the batch dimension ``b``:
  ``init_m{M}`` and ``beam_step_m{M}`` per exported beam size M, ``mask`` and
  ``advance``. ``manifest["modules"][name]["args"]`` gives each argument's
  name, shape (``"b"`` for the batch) and dtype, in call order; every module
  but ``init_m{M}`` takes all tables first and the step (int32 scalar) last.

Modules execute exactly what `static_compiler.backend.decode` does in
process (beam_step, mask, advance with the step as a traced argument), so
decoding through an artifact is bit-identical to `sc.beam_search` for the
same logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from static_compiler.errors import (ArtifactChecksumError, ArtifactFormatError, ArtifactVersionError,
                                    DecodeInputError)

# ---------------------------------------------------------------------------
# Format versions. `static_compiler.artifact.save` writes FORMAT_VERSION; this
# reader accepts [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION]. History:
#   1 (2026-11-29): manifest.json, ir.txt, tables/*.npy, modules/*.jaxexport;
#     modules init_m{M}, beam_step_m{M}, mask, advance; batch dimension "b".
FORMAT_NAME = "static-compiler-artifact"
FORMAT_VERSION = 1
MIN_FORMAT_VERSION = 1
MAX_FORMAT_VERSION = 1

MANIFEST_FILE = "manifest.json"
IR_FILE = "ir.txt"
BATCH_DIM = "b"
"""Name of the symbolic batch dimension in module shapes."""

STATE_FIELDS = ("tokens", "scores", "node", "valid", "finished", "lengths", "last_tokens",
                "parent")
PROCESSOR_FIELDS = ("node", "valid", "finished")

_HASH_CHUNK = 1 << 20


# ---------------------------------------------------------------------------
# State and results (same fields, in the same order, as backend.decode's).


class BeamState(NamedTuple):
    """Beam-search state (B = batch, M = beams, T = max length).

    tokens int32 (B, M, T); scores float32 (B, M); node int32 (B, M); valid
    bool (B, M); finished bool (B, M); lengths int32 (B, M); last_tokens int32
    (B, M): the tokens to feed the model next; parent int32 (B, M): the beam
    each beam came from at the last step (reorder KV caches with it)."""

    tokens: Any
    scores: Any
    node: Any
    valid: Any
    finished: Any
    lengths: Any
    last_tokens: Any
    parent: Any


class ProcessorState(NamedTuple):
    """Per-row state of the mask/advance pair: node int32 (B,), valid bool
    (B,), finished bool (B,)."""

    node: Any
    valid: Any
    finished: Any


class Result(NamedTuple):
    """tokens int32 (B, M, T) (-1 past the end); scores float32 (B, M),
    descending per row; valid bool (B, M); lengths int32 (B, M) without the
    end token."""

    tokens: Any
    scores: Any
    valid: Any
    lengths: Any


# ---------------------------------------------------------------------------
# Manifest and file checks


def _format_error(path, message: str) -> ArtifactFormatError:
    return ArtifactFormatError(f"artifact {str(path)!r}: {message}")


def _require(mapping: dict, key: str, types, where: str, path):
    if not isinstance(mapping, dict) or key not in mapping:
        raise _format_error(path, f"{where} has no key {key!r}")
    value = mapping[key]
    if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
        raise _format_error(path, f"{where}[{key!r}] is {value!r} ({type(value).__name__}), "
                                  f"expected {_type_names(types)}")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))


def sha256_file(path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(root) -> list:
    """Relative POSIX paths of every file under `root` (sorted), excluding
    the manifest."""
    root = pathlib.Path(root)
    out = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            rel = (pathlib.Path(dirpath) / name).relative_to(root).as_posix()
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


MANIFEST_DIGEST_KEY = "manifest_sha256"
"""Key of the manifest's own checksum: sha256 of `manifest_bytes` of the
manifest without this key."""


def manifest_bytes(manifest: dict) -> bytes:
    """The canonical bytes of a manifest (sorted keys, one-space indent)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def seal_manifest(manifest: dict) -> bytes:
    """manifest.json bytes with the manifest's own checksum added."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST_KEY}
    return manifest_bytes({**body, MANIFEST_DIGEST_KEY: hashlib.sha256(
        manifest_bytes(body)).hexdigest()})


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def read_manifest(path, *, verify_checksums: bool = True) -> dict:
    """Reads and checks `path`/manifest.json against the directory.

    Checks, in this order: the manifest is a JSON object of our format; the
    format version is in [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION]; the
    calling-convention version is one this jax can run; the manifest's own
    sha256; the files on disk are exactly those the manifest lists; each has
    the listed size and (unless `verify_checksums` is False) sha256.

    Raises ArtifactFormatError, ArtifactVersionError or ArtifactChecksumError,
    each naming the artifact, the file, what was expected and what was found.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise _format_error(path, "expected a directory written by static_compiler.artifact.save"
                                  f", found {'a file' if path.exists() else 'nothing'}")
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise _format_error(path, f"missing file {MANIFEST_FILE!r}")
    try:
        manifest = json.loads(manifest_path.read_bytes().decode("utf-8"),
                              parse_constant=_reject_constant)
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, NaN/Infinity
        raise _format_error(path, f"{MANIFEST_FILE} is not valid UTF-8 JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise _format_error(path, f"{MANIFEST_FILE} holds a {type(manifest).__name__}, "
                                  "expected a JSON object")
    fmt = manifest.get("format")
    if fmt != FORMAT_NAME:
        raise _format_error(path, f"{MANIFEST_FILE} format is {fmt!r}, expected {FORMAT_NAME!r}")
    version = _require(manifest, "format_version", int, MANIFEST_FILE, path)
    if not MIN_FORMAT_VERSION <= version <= MAX_FORMAT_VERSION:
        raise ArtifactVersionError(
            f"artifact {str(path)!r}: format version {version} is outside the range this reader "
            f"supports [{MIN_FORMAT_VERSION}, {MAX_FORMAT_VERSION}]; use a static_compiler "
            "release that reads it, or re-save the artifact")
    cc = _require(manifest, "calling_convention_version", int, MANIFEST_FILE, path)
    lo = jax_export.minimum_supported_calling_convention_version
    hi = jax_export.maximum_supported_calling_convention_version
    if not lo <= cc <= hi:
        raise ArtifactVersionError(
            f"artifact {str(path)!r}: jax.export calling-convention version {cc} cannot run on "
            f"jax {jax.__version__}, which supports [{lo}, {hi}] (the artifact was written by "
            f"jax {manifest.get('jax_version', '?')}); re-save it with this jax or use a matching one")
    digest = _require(manifest, MANIFEST_DIGEST_KEY, str, MANIFEST_FILE, path)
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST_KEY}
    actual = hashlib.sha256(manifest_bytes(body)).hexdigest()
    if actual != digest:
        raise ArtifactChecksumError(
            f"artifact {str(path)!r}: {MANIFEST_FILE} content has sha256 {actual}, its "
            f"{MANIFEST_DIGEST_KEY} says {digest} (the manifest is corrupted)")
    files = _require(manifest, "files", dict, MANIFEST_FILE, path)
    on_disk = list_files(path)
    missing = sorted(set(files) - set(on_disk))
    extra = sorted(set(on_disk) - set(files))
    if missing:
        raise _format_error(path, f"missing file(s) {missing} listed in {MANIFEST_FILE}")
    if extra:
        raise _format_error(path, f"extra file(s) {extra} not listed in {MANIFEST_FILE} "
                                  f"(expected exactly {sorted(files)})")
    for rel in sorted(files):
        entry = files[rel]
        size = _require(entry, "size", int, f"files[{rel!r}]", path)
        digest = _require(entry, "sha256", str, f"files[{rel!r}]", path)
        found = (path / rel).stat().st_size
        if found != size:
            what = "truncated" if found < size else "longer than recorded"
            raise ArtifactChecksumError(
                f"artifact {str(path)!r}: file {rel!r} is {what}: {found} bytes, expected {size}")
        if verify_checksums:
            actual = sha256_file(path / rel)
            if actual != digest:
                raise ArtifactChecksumError(
                    f"artifact {str(path)!r}: file {rel!r} has sha256 {actual}, expected {digest} "
                    "(the file is corrupted)")
    return manifest


def _listed_file(entry: dict, where: str, manifest: dict, path) -> str:
    """entry["file"], which must be one of the manifest's checked files."""
    rel = _require(entry, "file", str, where, path)
    if rel not in manifest.get("files", {}):
        raise _format_error(path, f"{where} names file {rel!r}, which is not among the "
                                  f"manifest's files {sorted(manifest.get('files', {}))}")
    return rel


def load_tables(path, manifest: dict, mmap_mode: Optional[str] = "r") -> list:
    """The tables as numpy arrays (memory-mapped by default), in argument
    order, each checked against the manifest's shape and dtype."""
    path = pathlib.Path(path)
    out = []
    for i, entry in enumerate(_require(manifest, "tables", list, MANIFEST_FILE, path)):
        rel = _listed_file(entry, f"tables[{i}]", manifest, path)
        try:
            arr = np.load(path / rel, mmap_mode=mmap_mode, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise _format_error(path, f"table {rel!r} is not a readable .npy file ({e})") from None
        want_shape = tuple(_require(entry, "shape", list, f"tables[{i}]", path))
        want_dtype = _require(entry, "dtype", str, f"tables[{i}]", path)
        if arr.shape != want_shape or str(arr.dtype) != want_dtype:
            raise _format_error(path, f"table {rel!r} holds {arr.dtype}{list(arr.shape)}, the "
                                      f"manifest says {want_dtype}{list(want_shape)}")
        out.append(arr)
    return out


def _aval_spec(aval) -> tuple:
    """(shape with symbolic dims as strings, dtype name) of an abstract value."""
    return [d if isinstance(d, int) else str(d) for d in aval.shape], str(aval.dtype)


def _current_platform() -> str:
    backend = jax.default_backend()
    if backend == "gpu":
        return "rocm" if "rocm" in jax.devices()[0].client.platform_version.lower() else "cuda"
    return backend


# ---------------------------------------------------------------------------
# Modules


class _Module:
    """One deserialized module with its calling convention; calls are checked
    against the convention before reaching XLA."""

    def __init__(self, name: str, exported, convention: dict):
        self.name = name
        self.exported = exported
        self.convention = convention
        self._call = jax.jit(exported.call)

    def __call__(self, tables, *args):
        specs = self.convention["args"][len(tables):]
        if len(args) != len(specs):
            raise DecodeInputError(f"{self.name}: got {len(args)} arguments after the tables, "
                                   f"expected {len(specs)} ({[s['name'] for s in specs]})")
        batch = None
        for value, spec in zip(args, specs):
            shape, dtype = tuple(np.shape(value)), str(jnp.result_type(value))
            want = spec["shape"]
            if len(shape) == len(want) and batch is None and BATCH_DIM in want:
                batch = shape[want.index(BATCH_DIM)]
            expect = tuple((BATCH_DIM if batch is None else batch) if d == BATCH_DIM else d
                           for d in want)
            if shape != expect or dtype != spec["dtype"]:
                raise DecodeInputError(
                    f"{self.name}: argument {spec['name']!r} is {dtype}{list(shape)}, expected "
                    f"{spec['dtype']}{list(expect)} (manifest shape {want}, b = batch size)")
        return self._call(*tables, *args)


def _check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low \
            or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise DecodeInputError(f"{name}={value!r}: expected an int {bound}")
    return int(value)


class Artifact:
    """A loaded artifact: tables on the device and the modules to run on them.

    Attributes:
      path: the artifact directory.
      manifest: the parsed manifest.json.
      vocab_size: V, the model's vocabulary size.
      max_length: T, decoding steps (depth, plus one with an end token).
      end_token: the end token, or None for fixed-length sets.
      num_sequences: the size of the compiled set.
      beam_sizes: beam sizes with an exported beam_step module.
      tables: the tables as device arrays, in argument order.
      modules: name -> deserialized `jax.export.Exported`.
    """

    def __init__(self, path, manifest: dict, tables: list, modules: dict):
        self.path = pathlib.Path(path)
        self.manifest = manifest
        self.vocab_size = int(manifest["vocab_size"])
        self.max_length = int(manifest["max_length"])
        self.end_token = manifest["end_token"]
        self.num_sequences = int(manifest["num_sequences"])
        self.tables = tuple(tables)
        self._modules = modules
        self.modules = {name: m.exported for name, m in modules.items()}
        self.beam_sizes = tuple(sorted(int(m.convention["beam_size"]) for m in modules.values()
                                       if m.convention["kind"] == "beam_step"))

    def __repr__(self):
        return (f"Artifact({str(self.path)!r}, vocab_size={self.vocab_size}, max_length="
                f"{self.max_length}, num_sequences={self.num_sequences}, beam_sizes="
                f"{self.beam_sizes})")

    def _beam_module(self, kind: str, beam_size: int) -> _Module:
        if beam_size not in self.beam_sizes:
            raise DecodeInputError(f"beam_size={beam_size}: this artifact exports beam sizes "
                                   f"{list(self.beam_sizes)} (compile with export_beam_sizes=... "
                                   "to add one)")
        return self._modules[f"{kind}_m{beam_size}"]

    def _step(self, step, where: str):
        if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
            return jnp.int32(_check_int(f"{where}: step", step, 0, self.max_length))
        shape, dtype = np.shape(step), jnp.result_type(step)
        if shape != () or not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
            raise DecodeInputError(f"{where}: step is {dtype}{list(shape)}, expected an int or "
                                   "an integer scalar (a traced step outside "
                                   f"[0, {self.max_length}) is clamped)")
        return jnp.asarray(step, jnp.int32)

    def _logits(self, logits, batch_shape: tuple, where: str):
        shape, dtype = tuple(np.shape(logits)), jnp.result_type(logits)
        want = tuple(batch_shape) + (self.vocab_size,)
        if shape != want:
            raise DecodeInputError(f"{where}: logits have shape {shape}, expected {want} "
                                   f"(batch dims {tuple(batch_shape)}, vocab {self.vocab_size})")
        if not jnp.issubdtype(dtype, jnp.floating):
            raise DecodeInputError(f"{where}: logits have dtype {dtype}, expected a float dtype "
                                   "(computed in float32)")
        return jnp.asarray(logits).astype(jnp.float32)

    @staticmethod
    def _state(state, fields: tuple, where: str) -> tuple:
        if not isinstance(state, tuple) or len(state) != len(fields):
            raise DecodeInputError(f"{where}: state is a {type(state).__name__}, expected a "
                                   f"tuple of {len(fields)} arrays {fields}")
        return tuple(state)

    # Beam search

    def init_state(self, batch_size: int, beam_size: int, start_token=0) -> BeamState:
        """All beams at the root; only beam 0 of each row is valid.

        start_token: an int, or ints (batch_size,), one per row: the model's
        `last_tokens` at step 0."""
        batch_size = _check_int("batch_size", batch_size, 1)
        beam_size = _check_int("beam_size", beam_size, 1)
        start = np.asarray(start_token)
        if start.dtype.kind not in "iu" or start.shape not in ((), (batch_size,)) \
                or (start.size and (start.min() < -2 ** 31 or start.max() >= 2 ** 31)):
            raise DecodeInputError(f"init_state: start_token={start_token!r}, expected an int32 "
                                   f"value or ints of shape ({batch_size},)")
        module = self._beam_module("init", beam_size)
        start = jnp.asarray(np.broadcast_to(start, (batch_size,)).astype(np.int32))
        return BeamState(*module((), start))

    def beam_step(self, state: BeamState, logits, step) -> BeamState:
        """One beam-search step; jit-able.

        state: a BeamState (B, M) with M in `beam_sizes`; logits float (B, M,
        V) for `state.last_tokens`; step: an int in [0, max_length) or an
        int32 scalar (traced steps are clamped to that range)."""
        fields = self._state(state, STATE_FIELDS, "beam_step")
        B, M = np.shape(fields[2])[:2] if np.ndim(fields[2]) == 2 else (None, None)
        if B is None:
            raise DecodeInputError(f"beam_step: state.node has shape {np.shape(fields[2])}, "
                                   "expected (batch, beams)")
        logits = self._logits(logits, (B, M), "beam_step")
        step = self._step(step, "beam_step")
        module = self._beam_module("beam_step", M)
        return BeamState(*module(self.tables, *fields, logits, step))

    @staticmethod
    def finalize(state: BeamState) -> Result:
        """(tokens, scores, valid, lengths) of the final state; beams are
        already sorted by score, best first."""
        fields = Artifact._state(state, STATE_FIELDS, "finalize")
        s = BeamState(*fields)
        return Result(s.tokens, s.scores, s.valid, s.lengths)

    # Logits-processor pair

    @staticmethod
    def init_processor_state(batch_size: int) -> ProcessorState:
        """Every row at the root, valid, not finished."""
        batch_size = _check_int("batch_size", batch_size, 1)
        return ProcessorState(node=jnp.zeros((batch_size,), jnp.int32),
                              valid=jnp.ones((batch_size,), bool),
                              finished=jnp.zeros((batch_size,), bool))

    def mask(self, logits, state: ProcessorState, step):
        """logits float (B, V) -> float32 (B, V): allowed tokens keep their
        logit, the others get the sentinel score (-1e30)."""
        fields = self._state(state, PROCESSOR_FIELDS, "mask")
        logits = self._logits(logits, tuple(np.shape(fields[0])[:1]), "mask")
        return self._modules["mask"](self.tables, logits, *fields, self._step(step, "mask"))[0]

    def advance(self, state: ProcessorState, tokens, step) -> ProcessorState:
        """Moves each row along its chosen token, int (B,); a disallowed token
        marks the row invalid."""
        fields = self._state(state, PROCESSOR_FIELDS, "advance")
        dtype = jnp.result_type(tokens)
        if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
            raise DecodeInputError(f"advance: tokens have dtype {dtype}, expected an int dtype")
        tokens = jnp.asarray(tokens).astype(jnp.int32)
        out = self._modules["advance"](self.tables, *fields, tokens, self._step(step, "advance"))
        return ProcessorState(*out)


def load(path, *, verify_checksums: bool = True, device=None) -> Artifact:
    """Loads an artifact for serving.

    Verifies the manifest, file set, sizes, sha256 checksums (skip them with
    verify_checksums=False for huge tables already verified once), format and
    calling-convention versions, that the modules were lowered for this
    platform and match their recorded calling convention; then puts the
    tables on `device` (default: jax's default device) once.

    Raises ArtifactFormatError, ArtifactChecksumError or ArtifactVersionError.
    Only load artifacts from a trusted source (see the module docstring).
    """
    path = pathlib.Path(path)
    manifest = read_manifest(path, verify_checksums=verify_checksums)
    for key, types in (("vocab_size", int), ("max_length", int), ("num_sequences", int),
                       ("end_token", (int, type(None))), ("modules", dict), ("platforms", list)):
        _require(manifest, key, types, MANIFEST_FILE, path)
    platform = _current_platform()
    if platform not in manifest["platforms"]:
        raise _format_error(path, f"modules were lowered for {manifest['platforms']}, this "
                                  f"process runs on {platform!r}")
    tables = load_tables(path, manifest)
    modules = {}
    for name, conv in sorted(manifest["modules"].items()):
        rel = _listed_file(conv, f"modules[{name!r}]", manifest, path)
        try:
            exported = jax_export.deserialize(bytearray((path / rel).read_bytes()))
        except Exception as e:  # jax raises several types for a damaged flatbuffer
            raise _format_error(path, f"module {rel!r} cannot be deserialized "
                                      f"({type(e).__name__}: {e}); truncated or not a jax.export "
                                      "module") from None
        if exported.calling_convention_version != manifest["calling_convention_version"]:
            raise ArtifactVersionError(
                f"artifact {str(path)!r}: module {rel!r} has calling-convention version "
                f"{exported.calling_convention_version}, the manifest says "
                f"{manifest['calling_convention_version']}")
        found = [dict(zip(("shape", "dtype"), _aval_spec(a))) for a in exported.in_avals]
        want = [{"shape": a.get("shape"), "dtype": a.get("dtype")} if isinstance(a, dict) else a
                for a in _require(conv, "args", list, f"modules[{name!r}]", path)]
        if found != want:
            raise _format_error(path, f"module {rel!r} takes {found}, the manifest's calling "
                                      f"convention says {want}")
        kind = _require(conv, "kind", str, f"modules[{name!r}]", path)
        if kind in ("init", "beam_step"):
            beams = _require(conv, "beam_size", int, f"modules[{name!r}]", path)
            if name != f"{kind}_m{beams}":
                raise _format_error(path, f"module {name!r} records kind {kind!r} and beam size "
                                          f"{beams}, expected the name {kind}_m{beams}")
        modules[name] = _Module(name, exported, conv)
    expected = {"mask", "advance"} | {f"init_m{m.convention['beam_size']}" for m in
                                      modules.values() if m.convention["kind"] == "beam_step"}
    missing = sorted(expected - set(modules))
    if missing:
        raise _format_error(path, f"manifest lists no module(s) {missing}")
    device = device if device is not None else jax.devices()[0]
    device_tables = [jax.device_put(np.asarray(t), device) for t in tables]
    return Artifact(path, manifest, device_tables, modules)
