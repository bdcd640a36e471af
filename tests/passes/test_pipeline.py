"""Pipeline specs round-trip (parse -> format -> parse); bad specs give typed
errors; the pass manager verifies between passes, prints after each on
request, and names the failing pass and the passes before it."""

import contextlib
import dataclasses
import io
import re
from typing import Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import fixed_length_sets, ragged_sets

from static_compiler import DEFAULT_PIPELINE, compile_constraints, format_pipeline, parse_pipeline
from static_compiler.errors import IRVerificationError, MemoryBudgetError, PipelineError
from static_compiler.frontend import build_automaton
from static_compiler.ir import LayoutKind, parse_ir
from static_compiler.passes import REGISTRY, ByteSize, Pass
from static_compiler.passes.pipeline import run_pipeline

THREE = np.array([[1, 2, 1], [3, 1, 2], [3, 1, 3]])


@dataclasses.dataclass(frozen=True)
class OptionsProbe(Pass):
    """A pass with one option of every supported type (spec parsing tests)."""

    name = "options-probe"
    flag: bool = False
    ratio: float = 0.5
    label: str = ""
    count: int = 3
    budget: ByteSize = ByteSize(1 << 20)
    sizes: Tuple[int, ...] = (1, 2)

    def run(self, ir):
        return ir


@dataclasses.dataclass(frozen=True)
class BreakTokens(Pass):
    """Makes the last row of the last layer decrease (it must hold >= 2 edges)."""

    name = "break-tokens"

    def run(self, ir):
        last = ir.layers[-1]
        tokens = np.array(last.tokens)
        tokens[-2:] = [ir.vocab_size - 1, 0]
        return ir.with_layers(ir.layers[:-1] + (last.replace(tokens=tokens),))


@dataclasses.dataclass(frozen=True)
class Explode(Pass):
    name = "explode"

    def run(self, ir):
        raise PipelineError("explode: refused on purpose")


@contextlib.contextmanager
def registered_test_passes():
    """Adds the test passes to the registry for the duration of a block."""
    added = {cls.name: cls for cls in (OptionsProbe, BreakTokens, Explode)}
    REGISTRY.update(added)
    try:
        yield
    finally:
        for name in added:
            del REGISTRY[name]


@pytest.fixture
def test_passes():
    with registered_test_passes():
        yield


# --------------------------------------------------------------------------
# Spec round trip

_BYTE_TEXT = st.one_of(
    st.integers(1, 10 ** 12).map(str),
    st.tuples(st.integers(1, 4096), st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
      .map(lambda p: f"{p[0]}{p[1]}"),
    st.tuples(st.integers(1, 99), st.integers(1, 9), st.sampled_from(["MB", "GiB"]))
      .map(lambda p: f"{p[0]}.{p[1]}{p[2]}"))

_OPTION_TEXT = {
    "choose-layout": {"memory-budget": _BYTE_TEXT,
                      "dense-threshold": st.floats(1e-3, 4.0, allow_nan=False).map(repr),
                      "force": st.sampled_from(["", "dense_rows", "csr", "unary", "near_unary"])},
    "pad-branches": {"multiple": st.integers(1, 512).map(str)},
    "split-heavy": {"wide-slots": st.integers(1, 64).map(str), "beams": st.integers(1, 512).map(str),
                    "max-read-ratio": st.floats(1e-3, 1.0, allow_nan=False).map(repr),
                    "light-k": st.integers(0, 512).map(str), "multiple": st.integers(0, 512).map(str)},
    "pack-dtypes": {}, "verify": {},
    "options-probe": {"flag": st.sampled_from(["true", "false", "True", "1", "0", "yes", "no"]),
                      "ratio": st.floats(-1e6, 1e6, allow_nan=False).map(repr),
                      "label": st.text("abcxyz_-.", max_size=6),
                      "count": st.integers(-10 ** 6, 10 ** 6).map(str),
                      "budget": _BYTE_TEXT,
                      "sizes": st.lists(st.integers(0, 999), max_size=4)
                        .map(lambda xs: "(" + ",".join(map(str, xs)) + ")")},
}


@st.composite
def spec_texts(draw):
    """(spec text with random options, spacing and units, the pass names in order)."""
    entries, names = [], []
    for _ in range(draw(st.integers(1, 5))):
        name = draw(st.sampled_from(sorted(_OPTION_TEXT)))
        keys = draw(st.lists(st.sampled_from(sorted(_OPTION_TEXT[name])), unique=True,
                             max_size=3)) if _OPTION_TEXT[name] else []
        opts = [f"{k}={draw(_OPTION_TEXT[name][k])}" for k in keys]
        space = draw(st.sampled_from(["", " "]))
        entries.append(name + (("{" + f",{space}".join(opts) + "}") if opts else ""))
        names.append(name)
    return draw(st.sampled_from([",", ", "])).join(entries), names


@settings(max_examples=150, deadline=None)
@given(spec_texts())
def test_spec_round_trips(case):
    spec, names = case
    with registered_test_passes():
        passes = parse_pipeline(spec)
        assert [p.name for p in passes] == names
        canonical = format_pipeline(passes)
        assert parse_pipeline(canonical) == passes
        assert format_pipeline(parse_pipeline(canonical)) == canonical


@pytest.mark.parametrize("spec,attr,value", [
    ("choose-layout{memory-budget=64MiB}", "memory_budget", 64 << 20),
    ("choose-layout{memory-budget=2GiB}", "memory_budget", 2 << 30),
    ("choose-layout{memory-budget=1.5GB}", "memory_budget", 1_500_000_000),
    ("choose-layout{memory-budget=512KB}", "memory_budget", 512_000),
    ("choose-layout{memory-budget=123}", "memory_budget", 123),
    ("choose-layout{dense-threshold=0.25}", "dense_threshold", 0.25),
    ("choose-layout{force=unary}", "force", "unary"),
    ("pad-branches{multiple=128}", "multiple", 128),
    ("options-probe{flag=true}", "flag", True),
    ("options-probe{flag=no}", "flag", False),
    ("options-probe{ratio=-2.5e3}", "ratio", -2500.0),
    ("options-probe{sizes=(4,8,16)}", "sizes", (4, 8, 16)),
    ("options-probe{sizes=()}", "sizes", ()),
    ("options-probe{budget=3KiB}", "budget", 3072),
])
def test_option_values_parse_to_their_types(test_passes, spec, attr, value):
    (p,) = parse_pipeline(spec)
    got = getattr(p, attr)
    assert got == value and type(got) is type(getattr(type(p)(), attr))
    assert parse_pipeline(format_pipeline([p])) == (p,)


def test_defaults_are_left_out_and_units_kept():
    passes = parse_pipeline(" verify , choose-layout{memory-budget=64MiB} ,pad-branches{multiple=8},"
                            "pack-dtypes ")
    assert format_pipeline(passes) == "verify,choose-layout{memory-budget=64MiB},pad-branches,pack-dtypes"
    assert format_pipeline(parse_pipeline(DEFAULT_PIPELINE)) == \
        "verify,choose-layout,split-heavy,pad-branches,pack-dtypes"


def test_default_pipeline_is_the_passes_at_their_defaults():
    passes = parse_pipeline(DEFAULT_PIPELINE)
    assert passes == tuple(type(p)() for p in passes)
    assert DEFAULT_PIPELINE == ("verify,choose-layout{memory-budget=2GiB},split-heavy{wide-slots=4},"
                                "pad-branches{multiple=8},pack-dtypes")


def test_spell_out_writes_options_at_their_default():
    (p,) = parse_pipeline("pad-branches")
    assert p.spec() == "pad-branches"
    assert p.spec(spell_out=("multiple",)) == "pad-branches{multiple=8}"
    with pytest.raises(ValueError, match="no option"):
        p.spec(spell_out=("multiples",))


BAD_SPECS = [
    ("unknown pass", "verify,minimise", PipelineError,
     r"entry 1: unknown pass 'minimise' \(known: .*choose-layout.*verify"),
    ("unknown option", "choose-layout{budget=1GiB}", PipelineError,
     r"pass 'choose-layout' has no option 'budget' \(options: memory-budget, dense-threshold, dense-max-overhead, force\)"),
    ("option on a pass without options", "verify{strict=true}", PipelineError,
     r"pass 'verify' has no option 'strict' \(options: none\)"),
    ("int option given text", "pad-branches{multiple=eight}", PipelineError,
     r"option 'multiple' of pass 'pad-branches': expected int, got 'eight'"),
    ("int option given float", "pad-branches{multiple=8.5}", PipelineError, r"expected int, got '8.5'"),
    ("byte size garbage", "choose-layout{memory-budget=lots}", PipelineError,
     r"option 'memory-budget' of pass 'choose-layout': expected ByteSize, got 'lots'"),
    ("byte size unknown unit", "choose-layout{memory-budget=2GiBs}", PipelineError, r"expected ByteSize"),
    ("negative budget", "choose-layout{memory-budget=-1}", PipelineError, r"expected ByteSize, got '-1'"),
    ("zero budget", "choose-layout{memory-budget=0}", PipelineError, r"memory-budget=0 must be positive"),
    ("float option given text", "choose-layout{dense-threshold=half}", PipelineError,
     r"expected float, got 'half'"),
    ("bool option given text", "options-probe{flag=maybe}", PipelineError,
     r"option 'flag' of pass 'options-probe': expected bool, got 'maybe'"),
    ("tuple without parentheses", "options-probe{sizes=1}", PipelineError,
     r"expected a tuple like \(1,2\), got '1'"),
    ("tuple of wrong items", "options-probe{sizes=(1,x)}", PipelineError, r"expected int, got 'x'"),
    ("missing =", "pad-branches{multiple}", PipelineError, r"option 'multiple' is not key=value"),
    ("empty entry", "verify,,pack-dtypes", PipelineError, r"entry 1 is empty"),
    ("empty spec", "", PipelineError, r"entry 0 is empty"),
    ("unbalanced open", "choose-layout{force=csr", PipelineError, r"unbalanced braces"),
    ("unbalanced close", "verify}", PipelineError, r"unbalanced '}'"),
    ("text after braces", "pad-branches{multiple=8}x", PipelineError, r"expected name\{key=value,...\}"),
    ("not a string", 42, PipelineError, r"pipeline spec 42: expected a string"),
]


@pytest.mark.parametrize("spec,error,pattern", [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS])
def test_bad_specs_are_rejected(test_passes, spec, error, pattern):
    with pytest.raises(error, match=pattern):
        parse_pipeline(spec)
    with pytest.raises(error, match=pattern):
        compile_constraints(THREE, 4, pipeline=spec)


# --------------------------------------------------------------------------
# The pass manager

def test_failing_pass_is_named_with_the_passes_before_it(test_passes):
    with pytest.raises(PipelineError) as info:
        run_pipeline(build_automaton(THREE, 4), "verify,choose-layout{force=csr},explode,pack-dtypes")
    assert str(info.value).startswith(
        "pass 'explode' failed (passes run before it: verify,choose-layout{force=csr}): "
        "explode: refused on purpose")


def test_pass_leaving_an_invalid_ir_is_caught_by_the_verifier(test_passes):
    with pytest.raises(PipelineError) as info:
        run_pipeline(build_automaton(THREE, 4), "verify,break-tokens,pack-dtypes")
    message = str(info.value)
    assert message.startswith("pass 'break-tokens' left an invalid IR (passes run before it: verify)")
    assert message.endswith("layer 2, state 1: tokens not strictly increasing (3 then 0)")
    assert isinstance(info.value.__cause__, IRVerificationError)


def test_the_first_pass_failing_reports_none_before_it(test_passes):
    with pytest.raises(PipelineError, match=r"pass 'explode' failed \(passes run before it: \(none\)\)"):
        run_pipeline(build_automaton(THREE, 4), "explode")


def test_without_verify_each_a_broken_ir_passes_through(test_passes):
    out = run_pipeline(build_automaton(THREE, 4), "break-tokens", verify_each=False)
    assert out.layers[-1].tokens.tolist() == [1, 3, 0]


def test_memory_budget_error_keeps_its_type_through_the_manager():
    with pytest.raises(MemoryBudgetError, match=r"pass 'choose-layout\{memory-budget=1\}' failed "
                                                r"\(passes run before it: verify\)"):
        run_pipeline(build_automaton(THREE, 4), "verify,choose-layout{memory-budget=1}")


def test_print_after_all_writes_each_pass_in_order():
    stream = io.StringIO()
    timings = []
    out = run_pipeline(build_automaton(THREE, 4), DEFAULT_PIPELINE, print_ir_after_all=True,
                       stream=stream, timings=timings)
    text = stream.getvalue()
    specs = [p.spec() for p in parse_pipeline(DEFAULT_PIPELINE)]
    headers = [ln for ln in text.splitlines() if ln.startswith("// ----- IR after ")]
    assert headers == [f"// ----- IR after {s} -----" for s in specs]
    dumps = text.split("// ----- IR after ")[1:]
    assert parse_ir(dumps[-1].partition(" -----\n")[2]) == out
    assert [s for s, _ in timings] == specs and all(sec >= 0 for _, sec in timings)


def test_compile_constraints_with_a_spec_prints_each_ir_and_records_the_canonical_spec(capsys):
    spec = "verify,choose-layout{memory-budget=64MiB},pad-branches{multiple=8},pack-dtypes"
    compiled = compile_constraints(THREE, vocab_size=4, pipeline=spec, print_ir_after_all=True)
    err = capsys.readouterr().err
    assert err.startswith("// ----- IR after frontend -----\n")
    assert err.count("// ----- IR after ") == 5
    assert compiled.build.pipeline == "verify,choose-layout{memory-budget=64MiB},pad-branches,pack-dtypes"
    assert parse_ir(str(compiled.ir)) == compiled.ir
    assert compiled.lowered.nbytes == sum(s["bytes"] for s in compiled.layer_stats())
    assert [s["layout"] for s in compiled.layer_stats()] == [
        LayoutKind.DENSE_ROWS, LayoutKind.UNARY, LayoutKind.DENSE_ROWS]


@settings(max_examples=40, deadline=None)
@given(st.one_of(fixed_length_sets(max_items=20).map(lambda c: (c[0], c[1], None)),
                 ragged_sets(max_items=20)))
def test_every_intermediate_ir_parses_back(case):
    rows, V, end = case
    stream = io.StringIO()
    out = run_pipeline(build_automaton(rows, V, end_token=end), DEFAULT_PIPELINE,
                       print_ir_after_all=True, stream=stream)
    dumps = [d.partition(" -----\n")[2] for d in stream.getvalue().split("// ----- IR after ")[1:]]
    for dump in dumps:
        assert str(parse_ir(dump)) == dump
    assert parse_ir(dumps[-1]) == out
    assert list(out.sequences()) == sorted(set(map(tuple, rows)))


# ----- layouts planned from layer summaries (partitioned builds) -----

SUMMARY_PIPELINES = [
    DEFAULT_PIPELINE,
    "verify,choose-layout,reserve-capacity{growth=1.5},split-heavy,pad-branches,pack-dtypes",
    "choose-layout{force=csr},split-heavy{light-k=1,wide-slots=1},pad-branches{multiple=4},"
    "pack-dtypes",
    "choose-layout{force=near_unary},split-heavy{beams=4},pack-dtypes",
    "choose-layout{force=dense_rows,dense-threshold=0.01}",
    "choose-layout{memory-budget=600,dense-max-overhead=64}",
    "choose-layout{memory-budget=8}",  # too small for any set: the same error
]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), spec=st.sampled_from(SUMMARY_PIPELINES), ragged=st.booleans())
def test_layouts_planned_from_summaries_equal_the_pipelines(data, spec, ragged):
    """`plan_layouts` on `AutomatonSummary.of(ir)` gives every layer the
    layout `run_pipeline` gives it (or the same error), for fixed and
    variable-length sets and pipelines with capacity, forced, mixed and
    budget-bound layouts."""
    from static_compiler.ir import AutomatonSummary
    from static_compiler.passes.pipeline import plan_layouts

    if ragged:
        rows, vocab, end = data.draw(ragged_sets(max_vocab=40, max_items=60))
    else:
        (rows, vocab), end = data.draw(fixed_length_sets(max_vocab=40, max_items=60)), None
    ir = build_automaton(rows, vocab, end_token=end)
    try:
        want = [layer.layout for layer in run_pipeline(ir, spec).layers]
    except PipelineError as e:
        with pytest.raises(type(e), match=re.escape(str(e))):
            plan_layouts(AutomatonSummary.of(ir), spec)
        return
    got = plan_layouts(AutomatonSummary.of(ir), spec)
    assert [layer.layout for layer in got.layers] == want


def test_a_pass_that_rewrites_layers_cannot_plan_from_summaries():
    from static_compiler.ir import AutomatonSummary
    from static_compiler.passes.pipeline import plan_layouts

    summary = AutomatonSummary.of(build_automaton(THREE, 4))
    with pytest.raises(PipelineError, match=r"pass 'minimize' rewrites the layers themselves"):
        plan_layouts(summary, "minimize,choose-layout")
    planned = plan_layouts(summary, "verify,choose-layout")  # verify: skipped on summaries
    assert all(layer.layout is not None for layer in planned.layers)
