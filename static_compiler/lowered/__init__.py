"""A set lowered for decoding: the static plan and the table format every
backend reads (the JAX decoder, the serving binary, the torch backend).
`target.lowering` makes them from the IR; `target.raising` reads them back.

- `plan`: the static decoding plan (`Plan`, `StepPlan`, the `PlanFacts`
  mixin) and the queries every decoder asks of it (`candidate_columns`,
  `live_beam_bounds`, `state_counts`, `slot_steps`, `tables_nbytes`);
- `tables`: the lowered tables' format, table names per layout kind, and
  the readers of a layer's rows from them (`row_pointers`,
  `exception_rows`).

numpy and the standard library, `errors`, `support` and the IR's types
(`ir.LayoutKind`) only: no compiler stage, no jax, no torch, so the serving
binary and a torch-only process read them. Internal: no module here is a
user's entry point (a compiled set's `plan` is a `lowered.plan.Plan`); the
library imports them by name.
"""
