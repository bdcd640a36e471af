"""Item bits: which states of a compiled trie each item reaches, packed as
bits per layer.

* `liveness`: item subsets as liveness bits (`Subset`, `stack_subsets`,
  re-exported at the package root; `BitLayout`);
* `layers`: how a trie's layers are read for those bits (from its tables
  or its IR); `layer_walk`: crossing one layer, by ranges; `bit_kernels`:
  its compiled numba kernels over packed bits (numpy without numba);
* `item_masks`: selected input rows -> their items, as bools or packed
  bits (`bucket_scatter`: a large set's row mask by buckets of item
  ranges); `state_order`: the final states' items after additions;
* `rank`: subsets as rank bits over the items in trie order
  (`rank_words`: their kernels); `trie_ranges`: each state's items as one
  range of that order;
* `placements`: a subset's device copies; `padding`: the bound on the
  padded subset stacks every door's warm-up keeps.

Items added to a set are `compiler_items.additions` (they need the
compiler). May import `errors`, `support`, `items`, `lowered` and numpy
(numba through `jit` only, optional: `bit_kernels`, `rank_words` and
`bucket_scatter` load it, on first use); no compiler module: the serving
binary ships the whole folder. Public: `liveness`; the others are imported
by the library by name. Nothing is imported here, so `item_bits.liveness`
loads alone.
"""
