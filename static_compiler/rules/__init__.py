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
  or filters, priors, the base subset);
* `subsets`: what item subsets need of a compiled set (its fingerprint,
  token sequences -> items, removals): the compiler's, no serving binary
  reaches it.

The rules read item bits (priors walk the trie's states), never the
reverse: may import `errors`, `support`, `items`, `item_bits`,
`target.plan`, `frontend` (`subsets` only) and numpy. Public: `where`,
`priors`, `set_view`; nothing is imported here.
"""
