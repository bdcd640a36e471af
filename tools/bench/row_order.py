"""What a subset's item bits cost by the order of the input rows (issue 54):
a random 10 % mask over N input rows made into item bits in trie order,
the first step of every `ranked_subset` (and `subset`) of a row mask.

* rows in random order (a catalogue compiled as it came): the selected
  rows scattered through the row -> item map (`item_masks.rows_item_bits`,
  int32 (N,), a random permutation here: each row's item far from its
  neighbours', as a trie's row order puts them), by buckets of item ranges
  (`item_bits.bucket_scatter`, from BUCKET_FROM items) and, as before it,
  each selected row's bit marked directly in the item bits; and the same
  rows given as a filter's (a `RowSource`, filled a chunk at a time: a
  copy of the mask here), both ways;
* the floor of that: the map and the mask read once on the same threads
  (one sum each; no write), the bytes any scatter must read at 10 %
  (nearly every 64-byte line of the map holds a selected row);
* rows in trie order (a catalogue stored sorted, row i item i, what
  `ranked_subset` detects: `item_masks.rows_are_items`): the mask packed
  in place on threads (`rows_item_bits(..., in_item_order=True)`), and
  `np.packbits` of the mask on one thread.

Medians of ``--repeats``; every output checked (the scatter against
numpy's, in-place packing against `np.packbits`). Issue 54's target: a
10 % subset from a ready mask at 1e9 <= 0.3 s.

    python -m tools.bench.row_order --items 1e9 --repeats 3
"""

from __future__ import annotations

import numpy as np

from tools.bench.cli import exit_without_teardown, sized_parser
from tools.bench.output import machine_line
from tools.bench.timing import median_ms


def _permutation(n: int, seed: int) -> np.ndarray:
    """int32 (n,): row -> item, rows spread far apart (item = (a * row + b)
    mod n for a random a coprime to n: a permutation, neighbours
    ~a apart), made a chunk at a time."""
    rng = np.random.default_rng(seed)
    while True:
        a = int(rng.integers(n // 3, n - 1)) | 1
        if np.gcd(a, n) == 1:
            break
    b, out, chunk = int(rng.integers(0, n)), np.empty(n, np.int32), 1 << 24
    for lo in range(0, n, chunk):
        i = np.arange(lo, min(n, lo + chunk), dtype=np.int64)
        out[lo:lo + i.shape[0]] = (a * i + b) % n
    return out


class _MaskRows:
    """A filter's rows as `item_masks.rows_item_bits` reads them (an
    `item_masks.RowSource`: filled a chunk at a time), here copied from a
    ready mask, so the scatter's cost is compared with the mask's."""

    def __init__(self, mask: np.ndarray):
        self.mask, self.num_rows = mask, mask.shape[0]

    def fill(self, lo: int, hi: int, out: np.ndarray, scratch=None) -> None:
        np.copyto(out, self.mask[lo:hi])


def _read_once(row_item: np.ndarray, mask: np.ndarray, threads: int) -> int:
    """The floor: every byte of `row_item` and `mask` read once, a chunk at a
    time on `threads` threads (numpy's reductions release the GIL)."""
    from static_compiler.support.threads import on_threads

    n, chunk = mask.shape[0], 1 << 22
    ranges = [(a, min(n, a + chunk)) for a in range(0, n, chunk)]

    def share(part) -> int:
        return sum(int(np.bitwise_or.reduce(row_item[a:b])) + int(np.count_nonzero(mask[a:b]))
                   for a, b in part)

    return sum(on_threads(ranges, share, threads))


def run(n: int, repeats: int, seed: int) -> int:
    from static_compiler.item_bits import bit_kernels, bucket_scatter, item_masks, layer_walk
    from static_compiler.items.index import ItemIndex

    print(f"# a 10 % row mask's item bits by the rows' order: {n} rows, each its own item")
    print(f"# {machine_line()}")
    bit_kernels.warm()
    bucket_scatter.warm()
    rng = np.random.default_rng(seed)
    mask = np.empty(n, bool)
    for a in range(0, n, 1 << 24):  # (16-bit draws below 6554: 10.0006 %)
        k = min(1 << 24, n - a)
        np.less(rng.bit_generator.random_raw(-(-k // 4)).view(np.uint16)[:k], 6554,
                out=mask[a:a + k])
    shuffled = ItemIndex(row_item=_permutation(n, seed), num_unique=n)
    in_order = ItemIndex(row_item=np.arange(n, dtype=np.int32), num_unique=n)
    threads = layer_walk.WALK_THREADS
    rows = []
    floor_ms = median_ms(lambda: _read_once(shuffled.row_item, mask, threads), repeats)
    want = np.zeros(n, bool)
    want[shuffled.row_item[mask]] = True
    library = bucket_scatter.BUCKET_FROM
    ways = [(f"by buckets (`bucket_scatter`, from {library:.1e} items)", library, mask),
            ("each row's bit marked directly", 1 << 62, mask),
            ("a filter's rows (a `RowSource`, a chunk at a time), by buckets", library,
             _MaskRows(mask)),
            ("a filter's rows, each row's bit marked directly", 1 << 62, _MaskRows(mask))]
    for name, bucket_from, selection in ways:
        bucket_scatter.BUCKET_FROM = bucket_from  # (1 << 62: the direct marking at any size)
        scatter_ms = median_ms(  # noqa: B023 (called here)
            lambda: item_masks.rows_item_bits(selection, shuffled, "bench"), repeats)
        bits = item_masks.rows_item_bits(selection, shuffled, "bench")
        rows.append((f"random order: {name}", scatter_ms, np.array_equal(bits.bools(), want)))
    bucket_scatter.BUCKET_FROM = library
    del want, bits
    rows.append(("random order: the floor, map and mask read once", floor_ms, True))
    assert item_masks.rows_are_items(in_order)
    check_ms = median_ms(lambda: item_masks.rows_are_items(in_order), repeats)
    place_ms = median_ms(
        lambda: item_masks.rows_item_bits(mask, in_order, "bench", in_item_order=True), repeats)
    pack_ms = median_ms(lambda: np.packbits(mask, bitorder="little"), repeats)
    bits = item_masks.rows_item_bits(mask, in_order, "bench", in_item_order=True)
    packed = np.packbits(mask, bitorder="little")
    ok = np.array_equal(bits.data[:packed.shape[0]], packed)
    rows += [("trie order: packed in place (`in_item_order`)", place_ms, ok),
             ("trie order: `np.packbits`, one thread", pack_ms, True),
             ("trie order: `rows_are_items`, once per loaded set", check_ms, True)]
    print(f"\n| {n:.0e} rows, 10 % selected, {threads} threads | ms | vs the floor | "
          "checked |")
    print("|---|--:|--:|---|")
    for name, ms, same in rows:
        print(f"| {name} | {ms:.1f} | {ms / floor_ms:.2f}x | {'same' if same else 'DIFFERS'} |")
    return 0 if all(same for *_, same in rows) else 1


def main(argv=None) -> int:
    parser = sized_parser("python -m tools.bench.row_order", __doc__, 1e7)
    args = parser.parse_args(argv)
    return run(int(args.items), args.repeats, args.seed)


if __name__ == "__main__":
    exit_without_teardown(main())
