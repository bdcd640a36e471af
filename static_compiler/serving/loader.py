"""Serving loader for saved artifacts. It needs only jax, numpy and the
standard library, and of this package only `errors`, the artifact's format
(`format/`: `spec`, `manifest`, `names`, `snapshot`), `runtime` (its modules
and tables on the device), `placement`, `decode_state` and
`item_bits.liveness` with `item_bits.layers`, the verbs every door speaks
(`decoding.decoder.Decoder`) over the exported modules (`engine`), with
`support.beam_loop` / `beam_result` (so a serving binary can ship it with
little else). Its names are the `static_compiler.serving` package's.

    from static_compiler import serving
    art = serving.load("fresh_items.static")     # verifies files, sizes, sha256, versions
    state = art.init_beams(batch_size=2, beam_size=70)
    for step in range(art.max_length):
        logits = model(state.last_tokens)         # float (B, M, V)
        state = art.beam_step(state, logits, step)
    tokens, scores, valid, lengths = art.finalize(state)
    names = art.texts(art.finalize(state))       # a text catalogue: its names, None if invalid

An artifact saved from `compiled.shard(mesh, axis)` holds modules exported
for that mesh: load it with `serving.load(path, mesh=mesh)` on a mesh of the
same axes and sizes; its large tables are split across the axis as they
were when it was saved (`static_compiler.jax_support.placement`).

SECURITY. A deserialized StableHLO module is a program: executing it runs
code chosen by whoever wrote the artifact. Load artifacts only from a trusted
source. The sha256 checksums in the manifest guard against corruption
(truncated copies, flipped bits), NOT against an attacker, who can rewrite
the manifest along with the files.

The artifact's layout and manifest are described in
`static_compiler.format.spec` and `static_compiler.format.manifest`.

Modules execute exactly what `static_compiler.backend.decode` does in
process (beam_step, mask, advance with the step as a traced argument), so
decoding through an artifact is bit-identical to `sc.beam_search` for the
same logits.
"""

from __future__ import annotations

import pathlib
from concurrent.futures import Future
from typing import Optional, Union

import jax
from jax import export as jax_export

from static_compiler.decoding.decoder import Decoder
from static_compiler.errors import ArtifactVersionError, DecodeInputError
from static_compiler.format import snapshot
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import Manifest
from static_compiler.item_bits.liveness import warm_kernels_in_background
from static_compiler.items.index import ItemIndex
from static_compiler.items.names import NameTable
from static_compiler.jax_support.compile_events import CompileCounter
from static_compiler.jax_support.placement import MeshPlacement
from static_compiler.jax_support.warmth import Warmth
from static_compiler.rules.set_view import SetView
from static_compiler.serving.engine import ExportedEngine
from static_compiler.serving.runtime import (
    check_table_arguments,
    current_platform,
    deserialize,
    item_index,
    put_tables,
    table_placement,
    warn_if_export_ages,
)
from static_compiler.serving.warm import warm as _warm
from static_compiler.support.decode_state import BeamState, DecodeResult, ProcessorState  # noqa: F401 (serving's names)
from static_compiler.support.decode_types import WarmReport


def open_snapshot(path, *, verify_checksums: bool = True) -> snapshot.Snapshot:
    """`snapshot.open_snapshot`, also checking that the artifact's
    jax.export calling-convention version is one this jax can run."""
    lo = jax_export.minimum_supported_calling_convention_version
    hi = jax_export.maximum_supported_calling_convention_version
    return snapshot.open_snapshot(path, verify_checksums=verify_checksums,
                                  calling_conventions=(lo, hi, f"jax {jax.__version__}"))


def read_manifest(path, *, verify_checksums: bool = True) -> Manifest:
    """The manifest, after the checks of `open_snapshot`."""
    with open_snapshot(path, verify_checksums=verify_checksums) as snap:
        return snap.manifest


class Artifact(Decoder):
    """A loaded artifact: tables on the device and the modules to run on them.

    Attributes:
      path: the artifact directory.
      manifest: the parsed, checked manifest (`manifest.Manifest`).
      vocab_size: V, the model's vocabulary size.
      max_length: T, decoding steps (depth, plus one with an end token).
      end_token: the end token, or None for fixed-length sets.
      num_sequences: the size of the compiled set.
      beam_sizes: beam sizes with an exported beam_step module.
      beam_schedules: the beam schedules it was exported for (tuples of
        one width per step, format version 13), whose modules it holds.
      names: a text catalogue's `items.names.NameTable` (names.jsonl),
        or None for a set compiled from token ids (and format version 1).
      items: the `items.index.ItemIndex` of an artifact saved with
        export_subsets=True (items/*.npy), else None: `subset` needs it.
      attributes: the items' attribute columns (property), or None.
      placement: for an artifact exported for a mesh, where its tables
        live (`placement.MeshPlacement`); None for one device.
    """

    def __init__(self, path, manifest: Manifest, tables: list, modules: dict,
                 names: Optional[NameTable] = None, items: Optional[ItemIndex] = None,
                 host_tables: Optional[tuple] = None, put=None,
                 placement: Optional[MeshPlacement] = None, warmth: Optional[Warmth] = None,
                 set_view: Optional[SetView] = None):
        self.path = pathlib.Path(path)
        self.manifest = manifest
        self.vocab_size = manifest.vocab_size
        self.max_length = manifest.max_length
        self.end_token = manifest.end_token
        self.num_sequences = manifest.num_sequences
        self._tables = tuple(tables)  # on the device, in the modules' argument order
        self._modules = modules  # name -> deserialized module (`manifest.modules` lists them)
        self.beam_sizes = manifest.beam_sizes()
        self.beam_schedules = manifest.beam_schedules
        self.names = names
        self.items = items
        self._host_tables = host_tables
        self._put = put
        self.placement = placement
        # the numpy view of its items (subsets, fingerprint, base subset); a reload
        # with the same host tables shares its trie and bit layout
        self._set_view = SetView.of_artifact(manifest, host_tables, items,
                                            manifest.files[fmt.IR_FILE].sha256, built=set_view,
                                            source=f"artifact {str(self.path)!r}",
                                            missing=DecodeInputError)
        self._warmth = warmth if warmth is not None else Warmth(CompileCounter())  # shared by reloads
        self._exported = ExportedEngine(self.path, manifest, self._tables, modules, items,
                                        placement, self._warmth, self._set_view)
        if manifest.exports_ranked and items is not None:  # (seconds at 1e9: off the first decode)
            from static_compiler.jax_support.ranked_arrays import start_set_ranges
            start_set_ranges(self._set_view, None if placement is None else
                             placement.sharding(None))

    @property
    def _engine(self) -> ExportedEngine:
        return self._exported

    def __repr__(self):
        return (f"Artifact({str(self.path)!r}, vocab_size={self.vocab_size}, max_length="
                f"{self.max_length}, num_sequences={self.num_sequences}, beam_sizes="
                f"{self.beam_sizes})")

    def _check_schedule(self, beam_size) -> tuple:
        """The widths of beam_size (an int, or one width per step: a beam
        schedule; `arguments.check_beam_schedule`) after checking that this
        artifact runs it: an exported beam size, or a schedule it was
        exported for. Raises DecodeInputError naming what it exports."""
        return self._engine.check_schedule(beam_size)

    def _no_names(self) -> str:
        return (f"texts: artifact {str(self.path)!r} has no names (compiled from token ids, or "
                "written before format version 2)")

    # The verbs: `Decoder`'s, over the exported modules (`ExportedEngine`).
    # beam_step: a state's M in `beam_sizes`; another beam_size runs the
    # step of a beam schedule the artifact was exported for (a module
    # beam_resize_m{M}_to{W}); prior needs export_priors=True, subset
    # export_subsets=True.

    # Warming up

    def warm(self, batch_sizes, *, beam_sizes=None, max_subsets: int = 0,
             background: bool = False, ranked: bool = False
             ) -> Union[WarmReport, Future[WarmReport]]:
        """Compiles every program a request can run for these shapes, so
        that afterwards none compiles (`compilations()` stays put): every
        front door's warm-up (`static_compiler.decoding.warm_up`), over this
        artifact's modules.

        batch_sizes: ints >= 1 (or one int), the B of the requests to come;
        beam_sizes: exported beam sizes M and beam schedules (default None:
        all of `beam_sizes` and `beam_schedules`; a schedule warms each of
        its steps' modules);
        max_subsets: K >= 0; from now on every stack of R <= K subsets
        (`liveness.stack_subsets`) is decoded padded to K rows (empty
        subsets appended, subset_index unchanged, the same results), so no
        R in 0..K compiles again.

        Warmed per B, through the public verbs on dummy inputs: init_beams,
        beam_step at every step (host and device float32 logits; other
        logits dtypes add a conversion program) and finalize for each M,
        and the served `beam_search` (its end-token loop); the processor
        loop if exported (init_processor, mask, allowed_tokens, advance at
        every step on the state advance returned, and at a step given as a
        device scalar) with `allowed` at every prefix length; each plain
        and, for an artifact with subsets, through the subset modules (the
        path every decode takes after an update removed items, so a reload
        of such a version compiles nothing: warmed even with K = 0), and
        with item-prior modules also with a prior. Holds across `reload()`
        of versions with the same modules and table shapes (removals,
        additions within capacity): they share the compiled programs and
        this warm state. A warm-up that raises leaves the padding as it
        was (all or nothing).

        ranked: also walk every path through the ranked modules
        (`ranked_subset`: one, and max_subsets stacked when max_subsets >
        1; ranked stacks are not padded, another stack size compiles once);
        needs an artifact with ranked modules (format version 16,
        `manifest.exports_ranked`).

        background: run it on a daemon thread and return at once a
        `concurrent.futures.Future` of the report (`.result()` waits, and
        raises what the warm-up raised); requests may run meanwhile (one
        that needs a program not yet compiled compiles it itself).

        Returns a `WarmReport` (compilations: the programs XLA compiled
        during it, which `compilations()` counts too; calls, seconds,
        batch_sizes, beam_sizes, subset_rows). Raises DecodeInputError for
        a batch size < 1, a beam size not exported, max_subsets < 0,
        max_subsets > 0 without subsets or past
        `item_bits.padding.PADDED_SUBSETS_MAX_BYTES` over one subset's bytes;
        these are checked before anything runs, background or not."""
        return _warm(self, batch_sizes, beam_sizes, max_subsets, background, ranked)

    # New versions

    def reload(self, *, verify_checksums: bool = True) -> "Artifact":
        """The artifact as it is on disk now, for the next decode (double
        buffering: this object keeps serving the version it loaded, so a
        decode in progress finishes on it; swap in the returned one between
        two decodes). The new object shares this one's deserialized modules
        whenever they are the same files: after removals (only the items
        change) and after additions that fit the reserved capacity (new
        tables of the same shapes and dtypes, read and put on the device (or mesh)
        beside the old ones), so nothing is deserialized or compiled again
        (after `warm()`: the warm state and compile counter are shared too),
        but for the ranked modules of a version whose additions grew the
        trie (exported anew with it: read, and compiled on first use or by
        `warm(ranked=True)`; the warm state is kept).
        Modules exported anew over tables of the same shapes
        (`static-compiler re-export`) are read and start cold (warm them
        again). Returns self when nothing changed. Raises what `load` raises
        for a version it refuses (`check_servable`: ArtifactVersionError for
        a tables-only version, after a rollback to one or a save with
        modules=False, naming `static-compiler re-export`), and
        ArtifactVersionError when a table's shape or the mesh changed (load
        that version with `serving.load`); this object then keeps serving
        the version it holds."""
        with open_snapshot(self.path, verify_checksums=verify_checksums) as snap:
            return self._reloaded(snap)

    def _reloaded(self, snap: snapshot.Snapshot) -> "Artifact":
        manifest = snap.manifest
        if manifest.seal() == self.manifest.seal():
            return self
        check_servable(snap)  # (as `load`: a tables-only version is refused, this one kept)
        same = lambda rel: manifest.files.get(rel) == self.manifest.files.get(rel)
        module_files = [e.file for e in manifest.modules.values()] + \
            [e.file for e in self.manifest.modules.values()]
        shapes = lambda m: [(t.layer, t.name, tuple(t.shape), t.dtype) for t in m.tables]
        changed = sorted({rel for rel in module_files if not same(rel)})
        if shapes(manifest) != shapes(self.manifest) or manifest.mesh != self.manifest.mesh:
            raise ArtifactVersionError(f"reload: artifact {str(self.path)!r} changed its table "
                                       "shapes or mesh: load it anew with serving.load")
        modules = self._modules
        warmth: Optional[Warmth] = self._warmth
        if changed or manifest.modules.keys() != self.manifest.modules.keys():
            # modules exported anew over the same tables: each unchanged one shared, the
            # others read; after a re-export of them all the warm state starts anew (the
            # programs are new), after ranked ones alone (an addition) it is kept
            modules = {name: self._modules[name] if name in self._modules and
                       same(entry.file) else deserialize(snap, name, entry, self.placement)
                       for name, entry in sorted(manifest.modules.items())}
            warn_if_export_ages(manifest, self.path)
            if not all(fmt.is_ranked_module(name) for name, entry in manifest.modules.items()
                       if modules[name] is not self._modules.get(name)):
                warmth = None
        tables, host = list(self._tables), self._host_tables
        if any(not same(t.file) for t in manifest.tables):
            keep = [old if same(t.file) else None for old, t in zip(self._tables, manifest.tables)]
            tables, host = put_tables(snap, self._put, keep)
        return Artifact(self.path, manifest, tables, modules, snapshot.read_names(snap),
                        item_index(snap), host, self._put, self.placement, warmth,
                        self._set_view if host is self._host_tables else None)


def load(path, *, verify_checksums: bool = True, device=None, mesh=None) -> Artifact:
    """Loads an artifact for serving.

    Verifies the manifest, file set, sizes, sha256 checksums (skip them with
    verify_checksums=False for huge tables already verified once), format and
    calling-convention versions, that the modules were lowered for this
    platform and match their recorded calling convention; then puts the
    tables on `device` (default: jax's default device) once; an artifact
    exported for a mesh (saved from `compiled.shard(mesh, axis)`) needs
    `mesh`, a `jax.sharding.Mesh` with the same axes and sizes, and its
    tables are split across it as they were when saved. Everything is
    read from one `snapshot.Snapshot`, so a save with overwrite=True
    landing meanwhile gives the old version or the new one, never a mix.

    Checksums catch damage, not tables edited with their checksums
    recomputed: `static_compiler.artifact.load_checked` also checks that the
    tables form a valid automaton (O(table size); it needs the compiler).

    Raises ArtifactFormatError, ArtifactChecksumError or ArtifactVersionError;
    DecodeInputError for a bad device, a mesh unlike the artifact's or a
    mesh given for a one-device artifact (and the reverse). Only load artifacts from a trusted source (see the module docstring).
    """
    with open_snapshot(fmt.artifact_path(path, "load"), verify_checksums=verify_checksums) as snap:
        return load_from(snap, device=device, mesh=mesh)


def check_servable(snap: snapshot.Snapshot) -> None:
    """What a serving process needs of a version before it reads a module,
    checked alike by `load` and `Artifact.reload` (so a reload never takes
    a version that load refuses): modules at all (ArtifactVersionError for
    a tables-only artifact, naming `static-compiler re-export`), lowered
    for this platform, taking the manifest's tables, and every module the
    manifest's beam sizes, schedules, subsets and priors call for
    (ArtifactFormatError otherwise)."""
    path, manifest = snap.path, snap.manifest
    if manifest.tables_only:
        raise ArtifactVersionError(
            f"artifact {str(path)!r} holds tables only, no StableHLO modules (saved without "
            "jax, or with save(modules=False)): export its modules with this jax, "
            f"`static-compiler re-export {path}` (sc.reexport_artifact; add --beam-sizes for "
            "the beam sizes to serve), or decode it with the torch backend "
            "(TorchConstraints.load) or sc.load")
    platform = current_platform()
    if platform not in manifest.platforms:
        raise fmt.format_error(path, f"modules were lowered for {list(manifest.platforms)}, this "
                                     f"process runs on {platform!r}")
    check_table_arguments(snap)
    missing = manifest.missing_modules()
    if missing:
        raise fmt.format_error(path, f"manifest lists no module(s) {missing}")


def load_from(snap: snapshot.Snapshot, *, device=None, mesh=None) -> Artifact:
    """`load` of an artifact already open as a snapshot (`open_snapshot`),
    for a caller that checks more of it first (`artifact.load_checked`)."""
    path, manifest = snap.path, snap.manifest
    check_servable(snap)
    put, where = table_placement(snap, device, mesh)
    modules = {name: deserialize(snap, name, entry, where)
               for name, entry in sorted(manifest.modules.items())}
    warn_if_export_ages(manifest, path)
    device_tables, host = put_tables(snap, put)
    items = item_index(snap)
    if items is not None:  # (numba's start-up, off the first subset's path)
        warm_kernels_in_background()
    return Artifact(path, manifest, device_tables, modules, snapshot.read_names(snap),
                    items, host, put, where)
