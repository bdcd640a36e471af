"""`python -m static_compiler.cli COMMAND ...`: the same as `static-compiler`."""

import sys

from static_compiler.cli import main

sys.exit(main())
