"""The target: the IR lowered to a static plan and its tables, and the
tables raised back to IR (numpy only: no jax, no torch). What they make,
the plan and the table format every backend reads, is
`static_compiler.lowered`.

- `lowering`: IR -> (plan, tables) (`lower`, `lower_pieces`, `plan_of`);
- `raising`: tables -> IR (`automaton_from_tables`, `table_head`).

Internal: no module here is a user's entry point; the library imports them
by name.
"""
