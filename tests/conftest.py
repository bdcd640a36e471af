"""Session-wide test settings.

The CLI turns jax's persistent compilation cache on by default, in the
user's cache directory; tests run it with the cache off (the CLI and the
processes it starts read STATIC_COMPILER_NO_CACHE), so no test writes to the
user's real cache and no test process reads programs another run compiled.
tests/test_compilation_cache.py turns it on, in temporary directories.
"""

import os

os.environ["STATIC_COMPILER_NO_CACHE"] = "1"
