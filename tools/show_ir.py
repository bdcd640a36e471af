#!/usr/bin/env python3
"""Inspect a constraint set's IR: `python tools/show_ir.py INPUT [flags]`.

The same as `static-compiler show-ir INPUT [flags]` (see static_compiler/cli/show_ir.py),
runnable from a checkout without installing the package. Examples:

    python tools/show_ir.py sids.npy --vocab-size 4 --stats
    python tools/show_ir.py sids.npy --vocab-size 4 --print-ir-after-all
    python tools/show_ir.py golden/three_items/4-pack-dtypes.ir --layer 2
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from static_compiler.cli import main  # noqa: E402  (after the sys.path fix)

if __name__ == "__main__":
    sys.exit(main(["show-ir", *sys.argv[1:]]))
