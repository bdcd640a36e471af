"""The artifact format: names of files, versions with their dated history,
and the rules every module of `static_compiler.artifact` shares (the
writer's and the serving loader's). Standard library only; the manifest's
schema is `manifest`, the reader `snapshot`.

An artifact is a directory:

* ``manifest.json``: a `manifest.Manifest` (sorted keys, one-space indent),
  sealed with its own sha256 (`MANIFEST_DIGEST_KEY`);
* ``ir.txt``: the IR dump (rows elided for large sets);
* ``names.jsonl`` (version 2, text catalogues only): a `items.names.NameTable`,
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

import dataclasses
import datetime
import hashlib
import json
import os
import pathlib

from static_compiler.errors import ArtifactFormatError, ArtifactVersionError
from static_compiler.format.module_names import (  # noqa: F401 (fmt.step_module_name ...)
    BEAM_MODULE_KINDS,
    PRIOR_KINDS,
    RANKED_MODULES_VERSION,
    RESIZE_KINDS,
    STEP_KINDS,
    beam_module_name,
    beam_modules,
    is_ranked_module,
    parse_beam_module_name,
    ranked_module_name,
    step_module_name,
    subset_module_name,
)

# ---------------------------------------------------------------------------
# Versions: the writer writes FORMAT_VERSION; readers accept the window
# [MIN_FORMAT_VERSION, MAX_FORMAT_VERSION] (`version_error` otherwise), as
# jax.export keeps its calling conventions: each older version is read for
# SUPPORT_DAYS after the version that replaced it came out
# (`supported_until`), every reader branch for an older shape is a row of
# COMPAT (which names the date it may go), and `static-compiler upgrade
# PATH` rewrites an older artifact into FORMAT_VERSION before that date. To
# drop a version: raise MIN_FORMAT_VERSION past it once its date passed,
# delete the COMPAT rows whose last_version is below it and their branches.


@dataclasses.dataclass(frozen=True)
class FormatVersion:
    """One row of the dated history: version, the date (ISO) it was first
    written, what it changed, and how the versions before it read."""

    version: int
    introduced: str
    change: str


FORMAT_HISTORY = (
    FormatVersion(1, "2026-11-29", "manifest.json, ir.txt, tables/*.npy, modules/*.jaxexport; "
                  "modules init_m{M}, beam_step_m{M}, mask, advance; batch dimension \"b\"."),
    FormatVersion(2, "2026-12-01", "text catalogues: optional names.jsonl (the items' names and "
                  "token ids) and the manifest key \"names_file\" (its path, or null). A version "
                  "1 artifact reads as one without names."),
    FormatVersion(3, "2026-12-01", "item subsets: optional items/*.npy (row_item, and for "
                  "variable-length sets item_depth and item_state), the manifest key "
                  "\"item_files\" ({name: path}, or null), and with them the modules "
                  "beam_step_subset_m{M}, mask_subset and advance_subset (a module's arguments, "
                  "then the subsets' bits with a second symbolic dimension \"r\", then "
                  "subset_index int32[b]); after an update, items/removed.npy (bool, the unique "
                  "sequences taken out). Versions 1 and 2 read as artifacts without subsets."),
    FormatVersion(4, "2026-12-01", "tables on a device mesh: the manifest key \"mesh\" (null "
                  "for one device, else {\"axes\": [[name, size], ...], \"table_axis\": name, "
                  "\"split_tables\": [\"layer{t}.{name}\", ...], \"min_bytes\": int}); the "
                  "modules were exported for that mesh and take the split row pointers padded to "
                  "a multiple of the axis size (`placement`). Versions 1 to 3 read as one-device "
                  "artifacts."),
    FormatVersion(5, "2026-12-01", "the manifest key \"subset_bits\", how the subset modules "
                  "take an item subset's bits: \"dense_slots\" (the children of a dense_rows step "
                  "t as slot bits, num_states[t] * ceil(V / 32) words per subset, in (state, "
                  "token) order; see `liveness`) or \"per_state\" (one bit per state at every "
                  "depth, as versions 3 and 4 took them). Versions 1 to 4 read as \"per_state\"."),
    FormatVersion(6, "2026-12-02", "a near_unary layer's exceptions hold their row starts and "
                  "branches in two tables, layer{t}.ex_starts (X,) of the state dtype and "
                  "layer{t}.ex_branch (X,) of the narrowest unsigned dtype holding the layer's "
                  "max branch, instead of layer{t}.ex_bounds (X, 2) [start, end) rows: 9 bytes "
                  "an exception instead of 12 at int32. Versions 1 to 5 keep ex_bounds (their "
                  "own modules take it); the readers turn it into ex_starts / ex_branch."),
    FormatVersion(7, "2026-12-03", "room without csr, splits without room, summaries the library "
                  "reads back: a near_unary layer may reserve capacity (layout text "
                  "`near_unary(...,exceptions=X,capacity=S/E)`: tokens padded to E entries, "
                  "exception tables to X, padding entries holding id S, the layer's edge count "
                  "as start and branch 0); on a mesh every split table is padded to a multiple "
                  "of the axis size; each manifest layer records \"branch_counts\" (its branch "
                  "histogram), which `sc.load` checks against the tables. Older manifests "
                  "lack it: read from the tables."),
    FormatVersion(8, "2026-12-03", "a fixed-length set that took additions may hold "
                  "items/state_item.npy (int32, one entry per final state in state order: the "
                  "unique sequence ending there) instead of item_depth and item_state."),
    FormatVersion(9, "2026-12-04", "such a set holds its additions instead: "
                  "items/state_inserted_at.npy and items/state_inserted_item.npy (int32 (K,): "
                  "the final states, ascending, where its K added items end, and their ids, the "
                  "K largest); every other final state f holds item f - #(inserted_at < f) "
                  "(`item_bits.state_order.InsertedOrder`). Version 8's state_item still loads."),
    FormatVersion(10, "2026-12-05", "the manifest key \"exported_at\": the UTC date (ISO "
                  "YYYY-MM-DD) the modules were exported, by the jax and jaxlib that "
                  "\"jax_version\" and \"jaxlib_version\" name (an update that keeps the "
                  "modules keeps all three): a load warns as the date nears the end of "
                  "jax.export's backward window (`EXPORT_WINDOW_DAYS`), and `static-compiler "
                  "re-export` renews the modules. Versions 1 to 9 read as null (not known)."),
    FormatVersion(11, "2026-12-05", "tables-only artifacts: \"modules\" may be {} and "
                  "\"platforms\" [], with \"jax_version\", \"jaxlib_version\", "
                  "\"calling_convention_version\" and \"exported_at\" null (a set saved "
                  "without jax, or with save(modules=False)); the torch backend and sc.load "
                  "read it, a jax serving load names `static-compiler re-export PATH`, which "
                  "adds the modules. Versions 1 to 10 always hold modules."),
    FormatVersion(12, "2026-12-05", "item attributes: optional items/attr.{name}.npy (one "
                  "value per input row: an integer dtype, float32 or float64, bool, or a "
                  "category column's int32 codes) and the manifest key \"attributes\" (null, "
                  "or {name: {\"kind\": \"int\" | \"float\" | \"bool\" | \"category\", "
                  "\"file\", \"dtype\", \"categories\": [str, ...] (a code's string, first-"
                  "seen order) or null}}), with the item index only. Versions 1 to 11 read as "
                  "artifacts without attributes."),
    FormatVersion(13, "2026-12-05", "beam schedules: modules beam_resize_m{M}_to{W} (and "
                  "beam_resize_subset_m{M}_to{W}), a step from M beams keeping W, whose entries "
                  "record \"beam_size\" M and \"beam_size_out\" W, and the manifest key "
                  "\"beam_schedules\" (the schedules exported, [[w_0, ..., w_{T-1}], ...], each "
                  "served from the start beam alone by init_m1 and its steps' beam_step_m / "
                  "beam_resize_m modules: 1 -> w_0 -> ... -> w_{T-1}); item priors: with "
                  "export_priors, each step module's variant beam_step_prior_m{M} / "
                  "beam_resize_prior_m{M}_to{W} (and their _subset variants) taking the prior "
                  "(prior.best float32 (S,)) after the step. "
                  "Versions 1 to 12 read as artifacts without schedules."),
    FormatVersion(14, "2026-12-05", "narrow category codes: a category column's "
                  "items/attr.{name}.npy holds uint8 codes up to 256 categories, uint16 up to "
                  "65536, else int32 (its manifest \"dtype\"; an update that adds categories "
                  "widens them). Versions 12 and 13 hold int32 codes, read as they are."),
    FormatVersion(15, "2026-12-06", "the export plan of a tables-only artifact: the manifest "
                  "key \"export_plan\" (null for an artifact with modules, whose modules say "
                  "what was exported; for a tables-only one {\"beam_sizes\": [M, ...], "
                  "\"beam_schedules\": [[w_0, ..., w_{T-1}], ...], \"tokens_per_beam\": [cap "
                  "or null, one per step], \"priors\": bool}: what the set asked to export, "
                  "which `static-compiler re-export` exports). Versions 1 to 14 read as null "
                  "(a tables-only one re-exports beam size 70). Stale rows: optional "
                  "items/stale_rows.npy, bool (N,), once an update added a removed item "
                  "again: the rows that no longer stand for their item (absent before 15: "
                  "no stale rows)."),
    FormatVersion(16, "2026-12-07", "ranked subsets in the exported modules: with item "
                  "subsets, each subset module's variant mask_ranked, advance_ranked, "
                  "beam_step_ranked_m{M}, beam_step_prior_ranked_m{M}, beam_resize_ranked_m{M}"
                  "_to{W} and beam_resize_prior_ranked_m{M}_to{W} takes, after its own "
                  "arguments, a ranked subset's arrays (`jax_support.ranked_arrays`): the set's "
                  "range tables (the layers' row pointers, near_unary exception marks and "
                  "extras, accepting ranks, states per depth, added items' trie positions) as "
                  "exported, the subsets' rank bits (words uint32[r, W], counts int32[r, C], "
                  "within uint16[r, W], size int32[]; the added items' likewise), each batch "
                  "row's subset int32[b] and the depth-1 liveness bool[r, S_1], named "
                  "ranked.* in the manifest. Versions 1 to 15 read as artifacts without them."),
    FormatVersion(17, "2026-12-07", "the manifest key \"rows_in_item_order\": with an item "
                  "index, true when input row i is item i for every row (the catalogue was "
                  "sorted, without duplicates or stale rows: a row mask is its items' bits, "
                  "packed as it is), false when not, null when not recorded; a reader checks a "
                  "true one against items/row_item.npy at load (in place of its range check). "
                  "Null without an item index. Versions 1 to 16 read as null (checked when "
                  "first needed)."),
)
"""The dated history of the format, one row per version, oldest first."""

FORMAT_NAME = "static-compiler-artifact"
FORMAT_VERSION = 17
MIN_FORMAT_VERSION = 1
MAX_FORMAT_VERSION = 17

SUPPORT_DAYS = 183
"""How long (about six months, as jax.export keeps a calling convention)
the readers keep reading a version after the one that replaced it came out."""

EXPORT_WINDOW_DAYS = 183
"""jax.export's backward-compatibility window (six months: jax's
docs/export/export.md): a JAX released more than this many days after a
module was exported may refuse to deserialize it (jax >= 0.11.1 raises)."""

EXPORT_WARN_DAYS = 30
"""A load warns (`errors.ArtifactExpiryWarning`) when the modules' export
date is within this many days of EXPORT_WINDOW_DAYS, or past it."""


def export_expires(exported_at: str) -> str:
    """The ISO date EXPORT_WINDOW_DAYS after `exported_at` (ISO): from about
    then, newer JAX releases may refuse the modules."""
    when = datetime.date.fromisoformat(exported_at)
    return (when + datetime.timedelta(days=EXPORT_WINDOW_DAYS)).isoformat()


def version_introduced(version: int) -> str:
    """The ISO date format `version` was first written (FORMAT_HISTORY)."""
    return FORMAT_HISTORY[version - 1].introduced


def supported_until(version: int):
    """The ISO date after which the readers may stop reading `version`:
    SUPPORT_DAYS after the next version was introduced; None for
    FORMAT_VERSION (current: no end)."""
    if version >= FORMAT_VERSION:
        return None
    replaced = datetime.date.fromisoformat(version_introduced(version + 1))
    return (replaced + datetime.timedelta(days=SUPPORT_DAYS)).isoformat()


@dataclasses.dataclass(frozen=True)
class CompatBranch:
    """A reader branch for an older shape of the artifact: its name (the
    key of COMPAT, which the branch's code names), the newest version that
    writes that shape (`last_version`; an update that keeps an older
    artifact's modules keeps some shapes in newer versions: `kept_by_updates`),
    what it reads, and where the readers normalize it. It may be deleted
    with its code once MIN_FORMAT_VERSION passes `last_version`, after
    `removed_after`."""

    name: str
    last_version: int
    reads: str
    normalized_in: str
    kept_by_updates: bool = False

    @property
    def removed_after(self) -> str:
        return supported_until(self.last_version)


COMPAT = {b.name: b for b in (
    CompatBranch("names_file", 1, "no \"names_file\" key: an artifact without names",
                 "manifest.Manifest.from_json"),
    CompatBranch("item_files", 2, "no \"item_files\" key: an artifact without subsets",
                 "manifest.Manifest.from_json"),
    CompatBranch("mesh", 3, "no \"mesh\" key: a one-device artifact",
                 "manifest.Manifest.from_json"),
    CompatBranch("subset_bits", 4, "no \"subset_bits\" key: \"per_state\"",
                 "manifest.Manifest.from_json"),
    CompatBranch("per_state", 5, "subset modules that take one bit per state at every depth",
                 "the bit layout of the artifact's own modules (serving, torch_backend)",
                 kept_by_updates=True),
    CompatBranch("ex_bounds", 5, "a near_unary layer's ex_bounds (X, 2) [start, end) rows",
                 "normalize.current_tables (snapshot.read_tables, runtime.put_tables)",
                 kept_by_updates=True),
    CompatBranch("branch_counts", 6, "manifest layers without \"branch_counts\"",
                 "item_bits.layers.TableLayer (read from the tables on first use)",
                 kept_by_updates=True),
    CompatBranch("state_item", 8, "items/state_item.npy, every final state's item",
                 "item_bits.state_order.item_order", kept_by_updates=True),
    CompatBranch("exported_at", 9, "no \"exported_at\" key: the modules' export date is not "
                 "known (no expiry warning)", "manifest.Manifest.from_json"),
    CompatBranch("attributes", 11, "no \"attributes\" key: items without attributes",
                 "manifest.Manifest.from_json"),
    CompatBranch("beam_schedules", 12, "no \"beam_schedules\" key: no beam schedules exported",
                 "manifest.Manifest.from_json"),
    CompatBranch("export_plan", 14, "no \"export_plan\" key: a tables-only artifact's "
                 "export plan is not known (re-export defaults to beam size 70)",
                 "manifest.Manifest.from_json"),
    CompatBranch("rows_in_item_order", 16, "no \"rows_in_item_order\" key: not recorded "
                 "(whether row i is item i is read from the item index when first needed)",
                 "manifest.Manifest.from_json"),
)}
"""Every reader branch for an older shape, by name; a branch's code names
its row (``COMPAT["ex_bounds"]``). `normalize.needed_branches` tells which
rows an artifact needs; `static-compiler upgrade` rewrites it so it needs
none."""


def version_error(path, version: int, shape: str = "") -> ArtifactVersionError:
    """The ArtifactVersionError for an artifact at `path` of format
    `version` (or holding an older `shape`) outside the window: names the
    version, the window with its dates, and the fix."""
    window = (f"[{MIN_FORMAT_VERSION}, {MAX_FORMAT_VERSION}] (version {MIN_FORMAT_VERSION} of "
              f"{version_introduced(MIN_FORMAT_VERSION)} is read until "
              f"{supported_until(MIN_FORMAT_VERSION) or 'further notice'})")
    what = f"format version {version}" + (f" ({shape})" if shape else "")
    if version > MAX_FORMAT_VERSION:
        fix = ("it was written by a newer static_compiler: read it with that release (or "
               "upgrade this one)")
    else:
        fix = (f"rewrite it into format version {FORMAT_VERSION} with `static-compiler upgrade "
               f"{path}` run by a release whose window still holds it (or re-save the set)")
    return ArtifactVersionError(f"artifact {str(path)!r}: {what} is outside the window this "
                                f"reader accepts, {window}: {fix}")
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
               "state_inserted_at", "state_inserted_item", "stale_rows")
"""The arrays of `items.index.ItemIndex` an artifact may hold (item_depth and
item_state for variable-length sets; for fixed-length sets that took
additions state_inserted_at and state_inserted_item (format version 9), or
state_item (version 8); removed after an update; stale_rows, bool (N,),
once an update added a removed item again: the rows that no longer stand
for their item), one .npy file each under ITEMS_DIR."""
BOOL_ITEM_ARRAYS = ("removed", "stale_rows")
"""The ITEM_ARRAYS of dtype bool (the others are int32)."""
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





_HASH_CHUNK = 1 << 20


def table_file(layer: int, name: str) -> str:
    """Relative path of table `name` of `layer`."""
    return f"{TABLES_DIR}/layer{layer}.{name}.npy"


def module_file(name: str) -> str:
    """Relative path of module `name`."""
    return f"{MODULES_DIR}/{name}{MODULE_SUFFIX}"


















def item_file(name: str) -> str:
    """Relative path of item array `name` (one of ITEM_ARRAYS)."""
    return f"{ITEMS_DIR}/{name}.npy"


def attribute_file(name: str) -> str:
    """Relative path of item attribute `name`'s values (format version 12)."""
    return f"{ITEMS_DIR}/attr.{name}.npy"


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
