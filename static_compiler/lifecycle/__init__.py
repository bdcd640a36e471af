"""The lifecycle of a compiled set and of its saved artifact: what happens
after the compile. Lowest first:

* `next_version`: a compiled set's next version in memory
  (`CompiledConstraints.update`: removals as liveness, additions merged
  into the reserved capacity or compiled anew);
* `update`: a saved artifact's next version written in place
  (`update_artifact`; removals alone: `update_removed`);
* `upgrade`: an artifact rewritten into the current format version
  (`upgrade_artifact`) or its modules exported anew (`reexport_artifact`);
* `versions`: the versions every writer keeps, listed (`list_versions`)
  and swapped back in (`rollback_artifact`).

Every writer here writes as `artifact.writer` does (atomically, under the
path's `artifact.lock.update_lock`) and records the version it replaces in
the history the writer keeps (`artifact.history`). The package sits beside
the public API (tests/repository/test_layering.py): it reads versions back
as `CompiledConstraints` (`saved.compiled_from_snapshot`), and no module of
the artifact or of a serving process imports it. Internal: its modules; the public functions are
`static_compiler.update_artifact`, `upgrade_artifact`, `reexport_artifact`,
`list_versions` and `rollback_artifact`. Nothing is imported here.
"""
