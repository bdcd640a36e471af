"""`python -m tools.bench`: runs the benchmark suite (see `tools.bench.cli`)."""

import sys

from tools.bench.cli import main

sys.exit(main())
