"""Session-wide settings of the tools' tests (as tests/conftest.py's for the
library's): the CLI and the processes the tools start read
STATIC_COMPILER_NO_CACHE, so no test writes to the user's compilation cache."""

import os

os.environ["STATIC_COMPILER_NO_CACHE"] = "1"
