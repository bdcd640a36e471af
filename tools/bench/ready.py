"""Ready time of every front door: how long a fresh process takes to its
first result, what it compiles, and whether `warm()` leaves nothing to
compile for the requests that follow.

    python -m tools.bench ready                   # 2e4 SIDs (L=4, V=256), B=2/16, M=8
    python -m tools.bench ready --quick           # tiny sizes
    python -m tools.bench ready --quick --states cold   # the smoke test: every door, once
    python -m tools.bench ready --items 1e5 --doors library,serving --out bench_out/ready.md

Front doors (each in a fresh process, `python -m tools.bench.ready --child`):

* ``library``: `sc.beam_search(compiled, logits_fn, batch_size=B,
  beam_size=M)` with a trivial model (zeros), the set from `sc.load`;
* ``serving R=r``: `serving.load`, then one whole decode (`init_beams`,
  `beam_step` at every step, `finalize`) over r = 0..4 stacked item subsets
  (`stack_subsets`), in that order in one process, so each row is what a
  new subset count adds;
* ``serving after update``: `sc.update_artifact(path, remove=...)` (a copy of
  the artifact), `reload()`, then a plain decode;
* ``mask/advance``: `compiled.processor(B)`: `mask` and `advance` at every
  step (argmax tokens);
* ``HF jax`` / ``HF torch``: `model.generate` with `StaticLogitsProcessor`
  (the backend named), a randomly initialised tiny GPT-2 from a config
  (nothing downloaded), 4 beams;
* ``CLI decode``: `python -m static_compiler.cli decode ART` (the wall time
  of the whole command, imports included).

Per door and jax persistent-cache state (``cold``: an empty cache directory,
``warm``: the same directory again, in a new process; the library, the
serving loader and the HF processor do not turn the cache on by
themselves, the bench does, with `sc.enable_compilation_cache(dir)`):
``import`` (s, jax and the door's modules), ``setup`` (s: load the set / the
model), ``first`` (s to the first result), ``xla`` (XLA compilations of the
first result: jax's compile events, `compile_events.xla_compilations()`,
less ``reads``, the executables read from the persistent cache), ``steady``
(ms: the median of repeated identical requests: a decode, a step, a generate
call, timed after the first result and after the loader's background
start-up: `sc.load` and `serving.load` import numba for the subset kernels
on a thread, which from a warm cache outlasts the first result and, holding
the GIL, slowed the requests timed beside it 2-9x; each row's JSON records
the threads alive and the compilations of the timed calls). Then, in a third fresh process without the cache, ``warm()``: the
door's `warm` (when it has one; else "no warm()") for the request mix's
shapes (batch sizes B and B2, M beams, 0-4 subsets), its seconds and
compilations, and ``mix xla``: the compilations of the request mix after it
(every batch size, subset count, an update and `reload()` for serving): 0
means no request compiles.

Writes a markdown table to --out (default bench_out/ready.md in the working
directory) and prints it; the rows' numbers go beside it as JSON (the
same name, .json). Run from the repository's checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOORS = ("library", "serving", "mask-advance", "hf-jax", "hf-torch", "cli-decode")
STATES = ("cold", "warm", "warm()")
PROMPT_LENGTH = 4
HF_BEAMS = 4
MAX_SUBSETS = 4


# -- the child: one door, one cache state, in a fresh process ----------------------------

class _Counts:
    """XLA compilations and persistent-cache reads since a `now()`
    (`static_compiler.jax_support.compile_events`: compile events less cache hits)."""

    def __init__(self):
        from static_compiler.jax_support import compile_events

        self._events = compile_events

    def now(self) -> tuple:
        return self._events.xla_compilations(), self._events.cache_hits()

    def since(self, then: tuple) -> dict:
        compiled, hits = self.now()
        return {"xla": compiled - then[0], "reads": hits - then[1]}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    _block(out)
    return out, time.perf_counter() - t0


def _block(out) -> None:
    import jax

    try:
        jax.block_until_ready(out)
    except Exception:  # torch tensors and the like are ready already
        pass


def _zeros_model(V: int):
    import jax.numpy as jnp

    def logits_fn(last_tokens, step, carry):
        return jnp.zeros(last_tokens.shape + (V,), jnp.float32), carry
    return logits_fn


def _serving_decode(art, B: int, M: int, subset=None):
    import numpy as np

    state = art.init_beams(B, M)
    logits = np.zeros((B, M, art.vocab_size), np.float32)
    kwargs = {} if subset is None else {"subset": subset, "subset_index": np.arange(B) %
                                        subset.num_subsets}
    for step in range(art.max_length):
        state = art.beam_step(state, logits, step, **kwargs)
    return art.finalize(state)


def _subsets(art, R: int, seed: int):
    import numpy as np

    from static_compiler.item_bits.liveness import stack_subsets

    if R == 0:
        return None
    rng = np.random.default_rng(seed)
    n = art.items.num_items
    return stack_subsets([art.subset(rng.random(n) < 0.5) for _ in range(R)])


def _processor_loop(compiled, B: int):
    import numpy as np

    p = compiled.processor(B)
    state = p.init_processor()
    logits = np.zeros((B, compiled.plan.vocab_size), np.float32)
    logits[:, 1] = 1.0
    out = None
    for t in range(compiled.plan.max_length):
        out = p.mask(logits, state, t)
        tokens = np.asarray(out).argmax(-1).astype(np.int32)
        state = p.advance(state, tokens, t)
    return state


def _hf(compiled_path: str, V: int, L: int, backend: str):
    import torch
    import transformers

    import static_compiler as sc
    from static_compiler.integrations.torch import StaticLogitsProcessor

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=V, n_positions=max(32, PROMPT_LENGTH + L),
                                     bos_token_id=0, eos_token_id=None, pad_token_id=0,
                                     n_embd=64, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    compiled = sc.load(compiled_path)
    processor = StaticLogitsProcessor(compiled, PROMPT_LENGTH, backend=backend)
    return model, processor, compiled


def _generate(model, processor, B: int, beams: int, L: int):
    import torch
    import transformers

    prompts = torch.arange(B * PROMPT_LENGTH).reshape(B, PROMPT_LENGTH) % 7 + 1
    with torch.no_grad():
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), num_beams=beams,
                              num_return_sequences=beams, max_new_tokens=L, do_sample=False,
                              eos_token_id=None, pad_token_id=0,
                              logits_processor=transformers.LogitsProcessorList([processor]))


def _steady(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        times.append(_timed(fn)[1])
    return 1e3 * statistics.median(times)


def _steady_after_start_up(request, repeats: int, counts: "_Counts") -> tuple:
    """(steady ms, what the steady calls ran beside): the median of
    `repeats` requests, timed once the loader's background start-up is over.
    `sc.load` / `serving.load` of a set with an item index load the subset
    kernels on a thread (`liveness.warm_kernels_in_background`: numba's
    import, which holds the GIL): from a warm persistent cache the first
    result comes before it ends, and requests timed meanwhile measured
    their GIL waits (2-9x the step). The check: the Python threads alive
    besides this one when the timing starts (none), and the compilations
    and cache reads of the timed calls (0)."""
    import threading

    from static_compiler.item_bits.liveness import wait_for_kernels

    wait_for_kernels()
    others = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
    mark = counts.now()
    steady = _steady(request, repeats)
    return steady, {"threads": others, **counts.since(mark)}


def _flags() -> dict:
    """What decides how XLA compiles and runs the programs (the same in
    every cache state): the XLA / JAX environment and jax's optimization
    and precision options."""
    import jax

    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("XLA_", "JAX_"))}
    config = {name: str(getattr(jax.config, name, None)) for name in (
        "jax_enable_x64", "jax_default_matmul_precision", "jax_platforms",
        "jax_compiler_enable_remat_pass", "jax_exec_time_optimization_effort",
        "jax_memory_fitting_effort")}
    return {"env": env, "config": config}


def _call_warm(obj, *args, **kwargs) -> dict:
    if not hasattr(obj, "warm"):
        return {"warm": "no warm()"}
    t0 = time.perf_counter()
    try:
        result = obj.warm(*args, **kwargs)
    except Exception as err:  # the verb is new: record what it said, measure the rest
        return {"warm": f"warm() failed: {type(err).__name__}: {str(err)[:120]}"}
    result = getattr(result, "result", lambda: result)() if kwargs.get("background") else result
    return {"warm": "ok", "warm_s": time.perf_counter() - t0}


def child(spec: dict) -> dict:
    """One door in this (fresh) process; `spec`: door, phase ("first" or
    "warm"), cache dir or None, sizes and paths. Returns the row's numbers."""
    t_start = time.perf_counter()
    import jax  # noqa: F401  (the import is timed: every door pays it)

    import static_compiler as sc

    if spec["cache"]:
        sc.enable_compilation_cache(spec["cache"])
    counts = _Counts()
    door, B, B2, M, repeats = spec["door"], spec["batch"], spec["batch2"], spec["beams"], \
        spec["repeats"]
    out = {}
    t0 = time.perf_counter()
    if door.startswith("hf-"):
        import torch  # noqa: F401
        import transformers  # noqa: F401
    out["import_s"] = t0 - t_start + (time.perf_counter() - t0)
    t0 = time.perf_counter()
    if door == "library" or door == "mask-advance":
        compiled = sc.load(spec["artifact"])
        V = compiled.plan.vocab_size
    elif door == "serving":
        from static_compiler import serving

        path = spec["artifact_copy"]
        art = serving.load(path)
    else:
        model, processor, compiled = _hf(spec["artifact"], spec["vocab"], spec["length"],
                                         door[3:])
    out["setup_s"] = time.perf_counter() - t0
    mark = counts.now()
    if spec["phase"] == "warm":
        return {**out, **_warm_phase(spec, locals(), counts)}
    if door == "library":
        fn = _zeros_model(V)
        request = lambda: sc.beam_search(compiled, fn, batch_size=B, beam_size=M)
    elif door == "mask-advance":
        request = lambda: _processor_loop(compiled, B)
    elif door == "serving":
        request = lambda: _serving_decode(art, B, M)
    else:
        request = lambda: _generate(model, processor, B, HF_BEAMS, spec["length"])
    out["first_s"] = _timed(request)[1]
    out.update(counts.since(mark))
    out["flags"] = _flags()
    out["steady_ms"], out["steady_check"] = _steady_after_start_up(request, repeats, counts)
    if door == "serving":
        out["steady_what"] = "decode"
        out["subsets"] = []
        for R in range(1, MAX_SUBSETS + 1):
            stack = _subsets(art, R, R)
            mark = counts.now()
            seconds = _timed(lambda: _serving_decode(art, B, M, stack))[1]
            out["subsets"].append({"R": R, "first_s": seconds, **counts.since(mark)})
        sc.update_artifact(path, remove=_removed(art))
        mark = counts.now()
        t0 = time.perf_counter()
        new = art.reload()
        _block(_serving_decode(new, B, M))
        out["update"] = {"first_s": time.perf_counter() - t0, **counts.since(mark)}
    return out


def _removed(art):
    import numpy as np

    keep = np.ones(art.items.num_items, bool)
    keep[::7] = False
    return ~keep


def _warm_phase(spec: dict, scope: dict, counts: _Counts) -> dict:
    """warm() for the mix's shapes, then the mix; the mix's compilations."""
    door, B, B2, M = spec["door"], spec["batch"], spec["batch2"], spec["beams"]
    import static_compiler as sc

    if door == "library":
        compiled = scope["compiled"]
        fn = _zeros_model(compiled.plan.vocab_size)
        out = _call_warm(compiled, [B, B2], beam_sizes=[M], logits_fn=fn)
        mark = counts.now()
        for b in (B, B2):
            _block(sc.beam_search(compiled, fn, batch_size=b, beam_size=M))
    elif door == "mask-advance":
        compiled = scope["compiled"]
        out = _call_warm(compiled, [B, B2])
        mark = counts.now()
        for b in (B, B2):
            _block(_processor_loop(compiled, b))
    elif door == "serving":
        art = scope["art"]
        out = _call_warm(art, [B, B2], beam_sizes=[M], max_subsets=MAX_SUBSETS)
        mark = counts.now()
        for version in ("before", "after"):
            for b in (B, B2):
                for R in range(MAX_SUBSETS + 1):
                    _block(_serving_decode(art, b, M, _subsets(art, R, R)))
            if version == "before":
                sc.update_artifact(spec["artifact_copy"], remove=_removed(art))
                art = art.reload()
    else:
        model, processor = scope["model"], scope["processor"]
        rows = sorted({b * beams for b in (B, B2) for beams in (1, HF_BEAMS)})  # rows per step
        out = _call_warm(processor, rows, model_vocab_size=spec["vocab"])
        mark = counts.now()
        for b in (B, B2):
            for beams in (1, HF_BEAMS):
                _generate(model, processor, b, beams, spec["length"])
    out.update({f"mix_{k}": v for k, v in counts.since(mark).items()})
    return out


# -- the parent ---------------------------------------------------------------------------

def _run_child(spec: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("STATIC_COMPILER_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "tools.bench.ready", "--child", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _build(tmp: pathlib.Path, args) -> pathlib.Path:
    """The set (synthetic SIDs), saved with subsets and capacity, in a child."""
    path = tmp / "set.static"
    code = ("import sys, static_compiler as sc\n"
            "from static_compiler.frontend import datasets\n"
            "n, L, V, M, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), "
            "int(sys.argv[4]), sys.argv[5]\n"
            "c = sc.compile_constraints(datasets.synthetic_sids(n, L, V, seed=0), V, "
            "export_beam_sizes=(M,), export_subsets=True, capacity=1.25)\n"
            "c.save(path)\n")
    subprocess.run([sys.executable, "-c", code, str(args.items), str(args.length),
                    str(args.vocab), str(args.beams), str(path)], cwd=tmp, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return path


def _cli_decode(art: pathlib.Path, cache, batch: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("STATIC_COMPILER_NO_CACHE", None)
    flags = ["--no-compilation-cache"] if cache is None else []
    if cache is not None:
        env["STATIC_COMPILER_CACHE_DIR"] = cache
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "static_compiler.cli", "decode", str(art),
                           "--batch-size", str(batch), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    found = re.search(r"beam_step median ([\d.]+) ms", proc.stdout)
    return {"first_s": wall, "steady_ms": float(found.group(1)) if found else None,
            "steady_what": "step"}


def measure(args) -> list:
    """[(door label, cache state, numbers)] for every door asked."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ready-") as tmp:
        tmp = pathlib.Path(tmp)
        art = _build(tmp, args)
        for door in args.doors:
            cache = tmp / f"cache-{door}"
            for state in args.states:
                if door == "cli-decode":
                    if state == "warm()":
                        continue
                    rows.append((door, state, _cli_decode(art, str(cache), args.batch)))
                    continue
                copy = tmp / f"copy-{door}-{len(rows)}.static"
                if door == "serving":
                    shutil.copytree(art, copy)
                spec = {"door": door, "phase": "warm" if state == "warm()" else "first",
                        "cache": None if state == "warm()" else str(cache),
                        "artifact": str(art), "artifact_copy": str(copy),
                        "batch": args.batch, "batch2": args.batch2, "beams": args.beams,
                        "repeats": args.repeats, "vocab": args.vocab, "length": args.length}
                rows.append((door, state, _run_child(spec)))
                print(f"[ready] {door} {state}: {json.dumps(rows[-1][2])}", file=sys.stderr)
    return rows


LABELS = {"library": "library `sc.beam_search`", "serving": "serving `beam_step`, R=0",
          "mask-advance": "`processor(B)` mask/advance", "hf-jax": "HF processor, jax",
          "hf-torch": "HF processor, torch", "cli-decode": "CLI `decode` (wall, imports incl.)"}


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) \
        else str(value)


def table(rows: list) -> str:
    """The markdown tables: first results per cache state, then warm()."""
    lines = ["| front door | cache | import s | setup s | first result s | xla | reads | "
             "steady ms |", "|---|---|---|---|---|---|---|---|"]
    warm = ["| front door | warm() | warm() s | mix xla after warm() |", "|---|---|---|---|"]
    for door, state, r in rows:
        if "error" in r:
            (warm if state == "warm()" else lines).append(
                f"| {LABELS[door]} | {state} | error: {r['error']} |")
            continue
        if state == "warm()":
            warm.append(f"| {LABELS[door]} | {r.get('warm')} | {_f(r.get('warm_s'))} | "
                        f"{_f(r.get('mix_xla'))} |")
            continue
        what = f" per {r['steady_what']}" if r.get("steady_what") else ""
        lines.append(f"| {LABELS[door]} | {state} | {_f(r.get('import_s'))} | "
                     f"{_f(r.get('setup_s'))} | {_f(r.get('first_s'))} | {_f(r.get('xla'))} | "
                     f"{_f(r.get('reads'))} | {_f(r.get('steady_ms'))}{what} |")
        for sub in r.get("subsets", []):
            lines.append(f"| serving `beam_step`, R={sub['R']} (new count) | {state} | | | "
                         f"{_f(sub['first_s'])} | {sub['xla']} | {sub['reads']} | |")
        if "update" in r:
            u = r["update"]
            lines.append(f"| serving after `update --remove` + `reload()` | {state} | | | "
                         f"{_f(u['first_s'])} | {u['xla']} | {u['reads']} | |")
    return "\n".join(lines) + "\n\n" + "\n".join(warm) + "\n"


def _count(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer (2e4 is fine)")
    return int(value)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        print(json.dumps(child(json.loads(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m tools.bench ready",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (300 items, L=3, V=32, B=2/3, M=4, 2 repeats)")
    parser.add_argument("--items", type=_count, default=20_000)
    parser.add_argument("--length", type=_count, default=4)
    parser.add_argument("--vocab", type=_count, default=256)
    parser.add_argument("--batch", type=_count, default=2)
    parser.add_argument("--batch2", type=_count, default=16, help="the mix's second batch size")
    parser.add_argument("--beams", type=_count, default=8)
    parser.add_argument("--repeats", type=_count, default=5)
    parser.add_argument("--doors", default=",".join(DOORS),
                        help=f"comma-separated, of {', '.join(DOORS)}")
    parser.add_argument("--states", default="cold,warm,warm()",
                        help="what to run per door, comma-separated: cold (an empty persistent "
                             "cache), warm (the cache cold left), warm() (no cache: warm() then "
                             "the request mix)")
    parser.add_argument("--out", default=os.path.join("bench_out", "ready.md"),
                        help="the markdown table (default bench_out/ready.md in the working "
                             "directory)")
    args = parser.parse_args(argv)
    if args.quick:
        args.items, args.length, args.vocab = 300, 3, 32
        args.batch, args.batch2, args.beams, args.repeats = 2, 3, 4, 2
    args.doors = [d.strip() for d in args.doors.split(",") if d.strip()]
    args.states = [s.strip() for s in args.states.split(",") if s.strip()]
    for flag, given, known in (("--doors", args.doors, DOORS), ("--states", args.states, STATES)):
        unknown = [d for d in given if d not in known]
        if unknown or not given:
            parser.error(f"{flag}: unknown {unknown}; expected some of {', '.join(known)}")
    start = time.perf_counter()
    rows = measure(args)
    text = (f"`python -m tools.bench ready {' '.join(argv)}`: {args.items} SIDs, L={args.length}, "
            f"V={args.vocab}, B={args.batch} (mix also B={args.batch2}), M={args.beams}, HF "
            f"{HF_BEAMS} beams; {time.perf_counter() - start:.0f} s\n\n" + table(rows))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        [{"door": door, "state": state, **r} for door, state, r in rows], indent=1) + "\n")
    print(text)
    print(f"[ready] wrote {out}", file=sys.stderr)
    return 1 if any("error" in r for _, _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
