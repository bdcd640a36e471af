"""The README's measured figures are quotations of docs/benchmarks.md, and
every page's claim of the artifact format's version range is the range the
code accepts.

Each row of the README's "Measured" table links one or more sections of
benchmarks.md by the date of the measurement it quotes
(`[2026-12-03](docs/benchmarks.md#anchor)`, the anchor GitHub's heading
slug); that date must occur in the section, and every number in the row's
"measured" cell (1.1 s, 15.0 MB, 0.18, 1.02-1.14x, 2e7) must occur, as that
number, in the text of a linked section: from its heading to the next heading
of any level.
"""

from __future__ import annotations

import pathlib
import re

import pytest
from helpers import REPO

from static_compiler.format import spec as artifact_format

README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

CELL_SPLIT = re.compile(r"(?<!\\)\|")            # "\|C\|" stays inside its cell
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
# A date, or a number: 1.1, 15,013,560, 2e7, 1e-4 (a range 1.02-1.14 gives two).
NUMBER = re.compile(r"\d{4}-\d{2}-\d{2}|\d+(?:[.,]\d+)*(?:e-?\d+)?")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def slug(heading: str) -> str:
    """GitHub's heading anchor (as tests/repository/test_docs.py computes it)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(page: pathlib.Path) -> dict:
    """{anchor: text from the heading to the next heading of any level}."""
    text = page.read_text()
    fenced = [m.span() for m in re.finditer(r"^```.*?^```", text, re.M | re.S)]
    heads = [m for m in re.finditer(r"^#+ (.*)$", text, re.M)
             if not any(a <= m.start() < b for a, b in fenced)]
    return {slug(m.group(1)): text[m.start():(heads[i + 1].start() if i + 1 < len(heads)
                                               else len(text))]
            for i, m in enumerate(heads)}


def measured_rows() -> list:
    """(figure, measured cell, whole row) of each row of the README's
    Measured table."""
    text = README.read_text()
    part = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    header = [c.strip() for c in CELL_SPLIT.split(rows[0])[1:-1]]
    assert header[:2] == ["figure", "measured"], header
    out = []
    for line in rows[2:]:
        cells = [c.strip() for c in CELL_SPLIT.split(line)[1:-1]]
        out.append((cells[0], cells[1], line))
    return out


def numbers(cell: str) -> list:
    cell = LINK.sub(r"\1", cell)                 # a link's target is no figure
    return [n.group() for n in NUMBER.finditer(cell)]


def occurs(figure: str, text: str) -> bool:
    """`figure` in `text` as a whole number: 1.1 is not in 11.1 or 1.15."""
    pattern = r"(?<![\d.,])" + re.escape(figure) + r"(?![\d]|[.,]\d)"
    return re.search(pattern, text) is not None


def test_the_readme_has_a_few_headline_rows():
    """Headlines only: the rest, and every row's history, stay in benchmarks.md."""
    assert 3 <= len(measured_rows()) <= 6


@pytest.mark.parametrize("row", measured_rows(), ids=lambda r: r[0][:60])
def test_readme_figure_quotes_its_benchmarks_section(row):
    figure, measured, line = row
    links = [(text, target.partition("#")[2]) for text, target in LINK.findall(line)
             if target.partition("#")[0] == "docs/benchmarks.md"]
    assert links, (f"README Measured row {figure!r} links no section of docs/benchmarks.md "
                   "([YYYY-MM-DD](docs/benchmarks.md#<heading anchor>))")
    found = sections(BENCHMARKS)
    missing = [a for _text, a in links if a not in found]
    assert not missing, f"README Measured row {figure!r}: no section #{missing} in benchmarks.md"
    for text, anchor in links:
        assert DATE.match(text), (f"README Measured row {figure!r}: the link to #{anchor} is "
                                  f"{text!r}, not the date of the measurement it quotes")
        assert occurs(text, found[anchor]), (f"README Measured row {figure!r}: {text} does not "
                                             f"occur in benchmarks.md section #{anchor}")
    anchors = [a for _text, a in links]
    text = "\n".join(found[a] for a in anchors)
    absent = [n for n in numbers(measured) if not occurs(n, text)]
    assert not absent, (f"README Measured row {figure!r}: {absent} not found in benchmarks.md "
                        f"section(s) {', '.join('#' + a for a in anchors)}")


# A claim of the whole range the readers accept ("format versions 1 to 9",
# "version history (1 to 9)", "readers accept versions 1 to 9") and of the
# version the writer writes ("writes format version 9"). Sentences about
# older versions ("Versions 1 to 3 read as ...") are history, not claims.
RANGE_CLAIM = re.compile(r"(?:format versions |version history \(|accept versions )(\d+) to (\d+)",
                         re.I)
WRITER_CLAIM = re.compile(r"writes format version (\d+)", re.I)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_format_range_claims_match_the_code(page):
    text = re.sub(r"\s+", " ", page.read_text())
    window = (artifact_format.MIN_FORMAT_VERSION, artifact_format.MAX_FORMAT_VERSION)
    for m in RANGE_CLAIM.finditer(text):
        assert (int(m.group(1)), int(m.group(2))) == window, (
            f"{page.relative_to(REPO)}: {m.group()!r}, but static_compiler/format/spec.py "
            f"accepts versions {window[0]} to {window[1]}")
    for m in WRITER_CLAIM.finditer(text):
        assert int(m.group(1)) == artifact_format.FORMAT_VERSION, (
            f"{page.relative_to(REPO)}: {m.group()!r}, but the writer writes "
            f"{artifact_format.FORMAT_VERSION}")


def test_format_range_is_claimed_somewhere():
    """The claims above exist (a rewording must keep the test biting)."""
    claims = [m for p in PAGES for m in RANGE_CLAIM.finditer(re.sub(r"\s+", " ", p.read_text()))]
    assert len(claims) >= 3


STATS_COMMAND = "python -m tools.show_ir sids.npy --vocab-size 2048 --stats"


def test_cli_stats_example_is_what_the_command_prints(tmp_path):
    """docs/cli.md shows `--stats` of 1e6 synthetic SIDs as the command
    prints it today (bytes, layouts and format of the current writer)."""
    import subprocess
    import sys

    import numpy as np

    from static_compiler.frontend import datasets

    text = (REPO / "docs" / "cli.md").read_text()
    assert f"    {STATS_COMMAND}\n\n" in text, (
        f"docs/cli.md: no `{STATS_COMMAND}` block followed by its output")
    shown = text.split(f"    {STATS_COMMAND}\n\n", 1)[1].split("\n\n## ", 1)[0]
    shown = "\n".join(line[4:] for line in shown.splitlines())
    np.save(tmp_path / "sids.npy", datasets.synthetic_sids(10**6))
    proc = subprocess.run([sys.executable, "-m", "tools.show_ir", str(tmp_path / "sids.npy"),
                           *STATS_COMMAND.split()[4:]], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert shown.strip() == proc.stdout.strip(), (
        "docs/cli.md: the `--stats` example is not what the command prints now; paste its "
        f"output:\n{proc.stdout}")
