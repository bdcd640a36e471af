"""Utilities every layer may import: numpy and standard-library helpers
(dtypes, arrays, argument checks, memory-mapped files, worker processes,
threads, lazy package attributes, deprecation warnings) and the decoding
interface shared by the JAX decoders, the serving loader and the torch
backend (`decode_types`, `decode_state`, `beam_loop`).

Public: `decode_types` (`BeamState`, `DecodeResult`, `ProcessorState`,
`WarmReport`, the constants: at the package root); the others are internal.

numpy and the standard library only, and nothing of ours but `errors`: the
jax utilities are `static_compiler.jax_support`. `compile_events` and
`compilation_cache`, here until 0.1.0, are still attributes of this package
(imported from it by their old names) with a DeprecationWarning until 0.2.0
(`_MOVED`).
"""

from static_compiler.support.lazy import lazy_exports

_MOVED = {"compile_events": "static_compiler.jax_support.compile_events",
          "compilation_cache": "static_compiler.jax_support.compilation_cache"}
"""The public modules that left this package for `static_compiler.jax_support`:
still reachable here, warning, until 0.2.0."""

__getattr__, __dir__ = lazy_exports(__name__, {}, frozenset(), _MOVED)
