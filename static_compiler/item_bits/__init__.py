"""Item bits: which states of a compiled trie each item reaches, packed as
bits per layer, and items added to a set within its reserved capacity.

* `liveness`: item subsets as liveness bits (`Subset`, `stack_subsets`,
  re-exported at the package root; `BitLayout`);
* `layers`: how a trie's layers are read for those bits (from its tables
  or its IR); `layer_walk`: crossing one layer, by ranges; `bit_kernels`:
  its compiled numba kernels over packed bits (numpy without numba);
* `item_masks`: selected input rows -> their items, as bools or packed
  bits; `state_order`: the final states' items after additions;
* `placements`: a subset's device copies; `padding`: the bound on the
  padded subset stacks every door's warm-up keeps;
* `additions`, `table_additions`: added items merged into a trie, and
  written straight into its tables (the compiler's: no serving binary
  reaches them).

May import `errors`, `support`, `items`, `ir`, `frontend`, `target` and
numpy (numba in `bit_kernels` only); the modules the serving loader ships
reach no compiler module (tests/repository/test_layering.py follows the
serving binary's imports). Public: `liveness`; the others are imported by
the library by name. Nothing is imported here, so `item_bits.liveness`
loads alone.
"""
