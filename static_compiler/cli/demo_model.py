"""A small deterministic JAX "model" and a decoding loop over a loaded artifact,
for `static-compiler decode` and the main job (`static-compiler demo`).

Like `serving`, this module imports only jax, numpy, the standard library,
`static_compiler.serving` and `static_compiler.jax_support.compilation_cache`
(and, as its package, `static_compiler.cli`, whose `__init__` imports
nothing), so `python -m static_compiler.cli.demo_model ART`
proves a process can serve an artifact without the compiler.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from static_compiler import serving
from static_compiler.item_bits.liveness import wait_for_kernels

DEMO_SEED = 0


class DemoModel(NamedTuple):
    """Parameters of a toy next-token model: logits = tanh((emb[last] +
    pos[step]) @ hidden) @ out. Shapes: emb (V, D), pos (T, D), hidden (D, H),
    out (H, V), all float32."""

    emb: jax.Array
    pos: jax.Array
    hidden: jax.Array
    out: jax.Array


def demo_model(vocab_size: int, max_length: int, seed: int = DEMO_SEED, width: int = 64,
               hidden: int = 128) -> DemoModel:
    """Deterministic random parameters (same seed, same model on any machine
    with the same numpy version), drawn with numpy on the host: drawing them
    with jax.random ran (and compiled) eleven programs, a second of a small
    `decode`'s first call."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    scale = np.float32(4.0 / np.sqrt(hidden))
    return DemoModel(emb=jnp.asarray(normal(vocab_size, width)),
                     pos=jnp.asarray(normal(max_length, width)),
                     hidden=jnp.asarray(normal(width, hidden) / np.float32(np.sqrt(width))),
                     out=jnp.asarray(normal(hidden, vocab_size) * scale))


@jax.jit
def demo_logits(model: DemoModel, last_tokens, step):
    """last_tokens int32 (B, M), step int32 scalar -> logits float32 (B, M, V)."""
    x = model.emb[jnp.clip(last_tokens, 0, model.emb.shape[0] - 1)] + model.pos[step]
    return jnp.tanh(x @ model.hidden) @ model.out


class DecodeRun(NamedTuple):
    """Output of `decode_artifact`: the final Result (numpy arrays) and
    per-step wall times in seconds of the constrained step (beam_step) and of
    the model, measured after a warm-up pass."""

    result: serving.DecodeResult
    step_seconds: list
    model_seconds: list
    first_pass_seconds: float


def decode_artifact(art: serving.Artifact, *, batch_size: int, beam_size,
                    seed: int = DEMO_SEED, subset=None, prior=None) -> DecodeRun:
    """Beam search with the demo model through `art` (over `subset`, an
    `Artifact.subset`, when given), batch row i starting from token i (mod
    V), so rows differ; beam_size an int or one of the artifact's beam
    schedules (one width per step); prior: item priors (`Artifact.prior`). The first pass compiles (timed as
    first_pass_seconds); the second, once the loader's background kernel
    loading is over, is timed per step."""
    model = demo_model(art.vocab_size, art.max_length, seed)
    start_token = np.arange(batch_size) % art.vocab_size
    widths = art._check_schedule(beam_size)

    def one_pass():
        steps, models = [], []
        state = art.init_beams(batch_size, widths[0], start_token)
        for step in range(art.max_length):
            t0 = time.perf_counter()
            logits = demo_logits(model, state.last_tokens, step).block_until_ready()
            t1 = time.perf_counter()
            state = art.beam_step(state, logits, step, beam_size=widths[step + 1], prior=prior,
                                  **({} if subset is None else {"subset": subset}))
            jax.block_until_ready(state)
            t2 = time.perf_counter()
            models.append(t1 - t0)
            steps.append(t2 - t1)
        return art.finalize(state), steps, models

    t0 = time.perf_counter()
    one_pass()
    first = time.perf_counter() - t0
    wait_for_kernels()  # (the loader's numba import holds the GIL: not part of a step)
    result, steps, models = one_pass()
    return DecodeRun(serving.DecodeResult(*(np.asarray(x) for x in result)), steps, models, first)


def format_top(result: serving.DecodeResult, row: int = 0, top: int = 5) -> str:
    """The `top` best valid beams of batch row `row`, one per line:
    rank, score, tokens (without padding)."""
    lines = []
    for m in range(result.tokens.shape[1]):
        if len(lines) == top:
            break
        if not result.valid[row, m]:
            continue
        toks = [int(t) for t in result.tokens[row, m] if t >= 0]
        lines.append(f"  #{m:<3d} score {float(result.scores[row, m]):10.4f}  tokens {toks}")
    return "\n".join(lines) if lines else "  (no valid beam)"


def static_compiler_modules(names) -> list:
    """The names among `names` (e.g. sys.modules) of this package's modules, sorted."""
    return sorted(m for m in names if m == "static_compiler" or m.startswith("static_compiler."))


def serve_main(argv: Optional[list] = None) -> int:
    """`python -m static_compiler.cli.demo_model ART --out RESULT.npz ...`: loads ART
    with the serving loader, decodes with the demo model, writes the result
    arrays to RESULT.npz and a JSON line of timings (and the static_compiler
    modules this process imported) to stdout."""
    parser = argparse.ArgumentParser(prog="python -m static_compiler.cli.demo_model")
    parser.add_argument("artifact")
    parser.add_argument("--out", required=True, help="write the decoded arrays here (.npz)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=70)
    parser.add_argument("--seed", type=int, default=DEMO_SEED)
    parser.add_argument("--no-compilation-cache", action="store_true",
                        help="leave jax's persistent compilation cache off (also "
                             "STATIC_COMPILER_NO_CACHE=1)")
    args = parser.parse_args(argv)
    from static_compiler.jax_support import compilation_cache

    if not args.no_compilation_cache and not compilation_cache.disabled_by_environment():
        compilation_cache.enable_compilation_cache()
    t0 = time.perf_counter()
    art = serving.load(args.artifact)
    load_seconds = time.perf_counter() - t0
    run = decode_artifact(art, batch_size=args.batch_size, beam_size=args.beam_size,
                          seed=args.seed)
    np.savez(args.out, **run.result._asdict())
    print(json.dumps({"load_seconds": load_seconds, "first_pass_seconds": run.first_pass_seconds,
                      "step_seconds": run.step_seconds, "model_seconds": run.model_seconds,
                      "modules": static_compiler_modules(sys.modules),
                      "backend": jax.default_backend(),
                      "devices": [str(d) for d in jax.devices()]}))
    return 0


if __name__ == "__main__":
    sys.exit(serve_main())
