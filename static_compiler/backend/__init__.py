"""The JAX backend: per-layout step kernels (`kernels`, `row_search`) and
the decoding entry points over them (`decode`), reading the static plan and
tables that `static_compiler.target` lowers.

Public: `decode` (its names and `decode.prefix`); `kernels` and `row_search`
are internal.
"""
