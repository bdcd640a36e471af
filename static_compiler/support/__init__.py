"""Utilities every layer may import: numpy and standard-library helpers
(dtypes, arrays, argument checks, memory-mapped files, worker processes) and
the decoding interface shared by the JAX decoder, the serving loader and the
torch backend (`decode_types`, `decode_state`), with jax's compile events and
persistent cache (`compile_events`, `compilation_cache`).

Public: `decode_types` (`BeamState`, `DecodeResult`, `ProcessorState`,
`WarmReport`, the constants: at the package root), `compile_events`
(`CompileCounter`) and `compilation_cache` (`enable_compilation_cache`); the
others are internal.

Nothing here imports a stage of the compiler (ir, frontend, passes, target,
live, backend, artifact): the arrow points from those to here only.
"""
