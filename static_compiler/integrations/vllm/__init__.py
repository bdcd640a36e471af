"""vLLM integration: `beam_search` (exact constrained beam search on a
`vllm.LLM`, each request with its own set). Importing this package imports
neither vllm nor jax (each submodule imports what it needs)."""
