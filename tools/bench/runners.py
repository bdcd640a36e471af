"""Runners: one per method, each with a jitted step per t, the states a real
decode passes through, a kernel per t and a full decode."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import static_compiler as sc
from static_compiler import report
from static_compiler.backend import decode
from static_compiler.backend.kernels import expand
from static_compiler.ir import LayoutKind
from tools.bench import baselines as bl
from tools.bench.config import CellSpec


@dataclasses.dataclass
class Runner:
    name: str
    exact: bool
    steps: list          # [(jitted fn, args)] per step
    kernels: Optional[tuple]  # (jitted fn of all steps' kernels, args), None without a constraint
    decode: object       # () -> (tokens, scores, valid), blocking
    final: tuple = ()    # (tokens, valid) after the L timed steps ran in a chain
    index_bytes: int = 0
    build_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)


def _layout_label(step) -> str:
    """Short layout of a plan step: "unary", "csr(504)", "near_unary(1696/16x4)"
    (mixed: k / light_k x wide_slots)."""
    if step.kind in (LayoutKind.DENSE_ROWS, LayoutKind.UNARY):
        return step.kind
    return f"{step.kind}({step.k}/{step.light_k}x{step.wide_slots})" if step.light_k \
        else f"{step.kind}({step.k})"


def _static_runner(compiled, model, cfg) -> Runner:
    plan, tables = compiled.plan, compiled.lowered.device_tables
    B, M, tpb = cfg.batch, cfg.beams, cfg.tokens_per_beam
    live = decode.search.live_beam_bounds(plan, M, tpb)  # as static_compiler.beam_search

    def step_fn(tables, model_table, state, *, t):
        logits = bl.TableModel.logits(model_table, state.last_tokens, t)
        return decode.beam_step(plan, tables, state, logits, t, bl.step_cap(t, tpb),
                                live_beams=live[t])

    def kernels_fn(tables, nodes):
        out = []
        for t, node in enumerate(nodes):
            cand = expand(plan.steps[t], tables[t], node)
            # dense_rows tokens are an iota (nothing read): not returned, not timed
            out.append(cand[1:] if plan.steps[t].kind == LayoutKind.DENSE_ROWS else cand)
        return out

    steps, nodes = [], []
    state = decode.init_beam_state(plan, B, M)
    for t in range(plan.max_length):
        fn = jax.jit(functools.partial(step_fn, t=t))
        steps.append((fn, (tables, model.table, state)))
        nodes.append(state.node[:, :live[t]])
        state = fn(tables, model.table, state)
    kernels = (jax.jit(kernels_fn), (tables, nodes))

    def run_decode():  # static_compiler.beam_search, without holding `compiled`
        r = decode.beam_search(plan, tables, bl.TableModel.logits_fn, batch_size=B, beam_size=M,
                               tokens_per_beam=tpb, carry_axes=None, carry=model.table)
        return jax.block_until_ready((r.tokens, r.scores, r.valid))

    summary = report.summary(compiled)
    layouts = " ".join(_layout_label(s) for s in plan.steps)
    return Runner("static", True, steps, kernels, run_decode, (state.tokens, state.valid),
                  index_bytes=compiled.lowered.nbytes,
                  extra={"u_max_bytes": summary["paper_bound_bytes"], "layouts": layouts})


class StaticMask:
    """The library's logits-processor pair (`mask` / `advance`, one row per
    beam) as a method of the baselines' harness: STATIC with a dense mask."""

    name = "static_mask"
    exact = True

    def __init__(self, compiled):
        self.plan = compiled.plan
        self.tables = compiled.lowered.device_tables

    def init(self, tables, batch_size, beam_size):
        return decode.ProcessorState(node=jnp.zeros((batch_size, beam_size), jnp.int32),
                                     valid=jnp.ones((batch_size, beam_size), bool),
                                     finished=jnp.zeros((batch_size, beam_size), bool))

    @staticmethod
    def _rows(state):
        return jax.tree_util.tree_map(lambda x: x.reshape(-1), state)

    def allowed(self, tables, state, logprobs, step):
        B, M, V = logprobs.shape
        masked = decode.mask(self.plan, tables, logprobs.reshape(B * M, V), self._rows(state), step)
        # mask() keeps allowed log-probs and writes SENTINEL_SCORE elsewhere.
        return (masked > decode.SENTINEL_SCORE).reshape(B, M, V), None

    def advance(self, tables, state, aux, parent, token, step):
        nxt = decode.advance(self.plan, tables, self._rows(state), token.reshape(-1), step)
        return jax.tree_util.tree_map(lambda x: x.reshape(token.shape), nxt)


def _harness_runner(method, model, cfg, length: int, build_s: float = 0.0,
                    index_bytes: int = 0, extra: Optional[dict] = None) -> Runner:
    B, M, tpb = cfg.batch, cfg.beams, cfg.tokens_per_beam
    tables = method.tables

    def step_fn(tables, model_table, state, *, t):
        return bl.model_and_step(method, tables, model_table, state, t, tpb)

    def kernels_fn(tables, constraints, logprobs):
        return [method.allowed(tables, c, lp, t) for t, (c, lp) in enumerate(zip(constraints,
                                                                                 logprobs))]

    steps, constraints, logprobs = [], [], []
    state = bl.init_masked_state(method, tables, B, M, length)
    for t in range(length):
        fn = jax.jit(functools.partial(step_fn, t=t))
        steps.append((fn, (tables, model.table, state)))
        live = bl.harness_live_beams(t, M, model.vocab_size, tpb)
        logprobs.append(decode.logprobs.safe_log_softmax(
            bl.TableModel.logits(model.table, state.last_tokens, t)[:, :live]))
        constraints.append(jax.tree_util.tree_map(lambda x: x[:, :live], state.constraint))
        state = fn(tables, model.table, state)
    kernels = None
    if not isinstance(method, bl.Unconstrained):
        kernels = (jax.jit(kernels_fn), (tables, constraints, logprobs))

    def run_decode():
        return jax.block_until_ready(bl.masked_beam_search(
            method, tables, model.table, batch_size=B, beam_size=M, length=length,
            tokens_per_beam=tpb))

    return Runner(method.name, method.exact, steps, kernels, run_decode,
                  (state.tokens, state.valid), index_bytes=index_bytes, build_s=build_s,
                  extra=extra or {})


def _nbytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def make_runners(spec: CellSpec, methods, cfg):
    """(runners, compiled): one Runner per method, in `methods` order.

    Baseline indexes are built one after the other (their build time is
    measured); the runners, which trace and compile L steps each, are made
    on cfg.compile_threads threads (XLA compiles without the GIL)."""
    sequences = spec.sequences()
    compiled = sc.compile_constraints(sequences, vocab_size=spec.vocab)
    model = bl.TableModel(spec.vocab, seed=cfg.seed)
    L = compiled.plan.max_length
    makers = []  # thunks -> Runner
    if "static" in methods:
        makers.append(lambda: _static_runner(compiled, model, cfg))
    if "static_mask" in methods:
        makers.append(lambda: _harness_runner(StaticMask(compiled), model, cfg, L,
                                              index_bytes=compiled.lowered.nbytes))
    if "unconstrained" in methods:
        makers.append(lambda: _harness_runner(bl.Unconstrained(), model, cfg, L))
    if {"host_trie", "exact_bsearch", "approx_bsearch", "hash_bitmap"} & set(methods):
        start = time.perf_counter()
        sorted_set = bl.SortedSet(sequences, spec.vocab)
        sort_s = time.perf_counter() - start
        exact = None
        for name in ("host_trie", "exact_bsearch", "approx_bsearch", "hash_bitmap"):
            if name not in methods:
                continue
            start = time.perf_counter()
            extra = {}
            if name == "host_trie":
                method = bl.HostTrie(sorted_set)
                nbytes = _nbytes(method.host_arrays())
            elif name == "exact_bsearch":
                method = exact = bl.ExactBinarySearch(sorted_set)
                nbytes = _nbytes(method.tables)
            elif name == "approx_bsearch":
                method = bl.ApproxBinarySearch(sorted_set, top_n=cfg.approx_top_n, base=exact)
                nbytes = _nbytes(method.tables)
            else:
                method = bl.HashBitmap(sorted_set, bits_per_prefix=cfg.bitmap_bits)
                nbytes = _nbytes(method.tables)
                extra["fpr"] = method.false_positive_rate(sorted_set)
            build_s = sort_s + time.perf_counter() - start
            makers.append(functools.partial(_harness_runner, method, model, cfg, L, build_s,
                                            nbytes, extra))
        del sorted_set
    del sequences
    with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.compile_threads) as pool:
        runners = list(pool.map(lambda make: make(), makers))
    return runners, compiled


