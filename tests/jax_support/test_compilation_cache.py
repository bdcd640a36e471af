"""`sc.enable_compilation_cache`: jax's persistent compilation cache on in
one call, and the CLI's default use of it.

Everything that turns the cache on runs in a subprocess with a temporary
cache directory (XDG_CACHE_HOME / STATIC_COMPILER_CACHE_DIR / a path), so no
test writes to the user's real cache and this process's jax keeps its
configuration (tests/conftest.py sets STATIC_COMPILER_NO_CACHE=1 for the
rest of the suite; these tests drop it where they want the cache on).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO as ROOT

from static_compiler.errors import CompilationCacheError, StaticCompilerError
from static_compiler.jax_support import compilation_cache as cc


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in (cc.NO_CACHE_ENV, cc.CACHE_DIR_ENV, "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _python(code: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(path: pathlib.Path) -> list:
    return [p for p in path.iterdir() if not p.name.startswith(".")] if path.is_dir() else []


def test_enable_twice_is_idempotent_and_creates_the_default_directory(tmp_path):
    out = _python(
        "import json, jax, static_compiler as sc\n"
        "a = sc.enable_compilation_cache()\n"
        "b = sc.enable_compilation_cache()\n"
        "print(json.dumps({'a': a, 'b': b, 'dir': jax.config.jax_compilation_cache_dir,\n"
        "                  'min': jax.config.jax_persistent_cache_min_compile_time_secs,\n"
        "                  'version': jax.__version__}))",
        XDG_CACHE_HOME=tmp_path / "xdg")
    want = tmp_path / "xdg" / "static-compiler" / f"jax-{out['version']}"
    assert out["a"] == out["b"] == out["dir"] == str(want)
    assert want.is_dir() and out["min"] == 0.0


@pytest.mark.parametrize("kind", ["under a file", "a file", "read-only missing", "negative"])
def test_an_unusable_path_is_a_typed_error_naming_it(tmp_path, kind):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    path, kwargs = {"under a file": (blocker / "cache", {}), "a file": (blocker, {}),
                    "read-only missing": (tmp_path / "missing", {"read_only": True}),
                    "negative": (tmp_path / "c", {"min_compile_time_secs": -1.0})}[kind]
    with pytest.raises(CompilationCacheError) as err:  # raised before jax is configured
        cc.enable_compilation_cache(path, **kwargs)
    assert isinstance(err.value, (StaticCompilerError, OSError))
    assert (str(path) in str(err.value)) or "min_compile_time_secs" in str(err.value)


class _BytesPath:
    """An os.PathLike whose path is bytes."""

    def __init__(self, path: bytes):
        self.path = path

    def __fspath__(self):
        return self.path


@pytest.mark.parametrize("name, value", [
    ("path", 5), ("path", b"/tmp/static-cache"), ("path", "bytes-pathlike"), ("path", ""),
    ("path", 1.5), ("min_compile_time_secs", float("nan")), ("min_compile_time_secs", True),
    ("min_compile_time_secs", float("inf")), ("min_compile_time_secs", "1"),
    ("min_compile_time_secs", -0.5), ("min_compile_time_secs", None),
    ("read_only", "no"), ("read_only", 1), ("read_only", None)])
def test_a_bad_argument_is_a_typed_error_naming_it(tmp_path, name, value):
    """Every argument of the wrong type or range: CompilationCacheError
    naming the parameter, the value and what was expected, before jax is
    configured or a directory created."""
    import jax

    if value == "bytes-pathlike":
        value = _BytesPath(bytes(tmp_path / "c"))
    kwargs = {"path": tmp_path / "c", name: value}
    before = jax.config.jax_compilation_cache_dir
    with pytest.raises(CompilationCacheError) as err:
        cc.enable_compilation_cache(kwargs.pop("path"), **kwargs)
    message = str(err.value)
    assert f"{name}={value!r}: expected" in message, message
    assert "enable_compilation_cache" in message
    assert jax.config.jax_compilation_cache_dir == before
    assert not (tmp_path / "c").exists() and not pathlib.Path("/tmp/static-cache").exists()


COMPILE_ONE = """
import json, sys, jax, jax.numpy as jnp
import static_compiler as sc
from static_compiler.jax_support import compile_events
sc.enable_compilation_cache(sys.argv[1])
jax.block_until_ready(jax.jit(lambda x: jnp.cumsum(x * 3) + 1)(jnp.arange(7)))
print(json.dumps({"compiled": compile_events.xla_compilations(),
                  "hits": compile_events.cache_hits()}))
"""


def test_a_second_process_reads_the_program_from_the_cache(tmp_path):
    """The second process compiles nothing: every program is a cache read,
    which compile_events does not count as a compilation."""
    cache = tmp_path / "cache"
    run = lambda: json.loads(subprocess.run(
        [sys.executable, "-c", COMPILE_ONE, str(cache)], cwd=ROOT, env=_env(), check=True,
        capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1])
    first = run()
    assert first["hits"] == 0 and first["compiled"] >= 1
    assert _entries(cache), "the first process wrote nothing to the cache"
    second = run()
    assert second["hits"] >= 1 and second["compiled"] == 0, second


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    import static_compiler as sc

    path = tmp_path_factory.mktemp("art") / "s.static"
    rows = np.random.default_rng(0).integers(0, 8, size=(20, 3))
    sc.compile_constraints(rows, 8, export_beam_sizes=(4,)).save(path)  # no XLA compile
    return path


def _decode(artifact, *flags, **env):
    return subprocess.run([sys.executable, "-m", "static_compiler.cli", "decode", str(artifact),
                           "--top", "1", *flags], cwd=ROOT, env=_env(**env), capture_output=True,
                          text=True, timeout=120)


def test_cli_decode_uses_the_cache_by_default_and_the_flag_and_env_turn_it_off(tmp_path,
                                                                              artifact):
    cache = tmp_path / "cache"
    off = _decode(artifact, "--no-compilation-cache", STATIC_COMPILER_CACHE_DIR=cache)
    assert off.returncode == 0, off.stderr
    assert not cache.exists()
    off = _decode(artifact, STATIC_COMPILER_CACHE_DIR=cache, STATIC_COMPILER_NO_CACHE=1)
    assert off.returncode == 0, off.stderr
    assert not cache.exists()
    on = _decode(artifact, STATIC_COMPILER_CACHE_DIR=cache)
    assert on.returncode == 0, on.stderr
    assert _entries(cache)
    assert on.stdout.split("\n")[-3:] and "tokens" in on.stdout


def test_cli_runs_without_the_cache_when_its_directory_is_unusable(tmp_path, artifact):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = _decode(artifact, STATIC_COMPILER_CACHE_DIR=blocker / "cache")
    assert run.returncode == 0, run.stderr
    assert "warning: running without the compilation cache" in run.stderr
    assert str(blocker / "cache") in run.stderr


def test_help_says_where_the_cache_lives(tmp_path):
    run = subprocess.run([sys.executable, "-m", "static_compiler.cli", "decode", "--help"],
                         cwd=ROOT, env=_env(XDG_CACHE_HOME=tmp_path, COLUMNS=1000),
                         capture_output=True, text=True, timeout=60)
    assert "--no-compilation-cache" in run.stdout and "STATIC_COMPILER_NO_CACHE" in run.stdout
    assert str(tmp_path / "static-compiler" / "jax-") in run.stdout
    assert not tmp_path.joinpath("static-compiler").exists()  # --help creates nothing


def test_main_job_passes_the_choice_to_its_serving_process(monkeypatch):
    from static_compiler.cli import main_job

    assert "static_compiler.jax_support.compilation_cache" in main_job.serving_modules()
    seen = []
    monkeypatch.setattr(main_job, "serving_modules", lambda: frozenset())
    monkeypatch.setattr(main_job, "_run_child", lambda cmd: seen.append(cmd) or '{"modules": []}')
    for on in (True, False):
        main_job.serve_in_fresh_process("a", "o.npz", batch_size=1, beam_size=1,
                                        compilation_cache=on)
    assert ["--no-compilation-cache" in cmd for cmd in seen] == [False, True]
