#!/usr/bin/env python3
"""Inspect a constraint set's IR: `python -m tools.show_ir INPUT [flags]`.

The same as `static-compiler show-ir INPUT [flags]` (see static_compiler/cli/show_ir.py),
run from the repository root (`python -m` puts it on the import path, so the
package need not be installed). Examples:

    python -m tools.show_ir sids.npy --vocab-size 4 --stats
    python -m tools.show_ir sids.npy --vocab-size 4 --print-ir-after-all
    python -m tools.show_ir golden/three_items/05-pack-dtypes.ir --layer 2
"""

import sys

from static_compiler.cli import main

if __name__ == "__main__":
    sys.exit(main(["show-ir", *sys.argv[1:]]))
