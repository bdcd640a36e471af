"""The documentation runs: every ```python snippet in README.md and
docs/*.md is executed, and every relative link points at a file (and
heading) that exists.

The snippets of one page run in order in one namespace (a page's snippets
build on its earlier ones), in a fresh interpreter whose working directory
is a temporary directory (snippets write artifacts and shards), twice in the
same directory (a user re-runs a script; a page whose snippets saved nothing
there runs once: its second run would meet the same empty folder), with
`__name__ == "__main__"` (the partitioned-build snippet keeps its build
under that guard), JAX_PLATFORMS=cpu and XLA's CPU optimization level 0
(`helpers.FAST_COMPILE_FLAG`), with a jax compilation cache of the module's own.
Each snippet is compiled with the page's path and its own line numbers, so a
failure's traceback names the page and the line. A snippet that cannot run here is fenced
```python no-run: <reason>; anything else after ```python is an error, so a
misspelt marker never skips a snippet silently. The README's Quick start is
examples/quickstart.py, fenced no-run here: tests/repository/test_quickstart.py
runs the file and checks the output the README shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import FAST_COMPILE_FLAG, REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
NO_RUN = re.compile(r"^ no-run: \S.*$")
README_MAX_LINES = 150
TIMEOUT_S = 300

# Runs the snippets given as JSON [[path, first_line, code], ...] on stdin.
DRIVER = r"""
import json, sys, time, traceback
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
for path, line, code in json.load(sys.stdin):
    start = time.perf_counter()
    try:
        exec(compile("\n" * (line - 1) + code, path, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"\nthe snippet at {path}:{line} failed (traceback above)", file=sys.stderr)
        sys.exit(1)
    print(f"ran {path}:{line} in {time.perf_counter() - start:.1f} s", flush=True)
"""


def snippets(page: pathlib.Path) -> list:
    """(first code line, code, info) of every ```python block, in order."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("info"))
            for m in FENCE.finditer(text)]


def runnable(page: pathlib.Path) -> list:
    return [(line, code) for line, code, info in snippets(page) if not info.strip()]


def rel(page: pathlib.Path) -> str:
    return str(page.relative_to(REPO))


def missing_modules(codes) -> list:
    """Top-level modules the snippets import that are not installed (the
    test, text and torch extras hold them all)."""
    names = set(re.findall(r"^\s*(?:from|import) (\w+)", "\n".join(codes), re.M))
    names |= {"torch"} if any("integrations.torch" in code for code in codes) else set()
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> dict:
    """The environment of a jax compilation cache of this module's own (never
    the user's): a program one snippet run compiled, a later run (the same
    page run again, another page, the pasted README) reads instead of
    compiling it again, as a user's runs do with the cache on."""
    return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax-cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=rel)
def test_page_snippets_run(page, tmp_path, jax_cache):
    """The page's snippets run, and run again in the same folder (a user
    re-runs a script: what it saved must not make the second run fail)."""
    missing = missing_modules([code for _line, code in runnable(page)])
    if missing:
        pytest.skip(f"{rel(page)} imports {missing}, not installed")
    todo = [[str(page), line, code] for line, code in runnable(page)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1", **jax_cache,
               XLA_FLAGS=FAST_COMPILE_FLAG)  # a page that needs host devices adds them itself
    for attempt in ("a snippet failed", "a snippet failed when run again in the same folder"):
        if attempt != "a snippet failed" and not any(tmp_path.iterdir()):
            break  # it saved nothing: a run again would meet the folder the first run met
        proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(todo), cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, (f"{rel(page)}: {attempt}\n--- stdout\n{proc.stdout[-4000:]}"
                                      f"\n--- stderr\n{proc.stderr[-8000:]}")
        assert proc.stdout.count(f"ran {page}:") == len(todo), proc.stdout[-4000:]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_fences_are_python_or_marked_no_run(page):
    for line, _code, info in snippets(page):
        assert not info.strip() or NO_RUN.match(info), (
            f"{rel(page)}:{line - 1}: ```python{info!r}: write ```python for a snippet that runs, "
            "or ```python no-run: <reason>")


def test_most_snippets_run():
    found = [(page, info) for page in PAGES for _line, _code, info in snippets(page)]
    skipped = [f"{rel(page)}: {info.strip()}" for page, info in found if info.strip()]
    assert len(found) >= 15
    assert len(skipped) <= len(found) // 5, skipped


def test_readme_is_the_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    # CI (.ci/run) runs the README's test command.
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"^    bash scripts/test\.sh ", readme, re.M)
    assert re.search(r"^    bash scripts/main-job\.sh ", readme, re.M)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slugs(page: pathlib.Path) -> set:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped,
    spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link {target!r}: no {dest}"
        if anchor:
            assert dest.suffix == ".md", f"{rel(page)}: link {target!r}: anchor into a non-page"
            assert anchor in slugs(dest), (f"{rel(page)}: link {target!r}: no heading with that "
                                           f"anchor in {rel(dest)}")


def test_bench_writes_under_the_working_directory(tmp_path):
    """`python -m tools.bench` (run from the checkout, the docs say) writes
    bench_out/ where it is run, not into the checkout."""
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from tools.bench.cli import "
            "parse_args; print(os.path.abspath(parse_args([]).out))")  # tests import no tools
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == str(tmp_path / "bench_out")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_checkout_commands_say_where_they_run(page):
    """`python -m tools...` and `bash scripts/...` work only from the
    repository's checkout (neither folder is installed): a page that gives
    one says so."""
    text = re.sub(r"\s+", " ", page.read_text())
    if re.search(r"python -m tools\b|bash scripts/", text):
        assert "repository's checkout" in text, (
            f"{rel(page)} gives `python -m tools...` / `bash scripts/...` commands without "
            "saying they run from the repository's checkout")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_parse_back_promise_names_its_limit(page):
    """The IR text parses back only when printed in full (up to 4,096 edges
    by default): a page that promises the round trip says so."""
    text = re.sub(r"\s+", " ", page.read_text())
    if re.search(r"parses back", text):
        assert re.search(r"4,?096 edges", text), (
            f"{rel(page)} says the IR text parses back without its limit (4,096 edges by "
            "default; larger automata print elided rows)")
