"""The artifact stage: a compiled set saved as a directory of .npy tables,
`jax.export` modules and a manifest, and read back for serving.

Modules by layer (tests/repository/test_layering.py), lowest first:

* core definitions (standard library and numpy only, no jax; shared by the
  compiler, the writers and the serving loader):
  - `format`: names of files, format versions with their dated history, the
    checksum rules;
  - `manifest`: the manifest's schema (`Manifest` and its entries);
  - `names`: a text catalogue's names.jsonl read back (`read_names_jsonl`);
  - `snapshot`: opening and checking an artifact (`Snapshot`,
    `open_snapshot`) and reading its manifest, tables, names and items;
  (which tables split across a device mesh, and memory-mapped arrays, are
  `support.placement` and `support.mapped`);
* the artifact layer (jax, and the backend for the writers):
  - `export`: the modules exported with `jax.export`;
  - `metadata`: the manifest fields that describe the set, and the plan and
    automaton read back from them;
  - `lock`: the writers' lock (`update_lock`);
  - `history`: the versions every writer keeps of what it replaces;
  - `writer`: `save`, the files and their atomic swap, `recover_stale`;
  - `read`: `read_automaton`, `read_names`, `read_items`, `load_checked`;
  - `runtime` and `serving`: the serving loader (`serving.load`), which
    imports no compiler module.

Updating, upgrading, re-exporting and rolling back a saved artifact are
`static_compiler.lifecycle`, above this package.

Nothing is imported here: `static_compiler.artifact.format` loads without
jax. The writer's and readers' functions are available here on first use
(PEP 562), as `artifact.save`, `artifact.load_checked`, `artifact.update_lock`.
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

_SUBMODULES = frozenset({"format", "manifest", "names", "snapshot",
                         "export", "metadata", "lock", "history", "writer", "read", "runtime",
                         "serving"})


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)


__all__ = sorted(_EXPORTS)
