"""The target: what lowering makes and what reads it back, numpy only (no
jax, no torch), so every backend and the serving loader share it.

- `target.plan`: the static decoding plan (`Plan`, `StepPlan`, the
  `PlanFacts` mixin) and the queries every decoder asks of it
  (`candidate_columns`, `live_beam_bounds`, `state_counts`, `slot_steps`,
  `tables_nbytes`);
- `target.tables`: the lowered tables' format, table names per layout kind,
  and the readers of a layer's rows from them (`row_pointers`,
  `exception_rows`);
- `target.lowering`: IR -> (plan, tables) (`lower`, `lower_pieces`, `plan_of`);
- `target.raising`: tables -> IR (`automaton_from_tables`, `table_head`).

Internal: no module here is a user's entry point (a compiled set's `plan` is
a `target.plan.Plan`); the library imports them by name.
"""
