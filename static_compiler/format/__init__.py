"""The artifact's format: what a saved set is on disk, shared by everything
that writes or reads one (the compiler's writer, `sc.load`, the serving
binary, the torch backend). No jax; numpy only, and the standard library
alone in `spec`.

* `spec`: the names of the files, the format versions with their dated
  history (`FORMAT_HISTORY`, `MIN_FORMAT_VERSION`, `COMPAT`), the checksum
  rules and the format's errors (re-exporting `module_names`: the exported
  modules' kinds and names, standard library alone too);
* `manifest`: the manifest's schema (`Manifest` and its entries), with
  `manifest_records` (the attribute columns' records);
* `names`: a text catalogue's names.jsonl read back (`read_names_jsonl`);
* `snapshot`: opening and checking an artifact (`Snapshot`,
  `open_snapshot`) and reading its manifest, tables and names;
  `snapshot_items`: its item index and attribute columns;
* `normalize`: tables and items saved by older format versions read in
  today's shape.

May import `errors`, `support`, `items` and `item_bits.layers` /
`state_order` (tests/repository/test_layering.py). Nothing is imported
here, so `format.spec` loads alone.

Public: `spec`, `manifest`, `snapshot` (what a reader of an artifact
uses); `manifest_records`, `names`, `snapshot_items` and `normalize` are
internal.
"""
