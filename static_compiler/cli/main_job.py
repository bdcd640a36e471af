"""The README's main job (`static-compiler demo`, `scripts/main-job.sh`):
compile a built-in constraint set, save it, load it in a fresh process with
the serving loader only, decode with the demo model, check that every
decoded sequence is in the set, and print a short report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, TextIO

import numpy as np

from static_compiler import report, serving
from static_compiler.artifact import writer
from static_compiler.cli import demo_model
from static_compiler.compiler import compile_constraints
from static_compiler.errors import MainJobError
from static_compiler.frontend import as_token_matrix, datasets, row_keys

DEMO_SERVER = demo_model.__name__
"""The module the fresh serving process runs (`python -m`)."""


@dataclasses.dataclass(frozen=True)
class MainJobConfig:
    dataset: str = datasets.DEFAULT_DATASET
    num_items: int = datasets.DEFAULT_NUM_ITEMS
    seed: int = 0
    batch_size: int = 2
    beam_size: int = 70
    tokens_per_beam: Optional[int] = 30
    artifact_path: Optional[str] = None
    force: bool = False
    compilation_cache: bool = True  # the serving process uses jax's persistent cache
    verbose: bool = False  # the serve line lists the modules the serving process imported


def _repo_env() -> dict:
    """Environment for the child: this package importable even from a checkout."""
    env = dict(os.environ)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_child(cmd: list) -> str:
    """stdout of `cmd` run with `_repo_env()`; MainJobError if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_repo_env())
    if proc.returncode != 0:
        raise MainJobError(f"process {cmd} exited with status {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    return proc.stdout


def serving_modules() -> frozenset:
    """The static_compiler modules the fresh serving process may import:
    those that `import static_compiler.serving` loads (measured in a fresh
    interpreter, so a module the loader starts to import is allowed without a
    list to edit), plus the demo server (`DEMO_SERVER`) and its packages, and
    `compilation_cache` (jax and the standard library: it turns jax's cache on)."""
    code = ("import json, sys, static_compiler.serving; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(_run_child([sys.executable, "-c", code]).strip().splitlines()[-1])
    parts = DEMO_SERVER.split(".")
    server = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return (frozenset(demo_model.static_compiler_modules(loaded)) | server
            | {"static_compiler.jax_support.compilation_cache"})


def serve_in_fresh_process(path, out_npz, *, batch_size: int, beam_size: int,
                           seed: int = 0, compilation_cache: bool = True) -> dict:
    """Runs `python -m static_compiler.cli.demo_model` on the artifact in a
    new process and returns its JSON report (timings, imported modules).
    With `compilation_cache` the child uses jax's persistent cache (unless
    $STATIC_COMPILER_NO_CACHE), else runs with --no-compilation-cache.
    Raises MainJobError if it fails or imports a static_compiler module
    outside `serving_modules()` (the compiler, above all)."""
    cmd = [sys.executable, "-m", DEMO_SERVER, str(path), "--out", str(out_npz),
           "--batch-size", str(batch_size), "--beam-size", str(beam_size), "--seed", str(seed)]
    if not compilation_cache:
        cmd.append("--no-compilation-cache")
    info = json.loads(_run_child(cmd).strip().splitlines()[-1])
    allowed = serving_modules()
    extra = sorted(set(info["modules"]) - allowed)
    if extra:
        raise MainJobError(f"serving process imported {extra}; expected only {sorted(allowed)}")
    return info


def membership(set_sequences, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """bool (N,): whether each decoded sequence (tokens int (N, T) with
    lengths (N,)) is one of `set_sequences` (an (S, L) array or a list of
    sequences)."""
    mat, set_lengths, _ = as_token_matrix(set_sequences)
    width = max(mat.shape[1], tokens.shape[1])
    keys = row_keys(_widen(mat, width), set_lengths)
    return np.isin(row_keys(_widen(tokens, width), lengths), keys)


def _widen(tokens: np.ndarray, width: int) -> np.ndarray:
    out = np.full((tokens.shape[0], width), -1, dtype=np.int64)
    out[:, :tokens.shape[1]] = tokens
    return out


def serve_line(info: dict, verbose: bool = False) -> str:
    """The report's serve line from the serving process's JSON report
    (`serve_in_fresh_process`, which already refused any module outside
    `serving_modules()`, so the count is of serving-only modules): how many
    static_compiler modules it imported and its timings; the module names
    themselves only when `verbose` (they are ~50)."""
    modules = info["modules"]
    names = f": {modules}" if verbose else ""
    return (f"serve    fresh process ({info['backend']}): {len(modules)} serving-only modules, "
            f"no compiler module{names}; load + verify {info['load_seconds']:.3f} s, "
            f"first pass (XLA compile) {info['first_pass_seconds']:.2f} s")


def _ms(seconds: list) -> str:
    ms = [s * 1e3 for s in seconds]
    return f"median {statistics.median(ms):.3f} ms (min {min(ms):.3f}, max {max(ms):.3f})"


def _dir_bytes(path: pathlib.Path, sub: str) -> int:
    return sum(f.stat().st_size for f in (path / sub).iterdir())


def run(config: MainJobConfig, out: Optional[TextIO] = None) -> int:
    """Runs the main job and prints the report to `out`. Returns 0 when every
    decoded sequence is in the set and at least one beam is valid, else 1."""
    out = sys.stdout if out is None else out
    w = lambda line="": out.write(line + "\n")
    t0 = time.perf_counter()
    data = datasets.load_dataset(config.dataset, config.num_items, config.seed)
    gen_seconds = time.perf_counter() - t0
    w(f"dataset  {data.name}: {data.description} (generated in {gen_seconds:.2f} s)")

    t0 = time.perf_counter()
    compiled = compile_constraints(data.sequences, data.vocab_size, end_token=data.end_token,
                                   export_beam_sizes=(config.beam_size,),
                                   export_tokens_per_beam=config.tokens_per_beam)
    build_seconds = time.perf_counter() - t0
    stages = ", ".join(f"{name} {sec:.3f} s" for name, sec in compiled.build.timings)
    w(f"compile  {compiled.outline.num_sequences} unique sequences in {build_seconds:.2f} s ({stages})")
    w()
    w(report.stats_table(compiled).rstrip())
    w()

    tmp = None
    if config.artifact_path is None:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="static-demo-"))
        path = tmp / f"{data.name}.static"
    else:
        path = pathlib.Path(config.artifact_path)
    try:
        t0 = time.perf_counter()
        writer.save(compiled, path, overwrite=config.force)
        save_seconds = time.perf_counter() - t0
        total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        w(f"save     {path}: {total} bytes on disk (tables {_dir_bytes(path, 'tables')}, "
          f"modules {_dir_bytes(path, 'modules')}); export + write {save_seconds:.2f} s")

        out_npz = path.parent / f".{path.name}.decoded.npz"
        info = serve_in_fresh_process(path, out_npz, batch_size=config.batch_size,
                                      beam_size=config.beam_size, seed=config.seed,
                                      compilation_cache=config.compilation_cache)
        with np.load(out_npz) as z:
            result = serving.DecodeResult(*(z[k] for k in serving.DecodeResult._fields))
        out_npz.unlink()
        w(serve_line(info, verbose=config.verbose))
        w(f"decode   batch {config.batch_size}, beams {config.beam_size}, tokens_per_beam "
          f"{config.tokens_per_beam}, {len(info['step_seconds'])} steps")
        w(f"  constrained step (serving beam_step): {_ms(info['step_seconds'])}")
        w(f"  demo model step:                      {_ms(info['model_seconds'])}")

        B, M, T = result.tokens.shape
        valid = result.valid.reshape(-1)
        inside = membership(data.sequences, result.tokens.reshape(B * M, T),
                            result.lengths.reshape(-1))
        ok = bool(valid.any()) and bool(inside[valid].all())
        w(f"check    {int(valid.sum())}/{valid.size} beams valid; "
          f"{int(inside[valid].sum())}/{int(valid.sum())} valid beams are in the set: "
          f"{'OK' if ok else 'FAILED'}")
        w("top beams of batch row 0:")
        w(demo_model.format_top(result, row=0, top=5))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1
