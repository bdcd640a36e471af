"""Graph frontend: any acyclic networkx automaton compiles to a layered IR that
accepts exactly the graph's paths (brute-force path enumeration), is
deterministic and minimal; dropped nodes are counted; every bad graph is
rejected with a typed error naming the node or edge."""

import networkx as nx
import numpy as np
import oracle
import pytest
from helpers import right_languages
from hypothesis import given, settings
from hypothesis import strategies as st

import static_compiler as sc
from static_compiler.errors import ConstraintSetError
from static_compiler.frontend.graph import automaton_from_graph, is_graph
from static_compiler.ir import parse_ir, verify
from static_compiler.ir.merge_states import minimize_automaton


def graph_language(graph, start) -> set:
    """Brute force: token tuples of every path from `start` to an accepting node."""
    out = set()

    def walk(node, prefix):
        if graph.nodes[node].get("accept") and prefix:
            out.add(prefix)
        for _, nxt, tok in graph.out_edges(node, data="token"):
            walk(nxt, prefix + (tok,))
    walk(start, ())
    return out


@st.composite
def random_dags(draw, max_nodes=8, max_tokens=3):
    """(MultiDiGraph, vocab_size): edges only go from lower to higher node
    numbers (acyclic), few tokens (non-determinism is likely), node labels
    are strings so the frontend cannot rely on integer nodes."""
    n = draw(st.integers(2, max_nodes))
    vocab = draw(st.integers(2, max_tokens + 1))  # token vocab - 1 is kept free for END
    g = nx.MultiDiGraph()
    g.add_nodes_from(f"n{i}" for i in range(n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.tuples(st.sampled_from(pairs), st.integers(0, vocab - 2)),
                          min_size=1, max_size=3 * n))
    for (i, j), tok in edges:
        g.add_edge(f"n{i}", f"n{j}", token=tok)
    for i in draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=n, unique=True)):
        g.nodes[f"n{i}"]["accept"] = True
    g.nodes["n0"]["start"] = True
    return g, vocab


def check_graph_automaton(a, graph, start, minimal=True):
    """`a` accepts exactly the graph's paths; with `minimal`, no two states
    at one depth accept the same suffixes."""
    verify(a)
    want = sorted(graph_language(graph, start))
    assert list(a.sequences()) == want
    assert a.num_sequences == len(want)
    if minimal:
        for t, langs in enumerate(right_languages(a)):
            assert len(set(langs)) == len(langs), f"depth {t} is not minimal"
    assert parse_ir(str(a)) == a


@settings(max_examples=120, deadline=None)
@given(random_dags())
def test_random_dags_accept_exactly_their_paths(case):
    g, V = case
    language = graph_language(g, "n0")
    reachable = {"n0"} | nx.descendants(g, "n0")
    live = {n for n in g if g.nodes[n].get("accept")}
    live |= {a for n in list(live) for a in nx.ancestors(g, n)}
    if not language:
        with pytest.raises(ConstraintSetError, match="no accepting node is reachable"):
            automaton_from_graph(g, V, end_token=V - 1)
        return
    a, stats = automaton_from_graph(g, V, end_token=V - 1)
    # The cost model keeps the determinized automaton when minimizing does not pay.
    check_graph_automaton(a, g, "n0", minimal=stats.minimize.applied)
    assert stats.minimize.applied == (stats.minimize.bytes_after < stats.minimize.bytes_before)
    check_graph_automaton(minimize_automaton(a, force=True)[0], g, "n0", minimal=True)
    assert stats.nodes == g.number_of_nodes() and stats.edges == g.number_of_edges()
    assert stats.unreachable_nodes == len(set(g) - reachable)
    assert stats.dead_nodes == len(reachable - live)
    assert stats.minimize.states_before == stats.determinized_states
    if len({len(s) for s in language}) == 1:  # equal lengths need no end token
        check_graph_automaton(automaton_from_graph(g, V)[0], g, "n0", minimal=False)
    else:
        with pytest.raises(ConstraintSetError, match="pass end_token"):
            automaton_from_graph(g, V)


def test_product_catalogue_shares_suffixes():
    # brand -> model -> size; every model of every brand offers the same sizes.
    g = nx.DiGraph()
    g.add_node("root", start=True)
    sizes = {"S": 20, "M": 21, "L": 22}
    for b, brand_tok in enumerate([1, 2, 3]):
        for m, model_tok in enumerate([10, 11, 12, 13]):
            model = f"brand{b}/model{m}"
            g.add_edge("root", f"brand{b}", token=brand_tok)
            g.add_edge(f"brand{b}", model, token=model_tok)
            for size, tok in sizes.items():
                g.add_edge(model, f"{model}/{size}", token=tok)
                g.nodes[f"{model}/{size}"]["accept"] = True
    a, stats = automaton_from_graph(g, 32)
    check_graph_automaton(a, g, "root")
    assert a.num_sequences == 3 * 4 * 3 and a.end_token is None
    assert [layer.num_states for layer in a.layers] == [1, 1, 1]
    assert stats.determinized_states == 1 + 3 + 12 + 36
    assert stats.minimize.applied and stats.minimize.states_after == a.num_states


def test_node_reached_at_two_depths_is_unfolded():
    g = nx.DiGraph()
    g.add_edge("S", "X", token=1)   # X at depth 1
    g.add_edge("S", "Y", token=2)
    g.add_edge("Y", "X", token=3)   # and at depth 2
    g.add_edge("X", "F", token=4)
    g.add_edge("F", "G", token=5)
    g.nodes["F"]["accept"] = g.nodes["G"]["accept"] = True
    a, _ = automaton_from_graph(g, 8, start="S", end_token=0)
    check_graph_automaton(a, g, "S")
    assert list(a.sequences()) == [(1, 4), (1, 4, 5), (2, 3, 4), (2, 3, 4, 5)]
    assert a.depth == 4


def test_nondeterminism_is_determinized():
    g = nx.MultiDiGraph()
    g.add_edge("S", "X", token=1)
    g.add_edge("S", "Y", token=1)   # same token, other node
    g.add_edge("S", "Y", token=2)   # parallel edge with another token
    g.add_edge("X", "F", token=3)
    g.add_edge("Y", "F", token=4)
    g.nodes["F"]["accept"] = True
    a, _ = automaton_from_graph(g, 8, start="S")
    check_graph_automaton(a, g, "S")
    assert a.layers[0].tokens.tolist() == [1, 2]        # one edge per token
    assert list(a.sequences()) == [(1, 3), (1, 4), (2, 4)]


def test_unreachable_and_dead_nodes_are_dropped_and_counted():
    g = nx.DiGraph()
    g.add_node("S", start=True)
    g.add_edge("S", "A", token=1)
    g.nodes["A"]["accept"] = True
    g.add_edge("S", "dead1", token=2)
    g.add_edge("dead1", "dead2", token=3)
    g.add_edge("dead2", "dead1", token=4)         # a cycle among dead nodes is harmless
    g.add_edge("island", "A", token=5)            # cannot be reached from S
    g.add_edge("island2", "island", token=6)
    compiled = sc.compile_constraints(g, 8)
    assert list(compiled.ir.sequences()) == [(1,)]
    assert compiled.build.frontend_stats["states"] == compiled.ir.num_states == 2
    assert compiled.build.frontend_stats["edges"] == 1
    stats = compiled.build.frontend_stats["graph"]
    assert stats["unreachable_nodes"] == 2 and stats["dead_nodes"] == 2
    assert stats["nodes"] == 6 and stats["edges"] == 6
    assert set(stats["minimize"]) >= {"states_before", "states_after", "bytes_before",
                                      "bytes_after", "applied"}


def test_start_argument_overrides_missing_attribute_and_is_graph():
    g = nx.DiGraph()
    g.add_edge(0, 1, token=3)
    g.nodes[1]["accept"] = True
    assert is_graph(g) and not is_graph([[1]])
    assert list(sc.compile_constraints(g, 4, start=0).ir.sequences()) == [(3,)]


def test_decoding_a_graph_matches_the_oracle():
    # Ragged, shared suffixes, non-deterministic: decoded beams equal the brute force.
    g = nx.MultiDiGraph()
    g.add_node("S", start=True)
    for brand, tok in (("a", 1), ("b", 2), ("c", 3)):
        g.add_edge("S", brand, token=tok)
        g.add_edge(brand, "model", token=4)
        g.add_edge(brand, "model", token=5)
        g.add_edge(brand, "model2", token=5)
        g.nodes[brand]["accept"] = brand != "b"
    g.add_edge("model", "size", token=6)
    g.add_edge("model2", "size", token=7)
    g.add_edge("size", "xl", token=8)
    g.nodes["size"]["accept"] = g.nodes["xl"]["accept"] = True
    compiled = sc.compile_constraints(g, 10, end_token=0)
    items = graph_language(g, "S")
    assert set(compiled.ir.sequences()) == items
    assert any(not layer.implicit_targets for layer in compiled.ir.layers)
    cset = oracle.ConstraintSet(items, 10, end_token=0)
    model = oracle.HashModel(10, dup=40)
    for seeds in ([1, 2], [3, 4], [5, 6]):
        got = sc.beam_search(compiled, model, batch_size=2, beam_size=6,
                             carry_axes=model.carry_axes, carry=model.init_carry(seeds, 6))
        want = oracle.beam_search(cset, model, seeds, 6)
        np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens)
        np.testing.assert_array_equal(np.asarray(got.lengths), want.lengths)
        np.testing.assert_allclose(np.asarray(got.scores), want.scores, rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------
# Bad input


def _graph(*edges, accept=("F",), start="S", **edge_attrs):
    g = nx.DiGraph()
    for u, v, tok in edges:
        g.add_edge(u, v, **({} if tok is None else {"token": tok}))
    for n in accept:
        g.add_node(n, accept=True)
    if start is not None:
        g.add_node(start, start=True)
    return g


@pytest.mark.parametrize("graph, kwargs, pattern", [
    (nx.Graph([("S", "F")]), {}, r"graph of type Graph: expected a networkx.DiGraph"),
    (_graph(("S", "F", 1), start=None), {}, r"no node has a true 'start' attribute.*start=<node>"),
    (_graph(("S", "F", 1), ("T", "F", 2), start=None), {"start": "Q"},
     r"start='Q' is not a node of the graph \(3 nodes\)"),
    (nx.DiGraph([("S", "F"), ("T", "F")]), {}, r"no node has a true 'start'"),
    (_graph(("S", "F", None)), {}, r"edge 'S' -> 'F' has no 'token' attribute"),
    (_graph(("S", "F", 1.5)), {}, r"edge 'S' -> 'F': token=1.5 \(float\) is not an integer"),
    (_graph(("S", "F", True)), {}, r"edge 'S' -> 'F': token=True \(bool\) is not an integer"),
    (_graph(("S", "F", "a")), {}, r"token='a' \(str\) is not an integer"),
    (_graph(("S", "F", 8)), {}, r"edge 'S' -> 'F': token 8 is outside the vocabulary \[0, 8\)"),
    (_graph(("S", "F", -1)), {}, r"token -1 is outside the vocabulary \[0, 8\)"),
    (_graph(("S", "F", 0)), {"end_token": 0}, r"edge 'S' -> 'F': token 0 is the end token"),
    (_graph(("S", "F", 1)), {"end_token": 8}, r"end_token=8: expected an int in \[0, 8\)"),
    (_graph(("S", "F", 1)), {"end_token": 1.0}, r"end_token=1.0: expected an int"),
    (_graph(("S", "A", 1), ("A", "B", 2), ("B", "C", 3), ("C", "A", 4), ("C", "F", 5)), {},
     r"cycle through nodes \['A', 'B', 'C'\] \(then back to 'A'\)"),
    (_graph(("S", "F", 1), ("F", "F", 2)), {"end_token": 0},
     r"cycle through nodes \['F'\]"),
    (_graph(("S", "A", 1), accept=()), {}, r"no accepting node is reachable from the start "
                                           r"node 'S' \(0 nodes.*accept=True"),
    (_graph(("S", "F", 1), accept=("S", "F")), {"end_token": 0},
     r"start node 'S' is accepting: the empty sequence"),
    (_graph(("S", "A", 1), ("A", "F", 2), accept=("A", "F")), {},
     r"node 'A' accepts after 1 token .*pass end_token"),
    (_graph(("S", "F", 1), ("S", "A", 2), ("A", "F", 3)), {},
     r"node 'F' accepts after 1 token .*pass end_token"),
])
def test_bad_graphs_are_rejected(graph, kwargs, pattern):
    with pytest.raises(ConstraintSetError, match=pattern):
        automaton_from_graph(graph, 8, **kwargs)
    with pytest.raises(ConstraintSetError, match=pattern):
        sc.compile_constraints(graph, 8, **kwargs)


def test_bad_vocab_and_start_without_graph():
    g = _graph(("S", "F", 1))
    with pytest.raises(ConstraintSetError, match=r"vocab_size=0: expected an int in \[1, "):
        automaton_from_graph(g, 0)
    with pytest.raises(ConstraintSetError, match=r"start='S' applies to graph input only; "
                                                 r"got list"):
        sc.compile_constraints([[1]], 4, start="S")
    two = _graph(("S", "F", 1), ("T", "F", 2))
    two.add_node("T", start=True)
    with pytest.raises(ConstraintSetError, match=r"2 nodes have \(\['S', 'T'\]\)|"
                                                 r"2 nodes have \(\['T', 'S'\]\)"):
        automaton_from_graph(two, 8)
