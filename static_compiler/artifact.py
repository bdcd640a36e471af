"""Writing artifacts (`save`) and reading them back without jax (`read_automaton`,
for `static-compiler verify` and `show-ir`).

The directory layout, the manifest and the security note are documented in
`static_compiler.serving`, the loader; the format version and its history
live there too, so reader and writer share one definition.

`save` exports, with `jax.export` for ("cpu", "cuda", "tpu") at once and a
symbolic batch dimension ``b``, the modules (tables are arguments, never
constants, so the module bytes do not grow with the set):

============  =================================================================
init_m{M}     (start_tokens int32[b]) -> BeamState fields (b, M, ...)
beam_step_m{M}  (*tables, *BeamState fields, logits float32[b, M, V], step int32[])
              -> BeamState fields; `decode.beam_step_switch` with the compiled
              set's export_tokens_per_beam
mask          (*tables, logits float32[b, V], node, valid, finished, step)
              -> masked logits float32[b, V]
advance       (*tables, node, valid, finished, tokens int32[b], step)
              -> node, valid, finished
============  =================================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import pathlib
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from static_compiler import serving
from static_compiler.backend import decode
from static_compiler.backend.lowering import Plan
from static_compiler.errors import ArtifactExistsError, ArtifactFormatError, DecodeInputError
from static_compiler.ir import Automaton, Layer, Layout, verify

PLATFORMS = ("cpu", "cuda", "tpu")
"""Platforms every module is lowered for."""

TABLES_DIR = "tables"
MODULES_DIR = "modules"
MODULE_SUFFIX = ".jaxexport"

assert decode.BeamState._fields == serving.STATE_FIELDS
assert decode.ProcessorState._fields == serving.PROCESSOR_FIELDS


# ---------------------------------------------------------------------------
# Export


def table_keys(tables) -> list:
    """[(layer, name)] of every table, in module argument order (layer, then name)."""
    return [(t, name) for t, layer in enumerate(tables) for name in sorted(layer)]


def _unflatten_tables(keys: list, num_layers: int, flat) -> tuple:
    out = [{} for _ in range(num_layers)]
    for (t, name), arr in zip(keys, flat):
        out[t][name] = arr
    return tuple(out)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def export_modules(compiled) -> dict:
    """Exports the modules of `compiled`.

    Returns {name: (jax.export.Exported, argument names, result names)} in
    the order `save` writes them."""
    plan: Plan = compiled.plan
    keys = table_keys(compiled.tables)
    num_layers = len(compiled.tables)
    n = len(keys)
    table_specs = [_spec(compiled.tables[t][k].shape, compiled.tables[t][k].dtype) for t, k in keys]
    table_names = [f"table:layer{t}.{k}" for t, k in keys]
    b, = jax_export.symbolic_shape(serving.BATCH_DIM)
    T, V = plan.max_length, plan.vocab_size
    step_spec = _spec((), jnp.int32)
    tpb = compiled.export_tokens_per_beam
    state_names = [f"state.{f}" for f in serving.STATE_FIELDS]
    proc_names = [f"state.{f}" for f in serving.PROCESSOR_FIELDS]

    def export(fn, specs):
        with _no_source_locations():
            return jax_export.export(jax.jit(fn), platforms=PLATFORMS)(*specs)

    modules = {}
    for M in sorted(set(compiled.export_beam_sizes)):
        state_specs = [_spec((b, M, T), jnp.int32), _spec((b, M), jnp.float32)] + \
            [_spec((b, M), dt) for dt in (jnp.int32, bool, bool, jnp.int32, jnp.int32, jnp.int32)]

        def init(start_tokens, M=M):
            state = decode.init_beam_state(plan, start_tokens.shape[0], M)
            last = jnp.broadcast_to(start_tokens[:, None], state.last_tokens.shape)
            return tuple(state._replace(last_tokens=last))

        def step_fn(*args):
            tables = _unflatten_tables(keys, num_layers, args[:n])
            state = decode.BeamState(*args[n:n + 8])
            return tuple(decode.beam_step_switch(plan, tables, state, args[n + 8], args[n + 9], tpb))

        modules[f"init_m{M}"] = (export(init, [_spec((b,), jnp.int32)]), ["start_tokens"],
                                 state_names)
        modules[f"beam_step_m{M}"] = (
            export(step_fn, table_specs + state_specs + [_spec((b, M, V), jnp.float32), step_spec]),
            table_names + state_names + ["logits", "step"], state_names)

    proc_specs = [_spec((b,), jnp.int32), _spec((b,), bool), _spec((b,), bool)]

    def mask_fn(*args):
        tables = _unflatten_tables(keys, num_layers, args[:n])
        return (decode.mask_switch(plan, tables, args[n], decode.ProcessorState(*args[n + 1:n + 4]),
                                   args[n + 4]),)

    def advance_fn(*args):
        tables = _unflatten_tables(keys, num_layers, args[:n])
        return tuple(decode.advance_switch(plan, tables, decode.ProcessorState(*args[n:n + 3]),
                                           args[n + 3], args[n + 4]))

    modules["mask"] = (export(mask_fn, table_specs + [_spec((b, V), jnp.float32)] + proc_specs
                              + [step_spec]),
                       table_names + ["logits"] + proc_names + ["step"], ["masked_logits"])
    modules["advance"] = (export(advance_fn, table_specs + proc_specs
                                 + [_spec((b,), jnp.int32), step_spec]),
                          table_names + proc_names + ["tokens", "step"], proc_names)
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


def _convention(exported, arg_names: list, result_names: list) -> dict:
    def entries(avals, names):
        return [dict(name=name, **dict(zip(("shape", "dtype"), serving._aval_spec(a))))
                for name, a in zip(names, avals)]
    return {"args": entries(exported.in_avals, arg_names),
            "results": entries(exported.out_avals, result_names)}


# ---------------------------------------------------------------------------
# Save


def _check_beam_sizes(compiled) -> None:
    sizes = compiled.export_beam_sizes
    if not sizes or any(isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1
                        for m in sizes):
        raise DecodeInputError(f"export_beam_sizes={sizes!r}: expected a non-empty tuple of "
                               "ints >= 1")
    tpb = compiled.export_tokens_per_beam
    if tpb is not None and (isinstance(tpb, bool) or not isinstance(tpb, (int, np.integer))
                            or tpb < 1):
        raise DecodeInputError(f"export_tokens_per_beam={tpb!r}: expected None or an int >= 1")


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def _write_file(root: pathlib.Path, rel: str, data: bytes) -> None:
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_files(compiled) -> dict:
    """{relative path: bytes} of every file of the artifact, manifest last.

    Deterministic: the same compiled set and jax version give the same bytes
    (no timestamps; JSON with sorted keys)."""
    _check_beam_sizes(compiled)
    ir = compiled.ir
    files = {serving.IR_FILE: ir.to_text().encode("utf-8")}
    tables = []
    for t, name in table_keys(compiled.tables):
        arr = compiled.tables[t][name]
        rel = f"{TABLES_DIR}/layer{t}.{name}.npy"
        files[rel] = _npy_bytes(arr)
        tables.append({"layer": t, "name": name, "file": rel, "shape": list(arr.shape),
                       "dtype": str(arr.dtype)})
    modules = {}
    cc_versions = set()
    for name, (exported, arg_names, result_names) in export_modules(compiled).items():
        rel = f"{MODULES_DIR}/{name}{MODULE_SUFFIX}"
        files[rel] = bytes(exported.serialize())
        cc_versions.add(exported.calling_convention_version)
        kind, _, beams = name.partition("_m") if name.startswith(("init_m", "beam_step_m")) \
            else (name, "", "")
        entry = {"file": rel, "kind": kind, "platforms": list(exported.platforms),
                 **_convention(exported, arg_names, result_names)}
        if beams:
            entry["beam_size"] = int(beams)
        if kind == "beam_step":
            entry["tokens_per_beam"] = compiled.export_tokens_per_beam
        modules[name] = entry
    (cc,) = cc_versions
    manifest = {
        "format": serving.FORMAT_NAME,
        "format_version": serving.FORMAT_VERSION,
        "jax_version": jax.__version__,
        "jaxlib_version": _jaxlib_version(),
        "calling_convention_version": cc,
        "platforms": list(PLATFORMS),
        "batch_dim": serving.BATCH_DIM,
        "pad_token": decode.PAD_TOKEN,
        "sentinel_score": decode.SENTINEL_SCORE,
        "pipeline": compiled.pipeline,
        **set_metadata(compiled),
        "tables": tables,
        "modules": modules,
        "files": {rel: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                  for rel, data in sorted(files.items())},
    }
    files[serving.MANIFEST_FILE] = serving.seal_manifest(manifest)
    return files


def set_metadata(compiled) -> dict:
    """The manifest fields that describe the compiled set: vocab_size,
    max_length, depth, end_token, num_sequences, num_final_states,
    plan_steps (the static plan) and layers (per-layer statistics, layout
    text and table names). With the tables they determine the automaton
    (`automaton_from_tables`)."""
    plan: Plan = compiled.plan
    ir = compiled.ir
    layers = []
    for t, (stats, layer) in enumerate(zip(compiled.layer_stats(), ir.layers)):
        layers.append({**stats, "layout_text": layer.layout.to_text(),
                       "tables": sorted(compiled.tables[t])})
    return {"vocab_size": plan.vocab_size, "max_length": plan.max_length, "depth": plan.depth,
            "end_token": plan.end_token, "num_sequences": ir.num_sequences,
            "num_final_states": ir.num_final_states,
            "plan_steps": [dataclasses.asdict(s) for s in plan.steps], "layers": layers}


def _jaxlib_version() -> str:
    import jaxlib
    return getattr(jaxlib, "__version__", "unknown")


def save(compiled, path, *, overwrite: bool = False) -> pathlib.Path:
    """Writes `compiled` as an artifact directory at `path`, atomically.

    The files go into a temporary sibling directory, are fsynced, and the
    directory is renamed to `path`: readers never see a half-written
    artifact. With `overwrite=True` an existing artifact is renamed aside,
    the new one renamed in, then the old one deleted; if anything fails
    before the swap, the old artifact is left untouched (and restored if the
    swap itself fails).

    Raises ArtifactExistsError when `path` exists and `overwrite` is False,
    or when it exists and is not an artifact (we never delete other data);
    DecodeInputError for bad export_beam_sizes / export_tokens_per_beam.
    Returns the artifact path.
    """
    path = pathlib.Path(path)
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise ArtifactExistsError(f"artifact {str(path)!r} already exists: pass "
                                      "overwrite=True (CLI: --force) to replace it")
        if not (path.is_dir() and (path / serving.MANIFEST_FILE).is_file()):
            raise ArtifactExistsError(f"{str(path)!r} exists and is not an artifact (no "
                                      f"{serving.MANIFEST_FILE}); refusing to replace it")
    files = build_files(compiled)
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    try:
        for rel, data in files.items():
            _write_file(tmp, rel, data)
        for sub in (TABLES_DIR, MODULES_DIR):
            _fsync_dir(tmp / sub)
        _fsync_dir(tmp)
        _swap_in(tmp, path, parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _swap_in(tmp: pathlib.Path, path: pathlib.Path, parent: pathlib.Path) -> None:
    """Renames `tmp` to `path`, replacing an existing artifact (see `save`)."""
    if not path.exists():
        os.rename(tmp, path)
        _fsync_dir(parent)
        return
    old = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
    os.rmdir(old)
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    _fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------
# Reading the tables back (numpy only; no module is executed)


def _layer_from_tables(t: int, step: dict, layout: Layout, tabs: dict, where: str) -> Layer:
    kind = step["kind"]
    if kind == "dense_rows":
        nxt = np.asarray(tabs["next"])
        present = nxt >= 0
        rows, tokens = np.nonzero(present)
        indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))])
        targets = nxt[rows, tokens].astype(np.int64)
    elif kind == "csr":
        indptr = np.asarray(tabs["indptr"]).astype(np.int64)
        tokens = np.asarray(tabs["tokens"])
        targets = None
    elif kind == "unary":
        tokens = np.asarray(tabs["tokens"])
        indptr = np.arange(tokens.shape[0] + 1, dtype=np.int64)
        targets = None
    elif kind == "near_unary":
        tokens = np.asarray(tabs["tokens"])
        branch = np.ones(step["num_states"], dtype=np.int64)
        ex = np.asarray(tabs["ex_states"]).astype(np.int64)
        bounds = np.asarray(tabs["ex_bounds"]).astype(np.int64)
        branch[ex] = bounds[:, 1] - bounds[:, 0]
        indptr = np.concatenate([[0], np.cumsum(branch)])
        if not np.array_equal(indptr[ex], bounds[:, 0]):
            raise ArtifactFormatError(f"{where}: layer {t} ex_bounds disagree with the row "
                                      "starts implied by ex_states")
        targets = None
    else:
        raise ArtifactFormatError(f"{where}: layer {t} has layout kind {kind!r}, expected one of "
                                  "dense_rows, csr, unary, near_unary")
    if kind != "dense_rows" and step["explicit_targets"]:
        targets = np.asarray(tabs["targets"]).astype(np.int64)
    if targets is not None and not step["explicit_targets"]:
        if not np.array_equal(targets, np.arange(targets.shape[0])):
            raise ArtifactFormatError(f"{where}: layer {t} has implicit targets in the plan but "
                                      "its dense table does not number children in order")
        targets = None
    accepting = np.asarray(tabs["accepting"]) if "accepting" in tabs else None
    return Layer(indptr=indptr, tokens=np.asarray(tokens).astype(layout.token_dtype),
                 targets=targets, accepting=accepting, layout=layout)


def read_automaton(path, *, verify_checksums: bool = True) -> Automaton:
    """Rebuilds the compiled automaton (with its layouts) from an artifact's
    manifest and .npy tables alone, and verifies it (`ir.verify`).

    Raises the serving loader's artifact errors for a damaged artifact, and
    IRVerificationError when the tables do not form a valid automaton."""
    path = pathlib.Path(path)
    manifest = serving.read_manifest(path, verify_checksums=verify_checksums)
    arrays = serving.load_tables(path, manifest)
    keys = [(e["layer"], e["name"]) for e in manifest["tables"]]
    tables = _unflatten_tables(keys, len(manifest["layers"]), arrays)
    return automaton_from_tables(manifest, tables, where=f"artifact {str(path)!r}")


def automaton_from_tables(metadata: dict, tables, where: str = "tables") -> Automaton:
    """The automaton that `metadata` (the fields of `set_metadata`) and
    `tables` (one dict of numpy arrays per layer) describe, verified with
    `ir.verify`. The inverse of lowering: equal to the compiled IR."""
    layers = []
    for t, (step, info) in enumerate(zip(metadata["plan_steps"], metadata["layers"])):
        layers.append(_layer_from_tables(t, step, Layout.from_text(info["layout_text"]),
                                         tables[t], where))
    ir = Automaton(vocab_size=metadata["vocab_size"], layers=tuple(layers),
                   num_final_states=metadata["num_final_states"],
                   num_sequences=metadata["num_sequences"], end_token=metadata["end_token"])
    verify(ir)
    return ir


def row_keys(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One hashable-by-value key per sequence (a void view of the row with
    -1 past its length), for set comparisons with np.isin / np.unique.

    tokens: int (N, W); lengths: int (N,). Returns a (N,) void array."""
    tokens = np.asarray(tokens, dtype=np.int64)
    past = np.arange(tokens.shape[1])[None, :] >= np.asarray(lengths)[:, None]
    rows = np.ascontiguousarray(np.where(past, -1, tokens))
    return rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
