"""Session-wide test settings and the fixtures test files share (plain
helper functions are in helpers.py).

Hypothesis profiles: "ci" (the default) and "slow", chosen by the
HYPOTHESIS_PROFILE environment variable. Neither has a deadline (an example's
run time is never asserted). Tests whose examples each compile programs set
their own max_examples through `helpers.examples(n)`, which the slow profile
multiplies; `pytest -m slow` runs the tests marked slow (scale and long fuzz
runs), which the default `-m 'not slow'` of pyproject.toml leaves out.

The CLI turns jax's persistent compilation cache on by default, in the
user's cache directory; tests run it with the cache off (the CLI and the
processes it starts read STATIC_COMPILER_NO_CACHE), so no test writes to the
user's real cache and no test process reads programs another run compiled.
tests/jax_support/test_compilation_cache.py turns it on, in temporary directories.
"""

import importlib.util
import os

import pytest
from helpers import FAST_COMPILE_FLAG, PROFILE
from hypothesis import HealthCheck, settings

os.environ["STATIC_COMPILER_NO_CACHE"] = "1"
# before jax starts its CPU backend (no test module is imported yet); children inherit it
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()

# Without torch (the newest environment CI runs, scripts/test-newest.sh: PyPI
# has no CPU torch wheel for its Python), the modules that import torch at
# their top are not collected; tests that need it elsewhere skip.
collect_ignore = [] if importlib.util.find_spec("torch") is not None else [
    "api/test_verbs.py", "torch_backend", "integrations/test_live_processor.py",
    "integrations/test_integration_torch.py", "integrations/test_hf_warm.py"]

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("slow", deadline=None, print_blob=True, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(PROFILE)


@pytest.fixture(scope="session")
def tiny_ragged_set():
    """The set {(1,), (1, 2)}, V = 3, end token 0, compiled with the default
    pipeline, once per session: the step processors' input checks run on it."""
    import oracle

    return oracle.compile_set([(1,), (1, 2)], 3, end_token=0)
