"""Compiled host loops over a set's numpy tables: the processor pair (`mask`,
`advance`) for rows held on the CPU, one loop over the rows per call instead
of tens of tensor ops (each a few microseconds of dispatch) per step.

* `processor`: the kernels (numba, optional: `AVAILABLE` is False without
  it, and engines keep their tensor ops), `HostLayer` (one step's tables as
  the kernels read them) and `warm`.

numpy and numba only: an engine on the host (the torch backend's, for CPU
tensors) hands its tables and rows over as numpy views.
"""

from static_compiler.host_kernels.processor import AVAILABLE, HostLayer, HostSubset, warm

__all__ = ["AVAILABLE", "HostLayer", "HostSubset", "warm"]
