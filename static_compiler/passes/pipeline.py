"""Pipeline specs and the pass manager.

A spec is text such as ``verify,choose-layout{memory-budget=2GiB},pad-branches{multiple=8},pack-dtypes``:
pass names separated by commas, options in braces. `parse_pipeline` and
`format_pipeline` round-trip (parse -> str -> parse gives equal passes).
`run_pipeline` runs the passes, verifies the IR between them, prints the IR
after each on request, and on failure names the pass and those before it.

Constants
---------
DEFAULT_PIPELINE : str
    The pipeline `compile_constraints` runs when none is given:
    ``verify,choose-layout{memory-budget=2GiB},split-heavy{wide-slots=4},pad-branches{multiple=8},pack-dtypes``
    (the option values are the passes' own defaults, spelled out where
    they are worth tuning). Edit a copy of it to tune one option.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Callable, Optional, Sequence, TextIO

from static_compiler.errors import IRVerificationError, PipelineError, StaticCompilerError
from static_compiler.ir import Automaton, AutomatonSummary, verify
from static_compiler.passes import REGISTRY, Pass
from static_compiler.passes.base import ByteSize
from static_compiler.passes.choose_layout import ChooseLayoutPass
from static_compiler.passes.pack_dtypes import PackDtypesPass
from static_compiler.passes.pad_branches import PadBranchesPass
from static_compiler.passes.reserve_capacity import ReserveCapacityPass, checked_growth
from static_compiler.passes.split_heavy import SplitHeavyPass
from static_compiler.passes.verify import VerifyPass

_DEFAULT_PASSES = ((VerifyPass(), ()),
                   (ChooseLayoutPass(), ("memory_budget",)),
                   (SplitHeavyPass(), ("wide_slots",)),
                   (PadBranchesPass(), ("multiple",)),
                   (PackDtypesPass(), ()))
"""The default passes at their default options, each with the options its
spec spells out although they are at their default (the ones worth tuning)."""

DEFAULT_PIPELINE = ",".join(p.spec(spell_out=names) for p, names in _DEFAULT_PASSES)
"""The pipeline `compile_constraints` runs when none is given:
``verify,choose-layout{memory-budget=2GiB},split-heavy{wide-slots=4},pad-branches{multiple=8},pack-dtypes``
(the option values are the passes' own defaults)."""


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Splits on `sep` outside braces and parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"pipeline spec {text!r}: unbalanced {ch!r}")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise PipelineError(f"pipeline spec {text!r}: unbalanced braces")
    parts.append("".join(cur))
    return parts


def parse_pipeline(spec: str) -> tuple[Pass, ...]:
    """Parses a spec into a tuple of pass instances.

    Raises PipelineError for an unknown pass (listing the known ones), an
    unknown option, or an option value of the wrong type.

    Parameters
    ----------
    spec : str
        Pass names separated by commas, each optionally followed by its
        options in braces, ``name{key=value,...}``; whitespace around
        entries, keys and values is ignored.

    Returns
    -------
    tuple of Pass
        One pass instance per entry, in order; options not given are at
        the pass's defaults.

    Raises
    ------
    PipelineError
        If `spec` is not a string, an entry is empty, braces are
        unbalanced, a pass or option is unknown, an option is not
        key=value or is given twice, or a value has the wrong type.

    Examples
    --------
    >>> passes = parse_pipeline("verify, pad-branches{multiple=16}")
    >>> [p.name for p in passes]
    ['verify', 'pad-branches']
    >>> format_pipeline(passes)
    'verify,pad-branches{multiple=16}'
    """
    if not isinstance(spec, str):
        raise PipelineError(f"pipeline spec {spec!r}: expected a string")
    passes = []
    for i, item in enumerate(_split_top_level(spec.strip())):
        item = item.strip()
        if not item:
            raise PipelineError(f"pipeline spec {spec!r}: entry {i} is empty")
        name, _, rest = item.partition("{")
        name = name.strip()
        if name not in REGISTRY:
            raise PipelineError(f"pipeline spec entry {i}: unknown pass {name!r} "
                                f"(known: {', '.join(sorted(REGISTRY))})")
        options = {}
        if rest:
            if not rest.endswith("}"):
                raise PipelineError(f"pipeline spec entry {i} {item!r}: expected name{{key=value,...}}")
            for opt in _split_top_level(rest[:-1]):
                if not opt.strip():
                    continue
                key, eq, value = opt.partition("=")
                if not eq:
                    raise PipelineError(f"pipeline spec entry {i}: option {opt!r} is not key=value")
                if key.strip() in options:
                    raise PipelineError(f"pipeline spec entry {i} {item!r}: option "
                                        f"{key.strip()!r} is given twice")
                options[key.strip()] = value.strip()
        passes.append(REGISTRY[name].from_options(options))
    return tuple(passes)


def format_pipeline(passes: Sequence[Pass]) -> str:
    """The canonical spec text of `passes`.

    Options at their defaults are left out, so ``parse_pipeline`` of the
    result gives passes equal to `passes`.

    Parameters
    ----------
    passes : sequence of Pass
        Pass instances, as `parse_pipeline` returns.

    Returns
    -------
    str
        The passes' specs joined by commas ("" for no passes).

    Examples
    --------
    >>> format_pipeline(parse_pipeline("verify,pad-branches{multiple=8}"))
    'verify,pad-branches'
    """
    return ",".join(p.spec() for p in passes)


def with_capacity(passes: Sequence[Pass], growth: float) -> tuple[Pass, ...]:
    """`passes` with `reserve-capacity{growth=...}` right after choose-layout
    (what `compile_constraints(capacity=growth)` runs). PipelineError when
    the pipeline already reserves capacity or chooses no layout, or growth
    is not a finite number >= 1.0 (inf, NaN, a bool, a str)."""
    passes = tuple(passes)
    if any(isinstance(p, ReserveCapacityPass) for p in passes):
        raise PipelineError(f"capacity={growth!r} and a pipeline with reserve-capacity: give one")
    at = [i for i, p in enumerate(passes) if isinstance(p, ChooseLayoutPass)]
    if not at:
        raise PipelineError(f"capacity={growth!r} needs a pipeline with choose-layout (the "
                            "capacity is reserved in the layouts it picks)")
    reserve = ReserveCapacityPass(growth=checked_growth(growth, "capacity"))
    return passes[:at[0] + 1] + (reserve,) + passes[at[0] + 1:]


def with_memory_budget(passes: Sequence[Pass], size: int) -> tuple[Pass, ...]:
    """`passes` with choose-layout's memory budget set to `size` bytes (what
    `compile --memory-budget` runs). PipelineError when no pass chooses
    layouts."""
    passes = tuple(passes)
    if not any(isinstance(p, ChooseLayoutPass) for p in passes):
        raise PipelineError(f"memory budget {ByteSize(size)}: the pipeline "
                            f"{format_pipeline(passes)!r} has no choose-layout pass to give it to")
    return tuple(dataclasses.replace(p, memory_budget=ByteSize(size))
                 if isinstance(p, ChooseLayoutPass) else p for p in passes)


def partial_budget_check(passes: Sequence[Pass]) -> Optional[Callable[..., None]]:
    """What a partitioned build checks after each partition it builds
    (`ChooseLayoutPass.check_partial`, with the whole pipeline for its
    advice): the budget of the first choose-layout, when every pass before
    it keeps the layers' counts (verify and layout-only passes); None when
    no budget can be checked early (no choose-layout, or a pass such as
    minimize that shrinks the layers first)."""
    passes = tuple(passes)
    for p in passes:
        if isinstance(p, ChooseLayoutPass):
            return functools.partial(p.check_partial, pipeline=lambda size: format_pipeline(
                with_memory_budget(passes, size)))
        if not (p.layout_only or isinstance(p, VerifyPass)):
            return None
    return None


def run_pipeline(ir: Automaton, passes, *, verify_each: bool = True,
                 print_ir_after_all: bool = False, stream: Optional[TextIO] = None,
                 timings: Optional[list] = None) -> Automaton:
    """Runs `passes` (a spec string or pass instances) over `ir`.

    Each pass runs as `Pass.wired` to the passes after it (split-heavy takes
    a later pad-branches' multiple); printed and timed specs are the
    passes as given.

    Args:
      verify_each: run the IR verifier after every pass.
      print_ir_after_all: write the IR after every pass to `stream` (stderr).
      timings: if a list is given, (pass spec, seconds) pairs are appended.
    """
    passes = parse_pipeline(passes) if isinstance(passes, str) else tuple(passes)
    stream = stream if stream is not None else sys.stderr
    summary = isinstance(ir, AutomatonSummary)
    done = []
    for i, p in enumerate(passes):
        if summary and not p.layout_only:
            if p.name == "verify":
                continue  # a summary has no arrays: its parts were verified where built
            raise PipelineError(f"pass {p.spec()!r} rewrites the layers themselves, so it cannot "
                                "run on layer summaries (a partitioned build plans its layouts "
                                "from them): build the set in memory to run it")
        start = time.perf_counter()
        try:
            before = ir
            ir = p.wired(passes[i + 1:]).run(ir)
            if verify_each and p.name != "verify" and not summary:
                verify(ir, unchanged_from=before if done else None)
        except StaticCompilerError as e:
            before = format_pipeline(done) or "(none)"
            kind = "left an invalid IR" if isinstance(e, IRVerificationError) else "failed"
            err_cls = type(e) if isinstance(e, PipelineError) else PipelineError
            raise err_cls(f"pass {p.spec()!r} {kind} (passes run before it: {before}): {e}") from e
        if timings is not None:
            timings.append((p.spec(), time.perf_counter() - start))
        done.append(p)
        if print_ir_after_all and not summary:
            stream.write(f"// ----- IR after {p.spec()} -----\n")
            stream.write(ir.to_text())
            stream.flush()
    return ir


def plan_layouts(summary: AutomatonSummary, passes) -> AutomatonSummary:
    """The layouts `passes` give the automaton `summary` describes, planned
    from its layers' summaries alone (`ir.LayerSummary`: counts and branch
    histograms; no arrays): equal to running the pipeline on the automaton
    itself (tested), in time independent of its size. verify passes are
    skipped (the caller verified the parts the summary sums); a pass that
    rewrites layers (minimize) raises PipelineError."""
    return run_pipeline(summary, passes, verify_each=False)


def stage_dumps(ir: Automaton, passes=DEFAULT_PIPELINE, *, input_stage: str = "input",
                verify_each: bool = True) -> list[tuple[str, str]]:
    """[(stage, IR text)]: (`input_stage`, the text of `ir`) first, then
    (pass name, the IR text after that pass) for each of `passes` in order,
    exactly as `run_pipeline(..., print_ir_after_all=True)` prints them.
    Pass names carry no options, so a stage name is also a file-name part."""
    import io  # only this dump needs it

    if isinstance(passes, str):
        passes = parse_pipeline(passes)
    passes = tuple(passes)
    stream = io.StringIO()
    out = [(input_stage, ir.to_text())]
    run_pipeline(ir, passes, verify_each=verify_each, print_ir_after_all=True, stream=stream)
    chunks = stream.getvalue().split("// ----- IR after ")[1:]
    for p, chunk in zip(passes, chunks, strict=True):
        out.append((p.name, chunk.partition(" -----\n")[2]))
    return out
