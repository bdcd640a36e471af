"""The torch beam step's selection (`backend.decode.selection` in torch):
`best` (a row's k best entries, exactly ordered: one stable sort, or packed
int64 keys and a top-k past SORT_MAX), `select` (a step's best beam_size
candidates, each beam first cut to its best `keep`), and `ranked_select`,
the same selection over a ranked subset reading the liveness of each row's
best candidates only (lists of `LIST_FACTORS` x beam_size, then every
child's). `cand` below is a `beam.Candidates` (scores float32 (B, M', C),
children, end, stay)."""

from __future__ import annotations

import torch

from static_compiler.support.decode_types import SENTINEL_SCORE
from static_compiler.torch_backend.kernels import ranked_child_live, ranked_children_live

SORT_MAX = 1024
"""Rows of at most this many candidates are ranked by one stable sort;
longer ones (a dense step's V columns) by packed int64 keys and a top-k,
a few more ops but far less work than sorting thousands of entries."""


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 scores.shape: keys ordered as (score desc, position asc) along
    the last axis, every key of a row distinct. scores float32 (..., N) hold
    no NaN and no -0.0; N < 2 ** 32."""
    bits = scores.contiguous().view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    N = scores.shape[-1]
    position = torch.arange(N, device=scores.device)
    return (ordered << 32) | (N - 1 - position)


def key_positions(keys: torch.Tensor, n: int) -> torch.Tensor:
    """int64: the positions in [0, n) that `order_keys` packed into `keys`."""
    return n - 1 - (keys & 0xFFFFFFFF)


def best(scores: torch.Tensor, k: int):
    """(values float32, positions int64), each (..., k): the k best entries
    along the last axis of scores float32 (..., n), k <= n, no NaN, in the
    order (score desc, position asc) exactly: a tie goes to the lower
    position, and -0.0 ranks (and comes back) as 0.0."""
    scores = scores + 0.0
    n = scores.shape[-1]
    if n <= SORT_MAX:
        values, positions = torch.sort(scores, dim=-1, descending=True, stable=True)
        return values[..., :k], positions[..., :k]
    positions = key_positions(order_keys(scores).topk(k, dim=-1).values, n)
    return scores.gather(-1, positions), positions


def select(scores: torch.Tensor, beam_size: int, keep: int):
    """(score float32, position int64), each (B, beam_size), best first: the
    best `beam_size` candidates of each row of scores float32 (B, M', C),
    each beam first cut to its best `keep` <= C, ordered (score desc,
    parent asc, column asc); position = parent * C + column. Places past
    the M' * keep candidates hold SENTINEL_SCORE and position 0.
    `static_compiler.backend.decode.selection.select_beams` in torch."""
    B, M, C = scores.shape
    positions = None
    if keep < C:
        scores, columns = best(scores, keep)
        offsets = torch.arange(0, M * C, C, device=scores.device)[:, None]
        positions = (columns + offsets).reshape(B, M * keep)
    scores = scores.reshape(B, M * keep)
    n = min(M * keep, beam_size)
    top, at = best(scores, n)
    if positions is not None:
        at = positions.gather(1, at)
    if n < beam_size:
        top = torch.cat([top, top.new_full((B, beam_size - n), SENTINEL_SCORE)], dim=1)
        at = torch.cat([at, at.new_zeros((B, beam_size - n))], dim=1)
    return top, at


LIST_FACTORS = (16, 128)
"""A ranked subset's lazy selection (`ranked_select`) reads the liveness
of each row's best LIST_FACTORS[0] * beam_size candidates, then, where
such a list falls short (a sparse subset), of the best LIST_FACTORS[1] *
beam_size, then of them all. Measured at 1e6 and 1e7 items, batch 3 x 70
beams, 10 % subsets (about 10 % / 22 % of the depth-2 children live):
docs/benchmarks.md."""


def live_scores(plan, step: int, cand, node: torch.Tensor, sub) -> torch.Tensor:
    """float32 (B, M', C): the scores of candidates scored without their
    children's ranked liveness (`candidates(child_subset=False)`), with it:
    SENTINEL_SCORE at the children whose next state has no selected item
    below it (node int64 (B, M'): the beams' states; sub: (`RankedLive`,
    rows int64 (B * M',)))."""
    scores = cand.scores
    if cand.children is None:
        return scores
    B, M, C = scores.shape
    K = cand.children.next.shape[1]
    live = ranked_children_live(plan, step, node.reshape(-1), cand.children.next, sub)
    if K < C:
        live = torch.cat([live, live.new_ones((B * M, C - K))], dim=1)
    return torch.where(live.reshape(B, M, C), scores, SENTINEL_SCORE)


def ranked_select(plan, step: int, cand, node: torch.Tensor, sub, beam_size: int,
                  keep: int):
    """`select(live_scores(...), beam_size, keep)`, reading the ranked
    liveness of few candidates: each row's best R (`LIST_FACTORS` *
    beam_size, in turn) by their scores without it (the order of `select`: score
    desc, parent asc, column asc), the first beam_size live ones kept.

    Exact: liveness only turns a child's score to SENTINEL_SCORE, below
    every valid score, so the live candidates keep their order and come
    first; the list is a prefix of that order, so its first beam_size live
    entries are the answer when it has that many. With fewer, where the
    list ends on an invalid candidate it holds every valid one: the
    places left are invalid candidates in position order (those of the
    first 2 * beam_size positions that are not in the list's live ones),
    as `select` fills them. Else (a live candidate may lie past the list:
    a sparse subset) the next, longer list, and past the last the whole
    step's liveness is read and `select` ranks it (`live_scores`): eager,
    the host reads whether any row needs it; under torch.compile each
    choice is a `torch.cond`.

    The full path alone where a list cannot decide simply or gains
    nothing: a tokens_per_beam that binds (keep < min(C, beam_size): a
    beam's candidates past its cap would need counting), candidates that
    no list is shorter than (M' * C <= R), step 0 (its children's
    liveness is one lookup each, `RankedLive.first`: a list costs more
    ops than it saves), no children (the extra step of a variable-length
    set: its end reads are the beams' own). Item priors (`ranked`) never
    come here. cand: `candidates(child_subset=False)`; node int64 (B, M');
    sub: (`RankedLive`, rows int64 (B * M',))."""
    _, Mx, C = cand.scores.shape
    n = Mx * C

    def full():
        return select(live_scores(plan, step, cand, node, sub), beam_size, keep)

    if step == 0 or cand.children is None or cand.children.next.shape[1] == 0 or \
            keep < min(C, beam_size):
        return full()
    lists = [f * beam_size for f in LIST_FACTORS if f * beam_size < n]
    dense = lambda pair: tuple(x.contiguous().clone() for x in pair)  # noqa: E731  (cond's outputs: own, dense)

    def attempt(i: int):
        if i == len(lists):
            return full()
        fast, short = _listed(step, cand, node, sub, beam_size, lists[i])
        if torch.compiler.is_compiling():
            return torch.cond(short.any(), lambda: dense(attempt(i + 1)), lambda: dense(fast))
        return attempt(i + 1) if bool(short.any()) else fast

    return attempt(0)


def _listed(step: int, cand, node: torch.Tensor, sub, beam_size: int, R: int):
    """((top, position) as `select`'s, short bool (B,)): `ranked_select`
    from each row's list of its R best candidates; short: rows whose
    list cannot decide (fewer than beam_size live ones in it, a valid
    candidate past it), where top and position are not the answer."""
    scores = cand.scores
    B, Mx, C = scores.shape
    kids = cand.children
    K = kids.next.shape[1]
    n, M = Mx * C, beam_size
    device = scores.device
    top, at = best(scores.reshape(B, n), R)  # (B, R), the order without liveness
    parent = torch.div(at, C, rounding_mode="floor")
    col = at - parent * C
    beam = (parent + torch.arange(0, B * Mx, Mx, device=device)[:, None]).reshape(-1)
    column = col.clamp(max=K - 1).reshape(-1)
    live = ranked_child_live(step, node.reshape(-1)[beam], kids.next[beam, column],
                             (sub[0], sub[1][beam])).reshape(B, R)
    ok = (top > SENTINEL_SCORE) & ((col >= K) | live)
    # the first M live entries, in list order (keys past R: not live)
    big = R + n
    first, sel = torch.where(ok, torch.arange(R, device=device), big).topk(
        M, dim=1, largest=False, sorted=True)
    found = first < big
    picked, values = at.gather(1, sel), top.gather(1, sel)
    short = (found.sum(dim=1) < M) & (top[:, -1] > SENTINEL_SCORE)
    if not torch.compiler.is_compiling() and bool(found[:, -1].all()):
        return (values, picked), short  # (eager: every row's list decided, nothing to fill)
    # then invalid candidates in position order: those of [0, Q) not found live
    Q = min(2 * M, n)
    q = torch.arange(Q, device=device)
    taken = ((picked[:, None, :] == q[None, :, None]) & found[:, None, :]).any(dim=2)
    keys = torch.cat([torch.where(found, torch.arange(M, device=device), big),
                      torch.where(taken, big, M + q)], dim=1)
    _, place = keys.topk(M, dim=1, largest=False, sorted=True)
    sentinel = torch.full((B, Q), SENTINEL_SCORE, dtype=scores.dtype, device=device)
    top_out = torch.cat([torch.where(found, values, SENTINEL_SCORE), sentinel], 1).gather(1, place)
    position = torch.cat([picked, q.expand(B, Q)], dim=1).gather(1, place)
    return (top_out, position), short
