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

Selection is exact and deterministic (`selection.best`): a row of up to SORT_MAX
candidates is ranked by one stable sort (score desc, then position: parent
asc, column asc); a longer row maps each float32 score to an int32 of the
same order, packs it with its position into one int64 key (every key of a
row distinct) and takes `torch.topk` of the keys.

A step is few ops over all beams at once (about 70 eager ops a step; the
cost that remains on the CPU is mostly the one log_softmax over (B, M',
V)): a candidate's validity travels in its score (SENTINEL_SCORE), its
end / carried-over kind in its column, and the new state is read from the
selection. Every function is vectorized over the beams at a static step
with no branch on tensor values (``torch.compile(fullgraph=True)`` traces
`scored_step`, and `beam_step` there), and no host synchronisation but
two: eager on the CPU, `LogProbs.of` reads one float back (no device to
wait for) to skip the NaN / +inf passes where no row needs them; eager,
a ranked subset's lazy selection (`selection.ranked_select`) reads back whether a
list decided (a `torch.cond` under torch.compile).
`CompiledSteps` runs `scored_step` as compiled programs. Shapes: B rows,
M beams, M' beams expanded (the live-beam bound), C candidate columns, V
vocabulary, T max length.
"""

from __future__ import annotations

import math
import types
import weakref
from typing import NamedTuple, Optional

import torch

from static_compiler.support.decode_types import (
    MIN_VALID_SCORE,
    PAD_TOKEN,
    SENTINEL_SCORE,
    BeamState,
    DecodeResult,
)
from static_compiler.torch_backend.kernels import (
    Children,
    is_ranked,
    step_columns,
)
from static_compiler.torch_backend.selection import best, ranked_select, select


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

    logits: Optional[torch.Tensor]
    normalized: torch.Tensor
    log_posinf: Optional[torch.Tensor]

    @classmethod
    def of(cls, logits: torch.Tensor) -> "LogProbs":
        """The log-probabilities of logits float (..., V). Eager on the CPU,
        where reading a float back costs no device sync, one cheap max per
        row first: when every row's max is finite (no NaN, no +inf, some
        finite logit), ``torch.log_softmax`` of the logits as given is
        already the answer (logits and log_posinf None: `take` only
        gathers) and `full`'s passes are skipped; elsewhere `full`."""
        x = logits.float()
        if x.device.type == "cpu" and not torch.compiler.is_compiling() and \
                math.isfinite(x.amax(dim=-1).sum().item()):  # (a sum that overflows: the long way)
            return cls(None, torch.log_softmax(x, dim=-1), None)
        return cls.full(x)

    @classmethod
    def full(cls, logits: torch.Tensor) -> "LogProbs":
        """`of` with no shortcut and no host read: every row cleaned of NaN
        and its +inf counted (the same values where `of` takes its
        shortcut)."""
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
        if self.logits is None:
            return self.normalized.gather(-1, tokens)
        inf = float("inf")
        x = self.logits.gather(-1, tokens)
        normal = torch.where(x == -inf, -inf, self.normalized.gather(-1, tokens))
        shared = torch.where(x == inf, -self.log_posinf, -inf)
        return torch.where(self.log_posinf > -inf, shared, normal)

    def all(self) -> torch.Tensor:
        """float32 (..., V): every token's log-probability (`take` of them all)."""
        if self.logits is None:
            return self.normalized
        V = self.normalized.shape[-1]
        return self.take(torch.arange(V, device=self.normalized.device).expand(
            self.normalized.shape))

    def column(self, token: int) -> torch.Tensor:
        """float32 (..., 1): the log-probabilities of `token` in [0, V)."""
        if self.logits is None:
            return self.normalized[..., token:token + 1]
        return self.take(torch.full(self.normalized.shape[:-1] + (1,), token, dtype=torch.int64,
                                    device=self.normalized.device))


class Candidates(NamedTuple):
    """The candidates of B x M' beams. scores: float32 (B, M', C),
    SENTINEL_SCORE where not valid. A beam's C columns are its K children
    (`children`: tokens, next int64 (B * M', K) as the tables list them, or
    None past the last layer), then the end token (column `end`, or None
    where no state accepts), then the beam itself carried over once
    finished (column `stay`, None without an end token)."""

    scores: torch.Tensor
    children: Optional[Children]
    end: Optional[int]
    stay: Optional[int]


def candidates(plan, tables, step: int, node, valid, finished, scores, logprobs: LogProbs,
               sub, child_subset: bool = True) -> Candidates:
    """The `Candidates` of beams at states node int64 (B, M') (valid,
    finished bool, scores float32 (B, M')) at static `step`, scored with
    the beams' `LogProbs` (rows B * M'); sub: (LiveBits, rows int64 (B *
    M',)) or None; child_subset False: the children scored valid by the
    tables alone (`kernels.step_columns`'s, the caller reads their
    liveness). Each column's ops run once over all beams; a dense step
    reads the beams' log-probabilities whole instead of gathering them."""
    B, M = node.shape
    R = B * M
    cols = step_columns(plan, tables, step, node.reshape(R), valid.reshape(R),
                        finished.reshape(R), sub, child_subset=child_subset)
    V = logprobs.normalized.shape[-1]
    device = logprobs.normalized.device
    logprob, ok = [], []  # per column group: float32 (R, c), bool (R, c)
    kids = cols.children
    if kids is not None:
        dense = plan.steps[step].kind == "dense_rows"  # (column v is token v)
        logprob.append(logprobs.all() if dense else logprobs.take(kids.tokens.clamp(0, V - 1)))
        ok.append(kids.valid)
    if cols.end is not None:
        logprob.append(logprobs.column(plan.end_token))
        ok.append(cols.end[:, None])
    if cols.stay is not None:
        logprob.append(torch.zeros((R, 1), dtype=torch.float32, device=device))
        ok.append(cols.stay[:, None])
    join = lambda parts: parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    logprob, ok = join(logprob), join(ok)
    ok = ok & (logprob > -float("inf"))  # (a carried-over beam's 0.0 always passes)
    score = torch.where(ok, (scores.reshape(R, 1) + logprob).clamp(min=MIN_VALID_SCORE),
                        SENTINEL_SCORE)
    K = 0 if kids is None else kids.next.shape[1]
    end = None if cols.end is None else K
    stay = None if cols.stay is None else K + (end is not None)
    return Candidates(score.reshape(B, M, -1), kids, end, stay)


class PriorTerms(NamedTuple):
    """Item priors on this backend's device: best float32 (S,), the best
    weighted prior below each state (`rules.priors.Prior.best`), and where
    each step's children (and, with an end token, own terms) start in it
    (`lowered.plan.prior_offsets`: (children, own))."""

    best: torch.Tensor
    offsets: tuple


def ranked(ranking: PriorTerms, step: int, cand: "Candidates", node: torch.Tensor):
    """float32 (B, M', C): the candidates' ranks (`backend.decode.prior.ranked`
    in torch): max(score + term, MIN_VALID_SCORE) where valid (scores above
    SENTINEL_SCORE), SENTINEL_SCORE elsewhere; a child's term is the best
    below its next state, the end column's its beam's state's (node int64
    (B, M')) own item's, the carried-over column's none."""
    children, own = ranking.offsets
    last = ranking.best.shape[0] - 1
    take = lambda at: ranking.best[at.clamp(0, last)]  # (an invalid candidate reads any)
    parts = [] if cand.children is None else [take(cand.children.next + children[step])]
    if cand.end is not None:
        parts.append(take(node.reshape(-1, 1) + own[step]))
    if cand.stay is not None:
        parts.append(torch.zeros((node.numel(), 1), dtype=torch.float32, device=node.device))
    scores = cand.scores
    term = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).reshape(scores.shape)
    return torch.where(scores > SENTINEL_SCORE, (scores + term).clamp(min=MIN_VALID_SCORE),
                       SENTINEL_SCORE)


def beam_step(plan, tables, state: BeamState, logits: torch.Tensor, step: int,
              tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
              sub=None, beam_size: Optional[int] = None,
              ranking: Optional[PriorTerms] = None, normalized: bool = False) -> BeamState:
    """One beam-search step at static `step` on checked arguments (the
    public entry point is `TorchConstraints.beam_step`). logits float (B,
    M, V) for the beams of `state`; normalized: the logits already are
    log-probabilities over the full vocabulary (an engine's, read at the
    tokens it scored, -inf at the others), used as given with no
    log_softmax; live_beams: a static promise that only
    beams [0, live_beams) can be valid (they alone are expanded); sub:
    (LiveBits, rows int64 (B,)) one subset row per batch row, or a ranked
    subset's (`rank_kernels.RankedLive`, rows: its children's liveness
    read for the few candidates that can win, `ranked_select`), or None;
    beam_size: the beams the new state keeps (a beam schedule's width at
    this step; None: M, as many as `state` has); ranking: item priors
    (`PriorTerms`, a fixed-length set): candidates ranked with the best
    prior below them, the last step keeping the ranks as scores.

    A chosen candidate is valid exactly where its score is above
    SENTINEL_SCORE (valid scores are floored at MIN_VALID_SCORE), and
    ends or stays by its column: the new state is read from the selection
    with no per-candidate masks carried along."""
    B, M = state.node.shape
    Mx = M if live_beams is None else min(live_beams, M)
    rows = logits[:, :Mx].reshape(B * Mx, logits.shape[-1])
    logprobs = LogProbs(None, rows.float(), None) if normalized else LogProbs.of(rows)
    return scored_step(plan, tables, state, logprobs, step, tokens_per_beam, live_beams, sub,
                       beam_size, ranking)


def scored_step(plan, tables, state: BeamState, logprobs: LogProbs, step: int,
                tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
                sub=None, beam_size: Optional[int] = None,
                ranking: Optional[PriorTerms] = None) -> BeamState:
    """`beam_step` past its log-probabilities: logprobs the `LogProbs` of
    the expanded beams' logits (rows B * M', M' = min(live_beams, M)); the
    new state keeps beam_size beams (None: M)."""
    B, M, T = state.tokens.shape
    Mx = M if live_beams is None else min(live_beams, M)
    cut = (lambda x: x) if Mx == M else (lambda x: x[:, :Mx])
    M = M if beam_size is None else beam_size  # the beams kept from here on
    if sub is not None:
        sub = (sub[0], sub[1].repeat_interleave(Mx))
    lazy = ranking is None and is_ranked(sub)  # (a ranked subset: its liveness read lazily)
    cand = candidates(plan, tables, step, cut(state.node), cut(state.valid),
                      cut(state.finished), cut(state.scores), logprobs, sub,
                      child_subset=not lazy)
    C = cand.scores.shape[2]
    keep = min(C, M, C if tokens_per_beam is None else tokens_per_beam)
    if lazy:
        top, position = ranked_select(plan, step, cand, cut(state.node), sub, M, keep)
    else:
        rank = cand.scores if ranking is None else ranked(ranking, step, cand, cut(state.node))
        top, position = select(rank, M, keep)
    valid = top > SENTINEL_SCORE
    # C = 1: the one column is a child (an end or stay column comes with the other)
    parent, col = (position, None) if C == 1 else (position // C, position % C)
    ends = None if cand.end is None else col == cand.end
    stays = None if cand.stay is None else col == cand.stay
    done = ends if stays is None else stays if ends is None else ends | stays
    finished = torch.zeros_like(valid) if done is None else valid & done
    grows = valid ^ finished  # valid, not ended, not carried over
    if ranking is not None and step < plan.max_length - 1:  # log-probs until complete
        top = torch.where(grows, cand.scores.reshape(B, Mx * C).gather(1, position), top)
    end_or_pad = PAD_TOKEN if ends is None else torch.where(valid & ends, plan.end_token,
                                                            PAD_TOKEN)
    kids = cand.children
    if kids is None:
        token, nxt = torch.zeros_like(position), torch.zeros_like(position)
    else:
        K = kids.next.shape[1]
        at = position if C == K else parent if K == 1 else parent * K + col.clamp(max=K - 1)
        nxt = kids.next.reshape(B, Mx * K).gather(1, at)
        dense = plan.steps[step].kind == "dense_rows"  # (column v is token v)
        token = (position if C == 1 else col) if dense else \
            kids.tokens.reshape(B, Mx * K).gather(1, at)
    history = state.tokens.gather(1, parent[:, :, None].expand(B, M, T))
    history[:, :, step] = torch.where(grows, token, end_or_pad)
    fill = 0 if plan.end_token is None else plan.end_token
    return BeamState(
        tokens=torch.where(valid[:, :, None], history, PAD_TOKEN),
        scores=top,
        node=torch.where(grows, nxt, 0),
        valid=valid,
        finished=finished,
        lengths=torch.where(valid, state.lengths.gather(1, parent) + grows, 0),
        last_tokens=torch.where(grows, token, fill),
        parent=parent,
    )


class CompiledSteps:
    """`beam_step` for one set (plan, tables) with `scored_step` run as
    ``torch.compile(fullgraph=True, dynamic=False)`` programs: one per
    static step, options and shapes, each compiled at its first call
    (seconds each on a CPU) and traced from its own code object, so
    dynamo's per-code recompile limit never stops a long search or a new
    batch shape. The log-probabilities stay eager (`LogProbs.of`: its CPU
    fast path reads a float back). Results equal `beam_step`'s bit for bit
    (tests/torch_backend/test_torch_beam.py). options: torch.compile's
    (backend, mode, ...)."""

    def __init__(self, plan, tables, **options):
        self.plan = plan
        self.tables = tables
        self.options = options
        self.programs = {}

    def __call__(self, state: BeamState, logits: torch.Tensor, step: int,
                 tokens_per_beam: Optional[int] = None, live_beams: Optional[int] = None,
                 sub=None, beam_size: Optional[int] = None,
                 ranking: Optional[PriorTerms] = None) -> BeamState:
        """`beam_step(plan, tables, state, logits, step, tokens_per_beam,
        live_beams, sub, beam_size, ranking)`."""
        B, M, T = state.tokens.shape
        V = logits.shape[-1]
        Mx = M if live_beams is None else min(live_beams, M)
        logprobs = LogProbs.of(logits[:, :Mx].reshape(B * Mx, V))
        key = (step, tokens_per_beam, live_beams, B, M, T, V, logprobs.logits is None,
               sub is None, beam_size, ranking is None)
        program = self.programs.get(key)
        if program is None:
            program = self.programs[key] = torch.compile(
                self._program(step, tokens_per_beam, live_beams, beam_size), fullgraph=True,
                dynamic=False, **self.options)
        return program(state, logprobs, sub, ranking)

    def _program(self, step, tokens_per_beam, live_beams, beam_size):
        plan, tables = self.plan, self.tables

        def program(state, logprobs, sub, ranking):
            return scored_step(plan, tables, state, logprobs, step, tokens_per_beam, live_beams,
                               sub, beam_size, ranking)

        code = program.__code__.replace()  # a new code object: dynamo's caches are per code
        return types.FunctionType(code, program.__globals__, f"beam_step_{step}", None,
                                  program.__closure__)


_COMPILED_STEPS = weakref.WeakKeyDictionary()


def compiled_steps(owner) -> CompiledSteps:
    """The `CompiledSteps` of owner's plan and tables (a `TorchConstraints`),
    made at the first call and kept while owner lives, so every search on
    it reuses the programs compiled so far."""
    steps = _COMPILED_STEPS.get(owner)
    if steps is None:
        steps = _COMPILED_STEPS[owner] = CompiledSteps(owner.plan, owner._tables)
    return steps


def completed(state: BeamState, depth: int) -> BeamState:
    """`state` with only its complete beams valid (finished, or `depth`
    tokens), SENTINEL_SCORE for the others: `jax_support.beam_result.completed`
    in torch (a no-op after a search's last step)."""
    complete = state.valid & (state.finished | (state.lengths == depth))
    # (a new tuple, not `_replace`, which torch 2.5's dynamo cannot trace)
    return BeamState(state.tokens, torch.where(complete, state.scores, SENTINEL_SCORE),
                     state.node, complete, state.finished, state.lengths, state.last_tokens,
                     state.parent)


def finalize(state: BeamState, length_penalty: float = 0.0) -> DecodeResult:
    """The result; with a length penalty the beams re-ranked by the GNMT
    normalized score ``score / ((5 + length) / 6) ** length_penalty``
    (valid beams first, ties to the lower beam), which `scores` then hold."""
    if not length_penalty:
        return DecodeResult(state.tokens, state.scores, state.valid, state.lengths)
    normalized = state.scores / ((5.0 + state.lengths.float()) / 6.0) ** length_penalty
    ranked = torch.where(state.valid, torch.clamp(normalized, min=MIN_VALID_SCORE),
                         SENTINEL_SCORE).to(torch.float32)
    _, order = best(ranked, ranked.shape[1])
    rows = lambda x: x.gather(1, order.reshape(*order.shape, *([1] * (x.ndim - 2))).expand(
        *order.shape, *x.shape[2:]))
    return DecodeResult(rows(state.tokens), rows(ranked), rows(state.valid), rows(state.lengths))
