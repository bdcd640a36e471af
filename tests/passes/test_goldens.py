"""The IR after the frontend and after each pass of the default pipeline
matches golden/ for the reference sets (golden/<case>/input.json). Tests
never write goldens; the only way they change is
`python tools/update_goldens.py` (then review the diff); its --check mode is
tested beside it, in tools/tests/test_update_goldens.py."""

import difflib
import io
import json

import pytest
from helpers import REPO as ROOT
from ir_strategies import unique_sorted

from static_compiler.frontend import build_automaton
from static_compiler.ir import parse_ir
from static_compiler.passes.pipeline import DEFAULT_PIPELINE, parse_pipeline, run_pipeline, stage_dumps

GOLDEN = ROOT / "golden"
UPDATE_HINT = ("If the change is intended, run `python tools/update_goldens.py` from the repository "
               "root and review `git diff golden/` before committing.")


def read_cases() -> dict:
    """{case: (sequences, vocab_size, end_token)} from golden/<case>/input.json."""
    cases = {}
    for path in sorted(GOLDEN.glob("*/input.json")):
        spec = json.loads(path.read_text(encoding="utf-8"))
        cases[path.parent.name] = (spec["sequences"], spec["vocab_size"], spec["end_token"])
    return cases


CASES = read_cases()


def render_goldens() -> dict:
    """{path relative to golden/: the library's dump} for every case."""
    out = {}
    for name, (sequences, vocab_size, end_token) in CASES.items():
        ir = build_automaton(sequences, vocab_size, end_token=end_token)
        for i, (stage, text) in enumerate(stage_dumps(ir, DEFAULT_PIPELINE,
                                                      input_stage="frontend")):
            out[f"{name}/{i:02d}-{stage}.ir"] = text
    return out


def read_goldens() -> dict:
    """{path relative to golden/: text} of the .ir files there."""
    return {p.relative_to(GOLDEN).as_posix(): p.read_text(encoding="utf-8")
            for p in GOLDEN.rglob("*.ir")}


def test_goldens_match_current_output():
    want, have = render_goldens(), read_goldens()
    problems = []
    for path in sorted(set(want) | set(have)):
        if path not in have:
            problems.append(f"golden/{path} is missing")
        elif path not in want:
            problems.append(f"golden/{path} is no longer produced")
        elif have[path] != want[path]:
            problems.append("".join(difflib.unified_diff(
                have[path].splitlines(keepends=True), want[path].splitlines(keepends=True),
                fromfile=f"golden/{path}", tofile=f"current/{path}")))
    if problems:
        pytest.fail("\n".join(problems) + "\n" + UPDATE_HINT, pytrace=False)


def test_goldens_cover_every_case_and_stage():
    stages = ["frontend"] + [p.name for p in parse_pipeline(DEFAULT_PIPELINE)]
    have = read_goldens()
    for case in ("three_items", "single_item", "root_full_fanout", "chain", "skewed",
                 "skewed_mixed", "ragged_end_token"):
        assert case in CASES
        for i, stage in enumerate(stages):
            assert f"{case}/{i:02d}-{stage}.ir" in have


def test_stage_dumps_match_print_ir_after_all():
    ir = build_automaton([[1, 2, 1], [3, 1, 2]], 4)
    dumps = stage_dumps(ir, DEFAULT_PIPELINE)
    passes = parse_pipeline(DEFAULT_PIPELINE)
    assert [s for s, _ in dumps] == ["input"] + [p.name for p in passes]
    assert dumps[0][1] == ir.to_text()
    stream = io.StringIO()
    final = run_pipeline(ir, passes, print_ir_after_all=True, stream=stream)
    assert "".join(f"// ----- IR after {p.spec()} -----\n{text}"
                   for p, (_, text) in zip(passes, dumps[1:])) == stream.getvalue()
    assert dumps[-1][1] == final.to_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_dumps_parse_and_accept_exactly_the_case(case):
    rows, vocab_size, end_token = CASES[case]
    dumps = {p: t for p, t in read_goldens().items() if p.startswith(case + "/")}
    assert dumps
    for path, text in dumps.items():
        ir = parse_ir(text)
        assert (ir.vocab_size, ir.end_token) == (vocab_size, end_token), path
        assert list(ir.sequences()) == unique_sorted(rows), path
        assert str(ir) == text, path
