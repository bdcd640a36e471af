"""The JAX backend: lowering of the IR to a static plan plus array tables,
per-layout step kernels, and decoding entry points over them."""

from static_compiler.backend.lowering import Plan, StepPlan, lower, tables_nbytes

__all__ = ["Plan", "StepPlan", "lower", "tables_nbytes"]
