"""What a compiled set's items are: data, no algorithm.

* `index`: the item index (`ItemIndex`: input rows -> items, final states
  -> items, removals and stale rows);
* `names`: a catalogue's name table (`NameTable`: items <-> names);
* `attributes`: the items' attribute columns (`ItemAttributes`, `Column`).

The frontend builds them, the item bits, the rules, the artifact's snapshot
and the serving loader read them; so the folder sits below the IR and may
import only `errors`, `support` and numpy. Public: all three modules
(imported by name); nothing is imported here.
"""
