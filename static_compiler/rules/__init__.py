"""Business rules over a set's items, and the one set view every front door
applies them through.

* `where`: filter expressions over the items' attributes and named masks
  (`attr`, `item_mask`, re-exported at the package root; `parse`,
  `evaluate`, `RowFilter`), with `filter_tree` (their nodes) and
  `filter_text` (text -> tree);
* `priors`: an item prior, the best weighted attribute value below each
  state (`Prior`);
* `set_view`: one numpy view of a set's items behind the compiled set, the
  served artifact and the torch backend (`SetView`: subsets picked by rows
  or filters, priors, the base subset).

What item subsets need of the compiled automaton (its fingerprint, token
sequences -> items, removals) is `compiler_items.subsets`. The rules read
item bits (priors walk the trie's states), never the reverse: may import
`errors`, `support`, `items`, `item_bits`, `lowered` and numpy; no compiler
module: the serving binary ships the whole folder. Public: `where`,
`priors`, `set_view`; nothing is imported here.
"""
