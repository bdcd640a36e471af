"""Graph frontend: an acyclic automaton given as a `networkx.DiGraph` becomes
the layered automaton IR.

The graph:

* nodes: any hashable; the start node is the ``start=`` argument or the one
  node whose ``start`` attribute is true; nodes whose ``accept`` attribute is
  true end a sequence;
* edges: a ``token`` attribute, an int in [0, V), never the end token. A
  `networkx.MultiDiGraph` may hold parallel edges (several tokens from one
  node to another). Two edges with the same token from one node make the
  graph non-deterministic; that is allowed.

What happens to it:

1. validation (typed `ConstraintSetError` naming the node or edge);
2. nodes that the start cannot reach (*unreachable*) and nodes that reach no
   accepting node (*dead*) are dropped and counted in `GraphStats`;
3. a cycle among the remaining nodes is rejected, naming its nodes (the set
   would be infinite); a cycle among dropped nodes changes nothing;
4. subset construction by depth: a state is (set of graph nodes, depth),
   so the result is deterministic and layered even when paths of different
   lengths reach one node (a node reached at depths 2 and 3 becomes two
   states). States at a depth are numbered breadth first, children in token
   order; targets are explicit where states are shared;
5. equivalent states are merged, as the `minimize` pass does (kept when the
   cost model says it is smaller, see static_compiler/ir/merge_states.py).

The number of states is the number of distinct (node set, depth) pairs:
at most nodes x longest path for a deterministic graph, exponential in the
worst case for a non-deterministic one (as any subset construction). The
work is a Python loop over those states and their edges, about as long as
building the graph (1 s for 40k edges).
"""

from __future__ import annotations

import dataclasses
import sys
from collections import deque
from typing import Hashable, Optional

import numpy as np

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import check_end_token, check_vocab_size
from static_compiler.ir import Automaton, Layer, count_sequences
from static_compiler.ir.merge_states import MinimizeStats, minimize_automaton
from static_compiler.support.dtypes import index_dtype_for, token_dtype_for


@dataclasses.dataclass(frozen=True)
class GraphStats:
    """What the graph frontend did (for `show-ir --stats` and reports).

    Attributes:
      nodes, edges: size of the input graph.
      unreachable_nodes: nodes the start node cannot reach (dropped).
      dead_nodes: reachable nodes from which no accepting node is reachable
        (dropped).
      determinized_states: states after subset construction by depth
        (final states included), before minimizing.
      minimize: `merge_states.MinimizeStats` of the final step (None
        when minimizing was turned off).
    """

    nodes: int
    edges: int
    unreachable_nodes: int
    dead_nodes: int
    determinized_states: int
    minimize: Optional[MinimizeStats]

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["minimize"] = None if self.minimize is None else self.minimize.as_dict()
        return out


def is_graph(obj) -> bool:
    """Whether `obj` is a networkx graph (without importing networkx)."""
    nx = sys.modules.get("networkx")
    return nx is not None and isinstance(obj, nx.Graph)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _find_start(graph, start) -> Hashable:
    if start is not None:
        if start not in graph:
            raise ConstraintSetError(f"start={start!r} is not a node of the graph "
                                     f"({graph.number_of_nodes()} nodes)")
        return start
    marked = [n for n, is_start in graph.nodes(data="start") if is_start]
    if len(marked) != 1:
        found = "no node has" if not marked else f"{len(marked)} nodes have ({marked[:5]!r})"
        raise ConstraintSetError(
            f"graph start: {found} a true 'start' attribute; expected exactly one, "
            "or pass start=<node>")
    return marked[0]


def _edge_tokens(graph, vocab_size: int, end_token: Optional[int]
                 ) -> list[tuple[Hashable, Hashable, int]]:
    """[(u, v, token)] for every edge, validated."""
    edges = []
    for u, v, token in graph.edges(data="token"):
        where = f"edge {u!r} -> {v!r}"
        if token is None:
            raise ConstraintSetError(f"{where} has no 'token' attribute; every edge needs "
                                     "token=<int in [0, vocab_size)>")
        if not _is_int(token):
            raise ConstraintSetError(f"{where}: token={token!r} ({type(token).__name__}) is not "
                                     "an integer token id")
        if not 0 <= token < vocab_size:
            raise ConstraintSetError(f"{where}: token {int(token)} is outside the vocabulary "
                                     f"[0, {vocab_size})")
        if token == end_token:
            raise ConstraintSetError(f"{where}: token {int(token)} is the end token; mark the "
                                     "node accept=True instead (the compiler adds the end "
                                     "transition itself)")
        edges.append((u, v, int(token)))
    return edges


def _closure(sources, neighbours) -> set:
    """Nodes reachable from `sources` (included) along `neighbours`."""
    seen = set(sources)
    queue = deque(seen)
    while queue:
        for nxt in neighbours[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _reject_cycle(graph, out: dict) -> None:
    """Raises naming the nodes of one cycle among the nodes of `out`
    (node -> {token: targets}); Kahn's algorithm first, networkx only to
    name a cycle once one is known to exist."""
    indegree = dict.fromkeys(out, 0)
    for row in out.values():
        for targets in row.values():
            for v in targets:
                indegree[v] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    while ready:
        for targets in out[ready.pop()].values():
            for v in targets:
                indegree[v] -= 1
                if indegree[v] == 0:
                    ready.append(v)
    left = [n for n, d in indegree.items() if d > 0]  # on a cycle or below one
    if not left:
        return
    import networkx as nx
    nodes = [edge[0] for edge in nx.find_cycle(graph.subgraph(left))]
    rank = {n: i for i, n in enumerate(graph)}
    first = min(range(len(nodes)), key=lambda i: rank[nodes[i]])
    nodes = nodes[first:] + nodes[:first]
    raise ConstraintSetError(
        f"the graph has a cycle through nodes {nodes!r} (then back to {nodes[0]!r}); "
        "expected an acyclic graph (a cycle accepts infinitely many sequences)")


def _layers_by_depth(out: dict, accepting: set, start, order: dict, vocab_size: int,
                     end_token: Optional[int]) -> tuple[list[Layer], int]:
    """Subset construction by depth over the useful nodes.

    Args:
      out: node -> {token: targets tuple}; accepting: accepting nodes;
      order: node -> rank in the graph (sorts subsets deterministically).
    Returns:
      (layers, num_final): `Layer` per depth (explicit targets where states
      are shared) and the number of states after the last layer."""
    layers = []
    states = [(start,)]
    while True:
        if all(not out[n] for subset in states for n in subset):
            break  # every state at this depth is final
        depth = len(layers)
        indptr, tokens, targets, acc = [0], [], [], []
        next_ids: dict = {}
        for subset in states:
            acc.append(any(n in accepting for n in subset))
            if len(subset) == 1:
                row = out[subset[0]]
            else:
                merged: dict = {}
                for n in subset:
                    for tok, vs in out[n].items():
                        merged.setdefault(tok, set()).update(vs)
                row = {tok: tuple(sorted(vs, key=order.__getitem__)) for tok, vs in merged.items()}
            for tok in sorted(row):
                tokens.append(tok)
                targets.append(next_ids.setdefault(row[tok], len(next_ids)))
            indptr.append(len(tokens))
        if depth > 0 and any(acc) and end_token is None:
            node = next(n for n in states[acc.index(True)] if n in accepting)
            raise ConstraintSetError(
                f"node {node!r} accepts after {depth} token{'s' * (depth != 1)} but "
                "sequences continue or are longer elsewhere: pass end_token=... to compile a "
                "variable-length set")
        E = len(tokens)
        tg = np.asarray(targets, dtype=index_dtype_for(E))
        layers.append(Layer(indptr=np.asarray(indptr, dtype=index_dtype_for(E)),
                            tokens=np.asarray(tokens, dtype=token_dtype_for(vocab_size)),
                            targets=None if np.array_equal(tg, np.arange(E)) else tg,
                            accepting=np.asarray(acc, dtype=bool) if any(acc) else None))
        states = list(next_ids)
    return layers, len(states)


def automaton_from_graph(graph, vocab_size: int, *, start=None, end_token=None,
                         minimize: bool = True) -> tuple[Automaton, GraphStats]:
    """Compiles an acyclic `networkx.DiGraph` to the automaton IR (see module doc).

    Args:
      graph: networkx.DiGraph or MultiDiGraph.
      vocab_size: V; edge tokens must lie in [0, V).
      start: the start node; default the node with a true ``start`` attribute.
      end_token: token that ends a sequence; required when accepting states
        occur at different depths or have outgoing edges.
      minimize: merge equivalent states when the cost model says it pays.

    Returns:
      (Automaton, GraphStats).

    Raises:
      ConstraintSetError naming the node or edge at fault.
    """
    import networkx as nx

    if not isinstance(graph, nx.DiGraph):
        raise ConstraintSetError(f"graph of type {type(graph).__name__}: expected a "
                                 "networkx.DiGraph or MultiDiGraph")
    vocab_size = check_vocab_size(vocab_size)
    end_token = check_end_token(end_token, vocab_size)
    start = _find_start(graph, start)
    edges = _edge_tokens(graph, vocab_size, end_token)
    accepting = {n for n, acc in graph.nodes(data="accept") if acc}
    reachable = _closure([start], graph.succ)
    coreachable = _closure(accepting, graph.pred)
    useful = reachable & coreachable
    if start not in useful:
        raise ConstraintSetError(
            f"no accepting node is reachable from the start node {start!r} "
            f"({len(accepting)} nodes have a true 'accept' attribute); mark the nodes that end "
            "a sequence with accept=True")
    if start in accepting:
        raise ConstraintSetError(
            f"start node {start!r} is accepting: the empty sequence cannot be decoded; "
            "every sequence needs at least one token")

    # Per useful node: token -> sorted targets (several when non-deterministic).
    out = {n: {} for n in useful}
    for u, v, token in edges:
        if u in useful and v in useful:
            out[u].setdefault(token, set()).add(v)
    order = {n: i for i, n in enumerate(graph)}  # deterministic subset keys
    out = {n: {tok: tuple(sorted(vs, key=order.__getitem__)) for tok, vs in row.items()}
           for n, row in out.items()}
    _reject_cycle(graph, out)
    return automaton_from_edges(out, accepting, start, vocab_size, end_token, order=order,
                                minimize=minimize, num_edges=graph.number_of_edges(),
                                nodes=graph.number_of_nodes(),
                                unreachable=graph.number_of_nodes() - len(reachable),
                                dead=len(reachable - coreachable))


def automaton_from_edges(out: dict, accepting: set, start, vocab_size: int,
                         end_token: Optional[int], *, order: Optional[dict] = None,
                         minimize: bool = True, num_edges: int = 0, nodes: Optional[int] = None,
                         unreachable: int = 0, dead: int = 0) -> tuple[Automaton, GraphStats]:
    """Steps 4 and 5 of the module doc on a checked acyclic graph given as
    `out`: node -> {token: targets tuple} (every node useful), `accepting`
    nodes and the `start` node; order: node -> rank (sorts non-deterministic
    targets; default the nodes' own order, for int nodes). The rest of
    `GraphStats` (nodes, edges, unreachable, dead) as the caller counted."""
    order = order if order is not None else {n: n for n in out}
    layers, num_final = _layers_by_depth(out, accepting, start, order, vocab_size, end_token)
    ir = Automaton(vocab_size=vocab_size, layers=tuple(layers), num_final_states=num_final,
                   num_sequences=count_sequences(layers, num_final), end_token=end_token)
    determinized = ir.num_states
    ir, minimize_stats = minimize_automaton(ir, force=False) if minimize else (ir, None)
    stats = GraphStats(nodes=len(out) if nodes is None else nodes, edges=num_edges,
                       unreachable_nodes=unreachable, dead_nodes=dead,
                       determinized_states=determinized, minimize=minimize_stats)
    return ir, stats
