"""The host kernels' compiler: numba's `njit` when numba is installed
(`AVAILABLE`), else a stand-in that leaves functions as they are (never
called then: the engines keep their tensor ops); and `clamp`, the index
clamp every kernel read shares (as a gather clamps it).

numba is optional: nothing else of ours is imported here.
"""

from __future__ import annotations

try:
    from numba import njit
    AVAILABLE = True
except ModuleNotFoundError as err:
    if err.name != "numba":
        raise
    AVAILABLE = False

    def njit(*args, **kwargs):  # noqa: ARG001 (numba's signature)
        """No compiler: the kernels stay Python functions (never called:
        `AVAILABLE` is False)."""
        return lambda function: function


@njit(nogil=True, cache=True, inline="always")
def clamp(i, n):
    """i clamped into [0, n - 1] (0 when n is 0)."""
    if i >= n:
        i = n - 1
    if i < 0:
        i = 0
    return i
