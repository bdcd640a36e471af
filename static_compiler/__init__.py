"""static-compiler: compile sets of allowed token sequences into XLA programs
that enforce them during decoding (STATIC: vectorized tries).

    import static_compiler as sc
    compiled = sc.compile_constraints(sids, vocab_size=V)
    result = sc.beam_search(compiled, logits_fn, batch_size=2, beam_size=70)
"""

import importlib

# Names are imported on first use (PEP 562), so `from static_compiler import
# serving` loads jax and numpy only, not the compiler.
_LAZY = {
    "errors": None, "ir": None, "serving": None,
    "PAD_TOKEN": "support.decode_types", "SENTINEL_SCORE": "support.decode_types", "BeamState": "support.decode_types",
    "DecodeResult": "support.decode_types", "ProcessorState": "support.decode_types",
    "BeamAxis": "backend.decode.carry",
    "max_programs": "backend.decode.programs", "set_max_programs": "backend.decode.programs",
    "CompiledConstraints": "compiled", "beam_search": "compiler",
    "compile_constraints": "compiler", "greedy_decode": "compiler", "sample": "compiler",
    "load": "saved", "update_artifact": "lifecycle.update", "upgrade_artifact": "lifecycle.upgrade",
    "reexport_artifact": "lifecycle.upgrade", "list_versions": "lifecycle.versions",
    "rollback_artifact": "lifecycle.versions",
    "DEFAULT_PIPELINE": "passes.pipeline", "format_pipeline": "passes.pipeline",
    "parse_pipeline": "passes.pipeline",
    "enable_compilation_cache": "jax_support.compilation_cache",
    "Subset": "item_bits.liveness", "stack_subsets": "item_bits.liveness", "Shards": "frontend.shards",
    "attr": "rules.where", "item_mask": "rules.where",
}

# Modules that moved into their stage's package, still importable as
# `from static_compiler import datasets` (a path the docs used).
_MOVED = {"datasets": "frontend.datasets", "text": "frontend.text", "readers": "frontend.readers",
          "partitioned": "frontend.partitioned"}


_WITHOUT_JAX = ("(or, to decode without jax: static_compiler.torch_backend.TorchConstraints, "
                "which needs numpy and torch only; compile_constraints and save need numpy "
                "alone)")


def __getattr__(name):
    try:
        return _load(name)
    except ModuleNotFoundError as err:  # the compiler and its decoders need jax
        missing = (err.name or "").split(".")[0]
        if missing not in ("jax", "jaxlib"):
            raise
        from static_compiler.errors import JAX_INSTALL, require
        require(missing, f"static_compiler.{name} (the JAX decoders)",
                f"{JAX_INSTALL} {_WITHOUT_JAX}")  # raises MissingDependencyError
        raise


def _load(name):
    if name in _MOVED:
        value = importlib.import_module(f"static_compiler.{_MOVED[name]}")
        globals()[name] = value
        return value
    if name not in _LAZY:
        raise AttributeError(f"module 'static_compiler' has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        value = importlib.import_module(f"static_compiler.{name}")
    else:
        value = getattr(importlib.import_module(f"static_compiler.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "BeamAxis", "BeamState", "CompiledConstraints", "DEFAULT_PIPELINE", "DecodeResult", "PAD_TOKEN",
    "ProcessorState", "SENTINEL_SCORE", "beam_search", "compile_constraints",
    "enable_compilation_cache", "errors",
    "format_pipeline", "greedy_decode", "ir", "load", "max_programs", "parse_pipeline",
    "sample", "set_max_programs", "Shards", "Subset", "stack_subsets", "update_artifact", "upgrade_artifact",
    "reexport_artifact", "attr", "item_mask", "list_versions", "rollback_artifact",
]
