"""`static-compiler verify`: check an artifact's tables form the set its
manifest records and, optionally, compare its sequences with the input it
was compiled from. Exit status 1 on a mismatch.

Without --input the tables are checked and their sequences counted by the
check behind every verify path (`artifact.table_check.check_artifact`: a
trie's tables a chunk at a time, bounded memory, a 1e9 set too; a minimized
set rebuilt whole); with --input the automaton is rebuilt from the tables,
verified and enumerated.

The set a decode serves is the live one: the tables' sequences less those
`static-compiler update --remove` took out (items/removed.npy). The input is
compared with the live set, so after a removal the removed items count as
missing (labelled so) unless the input left them out too."""

from __future__ import annotations

import argparse
import sys

from static_compiler.cli.common import INPUT_FORMATS, Subcommand


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ART", help="artifact directory")
    parser.add_argument("--input", default=None,
                        help=f"the constraint set it was compiled from, as `compile` reads "
                             f"it: {INPUT_FORMATS}")
    parser.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON",
                        help="the tokenizers JSON file a text catalogue was compiled with: "
                             "--input is then its names, encoded as `compile` encodes them")
    parser.add_argument("--examples", type=int, default=5,
                        help="differing sequences to print (default 5)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from static_compiler.artifact.read import read_automaton
    from static_compiler.cli.common import read_any_input
    from static_compiler.errors import CliInputError
    from static_compiler.frontend import as_token_matrix, row_keys
    from static_compiler.frontend.text import encode_catalogue
    from static_compiler.ir import Automaton, enumerate_sequences

    if args.input is None and args.tokenizer is None:
        return _check(args.artifact)
    attributes_ok = _check_attributes(args.artifact)
    ir = read_automaton(args.artifact)
    tokens, lengths = enumerate_sequences(ir)
    out = sys.stdout
    ok = tokens.shape[0] == ir.num_sequences
    out.write(f"{args.artifact}: {tokens.shape[0]} sequences enumerated from the tables; the "
              f"manifest records {ir.num_sequences}: {'OK' if ok else 'MISMATCH'}\n")
    removed = _removed_rows(args.artifact, ir, tokens, lengths)
    if removed.any():
        out.write(f"{int(removed.sum())} of them removed by updates, "
                  f"{int((~removed).sum())} live\n")
    if args.tokenizer is not None and args.input is None:
        raise CliInputError("--tokenizer goes with --input (the names to compare with)")
    if args.input is not None:
        given, _, tokenizer = read_any_input(args.input, vocab_size=ir.vocab_size,
                                             end_token=ir.end_token, tokenizer=args.tokenizer)
        if tokenizer is not None:
            given = encode_catalogue(given, tokenizer, ir.vocab_size,
                                     end_token=ir.end_token).sequences
        if isinstance(given, Automaton):
            want_tokens, want_lengths = enumerate_sequences(given)
        else:
            want_tokens, want_lengths, _ = as_token_matrix(given)
        width = max(tokens.shape[1], want_tokens.shape[1])
        pad = lambda a: np.pad(np.asarray(a, np.int64), ((0, 0), (0, width - a.shape[1])),
                               constant_values=-1)
        keys = row_keys(pad(tokens), lengths)
        have = np.unique(keys[~removed])
        want = np.unique(row_keys(pad(want_tokens), want_lengths))
        missing = want[~np.isin(want, have)]
        extra = have[~np.isin(have, want)]
        gone = int(np.isin(missing, keys[removed]).sum())
        note = f" ({gone} of them removed by updates)" if gone else ""
        served = "live in the artifact" if removed.any() else "in the artifact"
        for label, rows in ((f"in the input but not {served}{note}", missing),
                            (f"{served} but not in the input", extra)):
            out.write(f"{len(rows)} sequences {label}\n")
            for key in rows[:args.examples]:
                row = np.frombuffer(key.tobytes(), dtype=np.int64)
                out.write(f"  {[int(t) for t in row if t >= 0]}\n")
        ok = ok and not len(missing) and not len(extra)
        out.write(f"{len(want)} unique input sequences: {'OK' if ok else 'MISMATCH'}\n")
    return 0 if ok and attributes_ok else 1


def _check(path):
    """Without --input: the tables checked and their sequences counted,
    never enumerated (`table_check.check_artifact`: a trie's a chunk at a
    time, bounded memory at 1e9)."""
    import numpy as np

    from static_compiler.artifact.table_check import CHECK_CHUNK, check_artifact
    from static_compiler.format import snapshot

    with snapshot.open_snapshot(path) as snap:
        counted = check_artifact(snap)
        rel = (snap.manifest.item_files or {}).get("removed")
        removed = 0
        if rel is not None:
            flags = snap.npy(rel)
            removed = sum(int(np.count_nonzero(flags[a:a + CHECK_CHUNK]))
                          for a in range(0, flags.shape[0], CHECK_CHUNK))
    ok = counted["num_sequences"] == counted["recorded"]
    out = sys.stdout
    out.write(f"{path}: {counted['num_sequences']} sequences counted from the tables "
              f"({counted['how']}); the manifest records {counted['recorded']}: "
              f"{'OK' if ok else 'MISMATCH'}\n")
    if removed:
        out.write(f"{removed} of them removed by updates, {counted['recorded'] - removed} live\n")
    return 0 if _check_attributes(path) and ok else 1


def _check_attributes(path) -> bool:
    """Writes one line on the artifact's item attributes (their count and
    kinds), when it has any; whether they are sound: every category code
    names one of its column's categories (read a chunk at a time)."""
    from static_compiler.artifact.table_check import CHECK_CHUNK
    from static_compiler.format import snapshot, snapshot_items

    with snapshot.open_snapshot(path) as snap:
        arrays = snapshot_items.read_item_arrays(snap)
        attributes = None if arrays is None else arrays["attributes"]
        if attributes is None:
            return True
        bad = []
        for name, column in attributes.items():
            if column.kind == "category":
                codes, count = column.values, len(column.categories)
                if any(codes[a:a + CHECK_CHUNK].min(initial=0) < 0 or
                       codes[a:a + CHECK_CHUNK].max(initial=0) >= count
                       for a in range(0, codes.shape[0], CHECK_CHUNK)):
                    bad.append(f"{name}: a code outside its {count} categories")
    kinds = ", ".join(f"{row['name']}: {row['kind']} {row['dtype']}" +
                      ("" if row["categories"] is None else f" ({row['categories']} categories)")
                      for row in attributes.describe())
    sys.stdout.write(f"{len(attributes)} item attributes ({kinds}) over {attributes.num_rows} "
                     f"rows: {'MISMATCH: ' + '; '.join(bad) if bad else 'OK'}\n")
    return not bad


def _removed_rows(path, ir, tokens, lengths):
    """bool (N,) over `enumerate_sequences(ir)`'s rows `tokens` int64 (N, L)
    (-1 past `lengths`): True for a sequence an update removed (the
    artifact's items/removed.npy); all False for an artifact without item
    index or removals."""
    import numpy as np

    from static_compiler.compiler_items.subsets import unique_ids
    from static_compiler.format import snapshot, snapshot_items
    from static_compiler.items.index import ItemIndex

    with snapshot.open_snapshot(path) as snap:
        arrays = snapshot_items.read_item_arrays(snap)
    none = np.zeros(tokens.shape[0], bool)
    if arrays is None or arrays.get("removed") is None or not arrays["removed"].any():
        return none
    items = ItemIndex(num_unique=ir.num_sequences, **arrays)
    fixed = bool((lengths == tokens.shape[1]).all())
    sequences = tokens if fixed else [row[:n] for row, n in zip(tokens, lengths.tolist())]
    ids = unique_ids(ir, items, sequences)
    return np.where(ids >= 0, items.removed[np.maximum(ids, 0)], False)


COMMAND = Subcommand("verify", "re-enumerate an artifact's set from its tables and compare it "
                               "with the input", add_arguments, run)
