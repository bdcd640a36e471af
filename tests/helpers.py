"""Plain functions and constants the test files share (import them: `from helpers import
run_cli`); the shared fixtures and the hypothesis profiles are in
conftest.py, the brute-force reference in oracle.py, the IR strategies in
ir_strategies.py.

- REPO / DATA: the checkout's root and tests/data (for files that move into
  folders of tests/).
- run_cli / one_error_line: the `static-compiler` CLI run in-process, and the
  single error line a bad input must give.
- packed_words: bools as the little-endian uint64 words the live kernels read.
- examples: a hypothesis example count scaled by the loaded profile.
- assert_matches / decode_and_check: a decoder's result against the
  brute-force oracle's (tokens, valid, lengths exact; scores to 1e-5).
- right_languages: each state's accepted suffixes, by brute force.
"""

from __future__ import annotations

import functools
import os
import pathlib

import numpy as np
import oracle

# The repository's checkout and the tests' frozen data, wherever a test file lives.
REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
"""XLA's CPU backend at optimization level 0, which conftest.py adds to
XLA_FLAGS for the suite and every process it starts: the tests check what
programs compute, never how fast, and level 0 compiles in about 60 % of the
CPU time (`python -m tools.bench --check`: 43.9 s -> 25.7 s of CPU, same
results). The programs are the same StableHLO; benchmarks, the main job and
users compile at XLA's default level."""

# The hypothesis profile conftest.py loads: "ci" (the default) or "slow".
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
# Hypothesis examples per test, relative to the count a test asks for, per profile.
EXAMPLE_SCALE = {"ci": 1.0, "slow": 10.0}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `static-compiler ARGV` run in this
    process (arguments are str()-ed: paths and numbers pass as they are)."""
    from static_compiler.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The one line a CLI error prints on stderr (no traceback, nothing else)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def packed_words(bits: np.ndarray, lead: int = 0) -> np.ndarray:
    """uint64 (ceil((lead + n) / 64) + 1,): `lead` zero bits, then the bools
    `bits` (n,), little-endian bit order, plus one spare zero word."""
    padded = np.zeros(64 * (-(-(lead + bits.size) // 64) + 1), bool)
    padded[lead:lead + bits.size] = bits
    return np.packbits(padded, bitorder="little").view("<u8").copy()


def examples(n: int) -> int:
    """`n` hypothesis examples in the CI profile, EXAMPLE_SCALE times as many in
    the slow one: for tests whose examples each compile programs (seconds),
    which therefore set max_examples themselves (a profile's max_examples
    does not override a test's)."""
    return max(1, round(n * EXAMPLE_SCALE.get(PROFILE, 1.0)))


def assert_matches(got, want: oracle.Result, context: str = ""):
    """Decoder result == oracle result (tokens, valid, lengths exact; scores 1e-5)."""
    tokens, scores = np.asarray(got.tokens), np.asarray(got.scores)
    valid, lengths = np.asarray(got.valid), np.asarray(got.lengths)
    assert tokens.dtype == np.int32 and scores.dtype == np.float32 and valid.dtype == bool
    assert not np.isnan(scores).any(), context
    np.testing.assert_array_equal(valid, want.valid, err_msg=f"valid {context}")
    np.testing.assert_array_equal(tokens, want.tokens, err_msg=f"tokens {context}")
    np.testing.assert_array_equal(lengths, want.lengths, err_msg=f"lengths {context}")
    np.testing.assert_allclose(scores, want.scores, rtol=1e-6, atol=1e-5,
                               err_msg=f"scores {context}")
    assert (np.diff(scores, axis=-1) <= 0).all(), f"scores not descending {context}"


def assert_same_beams(want, got, where):
    """A JAX backend's result == a torch backend's (torch tensors): tokens,
    valid and lengths exact, scores to float32 rounding."""
    for name in ("tokens", "valid", "lengths"):
        assert np.array_equal(np.asarray(getattr(want, name)),
                              getattr(got, name).numpy()), (where, name)
    assert np.allclose(np.asarray(want.scores), got.scores.numpy(), rtol=1e-5, atol=1e-5), where


def decode_and_check(cset: oracle.ConstraintSet, compiled, model: oracle.HashModel, seeds,
                     beam_size, tokens_per_beam=None, start_token: int = 0,
                     length_penalty: float = 0.0):
    """sc.beam_search with the hash model (one seed per batch row) == the
    oracle's beam search; returns the decoder's result. beam_size: an int or
    a beam schedule (one width per step)."""
    import static_compiler as sc

    first = beam_size if isinstance(beam_size, int) else 1  # (a schedule: the start beam)
    got = sc.beam_search(compiled, model, batch_size=len(seeds), beam_size=beam_size,
                         tokens_per_beam=tokens_per_beam, start_token=start_token,
                         carry=model.init_carry(seeds, first), carry_axes=model.carry_axes,
                         length_penalty=length_penalty)
    want = oracle.beam_search(cset, model, seeds, beam_size, tokens_per_beam, start_token,
                              length_penalty)
    assert_matches(got, want, f"(M={beam_size}, tpb={tokens_per_beam}, seeds={list(seeds)}, "
                              f"model={model!r}, set={sorted(cset.items)[:12]}...)")
    for b, j in zip(*np.nonzero(want.valid)):  # the oracle itself only returns members
        seq = tuple(want.tokens[b, j, :want.lengths[b, j]])
        assert seq in cset.items
    return got


def right_languages(a) -> list:
    """Brute force: per depth 0..depth-1, the set of suffixes each state accepts."""
    @functools.lru_cache(maxsize=None)
    def lang(depth, state):
        if depth == a.depth:
            return frozenset({()})
        layer = a.layers[depth]
        out = {()} if layer.accepting_array()[state] else set()
        targets = layer.target_array()
        for e in range(int(layer.indptr[state]), int(layer.indptr[state + 1])):
            out |= {(int(layer.tokens[e]),) + s for s in lang(depth + 1, int(targets[e]))}
        return frozenset(out)
    return [[lang(t, s) for s in range(a.layers[t].num_states)] for t in range(a.depth)]


def ir_unread(compiled) -> bool:
    """True for a `CompiledConstraints` held in its tables (no `_held_ir`)
    whose IR nothing has read back from them yet (`computed.ir`)."""
    return compiled._held_ir is None and compiled._computed.ir is None


def serve(art, model, seeds, beam_size, start_token=0):
    """Beam search through the loaded artifact, step by step, with the hash
    model's carry reordered by parent like `sc.beam_search` does."""
    import jax
    import jax.numpy as jnp

    carry = model.init_carry(seeds, beam_size)
    state = art.init_beams(len(seeds), beam_size, start_token)
    model_step = jax.jit(model.__call__)
    for step in range(art.max_length):
        logits, carry = model_step(state.last_tokens, step, carry)
        state = art.beam_step(state, logits, step)
        carry = {"h": jnp.take_along_axis(carry["h"], state.parent, axis=1),
                 "knobs": carry["knobs"]}
    return art.finalize(state)


def saved_kind(kind: str, folder, beams: int, seed: int, **options) -> tuple:
    """(items, compiled, the served artifact, its path) of a small set
    saved with item subsets in `folder`: kind "fixed" (40 items, L = 4,
    V = 6) or "ragged" (30, end token 0, V = 7), "-capacity" for capacity
    1.5; two items repeated (rows of one item); `options` to compile."""
    import static_compiler as sc
    from static_compiler import serving
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        items, vocab, end = oracle.random_set(rng, 40, 4, 6, skew=1.0), 6, None
    else:
        items, vocab, end = oracle.random_ragged_set(rng, 30, 4, 7, end_token=0), 7, 0
    items = items + items[:2]
    capacity = 1.5 if kind.endswith("capacity") else None
    compiled = sc.compile_constraints(items, vocab, end_token=end, export_beam_sizes=(beams,),
                                      export_subsets=True, capacity=capacity, **options)
    path = pathlib.Path(folder) / "set.static"
    compiled.save(path)
    return items, compiled, serving.load(path), path


def saved_with_capacity(path, beams: int) -> np.ndarray:
    """Saves 40 random items (L = 4, V = 9) compiled with item subsets and
    capacity 1.5 for beam size `beams` at `path`; returns the items."""
    import static_compiler as sc
    items = np.array(oracle.random_set(np.random.default_rng(4), 40, 4, 9))
    sc.compile_constraints(items, 9, export_beam_sizes=(beams,), export_subsets=True,
                           capacity=1.5).save(path)
    return items


def shares_the_modules(new, old) -> bool:
    """Whether a reloaded artifact `new` shares every deserialized module of
    `old` but the ranked ones (exported anew where an addition grew the
    trie) and the warm state."""
    from static_compiler.format import spec as fmt
    return new._warmth is old._warmth and all(
        new._modules[name] is module for name, module in old._modules.items()
        if not fmt.is_ranked_module(name))


def edit_manifest(path, change, reseal: bool = True) -> None:
    """Applies `change` (a function of the manifest's JSON dict, editing it in
    place) to the artifact at `path`, then writes the manifest resealed with
    its own checksum (reseal=False: with the checksum as it was)."""
    import json

    from static_compiler.format import spec as fmt

    manifest = json.loads((pathlib.Path(path) / fmt.MANIFEST_FILE).read_text())
    change(manifest)
    data = fmt.seal_manifest(manifest) if reseal else fmt.manifest_bytes(manifest)
    (pathlib.Path(path) / fmt.MANIFEST_FILE).write_bytes(data)
