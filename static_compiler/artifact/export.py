"""Exporting a compiled set's modules with `jax.export` (`export_modules`),
for ("cpu", "cuda", "tpu") at once and a symbolic batch dimension ``b``, and
their manifest entries (`exported_modules`; `writer.reused_modules` copies
a saved version's unchanged). Tables are arguments, never constants, so the module
bytes do not grow with the set:

============  =================================================================
init_m{M}     (start_tokens int32[b]) -> BeamState fields (b, M, ...)
beam_step_m{M}  (*tables, *BeamState fields, logits float32[b, M, V], step int32[])
              -> BeamState fields; `decode.step.beam_step_switch` with the per-step
              caps of export_tokens_per_beam (`export_caps`)
beam_resize_m{M}_to{W}
              as beam_step_m{M}, keeping W beams: a step of a beam schedule
              (`format.beam_modules` of export_beam_sizes) that changes the width
mask          (*tables, logits float32[b, V], node, valid, finished, step)
              -> masked logits float32[b, V]
advance       (*tables, node, valid, finished, tokens int32[b], step)
              -> node, valid, finished
============  =================================================================

With item subsets (export_subsets=True) each but init_m{M} also has a
``_subset`` variant taking the subsets' bits and subset_index last, and
(format version 16) a ``_ranked`` variant taking a ranked subset's arrays
last (`jax_support.ranked_arrays.ranked_leaves`: the set's range tables of
the exported shapes, the subsets' rank bits with the symbolic dimension
``r``, each batch row's subset int32[b], the depth-1 liveness bool[r, S_1]).
"""

from __future__ import annotations

import contextlib
import datetime
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from static_compiler.artifact.metadata import export_caps
from static_compiler.backend import decode
from static_compiler.backend.decode.prior import LivePrior
from static_compiler.backend.decode.processor import advance_switch, mask_switch
from static_compiler.backend.decode.step import beam_step_switch
from static_compiler.format import spec as fmt
from static_compiler.format.manifest import ArraySpec, ModuleEntry
from static_compiler.item_bits import rank
from static_compiler.jax_support import ranked_arrays
from static_compiler.lowered.plan import Plan, prior_size
from static_compiler.rules.set_view import TableTrie
from static_compiler.serving.runtime import running_versions
from static_compiler.support.decode_state import BeamState, ProcessorState


def _spec(shape, dtype, sharding=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


VARIANTS = ("plain", "subset", "ranked")
"""The module variants `export_modules` exports: the modules themselves,
their ``_subset`` and their ``_ranked`` variants (with item subsets)."""


def export_modules(compiled, variants: tuple = VARIANTS
                   ) -> dict[str, tuple[jax_export.Exported, list[str], list[str]]]:
    """Exports the modules of `compiled` (those of `variants`, of `VARIANTS`).

    Returns {name: (jax.export.Exported, argument names, result names)} in
    the order `save` writes them."""
    plan: Plan = compiled.plan
    lowered = compiled.lowered
    keys = fmt.table_keys(lowered.tables)
    num_layers = len(lowered.tables)
    n = len(keys)
    # On a mesh (`compiled.shard`) the modules are exported for it: split
    # tables (row pointers padded) along its axis, every other argument
    # replicated; jax.export records the shardings and the device count.
    where = lowered.placement
    spec = functools.partial(_spec, sharding=None if where is None else where.sharding(None))

    def table_spec(t, k):
        arr = lowered.tables[t][k]
        if where is None:
            return _spec(arr.shape, arr.dtype)
        return _spec(where.shape((t, k), arr.shape), arr.dtype, where.sharding((t, k), arr.ndim))

    table_specs = [table_spec(t, k) for t, k in keys]
    table_names = [f"table:layer{t}.{k}" for t, k in keys]
    b, r = jax_export.symbolic_shape(f"{fmt.BATCH_DIM}, {fmt.SUBSET_DIM}")
    T, V = plan.max_length, plan.vocab_size
    step_spec = spec((), jnp.int32)
    caps = export_caps(compiled)
    state_names = [f"state.{f}" for f in BeamState._fields]
    proc_names = [f"state.{f}" for f in ProcessorState._fields]
    unflatten = functools.partial(fmt.unflatten_tables, keys, num_layers)
    # name -> (function of (args, LiveMask or None), specs, argument names, result names)
    base = {}
    inits, steps = fmt.beam_modules(compiled.export_options.beam_sizes)
    for M in inits:
        def init(a, subset, M=M):  # noqa: ARG001 (every module takes the subset)
            return tuple(decode.init_beam_state(plan, a[0].shape[0], M, a[0]))

        base[fmt.beam_module_name("init", M)] = (init, [spec((b,), jnp.int32)],
                                                 ["start_tokens"], state_names)
    priors = compiled.export_options.priors
    prior_spec = spec((prior_size(plan),), jnp.float32)
    for M, W in steps:  # one step from M beams keeping W (W != M: a schedule's resize)
        state_specs = [spec((b, M, T), jnp.int32), spec((b, M), jnp.float32)] + \
            [spec((b, M), dt) for dt in (jnp.int32, bool, bool, jnp.int32, jnp.int32, jnp.int32)]

        def step_fn(a, subset, W=W):
            # with item priors, the prior's best terms come after the step
            prior = LivePrior(a[n + 10]) if len(a) > n + 10 else None
            return tuple(beam_step_switch(plan, unflatten(a[:n]), BeamState(*a[n:n + 8]),
                                          a[n + 8], a[n + 9], caps, subset, W, prior))

        specs = table_specs + state_specs + [spec((b, M, V), jnp.float32), step_spec]
        names = table_names + state_names + ["logits", "step"]
        base[fmt.step_module_name(M, W)] = (step_fn, specs, names, state_names)
        if priors:
            base[fmt.step_module_name(M, W, prior=True)] = (
                step_fn, specs + [prior_spec], names + ["prior.best"], state_names)

    proc_specs = [spec((b,), jnp.int32), spec((b,), bool), spec((b,), bool)]

    def mask_fn(a, subset):
        return (mask_switch(plan, unflatten(a[:n]), a[n], ProcessorState(*a[n + 1:n + 4]),
                            a[n + 4], subset),)

    def advance_fn(a, subset):
        return tuple(advance_switch(plan, unflatten(a[:n]), ProcessorState(*a[n:n + 3]),
                                    a[n + 3], a[n + 4], subset))

    base["mask"] = (mask_fn, table_specs + [spec((b, V), jnp.float32)] + proc_specs + [step_spec],
                    table_names + ["logits"] + proc_names + ["step"], ["masked_logits"])
    base["advance"] = (advance_fn, table_specs + proc_specs + [spec((b,), jnp.int32), step_spec],
                       table_names + proc_names + ["tokens", "step"], proc_names)

    def export(fn, specs):
        with _no_source_locations():
            return jax_export.export(jax.jit(fn), platforms=fmt.PLATFORMS)(*specs)

    modules = {name: (export(lambda *a, fn=fn: fn(a, None), specs), names, results)
               for name, (fn, specs, names, results) in base.items() if "plain" in variants}
    if compiled.export_options.subsets and "subset" in variants:
        live_w, ends_w = decode.live.subset_widths(plan)
        sub_specs = [spec((r, w), jnp.uint32) for w in live_w] + \
            [spec((r, w), jnp.uint32) for w in ends_w if w is not None] + [spec((b,), jnp.int32)]
        sub_names = [f"subset.live{d + 1}" for d in range(len(live_w))] + \
            [f"subset.ends{d}" for d, w in enumerate(ends_w) if w is not None] + ["subset_index"]
        k = len(sub_specs)

        def with_subset(fn, *a):
            it = iter(a[-k:])
            live = tuple(next(it) for _ in live_w)
            ends = tuple(None if w is None else next(it) for w in ends_w)
            return fn(a[:-k], decode.live.LiveMask(live, ends, next(it)))

        for name, (fn, specs, names, results) in base.items():
            if not name.startswith("init"):
                modules[fmt.subset_module_name(name)] = (
                    export(functools.partial(with_subset, fn), specs + sub_specs),
                    names + sub_names, results)
    if compiled.export_options.subsets and "ranked" in variants:
        ranked_specs, ranked_names, ranked_tree = ranked_arguments(compiled, spec, b, r)
        k_ranked = len(ranked_specs)

        def with_ranked(fn, *a):
            return fn(a[:-k_ranked], jax.tree_util.tree_unflatten(ranked_tree, a[-k_ranked:]))

        for name, (fn, specs, names, results) in base.items():
            if not name.startswith("init"):
                modules[fmt.ranked_module_name(name)] = (
                    export(functools.partial(with_ranked, fn), specs + ranked_specs),
                    names + ranked_names, results)
    return modules


def ranked_arguments(compiled, spec=_spec, b=None, r=None) -> tuple[list, list[str], object]:
    """(specs, names, pytree structure) of the ``_ranked`` modules' last
    arguments: the leaves of the `RankedMask` of a subset of no item (the
    set's range tables as they are, every leaf of the subsets' with ``r``
    rows, each batch row's subset int32[b]). The ranges are those of the
    trie the saved tables hold (`TableTrie`, as a loaded artifact reads
    them: a near_unary layer's exceptions), not of the compiled automaton.
    b and r: the symbolic dimensions (default: made here)."""
    if b is None:
        b, r = jax_export.symbolic_shape(f"{fmt.BATCH_DIM}, {fmt.SUBSET_DIM}")
    order = compiled._set_view.trie_order()
    empty = rank.ranked_subset(np.zeros((1, order.count), bool), order)  # (no fingerprint read)
    trie = TableTrie.of(compiled.plan, compiled.outline, compiled.lowered.tables)
    with jax.ensure_compile_time_eval():
        ranges = ranked_arrays.range_arrays(trie, order)
        mask = ranked_arrays.ranked_mask(empty, ranges, "", None, 1, "export")
    leaves, names = ranked_arrays.ranked_leaves(mask)
    per_subset = {id(leaf) for part in (mask.items, mask.added, mask.first)
                  for leaf in jax.tree_util.tree_leaves(part)}
    specs = []
    for leaf, name in zip(leaves, names):
        shape = tuple(np.shape(leaf))
        if leaf is mask.rows:
            shape = (b,)
        elif id(leaf) in per_subset and leaf.ndim:
            shape = (r,) + shape[1:]
        specs.append(spec(shape, jnp.result_type(leaf)))
    return specs, names, jax.tree_util.tree_structure(mask)


@contextlib.contextmanager
def _no_source_locations():
    """Lowers without Python source locations, so module bytes depend neither
    on the call site nor on where the package is installed (deterministic,
    and no build-machine paths end up in artifacts)."""
    keys = ("jax_traceback_in_locations_limit", "jax_include_full_tracebacks_in_locations")
    saved = [getattr(jax.config, key) for key in keys]
    jax.config.update(keys[0], 0)
    jax.config.update(keys[1], False)
    try:
        yield
    finally:
        for key, value in zip(keys, saved):
            jax.config.update(key, value)


def aval_specs(avals, names: list[str]) -> tuple[ArraySpec, ...]:
    """ArraySpecs of abstract values (symbolic dims as strings, e.g. "b")."""
    return tuple(ArraySpec(name, tuple(d if isinstance(d, int) else str(d) for d in a.shape),
                           str(a.dtype)) for name, a in zip(names, avals))


def exported_modules(compiled, caps, files: dict, variants: tuple = VARIANTS
                     ) -> tuple[dict, int, tuple]:
    """Exports `compiled`'s modules (those of `variants`) into `files`:
    (manifest entries by name, calling-convention version, (jax version,
    jaxlib version, export date): the running jax's, and today's UTC date,
    ISO)."""
    modules = {}
    cc_versions = set()
    for name, (exported, arg_names, result_names) in export_modules(compiled, variants).items():
        rel = fmt.module_file(name)
        files[rel] = bytes(exported.serialize())
        cc_versions.add(exported.calling_convention_version)
        kind, beams, beams_out = fmt.parse_beam_module_name(name)
        modules[name] = ModuleEntry(
            file=rel, kind=kind, platforms=tuple(exported.platforms),
            args=aval_specs(exported.in_avals, arg_names),
            results=aval_specs(exported.out_avals, result_names),
            beam_size=beams, beam_size_out=beams_out,
            tokens_per_beam=list(caps) if kind in fmt.STEP_KINDS else None)
    (cc,) = cc_versions
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return modules, cc, (*running_versions(), today)


def ranked_modules_anew(compiled, manifest, files: dict, caps) -> dict:
    """The ranked modules of `compiled` exported into `files` (their entries
    by name, caps `caps`) where they take other range tables than the
    saved `manifest`'s (an addition grew the trie), by the jax that exported
    its other modules; else {} (another jax's modules are kept: a ranked
    subset then names `static-compiler re-export`)."""
    from static_compiler.serving import runtime  # (its module's: a test stands in another jax)
    if (manifest.jax_version, manifest.jaxlib_version) != runtime.running_versions():
        return {}
    specs, names, _ = ranked_arguments(compiled)
    took = [(a.name, a.shape, a.dtype) for a in manifest.modules["mask_ranked"].args
            if a.name.startswith("ranked")]
    if took == [(a.name, a.shape, a.dtype) for a in aval_specs(specs, names)]:
        return {}
    for name, entry in manifest.modules.items():  # (linked by the caller: replaced)
        if fmt.is_ranked_module(name):
            files.pop(entry.file, None)
    return exported_modules(compiled, caps, files, variants=("ranked",))[0]
