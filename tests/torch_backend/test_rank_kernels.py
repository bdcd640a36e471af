"""Rank reads of item subsets in torch (`torch_backend.rank_kernels`): on the
live fuzz's sets (every layout, fixed and variable length, capacity,
additions, removals, stacked per-row subsets) the range counts answer
exactly what today's liveness bits do (`kernels.child_live`,
`dense_child_live`, `end_live`) and what the items say (brute force), at
every step, with the offsets carried down by `child_offsets` (and the
same offsets searched up from a state, `node_offsets`); the shallow
depths' bits made from the rank bits (`trie_ranges.depth_live`, and depth
1's in torch, `ranked_live`) equal the walk's;
the reads trace under torch.compile(fullgraph=True); bad inputs are refused
naming the value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from item_bits.test_rank import prefixes
from live_cases import CI_EXAMPLES, compile_case, fuzz_settings, live_cases, updated

import static_compiler as sc
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.item_bits import liveness, rank, trie_ranges
from static_compiler.item_bits.item_masks import rows_item_mask
from static_compiler.torch_backend import kernels, live_bits
from static_compiler.torch_backend import rank_kernels as rk
from static_compiler.torch_backend.tables import torch_plan, torch_tables


class Ranked:
    """A compiled set's torch plan and tables, its ranges, and a stack of
    subsets both as liveness bits and as placed rank bits."""

    def __init__(self, compiled, subsets: list):
        view = compiled._set_view
        self.items, self.trie = view.checked_items("test"), view.trie()
        self.layers = trie_ranges.range_layers(self.trie.layers, self.trie.num_final_states)
        self.order = trie_ranges.trie_order(self.items, self.layers)
        self.plan = torch_plan(view.facts)
        self.tables = torch_tables(compiled.lowered.tables)
        self.ranges = rk.range_tensors(self.trie, self.order, view.fingerprint)
        self.masks = np.stack([rows_item_mask(s, self.items, "test") for s in subsets])
        self.ranked = rank.ranked_subset(self.masks, self.order, self.items.removed,
                                         fingerprint=view.fingerprint)
        self.placed = rk.ranked_rows(self.ranked, self.ranges, "test")
        self.bits = live_bits(sc.stack_subsets([compiled.subset(m) for m in subsets]))

    def offsets(self) -> list:
        """Per depth 0..depth: every table state's offset, carried down from
        the root by `child_offsets` (0 past the trie's states)."""
        out = [torch.zeros(1, dtype=torch.long)]
        for t, layer in enumerate(self.trie.layers):
            node = torch.arange(layer.num_states)
            kids = rk.child_offsets(self.ranges, t, out[-1][:layer.num_states], node)
            branch = torch.from_numpy(np.diff(np.asarray(layer.indptr).astype(np.int64)))
            carried = torch.zeros(self.plan.count_at(t + 1), dtype=torch.long)
            carried[:int(branch.sum())] = torch.repeat_interleave(kids, branch)
            out.append(carried)
        return out


def check_reads(compiled, case) -> None:
    s = Ranked(compiled, case.subsets)
    R, V = len(case.subsets), case.vocab
    chosen = [case.subset_items(r) for r in range(R)]
    names = prefixes(s.trie)
    offsets = s.offsets()
    for t in range(s.plan.depth + 1):
        count = s.plan.count_at(t)
        node = torch.arange(count, dtype=torch.long)
        rows = node % R
        sub = (s.bits, rows)
        real = node < s.ranges.counts[t]  # (past them: a capacity's padding)
        carried = offsets[t] if s.ranges.carries_offsets(t) else None
        searched = rk.node_offsets(s.ranges, t, node)  # (up from the node: what decoders use)
        assert (searched is None) == (carried is None), t
        if carried is not None:
            assert torch.equal(searched[real].long(), carried[real]), ("offsets", t)
        want = kernels.end_live(sub, t, node)
        got = rk.end_live(s.ranges, s.placed, rows, t, node, carried)
        assert (want is None) == (got is None), t
        if got is not None:
            assert torch.equal(got[real], want[real]), ("end", t)
            brute = [names[t][x] in chosen[x % R] for x in range(int(real.sum()))]
            assert got[real].tolist() == brute, ("end brute", t)
        if t == s.plan.depth:
            break
        step = s.plan.steps[t]
        kids = kernels.children(step, s.tables[t], node, V)
        want = kernels.dense_child_live(sub, t, node, V) if t in s.plan.slot_steps else \
            kernels.child_live(sub, t, kids.next)
        below = rk.child_offsets(s.ranges, t, offsets[t], node) \
            if s.ranges.carries_offsets(t + 1) else None
        got = rk.child_live(s.ranges, s.placed, rows, t, kids.next, below)
        checked = kids.valid & real[:, None]
        assert torch.equal(got[checked], want[checked]), ("child", t)
        if step.kind != "dense_rows":  # a slice of consecutive states
            fast = rk.child_live(s.ranges, s.placed, rows, t, kids.next, below, consecutive=True)
        else:  # a row's consecutive states, read back by token
            fast = rk.dense_child_live(s.ranges, s.placed, rows, t, node, kids.next, below)
            assert not fast[~kids.valid].any(), t
        assert torch.equal(fast[checked], got[checked]), ("consecutive", t)
        for b, k in torch.nonzero(checked).tolist():
            name = names[t + 1][int(kids.next[b, k])]
            assert name[:-1] == names[t][b]
            assert bool(got[b, k]) == any(u[:t + 1] == name for u in chosen[b % R]), (t, b, k)
        # the bits a shallow depth would keep, made from the rank bits
        from_ranks = trie_ranges.depth_live(s.ranked, trie_ranges.depth_bounds(s.layers, t + 1))
        if t == 0:  # the decoders' depth-1 bits, made when a ranked subset is placed
            first = rk.ranked_live(s.ranges, s.placed).first
            assert np.array_equal(first.numpy(), from_ranks), "ranked_live.first"
        for r in range(R):
            live, _ = liveness.liveness(s.trie.layers, s.trie.num_final_states, s.trie.end_token,
                                        s.items, drop_removed(s.masks[r], s.items))
            assert np.array_equal(from_ranks[r], live[t]), ("depth_live", t, r)


def drop_removed(mask: np.ndarray, items) -> np.ndarray:
    out = mask.copy()
    if items.removed is not None:
        out &= ~np.asarray(items.removed, bool)[:out.shape[0]]
    return out


@fuzz_settings(CI_EXAMPLES * 2)
@given(live_cases())
def test_rank_reads_equal_the_liveness_bits_at_every_step(case):
    check_reads(updated(compile_case(case), case), case)


@fuzz_settings(max(4, CI_EXAMPLES // 2))
@given(live_cases())
def test_rank_reads_of_a_set_built_in_shards(case):
    check_reads(updated(compile_case(case, shards=True), case), case)


def _ragged():
    rng = np.random.default_rng(5)
    rows = [tuple(int(x) for x in rng.integers(1, 9, rng.integers(1, 5))) for _ in range(60)]
    compiled = sc.compile_constraints(rows, 9, end_token=0, export_subsets=True)
    compiled = compiled.update(add=[(1, 1, 1, 2), (2, 2), (3,)]).update(
        remove=np.arange(len(rows) + 3) % 5 == 0)
    return rows, compiled


def test_reads_trace_under_torch_compile_fullgraph():
    rows, compiled = _ragged()
    s = Ranked(compiled, [np.arange(len(rows) + 3) % k == 0 for k in (2, 3)])
    assert s.ranges.at.shape[0] and s.ranges.carries_offsets(2)

    def run(index):
        node = torch.zeros(index.shape[0], dtype=torch.long)
        offsets = torch.zeros_like(node)
        out = []
        for t in range(s.plan.depth):
            kids = kernels.children(s.plan.steps[t], s.tables[t], node, s.plan.vocab_size)
            below = rk.child_offsets(s.ranges, t, offsets, node)
            live = rk.child_live(s.ranges, s.placed, index, t, kids.next, below)
            end = rk.end_live(s.ranges, s.placed, index, t, node, offsets)
            out += [live[:, :4]] + ([] if end is None else [end[:, None]])
            pick = (kids.valid & live).long().argmax(dim=1)
            node, offsets = kids.next.gather(1, pick[:, None])[:, 0], below
        return torch.cat(out, dim=1)

    index = torch.tensor([0, 1, 1, 0])
    want = run(index)
    assert want.any()
    assert torch.equal(torch.compile(run, fullgraph=True, backend="eager")(index), want)


def test_bad_inputs_are_refused_naming_the_value():
    rows, compiled = _ragged()
    s = Ranked(compiled, [np.arange(len(rows) + 3) % 2 == 0])
    other = sc.compile_constraints(rows, 9, end_token=0, export_subsets=True)
    theirs = Ranked(other, [np.arange(len(rows)) % 2 == 0])
    with pytest.raises(DecodeInputError, match="made from another set"):
        rk.ranked_rows(theirs.ranked, s.ranges, "test")
    forged = rank.RankedSubset(theirs.ranked.items, theirs.ranked.added, theirs.ranked.at,
                               s.ranked.fingerprint)
    with pytest.raises(DecodeInputError, match=r"has \d+ items, 0 of them added: this set "
                                               r"has \d+, 2 added"):
        rk.ranked_rows(forged, s.ranges, "test")
    with pytest.raises(DecodeInputError, match="subset is a Subset: expected a RankedSubset"):
        rk.ranked_rows(compiled.subset(np.ones(len(rows) + 3, bool)), s.ranges, "test")
    with pytest.raises(DecodeInputError, match=r"subset_index has shape \(3,\) and dtype "
                                               r"torch.int64: expected an int tensor \(4,\)"):
        rk.check_rows(s.placed, torch.zeros(3, dtype=torch.long), 4, "test")
    with pytest.raises(DecodeInputError, match="dtype torch.float32"):
        rk.check_rows(s.placed, torch.zeros(4), 4, "test")
    node = torch.zeros(2, dtype=torch.long)
    with pytest.raises(DecodeInputError, match="offsets=None at depth 2"):
        rk.child_live(s.ranges, s.placed, node, 1, node[:, None])
    with pytest.raises(ConstraintSetError, match="different sets"):
        rank.RankedSubset.stack([s.ranked, theirs.ranked])


def test_stacked_ranked_subsets_read_as_one():
    rows, compiled = _ragged()
    masks = [np.arange(len(rows) + 3) % k == 1 for k in (2, 3, 7)]
    s = Ranked(compiled, masks)
    one = rank.RankedSubset.stack([rank.ranked_subset(m[None], s.order, s.items.removed,
                                                      fingerprint=s.ranked.fingerprint)
                                   for m in s.masks])
    positions = np.arange(s.order.count + 1)
    for r in range(len(masks)):
        np.testing.assert_array_equal(one.prefix(positions, r), s.ranked.prefix(positions, r))


@pytest.mark.parametrize("size", [0, 1, 31, 511, 512, 513, 1024, 3000])
def test_rank_at_equals_the_numpy_rank_at_every_position(size):
    """int32 and int64 positions, stacked rows, positions past the ends
    clamped; an `ItemRanks` made without the spare bit (words exactly
    ceil(size / 512) blocks) is read the same."""
    rng = np.random.default_rng(size)
    masks = rng.random((3, size)) < 0.3
    ranks = rank.ItemRanks.of_mask(masks, fine=True)
    blocks = max(1, -(-size // 512))
    tight = rank.ItemRanks(ranks.words[:, :16 * blocks], ranks.counts[:, :blocks + 1], size,
                           ranks.within[:, :16 * blocks])
    at = np.arange(size + 1)
    rows = np.arange(3)
    want = np.stack([ranks.rank(at, r) for r in rows])
    assert np.array_equal(want[:, -1], masks.sum(axis=1))
    for made in (ranks, tight, rank.ItemRanks.of_mask(masks)):  # (the last: counted on placing)
        t = rk.rank_tensors(made)
        for dtype in (torch.int32, torch.int64):
            pos = torch.from_numpy(at).to(dtype).expand(3, -1)
            got = rk.rank_at(t, torch.from_numpy(rows), pos)
            assert got.dtype == dtype and np.array_equal(got.numpy(), want)
            outside = rk.rank_at(t, torch.tensor([5, -1, 1]), torch.tensor([[-4, size + 9]] * 3,
                                                                            dtype=dtype))
            assert outside.tolist() == [[0, want[2, -1]], [0, want[0, -1]], [0, want[1, -1]]]
