"""Compiled host loops over a set's numpy tables: the processor pair (`mask`,
`advance`) for rows held on the CPU, one loop over the rows per call instead
of tens of tensor ops (each a few microseconds of dispatch) per step.

* `processor`: the kernels (numba, optional: `AVAILABLE` is False without
  it, and engines keep their tensor ops), `HostLayer` (one step's tables as
  the kernels read them) and `warm`;
* `ranked`: the kernels' reads of a ranked subset (a set's ranges packed
  once, `HostRanges`; the range counts, a row at a time);
* `logits`: logits rows masked in place (the vLLM processor's, on a CPU);
* `jit`: numba's `njit` or its stand-in, and the shared index clamp.

numpy and numba only: an engine on the host (the torch backend's, for CPU
tensors) hands its tables and rows over as numpy views. Internal: the
library imports `processor` and `logits` by name (the torch engine, the
vLLM processor); nothing here is a user's entry point, and nothing is
imported here.
"""
