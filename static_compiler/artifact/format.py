"""The artifact format: names of files, versions with their dated history,
and the rules every module of `static_compiler.artifact` shares (the
writer's and the serving loader's). Standard library only; the manifest's
schema is `manifest`, the reader `snapshot`.

An artifact is a directory:

* ``manifest.json``: a `manifest.Manifest` (sorted keys, one-space indent),
  sealed with its own sha256 (`MANIFEST_DIGEST_KEY`);
* ``ir.txt``: the IR dump (rows elided for large sets);
* ``names.jsonl`` (version 2, text catalogues only): a `names.NameTable`,
  one JSON object per item, ``{"name": str, "tokens": [int, ...]}`` plus
  ``"aliases": [str, ...]`` when other names encode to the same tokens,
  sorted by tokens (a prefix before its extensions); lines end in a line
  feed alone, and U+0085, U+2028 and U+2029 are written as JSON escapes
  (the reader splits on line feeds only, so a file an older writer wrote
  them raw in reads too); the manifest's ``names_file`` names it (null when
  the set was compiled from token ids);
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
the manifest lists, each with the recorded size and sha256 (the checksum
rules are here; `snapshot` checks them).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from static_compiler.errors import ArtifactFormatError

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
#   7 (2026-12-03): room without csr, splits without room, summaries the
#     library reads back. A near_unary layer may reserve capacity (its layout
#     text records capacity=S/E and exceptions=X, the room for exceptions):
#     its tokens are padded to E and its exception tables to X entries of
#     id S (the table's state count: past every state), start the layer's
#     edge count and branch 0. On a mesh, every split table is padded to a
#     multiple of the axis size (`placement.padded`: not only row
#     pointers), so a set splits without reserved capacity. Each manifest
#     layer may record "branch_counts" (its branch histogram, as
#     `ir.LayerSummary.counts`), which `load_compiled` checks against the
#     tables instead of rebuilding the automaton (absent in older
#     manifests: read from the tables). Versions 1 to 6 read as before.
#   8 (2026-12-03): a fixed-length set that took additions may hold
#     items/state_item.npy (int32, one entry per final state in state order:
#     the unique sequence ending there) instead of item_depth and item_state
#     (an addition inserts into it and renumbers nothing, and a lookup reads
#     it directly). Versions 1 to 7 read as before (their fixed-length sets
#     with additions hold item_depth and item_state, which still load).
#   9 (2026-12-04): such a set holds its additions instead:
#     items/state_inserted_at.npy and items/state_inserted_item.npy (int32
#     (K,): the final states, ascending, where its K added items end, and
#     their ids, the K largest); every other final state f holds item
#     f - #(inserted_at < f) (`live.state_order.InsertedOrder`). A first
#     subset no longer reads a 4 GB array at 1e9. Version 8's state_item
#     still loads; an update writes the new form.
FORMAT_NAME = "static-compiler-artifact"
FORMAT_VERSION = 9
MIN_FORMAT_VERSION = 1
MAX_FORMAT_VERSION = 9
SUBSET_BITS = ("per_state", "dense_slots")
"""The values of the manifest's "subset_bits" (format version 5); this
writer's is the last."""

# ---------------------------------------------------------------------------
# Layout.
MANIFEST_FILE = "manifest.json"
IR_FILE = "ir.txt"
NAMES_FILE = "names.jsonl"
ITEMS_DIR = "items"
ITEM_ARRAYS = ("row_item", "item_depth", "item_state", "removed", "state_item",
               "state_inserted_at", "state_inserted_item")
"""The arrays of `liveness.ItemIndex` an artifact may hold (item_depth and
item_state for variable-length sets; for fixed-length sets that took
additions state_inserted_at and state_inserted_item (format version 9), or
state_item (version 8); removed after an update), one .npy file each under
ITEMS_DIR."""
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


def artifact_path(path, where: str) -> pathlib.Path:
    """`path` (a str or os.PathLike naming an artifact directory) as a Path;
    anything else is an ArtifactFormatError naming `where` and the value."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactFormatError(f"{where}: path={path!r}: expected the path (a str or "
                                  "os.PathLike) of an artifact directory")
    return pathlib.Path(path)


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


def _reject_constant(name: str):
    """json.loads' parse_constant for NaN and Infinity: not JSON."""
    raise ValueError(f"{name} is not valid JSON")
