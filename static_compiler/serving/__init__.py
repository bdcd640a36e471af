"""The serving binary: a saved artifact loaded and decoded with jax, numpy
and no compiler module (no frontend, pass, lowering, backend or writer;
tests/repository/test_layering.py follows every import it may make).

    from static_compiler import serving
    art = serving.load("fresh_items.static")     # verifies files, sizes, sha256, versions
    state = art.init_beams(batch_size=2, beam_size=70)

* `loader`: `load`, `Artifact` (the verbs over the exported modules),
  `read_manifest`, `open_snapshot`, `load_from`; its names are this
  package's;
* `runtime`: the exported modules and the tables on the device;
* `engine`: the exported modules as the engine of the verbs
  (`decoding.decoder.Decoder`);
* `warm`: `Artifact.warm`, its plan and the subset padding it keeps.

It reads the artifact through `static_compiler.format`.

Public: this package's names (from `loader`); `runtime`, `engine` and
`warm` are internal.
"""

from static_compiler.serving.loader import (
    Artifact,
    BeamState,
    DecodeResult,
    ProcessorState,
    load,
    load_from,
    open_snapshot,
    read_manifest,
)

__all__ = ["Artifact", "BeamState", "DecodeResult", "ProcessorState", "load", "load_from",
           "open_snapshot", "read_manifest"]
