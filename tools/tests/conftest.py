"""Session-wide settings of the tools' tests (as tests/conftest.py's for the
library's): the CLI and the processes the tools start read
STATIC_COMPILER_NO_CACHE, so no test writes to the user's compilation cache.

The tools run (in child processes) with XLA's CPU backend optimization level 0:
the tests assert what the tools compute, never how fast, and most of a smoke
run is XLA compiling programs it then calls a few times (level 0 compiles in
about 60 % of the CPU time; docs/benchmarks.md measured its cost per call)."""

import os

os.environ["STATIC_COMPILER_NO_CACHE"] = "1"
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
# before jax starts its CPU backend; the tools' child processes inherit it
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()
