"""`support.threads.on_threads`: each thread takes every k-th range, once, on
workers kept between calls."""

from __future__ import annotations

import os
import threading

import pytest

from static_compiler.support.threads import on_threads


@pytest.mark.parametrize("num_ranges, threads", [(0, 4), (1, 4), (5, 1), (5, 2), (7, 3), (2, 8)])
def test_every_range_goes_to_one_share_dealt_in_turn(num_ranges, threads):
    ranges = [(10 * i, 10 * i + 10) for i in range(num_ranges)]
    seen = []

    def share(mine):
        seen.append(threading.get_ident())
        return list(mine)

    shares = on_threads(ranges, share, threads)
    k = max(1, min(threads, num_ranges))
    assert shares == [ranges[t::k] for t in range(k)]
    assert len(seen) == k
    if k == 1:
        assert seen == [threading.get_ident()]  # (inline: no pool)


def test_the_workers_are_kept_between_calls():
    """A later call runs on threads the pool already held (no new thread,
    no fresh malloc arena for its buffers)."""
    from static_compiler.support import threads as module

    barrier = threading.Barrier(2, timeout=30)

    def share(_mine):
        barrier.wait()  # (both shares at once: two distinct workers)
        return threading.get_ident()

    first = set(on_threads([(0, 1), (1, 2)], share, 2))
    held = {t.ident for t in module._kept_pool()._threads}
    second = set(on_threads([(0, 1), (1, 2)], share, 2))
    assert len(first) == len(second) == 2 and threading.get_ident() not in first | second
    assert first | second <= held
    assert {t.ident for t in module._kept_pool()._threads} == held


def test_a_share_that_splits_again_runs_on_threads_of_its_own():
    """on_threads called from a worker never waits for a kept worker it
    holds: every kept worker busy at once, each splitting its share."""
    from static_compiler.support import threads as module

    k = module.KEPT_WORKERS
    barrier = threading.Barrier(k, timeout=60)

    def inner(mine):
        return sum(b - a for a, b in mine)

    def outer(mine):
        barrier.wait()
        return on_threads([(0, 3), (3, 5)], inner, 2) + [len(mine)]

    assert on_threads([(i, i + 1) for i in range(k)], outer, k) == [[3, 2, 1]] * k


def test_callers_on_several_threads_at_once_each_get_their_shares():
    results, errors = {}, []

    def caller(c):
        try:
            results[c] = on_threads([(c, c + i) for i in range(6)], lambda mine: list(mine), 3)
        except Exception as err:  # pragma: no cover (reported below)
            errors.append(err)

    callers = [threading.Thread(target=caller, args=(c,)) for c in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(60)
    assert not errors
    assert results == {c: [[(c, c + i) for i in range(6)][t::3] for t in range(3)]
                       for c in range(8)}


def test_an_error_in_a_share_reaches_the_caller_and_the_workers_stay():
    def share(mine):
        if mine[0][0] == 1:
            raise ValueError("share 1")
        return mine

    with pytest.raises(ValueError, match="share 1"):
        on_threads([(0, 1), (1, 2)], share, 2)
    assert on_threads([(0, 1), (1, 2)], lambda mine: mine, 2) == [[(0, 1)], [(1, 2)]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_makes_workers_of_its_own():
    """The parent's kept workers do not exist in a forked child (vLLM forks
    its workers): the child's calls start workers of its own."""
    on_threads([(0, 1), (1, 2)], lambda mine: mine, 2)  # (the parent's pool made)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        ok = False
        try:
            ok = on_threads([(0, 1), (1, 2)], lambda mine: mine, 2) == [[(0, 1)], [(1, 2)]]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("n, span, threads", [(0, 8, 2), (1, 8, 2), (100, 8, 3), (100, 13, 2),
                                              (1000, 64, 2), (1000, 5000, 4), (77, 1, 2)])
def test_bools_packed_in_spans_are_numpys_packbits(n, span, threads):
    """`pack_in_spans`: the bytes of `np.packbits(..., bitorder="little")`,
    spans rounded down to whole bytes, each thread's `own` dict kept
    across its spans."""
    import numpy as np

    from static_compiler.support.threads import pack_in_spans

    rows = np.random.default_rng(n).random(n) < 0.3
    out = np.full(-(-n // 8) + 2, 0xAB, np.uint8)  # (the bytes past the rows untouched)
    owners = []

    def rows_of(a, b, own):
        assert a % 8 == 0 and (b == n or b - a == max(8, span // 8 * 8))
        own.setdefault("spans", 0)
        own["spans"] += 1
        owners.append(id(own))
        return rows[a:b]

    pack_in_spans(n, span, rows_of, out, threads)
    np.testing.assert_array_equal(out[:-(-n // 8)], np.packbits(rows, bitorder="little"))
    assert (out[-(-n // 8):] == 0xAB).all()
    assert len(set(owners)) <= max(1, threads)
