"""`python -m tools.bench.peers_check`: the peers benchmark's own checks of
the work it generates (the catalogue of names, the near misses, the regex
alternation, a missing engine reported as skipped). Prints one line per
check ("ok" or "FAIL" with the reason) and exits 1 when any fails; the test
suite runs it in a subprocess (tests do not import tools/)."""

from __future__ import annotations

import re
import sys
import traceback

from tools.bench import peers


def check_catalogue_is_deterministic_and_distinct():
    real = peers.real_names(0)
    assert len(real) > 30000 and len(set(real)) == len(real)
    assert "LATIN SMALL LETTER A" in real and "Europe/Paris" in real
    assert not any(peers._ALGORITHMIC.search(n) for n in real)
    a = peers.catalogue(len(real) + 5000, 0)
    assert a == peers.catalogue(len(real) + 5000, 0)
    assert len(set(a)) == len(a) == len(real) + 5000
    assert a[:1000] == peers.catalogue(1000, 0)          # the real names come first
    assert peers.catalogue(1000, 1) != peers.catalogue(1000, 0)


def check_product_names():
    names = peers.product_names(20000, 0)
    assert names == peers.product_names(20000, 0) and len(set(names)) == 20000
    assert all(n.split()[0] in peers.BRANDS for n in names)
    assert peers.product_names(10, 1) != names[:10]
    assert not set(peers.product_names(100, 0, exclude=frozenset(names[:50]))) & set(names[:50])


def check_near_misses():
    names = peers.catalogue(2000, 0)
    misses = peers.near_misses(names, 500, 0)
    assert misses == peers.near_misses(names, 500, 0)
    assert len(set(misses)) == 500 and not set(misses) & set(names) and all(misses)
    # each is one edit away from a name: one character changed, 1-3 dropped, or one added
    taken = set(names)
    kinds = set()
    for m in misses:
        if m[:-1] in taken:
            kinds.add("extended")
        elif any(n.startswith(m) and 1 <= len(n) - len(m) <= 3 for n in names):
            kinds.add("truncated")
        else:
            assert any(len(n) == len(m) and sum(a != b for a, b in zip(n, m)) == 1
                       for n in names), m
            kinds.add("changed")
    assert kinds == {"extended", "truncated", "changed"}


def check_regex_escape():
    names = ["Etc/GMT+1", "A.B (C)", "x|y*z", "BBYEG", "BBYEGS"]
    rx = re.compile(peers.name_regex(names))
    assert all(rx.fullmatch(n) for n in names)
    assert not rx.fullmatch("Etc/GMTT1") and not rx.fullmatch("AxB (C)")


def check_a_missing_engine_is_skipped():
    saved = peers.ENGINE_PACKAGES["xgrammar"]
    peers.ENGINE_PACKAGES["xgrammar"] = ("no_such_module_xyz", "nope")
    try:
        assert peers.availability("xgrammar") == (False, None)
    finally:
        peers.ENGINE_PACKAGES["xgrammar"] = saved
    assert peers.availability("static")[0]


CHECKS = [check_catalogue_is_deterministic_and_distinct, check_product_names, check_near_misses,
          check_regex_escape, check_a_missing_engine_is_skipped]


def main() -> int:
    failed = 0
    for check in CHECKS:
        try:
            check()
            print(f"ok    {check.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL  {check.__name__}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
