"""`support.threads.on_threads`: each thread takes every k-th range, once."""

from __future__ import annotations

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
