"""The artifact's writer side: a compiled set saved as a directory of .npy
tables, `jax.export` modules and a manifest, and read back as compiler
objects (the automaton, the items, a checked set).

* `export`: the modules exported with `jax.export`;
* `metadata`: the manifest fields that describe the set, and the plan and
  automaton read back from them;
* `lock`: the writers' lock (`update_lock`);
* `history`: the versions every writer keeps of what it replaces;
* `files`: a version's files before they are written (bytes, `NpyFile`,
  `LinkedFile`) and how one is written;
* `writer`: `save`, the files' atomic swap, `recover_stale`;
* `read`: `read_automaton`, `read_names`, `read_items`, `load_checked`;
* `table_check`: an artifact's tables checked a chunk at a time (what
  `static-compiler verify` runs without --input).

The data flow: the compiler writes through this package in the format of
`static_compiler.format` (file names, versions, manifest, snapshot: no jax),
which the serving binary, `static_compiler.serving`, reads with no compiler
module. Updating, upgrading, re-exporting and rolling back a saved artifact
are `static_compiler.lifecycle`, above this package.

Public: `writer` (through this package's `save`, `recover_stale`), `read`
(`load_checked` and the readers), `lock` (`update_lock`), `table_check`;
the others are internal.

Nothing is imported here. The writer's and readers' functions are available
here on first use (PEP 562), as `artifact.save`, `artifact.load_checked`,
`artifact.update_lock`. The format's and the serving binary's modules,
here until 0.1.0, are reachable by their old names with a
DeprecationWarning until 0.2.0 (`_MOVED`).
"""

from static_compiler.support.lazy import lazy_exports

_EXPORTS = {
    "export_modules": "export", "aval_specs": "export", "export_caps": "metadata",
    "set_metadata": "metadata", "plan_from_metadata": "metadata",
    "automaton_from_metadata": "metadata",
    "lock_file": "lock", "update_lock": "lock",
    "NpyFile": "writer", "build_files": "writer", "save": "writer", "save_locked": "writer",
    "recover_stale": "writer",
    "read_items": "read", "read_automaton": "read", "load_checked": "read", "read_names": "read",
}
"""Public name -> the module of this package that defines it."""

_SUBMODULES = frozenset({"export", "metadata", "lock", "history", "writer", "read", "table_check"})


_MOVED = {
    "format": "static_compiler.format.spec", "manifest": "static_compiler.format.manifest",
    "manifest_records": "static_compiler.format.manifest_records",
    "names": "static_compiler.format.names", "normalize": "static_compiler.format.normalize",
    "snapshot": "static_compiler.format.snapshot", "snapshot_items": "static_compiler.format.snapshot_items",
    "runtime": "static_compiler.serving.runtime", "warm": "static_compiler.serving.warm",
    "serving": "static_compiler.serving",
}
"""The modules that left this package for `static_compiler.format` and
`static_compiler.serving` (0.1.0's `from static_compiler.artifact import
serving`): still reachable here, warning, until 0.2.0."""


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES, _MOVED)


__all__ = sorted(_EXPORTS)
