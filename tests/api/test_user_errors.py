"""User errors that used to pass silently or raise bare Python errors:
each is now one of ours, naming the value and
what was expected, and each test failed before its fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import static_compiler as sc
from static_compiler import serving
from static_compiler.errors import ConstraintSetError, DecodeInputError, IRVerificationError, PipelineError


def zeros(last_tokens, step, carry):
    return jnp.zeros(last_tokens.shape + (3,), jnp.float32), carry


@pytest.fixture(scope="module")
def compiled():
    return sc.compile_constraints([[0, 1], [1, 2]], 3, export_beam_sizes=(2,))


def test_a_pass_option_given_twice_is_refused():
    with pytest.raises(PipelineError, match="'multiple' is given twice"):
        sc.parse_pipeline("verify,pad-branches{multiple=8,multiple=16}")


@pytest.mark.parametrize("items", [[[True, 1]], [(0, np.bool_(False))]])
def test_bools_are_not_token_ids(items):
    with pytest.raises(ConstraintSetError, match="is a bool: expected integer token ids"):
        sc.compile_constraints(items, 3)


@pytest.mark.parametrize("sizes", [("a",), (), (0,), (True,), 70])
def test_bad_export_beam_sizes_are_refused_when_compiling(sizes):
    with pytest.raises(DecodeInputError, match="export_beam_sizes="):
        sc.compile_constraints([[0, 1]], 3, export_beam_sizes=sizes)


def test_export_beam_sizes_accept_any_sequence_of_ints():
    assert sc.compile_constraints([[0, 1]], 3,
                                  export_beam_sizes=np.array([2, 4])).export_options.beam_sizes == (2, 4)


@pytest.mark.parametrize("key", [0, np.zeros(3, np.uint32), "seed"])
def test_sample_needs_a_prng_key(compiled, key):
    with pytest.raises(DecodeInputError, match="expected a jax PRNG key"):
        sc.sample(compiled, zeros, key, batch_size=1)


def test_sample_takes_both_kinds_of_key(compiled):
    for key in (jax.random.PRNGKey(0), jax.random.key(0)):
        assert np.asarray(sc.sample(compiled, zeros, key, batch_size=1).valid).all()


def test_a_state_of_the_wrong_shape_is_refused_by_mask_and_advance(compiled):
    pair = (jnp.zeros(1, jnp.int32), jnp.ones(1, bool))
    with pytest.raises(DecodeInputError, match="mask: state"):
        compiled.mask(jnp.zeros((1, 3)), pair, 0)
    with pytest.raises(DecodeInputError, match="advance: state"):
        compiled.advance(pair, jnp.zeros(1, jnp.int32), 0)


def test_load_refuses_a_device_that_is_not_one(compiled, tmp_path):
    compiled.save(tmp_path / "a")
    with pytest.raises(DecodeInputError, match="device='bogus': expected a jax.Device"):
        serving.load(tmp_path / "a", device="bogus")
    assert serving.load(tmp_path / "a", device=jax.devices()[0]).num_sequences == 2



@pytest.mark.parametrize("header", ["sequences=1", "sequences=3"])
def test_an_ir_dump_whose_sequence_count_is_wrong_is_refused(compiled, header):
    text = compiled.ir.to_text()
    assert "sequences=2" in text
    with pytest.raises(IRVerificationError, match=r"num_sequences=\d, but the layers accept 2"):
        sc.compile_constraints(sc.ir.parse_ir(text.replace("sequences=2", header)), 3,
                               pipeline="verify")


@pytest.mark.parametrize("vocab, end", [(4, None), (3, 2)])
def test_vocab_size_and_end_token_must_agree_with_an_automaton_given(compiled, vocab, end):
    with pytest.raises(ConstraintSetError, match=r"the Automaton given has vocab_size=3, "
                                                 r"end_token=None"):
        sc.compile_constraints(compiled.ir, vocab, end_token=end)
    assert sc.compile_constraints(compiled.ir, 3).ir.num_sequences == 2


def test_sequence_counts_of_shared_states_and_of_huge_graphs():
    """Explicit targets are counted over the edges; a graph with more paths
    than int64 holds is counted in Python ints."""
    import networkx as nx

    from static_compiler.ir import count_sequences

    rows = [[a, b, c] for a in range(4) for b in range(3) for c in range(2)] + [[5, 0, 0]]
    minimized = sc.compile_constraints(rows, 6, pipeline="minimize,choose-layout").ir
    assert any(not layer.implicit_targets for layer in minimized.layers)
    assert count_sequences(minimized.layers, minimized.num_final_states) == len(rows) == \
        minimized.num_sequences
    g = nx.DiGraph()
    depth = 70  # 2**70 paths: two ways of two tokens from node t to node t + 1
    for t in range(depth):
        for way in (0, 1):
            g.add_edge(t, (t, way), token=way)
            g.add_edge((t, way), t + 1, token=2)
    g.nodes[0]["start"] = True
    g.nodes[depth]["accept"] = True
    ir = sc.compile_constraints(g, 3).ir
    assert ir.num_sequences == count_sequences(ir.layers, ir.num_final_states)
    assert ir.num_sequences > 2 ** 63


def test_a_manifest_of_deeply_nested_json_is_a_format_error(compiled, tmp_path):
    """Raised a bare RecursionError."""
    path = compiled.save(tmp_path / "a")
    (path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(sc.errors.ArtifactFormatError, match="nested too deeply"):
        serving.load(path)
