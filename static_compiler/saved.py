"""The artifact round trip of the library: `load` reads a saved
artifact back into a `CompiledConstraints` (`compiled_from_snapshot`, which
the lifecycle's writers read a version back with: `static_compiler.lifecycle`)."""

from __future__ import annotations

import dataclasses

from static_compiler.compiled import BuildInfo, CompiledConstraints, ExportOptions, Lowered
from static_compiler.item_bits.liveness import warm_kernels_in_background


def load(path, *, verify_checksums: bool = True,
                  check_automaton: bool = False) -> CompiledConstraints:
    """The compiled set a saved artifact holds.

    Read from its manifest and tables (numpy, memory-mapped; no module is
    run): plan, tables, pipeline, export options, names and item index as
    saved, and the manifest's summary of the automaton (counts, branch
    histograms, layouts: `metadata.summary_from_metadata`), checked against
    the tables a chunk at a time. The automaton itself is never rebuilt:
    subsets, removals, additions, `show-ir` and a new save read the tables
    (as for a set built from `Shards`), so a set of 1e9 items loads in
    bounded memory. `ir` reads it back when asked for. For updating a saved
    set in the library (`update_artifact`, `static_compiler.lifecycle.update`).

    Parameters
    ----------
    path : str or os.PathLike
        The artifact directory (`CompiledConstraints.save`).
    verify_checksums : bool
        Check every file against the manifest's checksums.
    check_automaton : bool
        Also check that the tables form a valid automaton that agrees with
        the manifest, refusing tables edited with their checksums
        recomputed: the check behind every verify path
        (`artifact.table_check.check_artifact`, as `static-compiler verify`
        and the serving loader's `load_checked` run it: a trie's tables a
        chunk at a time, bounded memory; a minimized set rebuilt whole and
        verified). The automaton is not kept: `ir` reads it back when asked.

    Returns
    -------
    CompiledConstraints
        The saved set, tables as numpy arrays (`lowered.tables`, one dict
        per layer), one device (no `lowered.placement`), the export options
        its artifact was exported for (`export_options`; `subsets` set when
        the artifact holds an item index) and its `build.pipeline`.

    Raises
    ------
    ArtifactFormatError
        For a missing or malformed artifact (manifest, plan, files).
    IRVerificationError
        With check_automaton, when its tables do not form a valid automaton
        (naming the layer and state) or accept another number of sequences
        than the manifest records.
    ArtifactChecksumError
        For a file whose checksum differs from the manifest's.
    ArtifactVersionError
        For an artifact of an unsupported format version.
    """
    from static_compiler.artifact.table_check import require_valid
    from static_compiler.format import snapshot
    from static_compiler.format.spec import artifact_path

    with snapshot.open_snapshot(artifact_path(path, "load"),
                                verify_checksums=verify_checksums) as snap:
        if check_automaton:
            require_valid(snap)
        return compiled_from_snapshot(snap)


def compiled_from_snapshot(snap) -> CompiledConstraints:
    """`load` of an open `format.snapshot.Snapshot` (every array
    read from its open files)."""
    from static_compiler.artifact.metadata import export_options, plan_from_metadata, summary_from_metadata
    from static_compiler.artifact.read import read_items
    from static_compiler.format import snapshot

    manifest = snap.manifest
    where, metadata = f"artifact {str(snap.path)!r}", dataclasses.asdict(manifest)
    plan, _ = plan_from_metadata(metadata, where)
    tables = tuple(snapshot.read_tables(snap))
    summary = summary_from_metadata(metadata, tables, where)
    items = None if manifest.item_files is None else read_items(snap)
    if items is not None:  # (numba's start-up, off the first subset's path)
        warm_kernels_in_background()
    names = snapshot.read_names(snap)
    compiled = CompiledConstraints(
        Lowered(plan, tables), BuildInfo(pipeline=manifest.pipeline),
        ExportOptions(subsets=items is not None, **export_options(manifest)),
        names=names, items=items, _summary=summary)
    # the tables' file checksums are their digests (`subsets.set_fingerprint`):
    # its fingerprint then reads no table
    compiled._computed.rows_in_item_order = manifest.rows_in_item_order  # (checked by read_items)
    compiled._computed.table_digests = {
        (entry.layer, entry.name): manifest.files[entry.file].sha256
        for entry in manifest.tables if entry.file in manifest.files and
        tuple(entry.shape) == tuple(getattr(tables[entry.layer].get(entry.name), "shape", ()))}
    return compiled
