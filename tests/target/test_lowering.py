"""The lowered decoding programs run on an accelerator alone.

Every entry point (beam_search, beam_step, greedy, sample, mask, advance,
and the traced-step switch variants) is exported with jax.export for cpu,
cuda and tpu together, and its StableHLO must hold no custom_call, host
callback or host transfer (a TPU serving binary could not run them, or
would round-trip to the host every step). A model with a host callback
is caught by the same check, so the check can fail.

The constraint tables must be arguments of the lowered step, not constants:
two sets with the same plan but different tokens lower to identical text,
and the tables' shapes appear among main's arguments.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest

from static_compiler.backend import decode

FORBIDDEN = re.compile(r"custom_call|callback|\bhost\b|infeed|outfeed|stablehlo\.send|"
                       r"stablehlo\.recv", re.IGNORECASE)
PLATFORMS = ("cpu", "cuda", "tpu")
B, M, V = 2, 3, 6
ITEMS = [(1,), (1, 2, 3), (2, 4, 4), (3, 1, 2), (3, 2, 5)]  # layer 2 unary; (1,) accepts
OTHER = [(2,), (2, 1, 4), (3, 5, 5), (4, 2, 1), (4, 3, 1)]  # the same trie shape
MODEL = oracle.HashModel(V)
MLIR_TYPES = {"bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "uint8": "ui8",
              "uint16": "ui16", "uint32": "ui32"}


def forbidden_ops(text: str) -> list:
    """Forbidden words in the program's operations (source locations, which
    name Python functions, are dropped first)."""
    ops = "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
    ops = re.sub(r'\bloc\((?:[^()"]|"[^"]*"|\([^()]*\))*\)', "", ops)
    return sorted({m.group(0).lower() for m in FORBIDDEN.finditer(ops)})


@functools.lru_cache(maxsize=None)
def compiled(layout: str, which: str = "items"):
    return oracle.compile_set(ITEMS if which == "items" else OTHER, V, layout, end_token=0)


def entry_points(plan, step: int = 1):
    """name -> (function of (tables, *args), args): every decoding entry point
    (`beam_step`, `mask`, `advance` at the static `step`, and as "... (traced
    step)" given `step` traced: the switch path)."""
    state = decode.init_beam_state(plan, B, M)
    logits = jnp.zeros((B, M, V), jnp.float32)
    pstate = decode.init_processor_state(B)
    plogits = jnp.zeros((B, V), jnp.float32)
    tokens = jnp.zeros((B,), jnp.int32)
    carry = MODEL.init_carry([1, 2], M)
    return {
        "beam_search": (lambda t, c: decode.beam_search(plan, t, MODEL, batch_size=B, beam_size=M,
                                                        tokens_per_beam=2, carry=c,
                                                        carry_axes=MODEL.carry_axes), (carry,)),
        "greedy_decode": (lambda t, c: decode.greedy_decode(plan, t, MODEL, batch_size=B, carry=c),
                          (MODEL.init_carry([1, 2], 1),)),
        "sample": (lambda t, k, c: decode.sample(plan, t, MODEL, k, batch_size=B, top_k=2,
                                                 carry=c),
                   (jax.random.PRNGKey(0), MODEL.init_carry([1, 2], 1))),
        "beam_step": (lambda t, s, x: decode.beam_step(plan, t, s, x, step, 2), (state, logits)),
        "beam_step (traced step)": (lambda t, s, x, i: decode.beam_step(plan, t, s, x, i),
                                    (state, logits, jnp.int32(step))),
        "mask": (lambda t, x, s: decode.mask(plan, t, x, s, step), (plogits, pstate)),
        "advance": (lambda t, s, k: decode.advance(plan, t, s, k, step), (pstate, tokens)),
        "mask (traced step)": (lambda t, x, s, i: decode.mask(plan, t, x, s, i),
                               (plogits, pstate, jnp.int32(step))),
        "advance (traced step)": (lambda t, s, k, i: decode.advance(plan, t, s, k, i),
                                  (pstate, tokens, jnp.int32(step))),
    }


def exported_text(fn, tables, args) -> str:
    exp = jax.export.export(jax.jit(fn), platforms=PLATFORMS)(tables, *args)
    return exp.mlir_module()


SWITCHES = ("beam_step (traced step)", "mask (traced step)",
            "advance (traced step)")  # the switch path: every step's kernel


@pytest.mark.parametrize("layout, names", [
    ("default", ("beam_search", "greedy_decode", "sample", "beam_step", "mask", "advance")),
    *[(layout, SWITCHES) for layout in ("dense_rows", "csr", "near_unary", "unary")]])
def test_exported_programs_stay_on_the_device(layout, names):
    c = compiled(layout)
    for name in names:
        fn, args = entry_points(c.plan)[name]
        text = exported_text(fn, c.lowered.tables, args)
        assert "func.func public @main" in text, name
        assert forbidden_ops(text) == [], f"{name} ({layout}) lowers to {forbidden_ops(text)}"


def test_a_host_callback_model_is_detected():
    """The check above is not vacuous: a model calling back to the host is caught."""
    c = compiled("csr")

    def host_logits(last_tokens, step, carry):
        shape = jax.ShapeDtypeStruct(last_tokens.shape + (V,), jnp.float32)
        return jax.pure_callback(lambda x: np.zeros(x.shape + (V,), np.float32), shape,
                                 last_tokens), carry

    fn = jax.jit(lambda t: decode.beam_search(c.plan, t, host_logits, batch_size=B, beam_size=M))
    text = fn.lower(c.lowered.tables).as_text()  # cpu only: jax.export cannot lower callbacks for tpu
    assert "custom_call" in forbidden_ops(text)
    assert forbidden_ops("#loc1 = loc(\"host_callback_custom_call\")\n%0 = stablehlo.add %a, %b "
                         "loc(\"callback\"(#loc1))") == []


STEP_FUNCTIONS = ("beam_step", "mask", "advance", *SWITCHES)


@pytest.mark.parametrize("layout", ["dense_rows", "csr", "near_unary", "unary"])
def test_tables_are_arguments_not_constants(layout):
    a, b = compiled(layout, "items"), compiled(layout, "other")
    assert a.plan == b.plan, "the two sets must share a plan for this test"
    assert any(not np.array_equal(x, y) for la, lb in zip(a.lowered.tables, b.lowered.tables)
               for x, y in zip(la.values(), lb.values()))
    step = [s.kind for s in a.plan.steps].index(layout)  # a layer with this layout
    for name in STEP_FUNCTIONS:
        fn, args = entry_points(a.plan, step)[name]
        text_a = jax.jit(fn).lower(a.lowered.tables, *args).as_text()
        text_b = jax.jit(fn).lower(b.lowered.tables, *args).as_text()
        assert text_a == text_b, f"{name} ({layout}) bakes table contents into the program"
        main_args = re.search(r"func\.func public @main\(([^)]*)\)", text_a).group(1)
        for key, table in a.lowered.tables[step].items():
            mlir = f"tensor<{'x'.join(map(str, table.shape))}x{MLIR_TYPES[table.dtype.name]}>"
            assert mlir in main_args, f"{name} ({layout}): table {key} {mlir} not in {main_args}"
