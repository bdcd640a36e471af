"""Live sets: a compiled set that changes without recompiling.

* `liveness`: item subsets as liveness bits (numpy only; shared by the
  library and the serving loader, which imports nothing else of ours but
  `layers`);
* `layers`: how a trie's layers are read for those bits (numpy only, shared
  too);
* `subsets`: what subsets need of a compiled set (its fingerprint, token
  sequences -> items, removals);
* `additions`: merging added items into a trie within reserved capacity.

Nothing is imported here, so the serving loader's `live.liveness` (and
`live.layers`) load alone.
"""
