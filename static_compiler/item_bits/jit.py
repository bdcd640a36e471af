"""numba, where it is installed: `njit`, `uint64` and `trailing_zeros` (of
a uint64: the index of its lowest set bit) for the host kernels
(`bit_kernels`, `bucket_scatter`), or stand-ins without it (`HAVE_NUMBA`
False: the kernels stay Python functions that their callers never call,
using numpy twins or another path instead). Importing this module loads
numba; the kernels' modules are imported on first use, never at a package
import (vLLM's worker start scans every loaded module and fails on
llvmlite's objects)."""

from __future__ import annotations

import numpy as np

try:
    from numba import njit, uint64
    from numba.cpython.unsafe.numbers import trailing_zeros  # (an intrinsic: one tzcnt)
    HAVE_NUMBA = True
except ModuleNotFoundError as err:  # the callers' numpy paths stand in
    if err.name != "numba":
        raise
    HAVE_NUMBA = False
    uint64 = np.uint64

    def njit(*args, **kwargs):  # noqa: ARG001 (numba's signature)
        """No compiler: the kernels stay Python functions (never called:
        numpy twins or another path replace them)."""
        return lambda function: function

    def trailing_zeros(word) -> int:
        """The index of the lowest set bit of `word` (a nonzero int), as
        numba's intrinsic gives it (the kernels call it on nonzero words)."""
        word = int(word)
        return (word & -word).bit_length() - 1

__all__ = ["HAVE_NUMBA", "njit", "trailing_zeros", "uint64"]
