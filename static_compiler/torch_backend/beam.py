"""Constrained beam search in torch: the JAX decoder's beam step
(`static_compiler.backend.decode.step`), its selection and its final
ranking, on the tables of a `TorchConstraints`.

The semantics are `static_compiler.backend.decode`'s, rule for rule:
log-probabilities are a NaN-free log_softmax over the full vocabulary;
step 0 expands beam 0 of each row only; a beam's candidates are its
children in table order, then the end token (where its state accepts),
then, once finished, itself carried over; the best `beam_size` candidates
of each row survive, ties to the lower parent beam, then the lower
column; valid scores are floored at MIN_VALID_SCORE. The tokens, validity
and lengths equal the JAX backend's (tests/torch_backend/test_torch_beam.py); scores
agree to float32 rounding (torch's exp and log are not XLA's, so a
log-probability may differ in its last bit, and a near-tie decided by
that bit could go the other way).

Selection is exact and deterministic without a stable top-k: each
candidate's float32 score is mapped to an int32 of the same order and
packed with its flat position into one int64 key, so every key of a row
is distinct and `torch.topk` over keys returns the order (score desc,
parent asc, column asc).

Every function is vectorized over the beams at a static step, with no
host synchronisation and no branch on tensor values (``torch.compile(
fullgraph=True)`` traces `beam_step`). Shapes: B rows, M beams, M' beams
expanded (the live-beam bound), C candidate columns, V vocabulary, T
max length.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from static_compiler.support.decode_types import (MIN_VALID_SCORE, PAD_TOKEN, SENTINEL_SCORE, BeamState,
                                          DecodeResult)
from static_compiler.torch_backend.kernels import step_columns


def init_beams(plan, batch_size: int, beam_size: int, start_tokens: torch.Tensor) -> BeamState:
    """Every beam at the root; beam 0 of each row alone valid (it alone
    expands at step 0). start_tokens int64 (B,): the model's input at
    step 0. Ints are int64, scores float32."""
    B, M, T = batch_size, beam_size, plan.max_length
    device = start_tokens.device
    valid = (torch.arange(M, device=device) == 0).expand(B, M).clone()
    return BeamState(
        tokens=torch.full((B, M, T), PAD_TOKEN, dtype=torch.int64, device=device),
        scores=torch.where(valid, 0.0, SENTINEL_SCORE).to(torch.float32),
        node=torch.zeros((B, M), dtype=torch.int64, device=device),
        valid=valid,
        finished=torch.zeros((B, M), dtype=torch.bool, device=device),
        lengths=torch.zeros((B, M), dtype=torch.int64, device=device),
        last_tokens=start_tokens.long()[:, None].expand(B, M).clone(),
        parent=torch.arange(M, device=device).expand(B, M).clone(),
    )


class LogProbs(NamedTuple):
    """`static_compiler.backend.decode.logprobs.LogProbs` in torch: the
    NaN-free log_softmax of logits (..., V), read at a step's candidates.

    logits: float32 (..., V), NaN replaced by -inf; normalized: their
    ``torch.log_softmax`` (NaN in rows holding +inf or no finite logit:
    `take` never reads it there); log_posinf: float32 (..., 1), log of the
    row's count of +inf logits (-inf: none)."""

    logits: torch.Tensor
    normalized: torch.Tensor
    log_posinf: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor) -> "LogProbs":
        # Three fused passes over (..., V): eager torch pays per pass, and
        # torch.log_softmax costs less than half of torch.logsumexp on CPU.
        inf = float("inf")
        x = torch.nan_to_num(logits.float(), nan=-inf, posinf=inf, neginf=-inf)
        return cls(x, torch.log_softmax(x, dim=-1),
                   torch.isposinf(x).sum(dim=-1, keepdim=True).float().log())

    def take(self, tokens: torch.Tensor) -> torch.Tensor:
        """float32 tokens.shape: the log-probabilities of tokens int64
        (..., K) in [0, V). NaN logits are -inf; in a row holding +inf
        logits those share all the probability (-log count) and every
        other token is -inf; a row with no finite or +inf logit is all
        -inf."""
        inf = float("inf")
        x = self.logits.gather(-1, tokens)
        normal = torch.where(x == -inf, -inf, self.normalized.gather(-1, tokens))
        shared = torch.where(x == inf, -self.log_posinf, -inf)
        return torch.where(self.log_posinf > -inf, shared, normal)


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 scores.shape: keys ordered as (score desc, position asc) along
    the last axis, every key of a row distinct. scores float32 (..., N) hold
    no NaN; N < 2 ** 32."""
    bits = (scores + 0.0).contiguous().view(torch.int32)  # + 0.0: -0.0 ranks as 0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    N = scores.shape[-1]
    position = torch.arange(N, device=scores.device)
    return (ordered << 32) | (N - 1 - position)


def key_positions(keys: torch.Tensor, n: int) -> torch.Tensor:
    """int64: the positions in [0, n) that `order_keys` packed into `keys`."""
    return n - 1 - (keys & 0xFFFFFFFF)


def candidates(plan, tables, step: int, state: BeamState, logits: torch.Tensor, sub):
    """Every candidate of the beams of `state` (B, M'), as columns (B, M',
    C): tokens, next, valid, score (float32, SENTINEL_SCORE where not
    valid), ends, stays. logits float (B, M', V); sub: (LiveBits, rows
    int64 (B * M',)) or None."""
    B, M = state.node.shape
    flat = lambda x: x.reshape(B * M)
    cols = step_columns(plan, tables, step, flat(state.node), flat(state.valid),
                        flat(state.finished), sub)
    logprobs = LogProbs.of(logits.reshape(B * M, -1))
    V = logits.shape[-1]
    device = logits.device
    parts = []  # (tokens, next, valid, logprob, ends, stays), each (B * M', c)
    one = lambda value, dtype: torch.full((B * M, 1), value, dtype=dtype, device=device)
    false = one(False, torch.bool)
    kids = cols.children
    if kids is not None:
        kid_lp = logprobs.take(kids.tokens.clamp(0, V - 1))
        zeros = torch.zeros_like(kids.valid)
        parts.append((kids.tokens, kids.next, kids.valid, kid_lp, zeros, zeros))
    if cols.end is not None:
        end = plan.end_token
        parts.append((one(end, torch.int64), one(0, torch.int64), cols.end[:, None],
                      logprobs.take(one(end, torch.int64)), one(True, torch.bool), false))
    if cols.stay is not None:
        parts.append((one(PAD_TOKEN, torch.int64), one(0, torch.int64), cols.stay[:, None],
                      one(0.0, torch.float32), false, one(True, torch.bool)))
    tokens, nxt, valid, logprob, ends, stays = (torch.cat(p, dim=1) for p in zip(*parts))
    valid = valid & (stays | (logprob > -float("inf")))
    score = (flat(state.scores)[:, None] + logprob).clamp(min=MIN_VALID_SCORE)
    score = torch.where(valid, score, SENTINEL_SCORE)
    shape = lambda x: x.reshape(B, M, -1)
    return tuple(shape(x) for x in (tokens, nxt, valid, score, ends, stays))


def select(scores: torch.Tensor, beam_size: int, tokens_per_beam: Optional[int]):
    """The best `beam_size` candidates of each row of scores float32 (B,
    M', C), each beam first cut to its best `tokens_per_beam` (None: no
    cut): (score float32, parent int64, col int64, real bool), each (B,
    beam_size), best first; places past the M' * C candidates are not real
    (parent 0, col 0, SENTINEL_SCORE). `static_compiler.backend.decode.
    selection.select_beams` in torch."""
    B, M, C = scores.shape
    keys = order_keys(scores.reshape(B, M * C)).reshape(B, M, C)
    # A beam places at most beam_size winners: its best min(C, cap, beam_size) suffice.
    keep = min(C, beam_size, C if tokens_per_beam is None else tokens_per_beam)
    if keep < C:
        keys = keys.topk(keep, dim=2).values
    keys = keys.reshape(B, M * keep)
    real_count = M * keep
    if real_count < beam_size:
        pad = torch.full((B, beam_size - real_count), torch.iinfo(torch.int64).min,
                         dtype=torch.int64, device=keys.device)
        keys = torch.cat([keys, pad], dim=1)
    top = keys.topk(beam_size, dim=1).values
    real = (torch.arange(beam_size, device=keys.device) < real_count).expand(B, beam_size)
    position = torch.where(real, key_positions(top, M * C), 0)
    score = torch.where(real, scores.reshape(B, M * C).gather(1, position), SENTINEL_SCORE)
    return score, position // C, position % C, real


def beam_step(plan, tables, state: BeamState, logits: torch.Tensor, step: int,
              tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
              sub=None) -> BeamState:
    """One beam-search step at static `step` on checked arguments (the
    public entry point is `TorchConstraints.beam_step`). logits float (B,
    M, V) for the beams of `state`; live_beams: a static promise that only
    beams [0, live_beams) can be valid (they alone are expanded); sub:
    (LiveBits, rows int64 (B,)) one subset row per batch row, or None."""
    B, M = state.node.shape
    expanded = state
    if live_beams is not None and live_beams < M:
        expanded = BeamState(*(x[:, :live_beams] for x in state))
        logits = logits[:, :live_beams]
    Mx = expanded.node.shape[1]
    if sub is not None:
        sub = (sub[0], sub[1].repeat_interleave(Mx))
    tokens, nxt, valid, score, ends, stays = candidates(plan, tables, step, expanded, logits,
                                                        sub)
    top, parent, col, real = select(score, M, tokens_per_beam)
    C = tokens.shape[2]
    pick = lambda x: x.reshape(B, Mx * C).gather(1, parent * C + col)
    valid = real & pick(valid)
    token, ends, stays = pick(tokens), pick(ends), pick(stays)
    finished = valid & (ends | stays)
    beams = lambda x: x.gather(1, parent.reshape(B, M, *([1] * (x.ndim - 2))).expand(
        B, M, *x.shape[2:]))
    history = beams(state.tokens)
    written = torch.where(valid & ~stays, token, PAD_TOKEN)
    history = torch.cat([history[:, :, :step], written[:, :, None], history[:, :, step + 1:]], 2)
    history = torch.where(valid[:, :, None], history, PAD_TOKEN)
    grows = valid & ~ends & ~stays
    fill = 0 if plan.end_token is None else plan.end_token
    return BeamState(
        tokens=history,
        scores=torch.where(valid, top, SENTINEL_SCORE),
        node=torch.where(valid & ~finished, pick(nxt), 0),
        valid=valid,
        finished=finished,
        lengths=torch.where(valid, beams(state.lengths) + grows.long(), 0),
        last_tokens=torch.where(grows, token, fill),
        parent=parent,
    )


def completed(state: BeamState, depth: int) -> BeamState:
    """`state` with only its complete beams valid (finished, or `depth`
    tokens), SENTINEL_SCORE for the others: `support.beam_result.completed`
    in torch (a no-op after a search's last step)."""
    complete = state.valid & (state.finished | (state.lengths == depth))
    return state._replace(scores=torch.where(complete, state.scores, SENTINEL_SCORE),
                          valid=complete)


def finalize(state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
    """The result; with a length penalty the beams re-ranked by the GNMT
    normalized score ``score / ((5 + length) / 6) ** length_penalty``
    (valid beams first, ties to the lower beam), which `scores` then hold."""
    if not length_penalty:
        return DecodeResult(state.tokens, state.scores, state.valid, state.lengths)
    normalized = state.scores / ((5.0 + state.lengths.float()) / 6.0) ** length_penalty
    ranked = torch.where(state.valid, torch.clamp(normalized, min=MIN_VALID_SCORE),
                         SENTINEL_SCORE).to(torch.float32)
    M = ranked.shape[1]
    order = key_positions(order_keys(ranked).topk(M, dim=1).values, M)
    rows = lambda x: x.gather(1, order.reshape(*order.shape, *([1] * (x.ndim - 2))).expand(
        *order.shape, *x.shape[2:]))
    return DecodeResult(rows(state.tokens), rows(ranked), rows(state.valid), rows(state.lengths))
