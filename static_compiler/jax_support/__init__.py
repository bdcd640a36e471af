"""The jax utilities the two JAX front doors share (the in-process decoder,
`backend/`, and the serving binary, `serving/`); the torch backend never
imports them.

* `compile_events`: XLA compilations counted from jax's compile events
  (`CompileCounter`, `xla_compilations`);
* `compilation_cache`: jax's persistent compilation cache, on in one call
  (`enable_compilation_cache`, re-exported at the package root);
* `placement`: which tables split across a device mesh (`MeshPlacement`);
* `beam_result`: a beam search's result from its last state (`finalize`);
* `ranked_arrays`: a ranked subset's arrays on the device (`RankedMask`),
  which the in-process decoder reads and the served ``_ranked`` modules
  take;
* `warmth`: a JAX door's warm state (`Warmth`: its compile counter and
  subset padding) and the arrays its warm-up walks with (`JaxPaths`).

May import jax, numpy, `errors`, `support`, `item_bits` and `decoding` (a JAX door's
warm-up paths); jax is imported by `beam_result` at import, by the others
on first use. Public: `compile_events` and `compilation_cache` (the docs
name them); the others are internal. Nothing is imported here.
"""
