"""Cross-machine check of artifacts on a GPU: saved on a CPU machine, served on
a CUDA one.

    python -m tools.gpu_check prepare DIR     # here, on the CPU: artifacts + expected results
    python -m tools.gpu_check check DIR OUT   # on the GPU machine: JSON report at OUT

(`prepare --sids N --variable N --beams M` shrinks the sets; `check` reads
the sizes back from DIR/sizes.json.)

    python -m tools.gpu_check vllm OUT        # on a GPU machine with vLLM: JSON report at OUT

`vllm` runs our vLLM logits processor on CUDA: it builds the tiny random Llama
of `tools.tiny_llama`, compiles a catalogue of `synthetic_names` with its
tokenizer, starts `vllm.LLM` on it with
`static_compiler.integrations.vllm.StaticLogitsProcessor` (the runner vLLM
picks on CUDA: MRV2 where Triton is installed), and sends one batch of greedy
and sampled requests that opt in (`extra_args={"sc_set": PATH}`) beside
requests that do not; every opted-in output must be a name of the catalogue,
ended by the end token. Where vllm is not importable or CUDA is not
available it prints why it skipped and exits 0.

`prepare` compiles two sets (1e5 random Semantic IDs, L = 8, V = 2048, with an
item index; a variable-length set of 2e4 items with an end token), saves them
and records, from the serving loader on this CPU, a beam search over a
deterministic numpy model (logits = emb[last] + pos[step], float32), the same
search over a 10 % item subset, and `allowed` masks of the torch backend for
random prefixes. `check` loads the same artifacts on the GPU through the
serving loader (their lowered "cuda" modules) and through the torch backend
on "cuda", decodes the same model, and reports: every valid beam a member of
the set, tokens / validity / lengths equal to the CPU's, the largest score
difference, the subset's beams inside the subset, and the torch masks equal
bit for bit. It exits 1 when a check fails. Ties between near-equal scores
may legitimately order differently across XLA's CPU and GPU log-softmax; the
report counts beams that differ rather than hiding them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

SEED = 0
BATCH, TOKENS_PER_BEAM = 2, 30
SIZES = {"sids": 10 ** 5, "variable": 2 * 10 ** 4, "beams": 70}


def _sets(sizes: dict) -> dict:
    """name -> (int32 sequences (N, L), end_token or None, vocab_size)."""
    from static_compiler.frontend.datasets import synthetic_sids
    rng = np.random.default_rng(SEED)
    sids = synthetic_sids(sizes["sids"], length=8, vocab_size=2048, seed=SEED)
    V, end = 512, 511
    lengths = rng.integers(1, 7, sizes["variable"])
    var = rng.integers(0, end, (lengths.size, 7)).astype(np.int32)
    var[np.arange(7)[None, :] >= lengths[:, None]] = end   # end-padded, for membership
    return {"sids": (sids, None, 2048), "variable": (var, end, V)}


def _input(seqs: np.ndarray, end):
    """The compiler's input: the matrix, or its rows up to the end token."""
    from static_compiler.frontend import PaddedRows
    return seqs if end is None else PaddedRows(seqs, (seqs != end).sum(axis=1))


def _model(vocab_size: int, max_length: int):
    """(emb float32 (V, V), pos float32 (T, V)): the same arrays on any machine."""
    rng = np.random.default_rng(SEED + 1)
    emb = rng.standard_normal((vocab_size, vocab_size), dtype=np.float32)
    pos = rng.standard_normal((max_length, vocab_size), dtype=np.float32)
    return emb, pos


def _serve(art, emb, pos, beams: int, subset=None) -> dict:
    import jax
    import jax.numpy as jnp
    emb_d, pos_d = jnp.asarray(emb), jnp.asarray(pos)
    state = art.init_beams(BATCH, beams)
    for step in range(art.max_length):
        logits = emb_d[state.last_tokens] + pos_d[step]
        state = art.beam_step(state, logits, step, subset=subset)
    tokens, scores, valid, lengths = jax.device_get(art.finalize(state))
    return {"tokens": np.asarray(tokens), "scores": np.asarray(scores),
            "valid": np.asarray(valid), "lengths": np.asarray(lengths)}


def _torch_search(tc, emb, pos, device, beams: int) -> dict:
    import torch
    emb_d, pos_d = torch.as_tensor(emb, device=device), torch.as_tensor(pos, device=device)
    result = tc.beam_search(lambda last, step, carry: (emb_d[last] + pos_d[step], carry),
                            batch_size=BATCH, beam_size=beams, tokens_per_beam=TOKENS_PER_BEAM)
    return {k: getattr(result, k).cpu().numpy() for k in ("tokens", "scores", "valid", "lengths")}


def _prefixes(seqs: np.ndarray, count: int = 256) -> np.ndarray:
    """Prefixes of length 3: half from the set, half random (mostly dead)."""
    rng = np.random.default_rng(SEED + 2)
    real = seqs[rng.integers(0, len(seqs), count // 2), :3]
    fake = rng.integers(0, int(seqs.max()) + 1, (count - count // 2, 3))
    return np.concatenate([real, fake]).astype(np.int64)


def prepare(root: pathlib.Path, sizes: dict) -> None:
    import static_compiler as sc
    from static_compiler import serving
    from static_compiler.torch_backend import TorchConstraints
    root.mkdir(parents=True, exist_ok=True)
    (root / "sizes.json").write_text(json.dumps(sizes))
    beams = sizes["beams"]
    for name, (seqs, end, V) in _sets(sizes).items():
        compiled = sc.compile_constraints(_input(seqs, end), vocab_size=V, end_token=end,
                                          export_beam_sizes=(beams,), export_subsets=True,
                                          export_tokens_per_beam=TOKENS_PER_BEAM)
        path = compiled.save(root / f"{name}.static", overwrite=True)
        art = serving.load(path)
        emb, pos = _model(V, art.max_length)
        mask = np.random.default_rng(SEED + 3).random(len(seqs)) < 0.1
        full = _serve(art, emb, pos, beams)
        sub = _serve(art, emb, pos, beams, art.subset(mask))
        allowed = TorchConstraints.load(path).allowed(_prefixes(seqs)).numpy()
        np.savez_compressed(root / f"{name}.expected.npz", mask=mask, allowed=allowed,
                            **{f"full_{k}": v for k, v in full.items()},
                            **{f"subset_{k}": v for k, v in sub.items()})
        print(f"prepared {name}: {path}")


def _compare(got: dict, want: dict, prefix: str, members: set, where: str) -> dict:
    same = (got["tokens"] == want[f"{prefix}_tokens"]).all(axis=-1) \
        & (got["valid"] == want[f"{prefix}_valid"]) & (got["lengths"] == want[f"{prefix}_lengths"])
    both = got["valid"] & want[f"{prefix}_valid"]
    diff = np.abs(got["scores"] - want[f"{prefix}_scores"])[both]
    outside = [tuple(t[:n]) for t, n, v in zip(got["tokens"].reshape(-1, got["tokens"].shape[-1]),
                                                got["lengths"].ravel(), got["valid"].ravel())
               if v and tuple(t[:n]) not in members]
    return {"where": where, "beams": int(same.size), "beams_equal_cpu": int(same.sum()),
            "valid": int(got["valid"].sum()), "valid_not_in_set": len(outside),
            "max_abs_score_diff": float(diff.max()) if diff.size else 0.0}


def check(root: pathlib.Path, out: pathlib.Path) -> int:
    import jax
    import torch

    from static_compiler import serving
    from static_compiler.torch_backend import TorchConstraints
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
              "torch": torch.__version__, "torch_device": device, "sets": {}}
    ok = True
    sizes = json.loads((root / "sizes.json").read_text())
    beams = sizes["beams"]
    for name, (seqs, end, V) in _sets(sizes).items():
        want = dict(np.load(root / f"{name}.expected.npz"))
        path = root / f"{name}.static"
        t0 = time.perf_counter()
        art = serving.load(path)
        emb, pos = _model(V, art.max_length)
        strip = (lambda row: tuple(int(t) for t in row if t != end)) if end is not None else \
            (lambda row: tuple(int(t) for t in row))
        members = {strip(row) for row in seqs}
        chosen = {strip(row) for row in seqs[want["mask"]]}
        rows = [_compare(_serve(art, emb, pos, beams), want, "full", members, "serving, full set"),
                _compare(_serve(art, emb, pos, beams, art.subset(want["mask"])), want, "subset",
                         chosen, "serving, 10 % subset")]
        tc = TorchConstraints.load(path, device=device)
        allowed = tc.allowed(_prefixes(seqs)).cpu().numpy()
        rows.append(_compare(_torch_search(tc, emb, pos, device, beams), want, "full", members,
                             f"torch beam_search on {device}, full set"))
        entry = {"load_and_decode_s": round(time.perf_counter() - t0, 3), "checks": rows,
                 "torch_allowed_equal_cpu": bool((allowed == want["allowed"]).all())}
        report["sets"][name] = entry
        ok &= entry["torch_allowed_equal_cpu"] and all(
            r["valid_not_in_set"] == 0 and r["valid"] > 0 for r in rows)
    report["ok"] = bool(ok)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


def vllm_skip_reason(cpu: bool = False) -> str | None:
    """Why the vLLM CUDA path cannot run here (with `cpu`: the same check on
    vLLM's CPU engine), or None."""
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError as e:
        return f"vllm is not importable here ({e})"
    if not cpu and not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def check_vllm(out: pathlib.Path, names: int, model: pathlib.Path | None, eager: bool,
               cpu: bool = False) -> int:
    """The vLLM CUDA path (module docstring); `cpu` runs it on vLLM's CPU
    engine instead (this check's own test where no GPU is). Returns 1 on a
    non-member."""
    reason = vllm_skip_reason(cpu)
    if reason is not None:
        print(f"gpu_check vllm: skipped: {reason}; the vLLM CUDA path needs vllm with CUDA")
        return 0
    import tempfile

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    import static_compiler as sc
    from static_compiler.integrations.vllm import StaticLogitsProcessor
    from tools import tiny_llama

    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    model = tiny_llama.build(model or work / "tiny-llama")
    catalogue = tiny_llama.synthetic_names(names)
    compiled = sc.compile_constraints(catalogue, tokenizer=str(model / "tokenizer.json"),
                                      end_token=tiny_llama.EOS)
    path = str(compiled.save(work / "names.static", modules=False))   # the torch door's tables
    start = time.perf_counter()
    llm = LLM(str(model), dtype="float32", gpu_memory_utilization=0.05 if cpu else 0.3,
              max_model_len=256, enforce_eager=eager or cpu, seed=SEED,
              logits_processors=[StaticLogitsProcessor])
    engine_s = time.perf_counter() - start
    max_tokens = compiled.max_length + 1
    opted = {"sc_set": path}
    requests = [("greedy", SamplingParams(temperature=0, max_tokens=max_tokens,
                                          extra_args=opted)) for _ in range(8)]
    requests += [("sampled", SamplingParams(temperature=1.0, seed=SEED + i, max_tokens=max_tokens,
                                            extra_args=opted)) for i in range(8)]
    requests += [("untouched", SamplingParams(temperature=0, max_tokens=8)) for _ in range(4)]
    prompts = [f"Entity {i}:" for i in range(len(requests))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, [p for _, p in requests], use_tqdm=False)
    generate_s = time.perf_counter() - start
    members = set(catalogue)
    rows = []
    for (kind, _), output in zip(requests, outputs):
        done = output.outputs[0]
        rows.append({"kind": kind, "text": done.text, "finish_reason": done.finish_reason,
                     "member": done.text in members and done.finish_reason == "stop"})
    opted_rows = [r for r in rows if r["kind"] != "untouched"]
    ok = all(r["member"] for r in opted_rows)
    report = {"vllm": vllm.__version__, "torch": torch.__version__,
              "device": "cpu" if cpu else torch.cuda.get_device_name(0), "names": names,
              "engine_start_s": round(engine_s, 2), "generate_s": round(generate_s, 3),
              "opted_in": len(opted_rows), "members": sum(r["member"] for r in opted_rows),
              "untouched_that_are_names": sum(r["member"] for r in rows
                                              if r["kind"] == "untouched"),
              "rows": rows, "ok": ok}
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="save the artifacts and the CPU's results in DIR")
    prep.add_argument("dir", type=pathlib.Path)
    for key, value in SIZES.items():
        prep.add_argument(f"--{key}", type=int, default=value)
    chk = sub.add_parser("check", help="decode DIR's artifacts here, write a JSON report")
    chk.add_argument("dir", type=pathlib.Path)
    chk.add_argument("out", type=pathlib.Path)
    llm = sub.add_parser("vllm", help="our vLLM logits processor on CUDA (skips without "
                                      "vllm or CUDA), a JSON report at OUT")
    llm.add_argument("out", type=pathlib.Path)
    llm.add_argument("--names", type=int, default=10 ** 4)
    llm.add_argument("--model", type=pathlib.Path, help="the tiny model's folder (built there)")
    llm.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    llm.add_argument("--cpu", action="store_true",
                     help="run on vLLM's CPU engine instead (tests this check without a GPU)")
    args = parser.parse_args(argv)
    if args.command == "vllm":
        return check_vllm(args.out, args.names, args.model, args.eager, args.cpu)
    if args.command == "prepare":
        prepare(args.dir, {key: getattr(args, key) for key in SIZES})
        return 0
    return check(args.dir, args.out)


if __name__ == "__main__":
    sys.exit(main())
