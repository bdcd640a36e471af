"""static-compiler: compile sets of allowed token sequences into XLA programs
that enforce them during decoding (STATIC: vectorized tries).

    import static_compiler as sc
    compiled = sc.compile_constraints(sids, vocab_size=V)
    result = sc.beam_search(compiled, logits_fn, batch_size=2, beam_size=70)
"""

from static_compiler import errors, ir
from static_compiler.backend.decode import (PAD_TOKEN, SENTINEL_SCORE, BeamState, DecodeResult,
                                            ProcessorState)
from static_compiler.compiler import (CompiledConstraints, beam_search, compile_constraints,
                                      greedy_decode, sample)
from static_compiler.pipeline import DEFAULT_PIPELINE, format_pipeline, parse_pipeline

__version__ = "0.1.0"

__all__ = [
    "BeamState", "CompiledConstraints", "DEFAULT_PIPELINE", "DecodeResult", "PAD_TOKEN",
    "ProcessorState", "SENTINEL_SCORE", "beam_search", "compile_constraints", "errors",
    "format_pipeline", "greedy_decode", "ir", "parse_pipeline", "sample",
]
