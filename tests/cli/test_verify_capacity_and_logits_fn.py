"""`verify` after removals, the capacity's range, and the logits_fn contract:

* ``static-compiler verify`` ignored removals: after ``update --remove`` it
  must compare the input with the live items (the tables' sequences less
  the removed ones);
* ``capacity=inf`` raised a raw OverflowError (library) and printed a
  traceback with exit 1 (CLI): a capacity must be a finite number >= 1.0;
* a ``logits_fn`` returning only logits failed in Python's tuple unpacking:
  the decoders now say what the contract is.
"""

from __future__ import annotations

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_cli

import static_compiler as sc
from static_compiler.cli.dispatch import main
from static_compiler.errors import DecodeInputError, PipelineError

RAGGED = [[1, 2, 3], [1, 2], [4], [4, 5, 6, 2], [6, 6], [3]]
REMOVED = [[1, 2], [6, 6]]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def updated_artifacts(tmp_path_factory):
    """{kind: (root, input file, removed rows)}: a ragged (.jsonl, end token
    0) and a fixed-length (.npy) set, compiled with --export-subsets, then
    `update --remove` of two items (as sequences, and as a bool mask)."""
    root = tmp_path_factory.mktemp("verify")
    fixed = np.random.default_rng(3).integers(0, 8, (12, 3))
    fixed = np.unique(fixed, axis=0)
    np.save(root / "fixed.npy", fixed)
    mask = np.zeros(len(fixed), bool)
    mask[[0, 5]] = True
    np.save(root / "fixed_remove.npy", mask)
    sets = {"ragged": (write_jsonl(root / "ragged.jsonl", RAGGED), ["--end-token", 0],
                       write_jsonl(root / "ragged_remove.jsonl", REMOVED), REMOVED),
            "fixed": (root / "fixed.npy", [], root / "fixed_remove.npy", fixed[mask].tolist())}
    out = {}
    for kind, (src, flags, remove, removed) in sets.items():
        art = root / f"{kind}.static"
        assert main(["compile", str(src), "-o", str(art), "--vocab-size", "8", *map(str, flags),
                     "--beam-sizes", "2", "--export-subsets"]) == 0
        assert main(["verify", str(art), "--input", str(src)]) == 0  # before the update
        assert main(["update", str(art), "--remove", str(remove)]) == 0
        out[kind] = (art, src, removed)
    return out


@pytest.mark.parametrize("kind", ["ragged", "fixed"])
def test_verify_compares_the_input_with_the_live_items(updated_artifacts, tmp_path, capsys,
                                                       kind):
    art, src, removed = updated_artifacts[kind]
    given = RAGGED if kind == "ragged" else np.load(src).tolist()
    live = [row for row in given if row not in removed]
    code, out, _ = run_cli(capsys, "verify", art)
    total = len(given)
    assert code == 0, out
    assert out == (f"{art}: {total} sequences counted from the tables (checked a chunk at a "
                   f"time); the manifest records {total}: OK\n2 of them removed by updates, "
                   f"{total - 2} live\n")
    # The original input: its removed items are not served any more.
    code, out, _ = run_cli(capsys, "verify", art, "--input", src)
    assert code == 1, out
    assert "2 sequences in the input but not live in the artifact (2 of them removed by " \
           f"updates)\n  {sorted(removed)[0]}\n  {sorted(removed)[1]}\n" in out
    assert "0 sequences live in the artifact but not in the input\n" in out
    assert out.endswith(f"{total} unique input sequences: MISMATCH\n")
    # The live items: OK.
    code, out, _ = run_cli(capsys, "verify", art, "--input",
                           write_jsonl(tmp_path / "l.jsonl", live))
    assert code == 0, out
    assert out.endswith(f"0 sequences live in the artifact but not in the input\n"
                        f"{total - 2} unique input sequences: OK\n")
    # A live item left out of the input is live in the artifact but not in the input.
    code, out, _ = run_cli(capsys, "verify", art, "--input",
                           write_jsonl(tmp_path / "s.jsonl", live[1:]))
    assert code == 1 and f"1 sequences live in the artifact but not in the input\n  {live[0]}\n" \
        in out, out


@pytest.mark.parametrize("capacity", [math.inf, -math.inf, math.nan, True, 0.5, "2", [1.5]])
def test_a_capacity_that_is_not_a_finite_number_at_least_one_is_a_pipeline_error(capacity):
    with pytest.raises(PipelineError, match=r"capacity=.*: expected a finite growth factor "
                                            r">= 1\.0"):
        sc.compile_constraints([(1, 2), (2, 3)], 4, capacity=capacity)


@pytest.mark.parametrize("growth", ["inf", "nan", "-inf", "0.5"])
def test_a_growth_option_out_of_range_is_a_pipeline_error(growth):
    with pytest.raises(PipelineError, match=rf"growth={growth}.*expected a finite growth factor"):
        sc.compile_constraints([(1, 2), (2, 3)], 4,
                               pipeline=f"verify,choose-layout,reserve-capacity{{growth={growth}}}")


def test_a_huge_finite_capacity_is_bounded_by_what_each_depth_can_hold():
    """1e308 times a count overflows a float: the capacity is then what the
    depth can hold (V times the states above), not an OverflowError."""
    compiled = sc.compile_constraints([(1, 2), (2, 3)], 4, capacity=1e308)
    caps = [layer.layout.states_capacity for layer in compiled.ir.layers]
    assert caps == [1, 4]
    assert compiled.update(add=[(3, 3), (0, 1)]).build.last_update["grew"] == []
    assert sc.compile_constraints([(1, 2), (2, 3)], 4, capacity=2).build.pipeline.count("growth=2.0")


@pytest.mark.parametrize("value", ["inf", "nan", "0.5"])
def test_cli_capacity_out_of_range_exits_2_with_one_line(tmp_path, capsys, value):
    np.save(tmp_path / "s.npy", np.array([[1, 2], [2, 3]]))
    code, _, err = run_cli(capsys, "compile", tmp_path / "s.npy", "-o", tmp_path / "a",
                           "--vocab-size", 4, "--capacity", value)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert lines[-1] == (f"static-compiler compile: error: --capacity {float(value)!r} (float): "
                         "expected a finite growth factor >= 1.0 (1.25 reserves 25 % more room)")
    assert not (tmp_path / "a").exists()


@pytest.fixture(scope="module")
def small_set():
    return sc.compile_constraints([(1, 2), (2, 3), (2, 1)], 4)


def logits_only(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (4,))


def logits_in_a_1_tuple(last_tokens, step, carry):
    return (jnp.zeros(last_tokens.shape + (4,)),)


@pytest.mark.parametrize("decoder, where, shape", [
    (lambda c, fn: sc.beam_search(c, fn, batch_size=2, beam_size=3), "beam_search", "(2, 3, 4)"),
    (lambda c, fn: sc.greedy_decode(c, fn, batch_size=2), "beam_search", "(2, 1, 4)"),
    (lambda c, fn: sc.sample(c, fn, jax.random.key(0), batch_size=2), "sample", "(2, 1, 4)"),
], ids=["beam_search", "greedy_decode", "sample"])
def test_a_logits_fn_that_returns_no_pair_says_the_contract(small_set, decoder, where, shape):
    want = rf"{where} \(step 0\): logits_fn must return \(logits float \(B, M, V\) = " \
           rf"{re.escape(shape)}, new_carry\); got "
    with pytest.raises(DecodeInputError, match=want + r"an array float32\[2, \d, 4\] alone"):
        decoder(small_set, logits_only)
    with pytest.raises(DecodeInputError, match=want + "a tuple of length 1"):
        decoder(small_set, logits_in_a_1_tuple)
    # The pair itself decodes.
    result = decoder(small_set, lambda last, step, carry: (logits_only(last, step, carry), carry))
    assert np.asarray(result.valid).all()


def test_a_logits_fn_with_params_is_checked_too(small_set):
    with pytest.raises(DecodeInputError, match=r"got an array float32\[1, 2, 4\] alone"):
        sc.beam_search(small_set, lambda params, last, step, carry: logits_only(last, step, carry),
                       batch_size=1, beam_size=2, params=jnp.zeros(3))
