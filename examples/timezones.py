"""Constrained generative retrieval with a small, locally trained model.

    python examples/timezones.py [--tiny] [--seconds 120]

The catalogue is the IANA time-zone names (``zoneinfo.available_timezones()``),
one token per character plus an end token and a start token. The query is
what a user might know without knowing the exact name: the region, and the
place's last word lower-cased, with "_" dropped and its characters sorted
("Europe/Paris" -> "europe/aiprs", "America/Argentina/Buenos_Aires" ->
"america/aabeiinorssu"). The model has to produce the exact name (sub-region,
spelling, case) from that.

A tiny decoder-only transformer (Flax NNX) is trained for ``--seconds``
(after its first, compiling step) on 85% of the names; the other 15% (chosen by a hash of the
name) are held out and used as test queries. The prompt is prefilled into a
KV cache laid out as serving engines do, ``(layers, 2, B*M, heads, T,
head_dim)``; beam search then decodes with

* an unconstrained beam search written here with ``lax.scan`` (top-k over
  M*V per step, ties to the lower flat index, like the library),
* ``sc.beam_search`` constrained to the whole catalogue,
* ``sc.beam_search`` constrained to the held-out names only,
* ``sc.beam_search`` over the whole catalogue with an item prior that
  "promotes" the held-out names (a campaign's items: the soft form of the
  previous rule; ``compiled.prior("promoted", weight=w)``, w = 1, 2, 4, 8),

and prints Recall@1 / Recall@10 on the held-out names, the share of
unconstrained outputs that are not catalogue names, and the time of the
first call (trace + compile + run) and of a steady call of each search.

Only the public API is used: ``import static_compiler as sc``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
import zlib
import zoneinfo

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

import static_compiler as sc

END, START, PAD = 0, 1, 2        # PAD only left-pads prompts; it is never a key
FIRST_CHAR = 3
HELD_OUT_PERMILLE = 150          # ~15% of the names are never trained on
NEG = -1e9                       # attention mask value (finite: a row with no keys stays finite)


# ---------------------------------------------------------------- catalogue

def catalogue() -> list[str]:
    """All IANA time-zone names known to this Python, sorted."""
    return sorted(zoneinfo.available_timezones())


def query_of(name: str) -> str:
    """The user's query: the region they know (the first path component,
    lower-cased, then "/"; nothing for names without one) and the place's
    last word, lower-cased, without "_", its characters sorted (a
    deterministic shuffle): "Europe/Paris" -> "europe/aiprs"."""
    parts = name.split("/")
    region = parts[0].lower() + "/" if len(parts) > 1 else ""
    return region + "".join(sorted(parts[-1].lower().replace("_", "")))


def is_held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % 1000 < HELD_OUT_PERMILLE


@dataclasses.dataclass(frozen=True)
class Vocab:
    chars: str

    @classmethod
    def of(cls, names) -> "Vocab":
        return cls("".join(sorted(set("".join(names)) | set("".join(map(query_of, names))))))

    @property
    def size(self) -> int:
        return FIRST_CHAR + len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [FIRST_CHAR + self.chars.index(c) for c in text]

    def decode(self, ids) -> str | None:
        """Characters up to the end token; None if there is no end token or
        a non-character token comes first."""
        out = []
        for t in ids:
            t = int(t)
            if t == END:
                return "".join(out)
            if t < FIRST_CHAR:
                return None
            out.append(self.chars[t - FIRST_CHAR])
        return None


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 2
    heads: int = 4
    d_model: int = 64
    d_ff: int = 256
    prompt_len: int = 25      # P: longest query
    max_name: int = 32        # longest name; the cache holds P + max_name + 1 positions

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.max_name + 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


TINY = dict(layers=1, heads=2, d_model=16, d_ff=64)


def config_for(names, **sizes) -> Config:
    return Config(prompt_len=max(len(query_of(n)) for n in names),
                  max_name=max(len(n) for n in names), **sizes)


# -------------------------------------------------------------------- model

class Block(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        d = cfg.d_model
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
        self.proj = nnx.Linear(d, d, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.ff1 = nnx.Linear(d, cfg.d_ff, rngs=rngs)
        self.ff2 = nnx.Linear(cfg.d_ff, d, rngs=rngs)

    def qkv_heads(self, x):
        """x (N, S, d) -> q, k, v, each (N, heads, S, head_dim)."""
        n, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(n, s, 3, self.heads, self.head_dim)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        return q, k, v

    def finish(self, x, q, k, v, mask):
        """Attention of q over (k, v) under mask (N, S_q, S_k) bool, then the MLP."""
        att = jnp.einsum("nhqd,nhkd->nhqk", q, k) / np.sqrt(self.head_dim)
        att = jax.nn.softmax(jnp.where(mask[:, None], att, NEG), axis=-1)
        y = jnp.einsum("nhqk,nhkd->nhqd", att, v)
        n, _, s, _ = y.shape
        x = x + self.proj(y.transpose(0, 2, 1, 3).reshape(n, s, -1))
        return x + self.ff2(jax.nn.gelu(self.ff1(self.ln2(x))))


class TinyLM(nnx.Module):
    def __init__(self, cfg: Config, vocab_size: int, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(vocab_size, cfg.d_model, rngs=rngs)
        self.pos = nnx.Embed(cfg.seq_len, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)]) \
            if hasattr(nnx, "List") else [Block(cfg, rngs) for _ in range(cfg.layers)]
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, vocab_size, rngs=rngs)

    def forward(self, tokens, key_valid):
        """Full sequences (training, prefill, brute-force scoring).
        tokens int (N, S) at positions 0..S-1; key_valid bool (N, S).
        Returns logits (N, S, V) and the cache (layers, 2, N, heads, S, head_dim)."""
        s = tokens.shape[1]
        x = self.embed(tokens) + self.pos(jnp.arange(s))[None]
        mask = jnp.tril(jnp.ones((s, s), bool))[None] & key_valid[:, None, :]
        kvs = []
        for block in self.blocks:
            q, k, v = block.qkv_heads(x)
            kvs.append(jnp.stack([k, v]))
            x = block.finish(x, q, k, v, mask)
        return self.head(self.ln_f(x)), jnp.stack(kvs)

    def decode_step(self, tokens, pos, cache, key_valid):
        """One token per row: tokens int (N,) at position pos (traced int32);
        cache (layers, 2, N, heads, T, head_dim); key_valid bool (N, T), which
        must already include pos. Returns logits (N, V) and the updated cache."""
        x = self.embed(tokens)[:, None] + self.pos(pos)[None, None]
        for i, block in enumerate(self.blocks):
            q, k, v = block.qkv_heads(x)
            zero = jnp.zeros((), jnp.int32)
            cache = lax.dynamic_update_slice(
                cache, jnp.stack([k, v])[None].astype(cache.dtype),
                (jnp.int32(i), zero, zero, zero, pos.astype(jnp.int32), zero))
            x = block.finish(x, q, cache[i, 0], cache[i, 1], key_valid[:, None, :])
        return self.head(self.ln_f(x))[:, 0], cache


def make_logits_fn(graphdef, cfg: Config):
    """The library's logits_fn: (params, last_tokens (B, M), step, carry) ->
    (logits (B, M, V), carry). Create it once and reuse the object: it is a
    static argument of the jitted searches."""

    def logits_fn(params, last_tokens, step, carry):
        model = nnx.merge(graphdef, params)
        b, m = last_tokens.shape
        pos = cfg.prompt_len + step
        decoded = jnp.arange(cfg.seq_len - cfg.prompt_len) <= step
        key_valid = jnp.concatenate(
            [carry["prompt_mask"], jnp.broadcast_to(decoded, (b * m, decoded.shape[0]))], axis=1)
        logits, kv = model.decode_step(last_tokens.reshape(b * m), pos, carry["kv"], key_valid)
        return logits.reshape(b, m, -1), {"kv": kv, "prompt_mask": carry["prompt_mask"]}

    return logits_fn


# Beams are flattened as B*M on axis 2 of the layers-first cache and on
# axis 0 of the per-beam prompt mask.
CARRY_AXES = {"kv": 2, "prompt_mask": 0}


# ------------------------------------------------------------------- data

def prompt_arrays(vocab: Vocab, cfg: Config, names):
    """Right-aligned prompts (N, P) and their masks: the query's characters
    end at position P-1, the start token goes at P."""
    p = cfg.prompt_len
    toks = np.full((len(names), p), PAD, np.int32)
    mask = np.zeros((len(names), p), bool)
    for i, name in enumerate(names):
        q = vocab.encode(query_of(name))
        toks[i, p - len(q):] = q
        mask[i, p - len(q):] = True
    return toks, mask


def training_arrays(vocab: Vocab, cfg: Config, names):
    """inputs (N, T), targets (N, T), loss mask (N, T), key_valid (N, T)."""
    toks, pmask = prompt_arrays(vocab, cfg, names)
    n, t = len(names), cfg.seq_len
    seq = np.full((n, t + 1), END, np.int32)
    seq[:, :cfg.prompt_len] = toks
    seq[:, cfg.prompt_len] = START
    loss = np.zeros((n, t), np.float32)
    for i, name in enumerate(names):
        ids = vocab.encode(name)
        seq[i, cfg.prompt_len + 1: cfg.prompt_len + 1 + len(ids)] = ids
        loss[i, cfg.prompt_len: cfg.prompt_len + len(ids) + 1] = 1.0   # the chars and END
    key_valid = np.concatenate([pmask, np.ones((n, t - cfg.prompt_len), bool)], axis=1)
    return seq[:, :-1], seq[:, 1:], loss, key_valid


def train(model: TinyLM, vocab: Vocab, names, *, seconds: float, batch_size: int = 128,
          lr: float = 3e-3, seed: int = 0, log=print):
    """Trains in place: the first step (which compiles) and then steps for
    `seconds` of wall time. Returns (steps, last loss, seconds after compile)."""
    graphdef, params = nnx.split(model)
    inputs, targets, loss_mask, key_valid = (jnp.asarray(a) for a in
                                             training_arrays(vocab, model.cfg, names))
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, 100, 20000, lr / 10),
                      weight_decay=0.01)

    def loss_fn(p, idx):
        logits, _ = nnx.merge(graphdef, p).forward(inputs[idx], key_valid[idx])
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[idx][..., None], -1)[..., 0]
        return jnp.sum(nll * loss_mask[idx]) / jnp.sum(loss_mask[idx])

    @jax.jit
    def step(p, opt_state, idx):
        loss, grads = jax.value_and_grad(loss_fn)(p, idx)
        updates, opt_state = opt.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    opt_state = opt.init(params)
    rng = np.random.default_rng(seed)
    batch_size = min(batch_size, len(names))
    batches = lambda: jnp.asarray(rng.integers(0, len(names), batch_size))   # noqa: E731
    params, opt_state, loss = step(params, opt_state, batches())
    jax.block_until_ready(loss)
    t0, steps = time.perf_counter(), 1
    while time.perf_counter() - t0 < seconds:
        params, opt_state, loss = step(params, opt_state, batches())
        steps += 1
        if steps % 1000 == 0:
            log(f"  step {steps:6d}  loss {float(loss):.3f}  {time.perf_counter() - t0:5.1f} s")
    nnx.update(model, params)
    return steps, float(loss), time.perf_counter() - t0


# ----------------------------------------------------------------- decoding

@functools.partial(jax.jit, static_argnames=("graphdef_holder", "cfg", "beam_size"))
def prefill(params, graphdef_holder, prompts, prompt_mask, *, cfg: Config, beam_size: int):
    """Runs the prompts once per row and lays the cache out for B*M beams:
    {"kv": (layers, 2, B*M, heads, T, head_dim), "prompt_mask": (B*M, P)}."""
    model = nnx.merge(graphdef_holder.graphdef, params)
    _, kv = model.forward(prompts, prompt_mask)
    kv = jnp.repeat(kv, beam_size, axis=2)                 # row b's beams at b*M .. b*M+M-1
    pad = cfg.seq_len - cfg.prompt_len
    kv = jnp.pad(kv, [(0, 0)] * 4 + [(0, pad), (0, 0)])
    return {"kv": kv, "prompt_mask": jnp.repeat(prompt_mask, beam_size, axis=0)}


@dataclasses.dataclass(frozen=True, eq=False)
class GraphDef:
    """Hashable-by-identity holder so the graphdef is a static jit argument."""
    graphdef: object

    def __hash__(self):
        return id(self)


@functools.partial(jax.jit, static_argnames=("logits_fn", "beam_size", "steps"))
def unconstrained_beam_search(params, carry, start_tokens, *, logits_fn, beam_size: int,
                              steps: int):
    """Plain beam search with lax.scan: every step takes the top beam_size of
    all M*V continuations per row (lax.top_k: ties to the lower flat index,
    i.e. lower parent beam, then lower token id). Step 0 expands beam 0 only.
    A finished beam continues only with the end token at log-prob 0, so it
    keeps its score and competes with live beams. Returns tokens (B, M, steps)
    (-1 after the end token) and scores (B, M)."""
    b, m = start_tokens.shape[0], beam_size
    scores = jnp.where(jnp.arange(m) == 0, 0.0, -jnp.inf)[None].repeat(b, 0)
    last = jnp.broadcast_to(start_tokens[:, None], (b, m)).astype(jnp.int32)
    init = (last, scores, jnp.zeros((b, m), bool), jnp.full((b, m, steps), -1, jnp.int32), carry)

    def body(state, step):
        last, scores, finished, tokens, carry = state
        logits, carry = logits_fn(params, last, step, carry)
        v = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        only_end = jnp.where(jnp.arange(v) == END, 0.0, -jnp.inf)
        logp = jnp.where(finished[..., None], only_end, logp)
        top, flat = lax.top_k((scores[..., None] + logp).reshape(b, m * v), m)
        parent, tok = flat // v, (flat % v).astype(jnp.int32)
        was_finished = jnp.take_along_axis(finished, parent, 1)
        tokens = jnp.take_along_axis(tokens, parent[..., None], 1)
        tokens = tokens.at[:, :, step].set(jnp.where(was_finished, -1, tok))
        rows = (jnp.arange(b)[:, None] * m + parent).reshape(-1)
        carry = {"kv": jnp.take(carry["kv"], rows, axis=2),
                 "prompt_mask": jnp.take(carry["prompt_mask"], rows, axis=0)}
        return (tok, top, was_finished | (tok == END), tokens, carry), None

    (_, scores, _, tokens, _), _ = lax.scan(body, init, jnp.arange(steps, dtype=jnp.int32))
    return tokens, scores


def sequence_scores(model: TinyLM, vocab: Vocab, names, queries) -> np.ndarray:
    """Brute force: (len(queries), len(names)) sums of log_softmax over the full
    vocabulary of each name's characters and end token, given each query's
    prompt, from one full-sequence forward pass (no cache)."""
    cfg = model.cfg
    out = np.zeros((len(queries), len(names)), np.float64)
    for qi, query_name in enumerate(queries):
        toks, pmask = prompt_arrays(vocab, cfg, [query_name] * len(names))
        inputs, targets, loss, _ = training_arrays(vocab, cfg, names)
        inputs[:, :cfg.prompt_len] = toks
        key_valid = np.concatenate([pmask, np.ones((len(names), cfg.seq_len - cfg.prompt_len),
                                                   bool)], axis=1)
        logits, _ = model.forward(jnp.asarray(inputs), jnp.asarray(key_valid))
        logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), np.float64)
        picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
        out[qi] = (picked * loss).sum(axis=1)
    return out


class Retriever:
    """The trained model plus everything decoding needs."""

    def __init__(self, model: TinyLM, vocab: Vocab):
        self.model, self.vocab, self.cfg = model, vocab, model.cfg
        graphdef, self.params = nnx.split(model)
        self.graphdef = GraphDef(graphdef)
        self.logits_fn = make_logits_fn(graphdef, self.cfg)   # one object: no recompiles

    def compile(self, names, attributes=None):
        return sc.compile_constraints(names, vocab_size=self.vocab.size, end_token=END,
                                      tokenizer=self.vocab.encode, attributes=attributes)

    def carry(self, queries, beam_size):
        toks, mask = prompt_arrays(self.vocab, self.cfg, queries)
        return prefill(self.params, self.graphdef, jnp.asarray(toks), jnp.asarray(mask),
                       cfg=self.cfg, beam_size=beam_size)

    def constrained(self, compiled, queries, beam_size, carry=None, prior=None):
        """sc.beam_search over `compiled`, one row per query (its prompt
        prefilled into the cache, the start token fed at step 0); prior:
        item priors (`compiled.prior`)."""
        if carry is None:
            carry = self.carry(queries, beam_size)
        result = sc.beam_search(compiled, self.logits_fn, batch_size=len(queries),
                                beam_size=beam_size, params=self.params,
                                carry=carry, carry_axes=CARRY_AXES,
                                start_token=np.full(len(queries), START, np.int32), prior=prior)
        jax.block_until_ready(result.tokens)
        return result

    def unconstrained(self, queries, beam_size, carry=None):
        if carry is None:
            carry = self.carry(queries, beam_size)
        tokens, scores = unconstrained_beam_search(
            self.params, carry, jnp.full(len(queries), START, jnp.int32),
            logits_fn=self.logits_fn, beam_size=beam_size, steps=self.cfg.max_name + 1)
        jax.block_until_ready(tokens)
        return tokens, scores

    def unconstrained_names(self, queries, beam_size):
        """Decoded strings per row, best first (None: no end token)."""
        tokens, _ = self.unconstrained(queries, beam_size)
        return [[self.vocab.decode(t) for t in row] for row in np.asarray(tokens)]


PRIOR_WEIGHTS = (1.0, 2.0, 4.0, 8.0)
"""Weights of the promotion prior (nats added to a promoted name's score)."""


def recall(predicted, targets, k):
    return float(np.mean([t in p[:k] for p, t in zip(predicted, targets)]))


def timed(fn, repeats=3):
    """(first call s, median of `repeats` further calls s)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    steady = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        steady.append(time.perf_counter() - t0)
    return first, float(np.median(steady))


# --------------------------------------------------------------------- main

def build(tiny: bool, seconds: float, log=print, seed: int = 0):
    names = catalogue()
    if tiny:
        names = names[::6]                      # ~100 names
    vocab = Vocab.of(catalogue())               # the same token ids at every size
    train_names = [n for n in names if not is_held_out(n)]
    held = [n for n in names if is_held_out(n)]
    cfg = config_for(names, **(TINY if tiny else {}))
    model = TinyLM(cfg, vocab.size, nnx.Rngs(seed))
    log(f"catalogue: {len(names)} names ({len(train_names)} trained, {len(held)} held out), "
        f"V = {vocab.size}, model: {cfg.layers} layers, d = {cfg.d_model}, "
        f"{cfg.heads} heads, cache (layers, 2, B*M, heads, T, head_dim) with T = {cfg.seq_len}")
    steps, loss, took = train(model, vocab, train_names, seconds=seconds, seed=seed, log=log)
    log(f"trained {steps} steps in {took:.1f} s, final loss {loss:.3f}")
    return Retriever(model, vocab), names, held


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true",
                    help="CI size: d=16, 1 layer, ~100 names, a few seconds of training")
    ap.add_argument("--seconds", type=float, default=None,
                    help="training budget in seconds after the first (compiling) step "
                         "(default 120; 3 with --tiny)")
    ap.add_argument("--beams", type=int, default=10)
    args = ap.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (3.0 if args.tiny else 120.0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    retriever, names, held = build(args.tiny, seconds)
    m = args.beams

    t0 = time.perf_counter()
    # a business rule's soft form: the held-out names are "promoted" (a
    # campaign's items), an attribute read as a log-prior (item priors)
    promoted = np.array([is_held_out(n) for n in names], np.float32)
    full = retriever.compile(names, attributes={"promoted": promoted})
    subset = retriever.compile(held)
    print(f"compiled {len(names)} + {len(held)} names in {time.perf_counter() - t0:.2f} s "
          f"({full.lowered.nbytes} + {subset.lowered.nbytes} bytes of tables)")

    carry = jax.block_until_ready(retriever.carry(held, m))   # prefill compiled here, not timed
    timings = {
        "unconstrained (lax.scan)": timed(lambda: retriever.unconstrained(held, m, carry)),
        "constrained: catalogue": timed(lambda: retriever.constrained(full, held, m, carry)),
    }
    free = retriever.unconstrained_names(held, m)
    in_catalogue = set(names)
    rows = [("unconstrained (lax.scan)", free)]
    for label, compiled in (("constrained: catalogue", full), ("constrained: held-out", subset)):
        rows.append((label, compiled.texts(retriever.constrained(compiled, held, m))))
    for weight in PRIOR_WEIGHTS:
        boost = full.prior("promoted", weight=weight)
        rows.append((f"catalogue, prior w={weight:g}",
                     full.texts(retriever.constrained(full, held, m, prior=boost))))

    print(f"\nheld-out queries: {len(held)}, beams: {m}")
    print(f"{'search':28s} {'R@1':>6s} {'R@' + str(m):>6s}")
    for label, predicted in rows:
        print(f"{label:28s} {recall(predicted, held, 1):6.3f} {recall(predicted, held, m):6.3f}")
    top1_bad = np.mean([p[0] not in in_catalogue for p in free])
    all_bad = np.mean([x not in in_catalogue for p in free for x in p])
    print(f"unconstrained outputs not in the catalogue: {top1_bad:.1%} of top-1, "
          f"{all_bad:.1%} of all {m} beams")

    print(f"\n{'timing (B=' + str(len(held)) + ', M=' + str(m) + ')':28s} "
          f"{'first s':>8s} {'steady ms':>10s}")
    for label, (first, steady) in timings.items():
        print(f"{label:28s} {first:8.2f} {steady * 1e3:10.1f}")
    (uf, us), (cf, cs) = timings.values()
    print(f"constrained / unconstrained: first call {cf / uf:.2f}x (target <= 1.5x), "
          f"steady call {cs / us:.2f}x (target <= 1.1x)")
    print("\nexamples (query -> top 3: unconstrained | constrained to the catalogue):")
    for i in range(min(5, len(held))):
        print(f"  {query_of(held[i])!r} ({held[i]}) -> {rows[0][1][i][:3]} | {rows[1][1][i][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
