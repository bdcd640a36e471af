"""What a compiled set's items need of the compiler (the frontend's token
matrices, lowering): the item folders' compiler side, which no serving
binary reaches.

* `subsets`: item subsets of a compiled set (its fingerprint, token
  sequences -> items, removals);
* `additions`: added items merged into a compiled trie
  (`CompiledConstraints.update(add=...)`);
* `table_additions`: the same additions written straight into a set's
  tables.

Above the item folders (`items`, `item_bits`, `rules`) and the compiler
(`frontend`, `target`): numpy only. Internal: the compiled set, the
compiler and the lifecycle import them by name.
"""
