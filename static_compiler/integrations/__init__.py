"""Constraints for engines that own the beam search, on top of the public API.

* `static_compiler.integrations.torch`: `StaticLogitsProcessor`, a PyTorch
  logits processor for Hugging Face ``generate`` (needs the ``torch`` extra:
  ``pip install 'static-compiler[torch]'``).
* `static_compiler.integrations.vllm`: `StaticLogitsProcessor`, a vLLM
  logits processor (requests opt in with ``extra_args`` / ``vllm_xargs``
  ``sc_set``, ...; needs vLLM and the ``torch`` extra).

Public: `torch` (its `StaticLogitsProcessor`), `vllm` (its `StaticLogitsProcessor`). Nothing in the library imports this package; importing it imports neither
torch nor transformers (each submodule imports what it needs).
"""
