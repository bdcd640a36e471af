"""A constraint set of any input kind read into the IR, one function per
kind (`read_input` picks one): token sequences (`from_sequences`), an
`Automaton` as given (`from_automaton`), an acyclic `networkx.DiGraph`
(`from_graph`), names with a tokenizer (`from_names`: a text catalogue, its
canonical encodings or every spelling) and a partitioned build
(`from_shards`: built partition by partition, its merged trie read only
when a pass needs its arrays). Each gives a `FrontendOutput`, on which
`compiler.compile_constraints` runs the passes and lowering.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

from static_compiler.errors import ConstraintSetError
from static_compiler.frontend import PaddedRows, build_trie
from static_compiler.frontend.array_files import ArrayFiles
from static_compiler.frontend.graph import automaton_from_graph, is_graph
from static_compiler.frontend.partitioned import partitions_built
from static_compiler.frontend.sequences import trie_from_sorted
from static_compiler.frontend.shards import Shards
from static_compiler.frontend.spellings import SPELLINGS, catalogue_spellings
from static_compiler.frontend.text import as_adapter, catalogue_vocab_size, encode_catalogue, looks_like_names
from static_compiler.ir import Automaton
from static_compiler.items.index import ItemIndex


@dataclasses.dataclass
class FrontendOutput:
    """What the frontend made of one input.

    Attributes
    ----------
    ir : Automaton or None
        The automaton; None for a partitioned build (`built`), whose layers
        are lowered piece by piece unless a pass reads them (`merged`).
    items : ItemIndex or None
        Where each input row ends (sequence inputs), for item subsets.
    names : NameTable or None
        A text catalogue's names.
    stats : dict
        The frontend's report: "states", "edges", and "text" / "graph" where
        those frontends ran.
    origin : str
        "input" for an `Automaton` given as is, else "frontend" (the IR
        printout's heading).
    built, files
        A partitioned build (`partitioned.partitions_built`) and the files
        of its merged layers (`ArrayFiles`), else None.
    """

    ir: Optional[Automaton]
    items: Optional[ItemIndex] = None
    names: Any = None
    stats: dict = dataclasses.field(default_factory=dict)
    origin: str = "frontend"
    built: Any = None
    files: Optional[ArrayFiles] = None

    def merged(self) -> "FrontendOutput":
        """A partitioned build's merged trie and item index, read from its
        files (for passes that read the arrays: minimize, printing the IR)."""
        return dataclasses.replace(self, ir=self.built.trie(self.files),
                                   items=self.built.items(self.files))


def read_input(constraints, vocab_size: Optional[int], *, end_token: Optional[int] = None,
               start=None, tokenizer=None, spellings: str = "canonical",
               export_subsets: bool = False, check_tables=None):
    """A context manager giving the `FrontendOutput` of `constraints` (see
    `compiler.compile_constraints` for the input kinds and options); a
    partitioned build's work directory lives as long as the context, and
    it checks its tables' bytes as it builds with `check_tables`
    (`partitioned.partitions_built`; other inputs are built whole first).
    Raises ConstraintSetError for a bad input or an option that does not
    apply to it."""
    if spellings not in SPELLINGS or (spellings != "canonical" and tokenizer is None):
        raise ConstraintSetError(f"spellings={spellings!r}: expected one of {SPELLINGS}, and "
                                 "'any' only for names with a tokenizer")
    if tokenizer is not None:
        return contextlib.nullcontext(from_names(constraints, vocab_size, tokenizer,
                                                 end_token=end_token, spellings=spellings,
                                                 export_subsets=export_subsets, start=start))
    if looks_like_names(constraints):
        raise ConstraintSetError(f"constraints hold names ({constraints[0]!r}, ...): pass "
                                 "tokenizer=... (a callable str -> list of token ids, a "
                                 "tokenizers / transformers tokenizer, or the path of a "
                                 "tokenizer.json) to compile a text catalogue")
    if vocab_size is None:
        raise ConstraintSetError("vocab_size=None: expected a positive int (only a text "
                                 "catalogue compiled with a tokenizer takes the tokenizer's)")
    _check_start(start, constraints)
    if isinstance(constraints, Shards):
        return from_shards(constraints, vocab_size, end_token=end_token,
                           check_tables=check_tables)
    if is_graph(constraints):
        return contextlib.nullcontext(from_graph(constraints, vocab_size, end_token=end_token,
                                                 start=start))
    if isinstance(constraints, Automaton):
        return contextlib.nullcontext(from_automaton(constraints, vocab_size,
                                                     end_token=end_token))
    return contextlib.nullcontext(from_sequences(constraints, vocab_size, end_token=end_token))


def _check_start(start, constraints) -> None:
    if start is not None and not is_graph(constraints):
        raise ConstraintSetError(f"start={start!r} applies to graph input only; got "
                                 f"{type(constraints).__name__}")


def _counted(out: FrontendOutput) -> FrontendOutput:
    out.stats.update(states=out.ir.num_states, edges=out.ir.num_edges)
    return out


def from_sequences(rows, vocab_size: int, *, end_token: Optional[int] = None) -> FrontendOutput:
    """Token sequences (an int array (N, L), `PaddedRows` or an iterable of
    int sequences) built into a trie with its item index."""
    ir, items = build_trie(rows, vocab_size, end_token=end_token)
    return _counted(FrontendOutput(ir, items))


def from_automaton(ir: Automaton, vocab_size: int, *,
                   end_token: Optional[int] = None) -> FrontendOutput:
    """An `Automaton` as given; its vocab_size and end_token must be those
    asked for (end_token may be left None)."""
    if vocab_size != ir.vocab_size or end_token not in (None, ir.end_token):
        raise ConstraintSetError(
            f"vocab_size={vocab_size!r}, end_token={end_token!r}: the Automaton given has "
            f"vocab_size={ir.vocab_size}, end_token={ir.end_token}; pass its own values "
            "(end_token may be left None)")
    return _counted(FrontendOutput(ir, origin="input"))


def from_graph(graph, vocab_size: int, *, end_token: Optional[int] = None,
               start=None) -> FrontendOutput:
    """An acyclic `networkx.DiGraph` as a layered automaton (`graph`)."""
    ir, graph_stats = automaton_from_graph(graph, vocab_size, start=start, end_token=end_token)
    return _counted(FrontendOutput(ir, stats={"graph": graph_stats.as_dict()}))


def from_names(names, vocab_size: Optional[int], tokenizer, *, end_token: Optional[int] = None,
               spellings: str = "canonical", export_subsets: bool = False,
               start=None) -> FrontendOutput:
    """A text catalogue: `names` encoded with `tokenizer` (`text`), built
    from its encodings sorted once, with its names; with spellings="any",
    every token sequence spelling a name (no item
    index, no names: their automaton, `spellings.catalogue_spellings`)."""
    tokenizer = as_adapter(tokenizer)  # (a tokenizer.json path read once)
    vocab_size = catalogue_vocab_size(vocab_size, tokenizer)
    catalogue = encode_catalogue(names, tokenizer, vocab_size, end_token=end_token)
    stats = {"text": dict(catalogue.stats, spellings=spellings)}
    if spellings == "any":
        if export_subsets:
            raise ConstraintSetError("spellings='any' keeps no item index: export_subsets "
                                     "needs the canonical spellings")
        ir, graph_stats = catalogue_spellings(catalogue, tokenizer, vocab_size)
        _check_start(start, ir)
        return _counted(FrontendOutput(ir, stats=dict(stats, graph=graph_stats.as_dict())))
    _check_start(start, catalogue.sequences)
    ir, items = trie_from_sorted(catalogue.sorted_rows, vocab_size, catalogue.end_token,
                                 ragged=isinstance(catalogue.sequences, PaddedRows))
    return _counted(FrontendOutput(ir, items, catalogue.names, stats))


@contextlib.contextmanager
def from_shards(shards: Shards, vocab_size: int, *, end_token: Optional[int] = None,
                check_tables=None):
    """A partitioned build (`partitioned.partitions_built`, checking its
    tables' bytes with `check_tables` as it builds), as a context giving its
    `FrontendOutput` (ir None: lowered piece by piece, or `merged`); the
    build's work directory lives as long as the context."""
    with partitions_built(shards, vocab_size, end_token=end_token,
                          check_tables=check_tables) as built:
        summary = built.summary
        yield FrontendOutput(None, stats=dict(states=summary.num_states,
                                              edges=summary.num_edges),
                             built=built, files=ArrayFiles(built.work / "merged"))
