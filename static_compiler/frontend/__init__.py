"""The frontend: inputs become the automaton IR.

* `sequences`: token sequences (an int array (N, L) or ragged lists) are
  validated, sorted, deduplicated and built into a trie, vectorized (its
  names are re-exported here: ``from static_compiler.frontend import
  build_trie``);
* `graph`: an acyclic `networkx.DiGraph` becomes a layered automaton;
* `text`: text catalogues (names and a tokenizer) become token sequences;
* `readers`: constraint sets read from files (.npy, .jsonl, .txt);
* `datasets`: the built-in deterministic sets of the demos and benchmarks;
* `partitioned`: catalogues larger than memory, built from shards
  partition by partition on any `concurrent.futures.Executor` (`Shards`,
  in `shards`),
  with its steps in `spill` (sources into partitions), `partition_layers`
  (each partition's layers, and their merge), `array_files` (CRC-checked
  files between tasks, memory-mapped results), `build_tasks` (running
  them) and `build_dirs` (work directories and their owners).

Public: `sequences`' names (re-exported here), `datasets`, `readers`, `text`,
`spellings` and `shards` (`Shards`, at the package root); the partitioned
build's steps and `inputs` are internal.

The item index, name table and attribute columns it builds are data of
`static_compiler.items`, below the IR (a serving binary reads them without
the frontend). numpy only here (networkx for graphs, tokenizers when a tokenizer file is
read); no jax.
"""

from static_compiler.support.lazy import lazy_exports

__all__ = [
    "PaddedRows", "as_token_matrix", "automaton_from_sorted_codes", "build_automaton", "build_trie",
    "check_end_token", "check_range", "check_vocab_size", "row_keys", "sort_unique_codes",
    "sort_unique_rows", "terminal_states",
]
_EXPORTS = {name: "sequences" for name in __all__}
"""Public name -> the module of this package that defines it (imported on
first use)."""


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
