"""Older artifacts read in the current shape: which `format.COMPAT`
branches an artifact needs (`needed_branches`), refused once a branch has
left the window (`check_window`), and what `snapshot` reads turned into the
current shape as it is read: a near_unary layer's ``ex_bounds`` into
``ex_starts`` / ``ex_branch`` (`current_tables`), missing branch histograms
read from the tables (`with_branch_counts`), a version 8 ``state_item`` into
insertions (`current_items`). So the decoding kernels of both backends,
`item_bits.layers` and the subset code read one format only; the modules an
artifact exported keep taking its tables as written
(`snapshot.load_tables`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_compiler.format.spec import COMPAT, MIN_FORMAT_VERSION, format_error, version_error
from static_compiler.item_bits.layers import table_branch_counts
from static_compiler.support.dtypes import branch_dtype_for

ADDED_KEYS = ("names_file", "item_files", "mesh", "subset_bits", "exported_at",
              "attributes", "beam_schedules", "export_plan", "rows_in_item_order")
"""Manifest keys older versions lack: each the name of its COMPAT row, added
by the version after the row's last_version (`Manifest.from_json` reads
their defaults)."""


def needed_branches(manifest) -> list[str]:
    """The names of the `format.COMPAT` rows the readers take to read
    `manifest` (a `manifest.Manifest`) and its files: [] for an artifact
    of the current shape. By shape, not by version alone: an update that
    keeps an older artifact's modules keeps its tables' names and bit
    layout in a newer version."""
    version = manifest.format_version
    needed = [key for key in ADDED_KEYS if version <= COMPAT[key].last_version]
    if manifest.item_files is not None and manifest.subset_bits == "per_state":
        needed.append("per_state")  # COMPAT["per_state"]
    if any(t.name == "ex_bounds" for t in manifest.tables):
        needed.append("ex_bounds")  # COMPAT["ex_bounds"]
    if any(not isinstance(layer, dict) or "branch_counts" not in layer
           for layer in manifest.layers):
        needed.append("branch_counts")  # COMPAT["branch_counts"]
    if "state_item" in (manifest.item_files or {}):
        needed.append("state_item")  # COMPAT["state_item"]
    return needed


def check_window(manifest, path) -> None:
    """ArtifactVersionError (`format.version_error`) when `manifest` needs
    a COMPAT branch whose last version is below MIN_FORMAT_VERSION (the
    branch has gone: its shape is outside the window)."""
    for name in needed_branches(manifest):
        branch = COMPAT[name]
        if branch.last_version < MIN_FORMAT_VERSION:
            raise version_error(path, manifest.format_version,
                                f"it holds {branch.reads}, of format version "
                                f"{branch.last_version} and before")


def current_tables(tables) -> tuple[dict, ...]:
    """`tables` (one dict of arrays per layer, as written) in the current
    shape: a near_unary layer's ex_bounds (X, 2) [start, end) rows
    (`COMPAT["ex_bounds"]`: format version <= 5, goes after its
    `removed_after` date) become ex_starts (X,) of its dtype and ex_branch
    (X,) of the narrowest unsigned dtype holding its branches, as the writer
    lowers them; every other array is returned as it is (a memory-mapped
    one stays mapped)."""
    out = []
    for tabs in tables:
        if "ex_bounds" in tabs:  # COMPAT["ex_bounds"]
            tabs = dict(tabs)
            bounds = np.asarray(tabs.pop("ex_bounds"))
            starts = bounds[:, 0]
            branch = bounds[:, 1].astype(np.int64) - starts
            tabs["ex_starts"] = starts.copy()
            tabs["ex_branch"] = branch.astype(branch_dtype_for(int(branch.max(initial=0))))
        out.append(tabs)
    return tuple(out)


def with_branch_counts(manifest, tables, path):
    """`manifest` with every layer's "branch_counts" (`COMPAT["branch_counts"]`:
    manifests before format version 7 have none), each read from the layer's
    `tables` (current shape, one dict per layer) over its own states
    (`item_bits.layers.table_branch_counts`, a chunk at a time), as the writer
    records them. ArtifactFormatError naming the layer where they cannot
    be read."""
    layers = []
    for t, (step, layer, tabs) in enumerate(zip(manifest.plan_steps, manifest.layers, tables)):
        if isinstance(layer, dict) and "branch_counts" not in layer:
            try:
                counts = table_branch_counts(step["kind"], tabs, layer["states"])
            except (KeyError, IndexError, ValueError, TypeError) as e:
                raise format_error(path, f"layer {t}: its branch histogram cannot be read from "
                                         f"its tables ({type(e).__name__}: {e})") from None
            layer = {**layer, "branch_counts": [int(c) for c in counts]}
        layers.append(layer)
    return dataclasses.replace(manifest, layers=tuple(layers))


def current_items(arrays: dict) -> dict:
    """The item arrays of `snapshot_items.read_item_arrays` (checked) in the
    current shape: a version 8 state_item (`COMPAT["state_item"]`, every
    final state's item) as state_inserted_at / state_inserted_item
    (`InsertedOrder.of_array`: one pass, a chunk at a time)."""
    if arrays.get("state_item") is None:
        return arrays
    from static_compiler.item_bits.state_order import InsertedOrder

    order = InsertedOrder.of_array(arrays["state_item"])
    return {**arrays, "state_item": None, "state_inserted_at": np.asarray(order.at, np.int32),
            "state_inserted_item": np.asarray(order.item, np.int32)}
