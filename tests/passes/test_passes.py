"""Passes: the cost model's estimate equals the measured table bytes for
every layout kind; choose-layout respects the budget and picks `unary` for
levels of single children; pad-branches and pack-dtypes keep their promises;
passes are pure and keep the accepted language."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import fixed_length_sets, ragged_sets, random_dags

from static_compiler import compile_constraints
from static_compiler.errors import MemoryBudgetError, PipelineError
from static_compiler.frontend import build_automaton
from static_compiler.ir import LayoutKind, parse_ir
from static_compiler.passes import REGISTRY
from static_compiler.passes.choose_layout import ChooseLayoutPass
from static_compiler.passes.pack_dtypes import PackDtypesPass
from static_compiler.passes.pad_branches import PadBranchesPass
from static_compiler.passes.pipeline import run_pipeline
from static_compiler.passes.split_heavy import SplitHeavyPass

THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])


def automata():
    """Fixed-length, ragged and explicit-target (DAG) automata."""
    return st.one_of(
        fixed_length_sets(max_items=20).map(lambda c: build_automaton(c[0], c[1])),
        ragged_sets(max_items=20).map(lambda c: build_automaton(c[0], c[1], end_token=c[2])),
        random_dags())


def test_registry_names_every_pass():
    assert set(REGISTRY) >= {"verify", "choose-layout", "split-heavy", "pad-branches", "pack-dtypes"}
    for name, cls in REGISTRY.items():
        assert cls.name == name


@settings(max_examples=60, deadline=None)
@given(automata(), st.sampled_from(list(LayoutKind)), st.booleans())
def test_estimate_equals_measured_bytes_for_every_layout(ir, kind, packed):
    spec = f"choose-layout{{force={kind}}},pad-branches{{multiple=8}}" + (",pack-dtypes" if packed else "")
    compiled = compile_constraints(ir, ir.vocab_size, pipeline=spec)
    for t, (layer, stats) in enumerate(zip(compiled.ir.layers, compiled.layer_stats())):
        branch = layer.branch()
        can_serve = {LayoutKind.DENSE_ROWS: True, LayoutKind.CSR: True,
                     LayoutKind.UNARY: bool((branch == 1).all()),
                     LayoutKind.NEAR_UNARY: bool((branch != 1).any())}[kind]
        if can_serve:
            assert layer.layout.kind == kind, (t, layer.layout)
        assert stats["estimated_bytes"] == stats["bytes"] == layer.layout.estimated_bytes, (t, stats)
    assert compiled.lowered.nbytes == sum(s["bytes"] for s in compiled.layer_stats())
    assert list(compiled.ir.sequences()) == list(ir.sequences())


@settings(max_examples=60, deadline=None)
@given(automata())
def test_levels_of_single_children_become_unary_without_row_pointers(ir):
    compiled = compile_constraints(ir, ir.vocab_size)
    for layer, tables in zip(compiled.ir.layers, compiled.lowered.tables):
        if (layer.branch() == 1).all():
            assert layer.layout.kind == LayoutKind.UNARY and layer.layout.k == 1
            assert "indptr" not in tables and "ex_starts" not in tables
            assert set(tables) <= {"tokens", "targets", "accepting"}
        else:
            assert layer.layout.kind != LayoutKind.UNARY


def test_a_chain_is_unary_everywhere():
    compiled = compile_constraints([[5, 0, 7, 7, 2]], 8)
    assert [l.layout.kind for l in compiled.ir.layers] == [LayoutKind.UNARY] * 5
    assert compiled.lowered.nbytes == 5 * 2  # one uint16 token per state


def test_near_root_full_fanout_is_dense():
    compiled = compile_constraints([[v, v] for v in range(16)], 16)
    assert [l.layout.kind for l in compiled.ir.layers] == [LayoutKind.DENSE_ROWS, LayoutKind.UNARY]


def test_smallest_layouts_for_the_example_are_23_bytes():
    # Packed tables (uint16 tokens, int16 states): layer 0 dense 1*4*2 = csr 2*2+2*2 = 8;
    # layer 1 unary 2*2 = 4;
    # layer 2 near_unary 3*2 + one exception (id 2, start 2, uint8 branch 1) = 11
    # (csr 3*2+3*2 = 12, dense 2*4*2 = 16): 23 bytes in all.
    with pytest.raises(MemoryBudgetError, match=r"the smallest layouts need 23 bytes"):
        run_pipeline(build_automaton(THREE, 4), "choose-layout{memory-budget=22}")
    ir = run_pipeline(build_automaton(THREE, 4), "choose-layout{memory-budget=23}")
    assert [l.layout.kind for l in ir.layers] == [LayoutKind.DENSE_ROWS, LayoutKind.UNARY,
                                                  LayoutKind.NEAR_UNARY]
    assert sum(l.layout.estimated_bytes for l in ir.layers) == 23


def _smallest_bytes(ir) -> int:
    with pytest.raises(MemoryBudgetError) as info:
        run_pipeline(ir, "choose-layout{memory-budget=1}")
    return int(re.search(r"the smallest layouts need (\d+) bytes", str(info.value)).group(1))


@settings(max_examples=50, deadline=None)
@given(automata(), st.floats(0.0, 1.0))
def test_choose_layout_respects_the_memory_budget(ir, where):
    smallest = _smallest_bytes(ir)
    fastest = run_pipeline(ir, "choose-layout{memory-budget=1TiB}")
    fastest_total = sum(l.layout.estimated_bytes for l in fastest.layers)
    assert fastest_total >= smallest
    budget = smallest + int(where * (fastest_total - smallest))
    chosen = run_pipeline(ir, f"choose-layout{{memory-budget={budget}}}")
    assert sum(l.layout.estimated_bytes for l in chosen.layers) <= budget
    if smallest > 1:
        with pytest.raises(MemoryBudgetError, match=rf"need {smallest} bytes"):
            run_pipeline(ir, f"choose-layout{{memory-budget={smallest - 1}}}")


def test_memory_budget_error_names_pass_budget_and_need():
    with pytest.raises(MemoryBudgetError) as info:
        compile_constraints(THREE, 4, pipeline="verify,choose-layout{memory-budget=10},pack-dtypes")
    message = str(info.value)
    for part in ("pass 'choose-layout{memory-budget=10}'", "passes run before it: verify",
                 "memory-budget=10 (10 bytes) is too small", "need 23 bytes"):
        assert part in message


@settings(max_examples=50, deadline=None)
@given(automata(), st.sampled_from([1, 2, 8, 128]))
def test_pad_branches_rounds_k_up_within_the_vocabulary(ir, multiple):
    laid = run_pipeline(ir, "choose-layout")
    padded = PadBranchesPass(multiple=multiple).run(laid)
    for before, after in zip(laid.layers, padded.layers):
        k0, k1 = before.layout.k, after.layout.k
        if before.layout.kind.sliced:
            assert k0 <= k1 <= max(k0, ir.vocab_size)
            assert k1 % multiple == 0 or k1 == ir.vocab_size or k1 == k0
            assert k1 - k0 < multiple
            assert k1 >= after.max_branch
        else:
            assert after.layout == before.layout
    assert parse_ir(str(padded)) == padded


@settings(max_examples=50, deadline=None)
@given(automata(), st.integers(1, 9), st.sampled_from([1, 2, 8]))
def test_pad_branches_rounds_light_k_and_drops_a_mix_that_reaches_k(ir, light, multiple):
    mixed = run_pipeline(ir, f"choose-layout{{force=csr}},split-heavy{{light-k={light}}}")
    padded = PadBranchesPass(multiple=multiple).run(mixed)
    for before, after in zip(mixed.layers, padded.layers):
        lay0, lay1 = before.layout, after.layout
        if not lay0.mixed:
            assert not lay1.mixed
            continue
        rounded = max(lay0.light_k, min(-(-lay0.light_k // multiple) * multiple, ir.vocab_size))
        if rounded < lay1.k:
            assert (lay1.light_k, lay1.wide_slots) == (rounded, lay0.wide_slots)
        else:
            assert (lay1.light_k, lay1.wide_slots) == (0, 0)
    assert parse_ir(str(padded)) == padded


@settings(max_examples=50, deadline=None)
@given(automata())
def test_pack_dtypes_picks_the_narrowest_types(ir):
    packed = run_pipeline(ir, "choose-layout,pack-dtypes")
    for t, layer in enumerate(packed.layers):
        lay = layer.layout
        assert lay.token_dtype == ("uint16" if ir.vocab_size <= 65536 else "int32")
        largest = max(layer.num_edges, layer.num_states, packed.num_states_at(t + 1))
        narrower = {"int16": None, "int32": "int16", "int64": "int32"}[lay.state_dtype]
        assert np.iinfo(lay.state_dtype).max >= largest
        assert narrower is None or np.iinfo(narrower).max < largest


@pytest.mark.parametrize("V,token_dtype", [(65536, "uint16"), (65537, "int32")])
def test_pack_dtypes_token_boundary(V, token_dtype):
    compiled = compile_constraints([[V - 1, 0], [0, V - 1]], V)
    assert {l.layout.token_dtype for l in compiled.ir.layers} == {token_dtype}
    assert all(tab["tokens"].dtype == token_dtype for tab in compiled.lowered.tables if "tokens" in tab)


def test_pack_dtypes_state_boundary():
    # 40000 states at depth 1 do not fit int16 (max 32767)
    rows = np.stack([np.arange(40000) // 200, np.arange(40000) % 200], axis=1)
    compiled = compile_constraints(rows, 200)
    assert [l.layout.state_dtype for l in compiled.ir.layers] == ["int16", "int32"]


@settings(max_examples=30, deadline=None)
@given(automata())
def test_passes_are_pure(ir):
    text = str(ir)
    for spec in ("verify", "choose-layout", "choose-layout,pad-branches", "choose-layout,pack-dtypes",
                 "choose-layout{force=csr},split-heavy{light-k=1}"):
        out = run_pipeline(ir, spec)
        assert list(out.sequences()) == list(ir.sequences())
    assert str(ir) == text and all(l.layout is None for l in ir.layers)


@pytest.mark.parametrize("spec", ["split-heavy", "pad-branches", "pack-dtypes"])
def test_layout_passes_need_choose_layout_first(spec):
    with pytest.raises(PipelineError, match=rf"{spec}: layer 0 has no layout; run choose-layout first"):
        run_pipeline(build_automaton(THREE, 4), spec)


@pytest.mark.parametrize("cls,kwargs,pattern", [
    (PadBranchesPass, dict(multiple=0), r"multiple=0 must be >= 1"),
    (ChooseLayoutPass, dict(memory_budget=0), r"memory-budget=0 must be positive"),
    (ChooseLayoutPass, dict(dense_threshold=0.0), r"dense-threshold=0.0 must be > 0"),
    (ChooseLayoutPass, dict(force="bitmap"), r"force='bitmap' is not a layout kind"),
    (SplitHeavyPass, dict(wide_slots=0), r"wide-slots=0 must be >= 1"),
    (SplitHeavyPass, dict(beams=0), r"beams=0 must be >= 1"),
    (SplitHeavyPass, dict(max_read_ratio=1.5), r"max-read-ratio=1.5 must be in \(0, 1\]"),
    (SplitHeavyPass, dict(light_k=-1), r"light-k=-1 must be >= 0"),
])
def test_pass_options_are_validated(cls, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        cls(**kwargs)
    spec_options = ",".join(f"{k.replace('_', '-')}={v}" for k, v in kwargs.items())
    with pytest.raises(PipelineError, match=pattern):
        REGISTRY[cls.name].from_options(dict(o.split("=") for o in spec_options.split(",")))


def test_pack_dtypes_is_idempotent():
    once = run_pipeline(build_automaton(THREE, 4), "choose-layout,pack-dtypes")
    assert PackDtypesPass().run(once) == once


def test_dense_rows_only_within_its_byte_overhead_over_csr():
    # Layer 1: state 0 has 40 of V=64 children (k >= V/2), the 63 others one each.
    # Dense: 64 states x 64 x int16 = 8192 bytes; csr: 65 + 103 int16 = 336 bytes (24x).
    sids = [[0, j] for j in range(40)] + [[i, 0] for i in range(1, 64)]
    default = compile_constraints(sids, 64)
    assert default.ir.layers[1].layout.kind == LayoutKind.NEAR_UNARY
    generous = compile_constraints(
        sids, 64, pipeline="choose-layout{dense-max-overhead=30},pack-dtypes")
    assert generous.ir.layers[1].layout.kind == LayoutKind.DENSE_ROWS
    assert generous.lowered.nbytes > default.lowered.nbytes
    with pytest.raises(PipelineError, match=r"dense-max-overhead=0.0 must be > 0"):
        compile_constraints(sids, 64, pipeline="choose-layout{dense-max-overhead=0}")


# --------------------------------------------------------------------------
# split-heavy: the mixed layout


def _skewed_layer_set(num_light: int = 2000, heavy_branch: int = 500, light_branch: int = 3):
    """Layer 1 of a two-token set: `num_light` states with `light_branch`
    children and one state with `heavy_branch` children (V = heavy_branch)."""
    rows = [(0, t) for t in range(heavy_branch)]
    rows += [(s, t) for s in range(1, num_light + 1) for t in range(light_branch)]
    return np.array(rows), max(heavy_branch, num_light + 1)


def test_split_heavy_mixes_a_skewed_layer_and_leaves_a_uniform_one():
    rows, V = _skewed_layer_set()
    skewed = compile_constraints(rows, V, pipeline="choose-layout{force=csr},split-heavy")
    lay = skewed.ir.layers[1].layout
    assert (lay.kind, lay.k, lay.light_k, lay.wide_slots) == (LayoutKind.CSR, 500, 8, 4)
    uniform = compile_constraints(np.array([(s, t) for s in range(300) for t in range(20)]), 300,
                                  pipeline="choose-layout{force=csr},split-heavy")
    assert not any(layer.layout.mixed for layer in uniform.ir.layers)
    # The mix needs a heavy-state fraction of at most wide_slots / 2 per `beams` beams.
    assert not compile_constraints(rows, V, pipeline="choose-layout{force=csr},split-heavy"
                                   "{beams=5000}").ir.layers[1].layout.mixed


def test_split_heavy_is_in_the_default_pipeline_and_prints_in_the_ir():
    rows, V = _skewed_layer_set()
    compiled = compile_constraints(rows, V)
    lay = compiled.ir.layers[1].layout
    assert lay.mixed and "light=8,wide=4" in lay.to_text()
    assert parse_ir(compiled.ir.to_text(max_edges=10 ** 6)) == compiled.ir
    assert compiled.plan.steps[1].light_k == 8 and compiled.plan.steps[1].wide_slots == 4


def _read_ratio(lay, beams: int = 70) -> float:
    """Entries a batch row reads with `lay`'s mix, over the entries it reads unmixed."""
    return (beams * lay.light_k + lay.wide_slots * (lay.k - lay.light_k)) / (beams * lay.k)


@pytest.mark.parametrize("heavy_branch", [500, 1000])
def test_split_heavy_plans_for_the_multiple_pad_branches_rounds_to(heavy_branch):
    rows, V = _skewed_layer_set(heavy_branch=heavy_branch)
    compiled = compile_constraints(rows, V, pipeline="choose-layout{force=csr},split-heavy,"
                                   "pad-branches{multiple=128}")
    lay = compiled.ir.layers[1].layout
    assert lay.mixed and lay.light_k % 128 == 0 and lay.k % 128 == 0
    assert _read_ratio(lay) <= SplitHeavyPass().max_read_ratio
    # The spec keeps what was written: the multiple is wired, not spelled out.
    assert compiled.build.pipeline == "choose-layout{force=csr},split-heavy,pad-branches{multiple=128}"


def test_split_heavy_does_not_mix_when_the_padded_widths_break_the_read_ratio():
    # k = 200 pads to 256 and light_k to 128: 70 * 128 + 4 * 128 reads > half of 70 * 256.
    # Planned at multiples of 8 (light_k = 8, k = 200) the mix looked cheap.
    rows, V = _skewed_layer_set(heavy_branch=200)
    padded = compile_constraints(rows, V, pipeline="choose-layout{force=csr},split-heavy,"
                                 "pad-branches{multiple=128}").ir.layers[1].layout
    assert (padded.k, padded.mixed) == (256, False)
    planned_at_8 = compile_constraints(rows, V, pipeline="choose-layout{force=csr},"
                                       "split-heavy{multiple=8},pad-branches{multiple=128}")
    lay = planned_at_8.ir.layers[1].layout
    assert (lay.k, lay.light_k) == (256, 128) and _read_ratio(lay) > 0.5


def test_split_heavy_takes_the_multiple_of_the_first_later_pad_branches_unless_set():
    pad8, pad128 = PadBranchesPass(8), PadBranchesPass(128)
    assert SplitHeavyPass().wired([PackDtypesPass(), pad128, pad8]).multiple == 128
    assert SplitHeavyPass().wired([PackDtypesPass()]).multiple == 0
    assert SplitHeavyPass(multiple=16).wired([pad128]).multiple == 16
    with pytest.raises(ValueError, match="multiple=-1 must be >= 0"):
        SplitHeavyPass(multiple=-1)


def test_mixed_layout_fields_are_validated():
    from static_compiler.errors import IRVerificationError
    from static_compiler.ir import Layout, LayoutKind
    with pytest.raises(IRVerificationError, match=r"light_k=4, wide_slots=0: expected both 0"):
        Layout(LayoutKind.CSR, 8, light_k=4)
    with pytest.raises(IRVerificationError, match=r"needs kind csr or near_unary and 1 <= light_k < k"):
        Layout(LayoutKind.CSR, 8, light_k=8, wide_slots=2)
    with pytest.raises(IRVerificationError, match=r"dense_rows\(k=8\) with light_k=2"):
        Layout(LayoutKind.DENSE_ROWS, 8, light_k=2, wide_slots=2)
    assert Layout.from_text("csr(k=8,light=2,wide=3,est=0B)") == Layout(LayoutKind.CSR, 8, light_k=2,
                                                                         wide_slots=3)
