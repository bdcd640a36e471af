"""Benchmark suite: STATIC (this library) against the paper's baselines.

Every method decodes with the same model (`baselines.TableModel`, a table
lookup, so constraint handling is what differs) at the paper's configuration:
batch 2, beams 70, tokens per beam 30, L = 8. Methods:

* ``static``: the library's own beam search (`static_compiler.beam_search`:
  sparse candidates from the compiled tables, no (B, M, V) mask);
* ``static_mask``: the library's logits-processor pair (`mask` / `advance`)
  in the baselines' harness: a dense mask, as the paper measures STATIC;
* ``unconstrained``, ``host_trie``, ``exact_bsearch``, ``approx_bsearch``,
  ``hash_bitmap``: see `tools.bench.baselines`; all run by the same masked beam
  search as ``static_mask``.

Per cell (constraint set) and method:

* ``step_ms``: one decoding step (model + constraint + beam update), each
  step t jitted on its own and timed with block_until_ready on the real state
  of a decode at t; a repeat times all L steps and takes their mean; reported
  as the median and the 25th / 75th percentiles over repeats (after warm-up).
  Repeats interleave the methods, so machine load hits them alike.
* ``added_ms``: step_ms minus the unconstrained step_ms of the same repeat
  (the paper's "added latency per step"); negative means faster.
* ``step_ms_by_t``: the median of each step t (the per-step breakdown).
* ``kernel_ms``: the constraint lookup alone per step, on the same states:
  for static the layout kernels giving each live beam's candidate tokens,
  next states and validity (`backend.kernels.expand`); for the baselines the
  allowed tokens (`allowed`). The L steps' lookups run as one program,
  divided by L, so per-call dispatch does not swamp microsecond kernels; each
  repeat is the mean of KERNEL_CALLS calls.
* ``decode_ms``: the whole jitted decode (L steps).
* index bytes (and the paper's bound U_max for static), build seconds and
  the build's peak RSS above its input (static: measured in a child process).
* ``sweep_step_ms`` / ``sweep_decode_ms`` / ``sweep_kernel_ms`` (static and
  unconstrained): the same, re-timed with the repeats interleaved over all
  cells of the sweep, so that ratios across cells (flat in |C|, in V, skew)
  compare measurements taken under the same machine load.

Sweeps: ``items`` (|C| at V = 2048), ``vocab`` (V at |C| = 1e6), ``skew``
(Zipf tokens vs uniform, same size), ``branch`` (V = B at |C| = 1e6).

    python -m tools.bench --quick            # ~70 s on 2 idle cores
    python -m tools.bench                    # the full suite
    python -m tools.bench --large            # adds |C| = 1e8 (static + unconstrained)
    python -m tools.bench --gpu              # on a GPU: |C| = 2e7 vs the paper's 0.033 ms/step
    python -m tools.bench --sweeps items --items 1e5 1e7 --out bench_out/items
    python -m tools.bench compile-time       # compile_constraints per stage vs the baseline
    python -m tools.bench ready              # ready time per front door: first result, cache, warm()
    python -m tools.bench rules              # business rules: subset(where=...) at 1e7 items
    python -m tools.bench vllm               # in vLLM: our processor vs its choice backends

Writes ``results.md`` (tables, machine, targets met / missed), ``results.csv``
and, when matplotlib is installed, ``<sweep>.png`` into --out (default: bench_out/
in the working directory).
``--check`` instead checks the baselines against the library (exact ones
decode what `static_compiler.beam_search` decodes, the bitmap's
false-positive estimate equals a brute-force count) and exits 1 on a
mismatch; ``--dry-run`` prints the cells a run would measure.

Run from the repository root. Modules: `cli` (options), `config` (methods,
sweeps, constraint sets), `baselines` (the baseline methods and their beam
search), `runners` (a runner per method), `timing`, `cells` (the decode
timing cells), `build` (build time and memory, in child processes; also the
build benchmark at scale, ``python -m tools.bench.build``), `targets`,
`output` (results.csv / results.md / plots), `check` (the --check mode).
"""
