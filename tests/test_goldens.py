"""The IR after the frontend and after each pass of the default pipeline
matches golden/ for the reference sets. Tests never write goldens; the only
way they change is `python tools/update_goldens.py` (then review the diff)."""

import difflib

import pytest

from ir_strategies import unique_sorted
from static_compiler.ir import parse_ir
from static_compiler.pipeline import DEFAULT_PIPELINE, parse_pipeline
from tools.update_goldens import CASES, main as update_goldens_main, read_goldens, render_goldens

UPDATE_HINT = ("If the change is intended, run `python tools/update_goldens.py` from the repository "
               "root and review `git diff golden/` before committing.")


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
                 "ragged_end_token"):
        assert case in CASES
        for i, stage in enumerate(stages):
            assert f"{case}/{i:02d}-{stage}.ir" in have


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


def test_update_check_mode_reports_no_difference(capsys):
    assert update_goldens_main(["--check"]) == 0
    assert capsys.readouterr().out == ""
