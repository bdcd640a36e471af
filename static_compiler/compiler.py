"""`compile_constraints`: frontend -> passes -> lowering, and the decode
entry points over the `CompiledConstraints` it returns (`beam_search`,
`greedy_decode`, `sample`). The compiled set itself lives in `compiled`,
the artifact round trip (`load`) in `saved`, updates of a saved artifact
(`update_artifact`) in `lifecycle.update`; both are importable from here too."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Optional

from static_compiler.backend import decode
from static_compiler.compiled import BuildInfo, CompiledConstraints, ExportOptions, Lowered
from static_compiler.compiler_items import subsets
from static_compiler.decode_calls import beam_search_over, decode_over
from static_compiler.errors import ConstraintSetError, DecodeInputError
from static_compiler.frontend import inputs
from static_compiler.frontend.array_files import ArrayFiles
from static_compiler.items.attributes import checked_attributes
from static_compiler.lifecycle.update import update_artifact
from static_compiler.lowered.plan import tables_nbytes
from static_compiler.passes import pipeline as pipeline_lib
from static_compiler.saved import load
from static_compiler.support.arguments import check_export_beam_sizes
from static_compiler.target.lowering import lower, lower_pieces

__all__ = ["CompiledConstraints", "beam_search", "compile_constraints", "greedy_decode",
           "load", "sample", "update_artifact"]


def compile_constraints(constraints, vocab_size: Optional[int] = None, *,
                        end_token: Optional[int] = None,
                        pipeline: Optional[str] = None, print_ir_after_all: bool = False,
                        verify_each: bool = True, export_beam_sizes=(70,),
                        export_tokens_per_beam: Optional[int] = None,
                        export_subsets: bool = False, export_priors: bool = False,
                        capacity: Optional[float] = None,
                        stream=None, start=None, tokenizer=None,
                        spellings: str = "canonical", attributes=None) -> CompiledConstraints:
    """Compiles a constraint set.

    Runs the frontend (sequences, graph, IR or text catalogue -> IR), the
    pass pipeline and lowering (IR -> plan and tables).

    Parameters
    ----------
    constraints : int array (N, L), iterable of int sequences, Automaton, networkx.DiGraph, Shards or sequence of str
        A 2-D int array (N, L), an iterable of int sequences, an
        `Automaton`, an acyclic `networkx.DiGraph` (see graph_frontend),
        `Shards` (a partitioned build), or, with `tokenizer`, a sequence of
        str (a text catalogue, see static_compiler.frontend.text).
    vocab_size : int, optional
        V; tokens must lie in [0, V). Required, except for names with a
        tokenizer that knows its vocabulary (a tokenizers / transformers
        tokenizer or a tokenizer.json: its length, added tokens included);
        a vocab_size given there must be at least the tokenizer's (the
        model's, padded vocabulary: logits wider than V are accepted).
    end_token : int, optional
        Token ending variable-length sequences (required when sequence
        lengths differ; for names, default the tokenizer's eos).
    pipeline : str, optional
        Pass pipeline spec; default `pipeline.DEFAULT_PIPELINE`.
    print_ir_after_all : bool
        Print the IR after every pass to `stream` (stderr).
    verify_each : bool
        Run the IR verifier after every pass.
    export_beam_sizes : tuple of int or of int sequences
        The beam sizes `save` exports a beam_step module for (each >= 1),
        and beam schedules (one width per step, e.g. (16, 32, 64, 64)),
        exported as the init and step modules their steps run, so that a
        served artifact's `beam_search(beam_size=schedule)` runs them.
    export_tokens_per_beam : int, optional
        The tokens_per_beam `save` exports beam_step with.
    export_subsets : bool
        `save` also exports item subsets (the item index and a subset
        variant of beam_step, mask and advance), for
        `serving.Artifact.subset`; the set must allow subsets (sequence
        input, no `minimize`).
    export_priors : bool
        `save` also exports each step module's item-prior variant, for
        `serving.Artifact.prior` (needs export_subsets).
    capacity : float, optional
        Room for items added later by `update(add=...)`, as a growth
        factor (1.25: 25 % more states at every depth, 25 % wider slices):
        the tables are padded to it, so additions that fit keep every shape
        and nothing recompiles (see passes.reserve_capacity). None
        (default) reserves nothing: each addition compiles anew.
    stream : text file, optional
        Where `print_ir_after_all` writes (default sys.stderr).
    start : hashable, optional
        Graph input only: the start node (default: the node whose
        ``start`` attribute is true).
    tokenizer : callable, tokenizer or path, optional
        For names: a callable str -> list of token ids, a
        `tokenizers.Tokenizer`, a `transformers` tokenizer, the path (str
        or os.PathLike) of a tokenizer.json (as the CLI's --tokenizer), or
        an adapter (static_compiler.frontend.text); the result keeps the
        names (`names`, `texts`).
    spellings : {"canonical", "any"}
        Names only: "canonical" (default) holds each name's own encoding;
        "any" every token sequence that spells a name's bytes, as grammar
        engines allow (static_compiler.frontend.spellings: no item index,
        no names table, tens of times the states).
    attributes : mapping of str to int, float, bool or str array (N,), optional
        Item attributes: one column per name (an identifier, not a word of
        the filter grammar), one value per input row: ints, floats, bools
        or strings (a category column); kept with the item index
        (`attributes`, saved with export_subsets=True), appended to by
        `update(add=..., attributes=...)`. Sequence input only (token
        sequences, names, `Shards`).

    Returns
    -------
    CompiledConstraints
        The compiled set: its IR, its plan and tables (`lowered`), how it
        was built (`build`: pipeline, timings, frontend_stats) and what
        `save` exports (`export_options`).

    Raises
    ------
    ConstraintSetError
        For a bad set (or names without a tokenizer, `start` without graph
        input, an `Automaton` with another vocab_size or end_token,
        attributes without sequence input); AttributeColumnError, naming
        the column, for a malformed attribute.
    PipelineError
        For a bad pipeline or a failing pass.
    MemoryBudgetError
        When no layout fits the budget (choose-layout's memory-budget; the
        message gives a value to try). A partitioned build (`Shards`)
        checks it as each partition is built and stops at the first that
        proves it too small, before building the rest.
    DecodeInputError
        For bad `export_beam_sizes`.

    Examples
    --------
    >>> import numpy as np
    >>> import static_compiler as sc
    >>> compiled = sc.compile_constraints(np.array([[1, 2], [1, 3], [2, 3]]), vocab_size=4)
    >>> compiled.max_length, compiled.outline.num_states
    (2, 6)
    """
    spec = pipeline if pipeline is not None else pipeline_lib.DEFAULT_PIPELINE
    passes = pipeline_lib.parse_pipeline(spec)
    if capacity is not None:
        passes = pipeline_lib.with_capacity(passes, capacity)
    export = ExportOptions(beam_sizes=check_export_beam_sizes(export_beam_sizes),
                           tokens_per_beam=export_tokens_per_beam,
                           subsets=bool(export_subsets), priors=bool(export_priors))
    t0 = time.perf_counter()
    with inputs.read_input(constraints, vocab_size, end_token=end_token, start=start,
                           tokenizer=tokenizer, spellings=spellings,
                           export_subsets=export_subsets,
                           check_tables=pipeline_lib.partial_budget_check(passes)) as front:
        timings = [("frontend", time.perf_counter() - t0)]
        build = BuildInfo(pipeline=pipeline_lib.format_pipeline(passes),
                          frontend_stats=front.stats)
        return _compiled(front, passes, timings, build, export,
                         print_ir_after_all=print_ir_after_all, verify_each=verify_each,
                         stream=stream if stream is not None else sys.stderr,
                         attributes=attributes)


def _compiled(front: inputs.FrontendOutput, passes, timings: list, build: BuildInfo,
              export: ExportOptions, *,
              print_ir_after_all: bool, verify_each: bool, stream,
              attributes=None) -> CompiledConstraints:
    """The one path from the frontend's output, whatever the input kind:
    the passes, then lowering (a partitioned build whose passes only choose
    layouts is lowered piece by piece: `_compiled_from_pieces`)."""
    if front.ir is None:
        if not print_ir_after_all and all(p.layout_only or p.name == "verify" for p in passes):
            assert front.files is not None  # (a partitioned build's merged layers)
            return _compiled_from_pieces(front.built, front.files, passes, timings, build,
                                         export, attributes)
        front = front.merged()  # passes that read the arrays (minimize, printing the IR)
    assert front.ir is not None
    items = _with_attributes(front.items, attributes)  # (checked before the passes run)
    if print_ir_after_all:
        stream.write(f"// ----- IR after {front.origin} -----\n" + front.ir.to_text())
    ir = pipeline_lib.run_pipeline(front.ir, passes, verify_each=verify_each,
                                   print_ir_after_all=print_ir_after_all, stream=stream,
                                   timings=timings)
    t0 = time.perf_counter()
    plan, tables = lower(ir)
    timings.append(("lower", time.perf_counter() - t0))
    if export.subsets:
        subsets.check_subsettable(ir, items, "export_subsets=True")
    return CompiledConstraints(Lowered(plan, tables),
                               dataclasses.replace(build, timings=tuple(timings)), export,
                               names=front.names, items=items, _held_ir=ir)


def _with_attributes(items, attributes):
    """`items` (an `ItemIndex` or None) with the attribute columns
    `attributes` (checked: `items.attributes.checked_attributes`)."""
    if attributes is None:
        return items
    if items is None:
        raise ConstraintSetError("attributes=...: item attributes need sequence input (token "
                                 "sequences, names or Shards: its rows are the items); this "
                                 "input (a graph, an Automaton, spellings='any') has no items")
    return dataclasses.replace(items, attributes=checked_attributes(
        attributes, items.num_items, "compile_constraints(attributes=...)"))


def _compiled_from_pieces(built, files: ArrayFiles, passes, timings: list, build: BuildInfo,
                          export: ExportOptions, attributes=None) -> CompiledConstraints:
    """A partitioned build compiled without its merged trie: the layout
    passes plan over the partitions' summed summaries (each part was
    verified where it was built), then every layer is lowered piece by
    piece into memory-mapped table files (`target.lowering.lower_pieces`); the
    IR is read back from the tables only when asked for."""
    planned = pipeline_lib.run_pipeline(built.summary, passes, verify_each=False,
                                        timings=timings)
    t0 = time.perf_counter()
    plan, tables = lower_pieces(planned, built.pieces, files.writer)
    items = _with_attributes(built.items(files), attributes)
    timings.append(("lower", time.perf_counter() - t0))
    built.say(f"lowered: {tables_nbytes(tables) / 2**20:.1f} MiB of tables and "
              f"{items.row_item.nbytes / 2**20:.1f} MiB of item index written, "
              f"{timings[-1][1]:.1f} s")
    if export.subsets:
        subsets.check_subsettable(planned, items, "export_subsets=True")
    return CompiledConstraints(Lowered(plan, tables),
                               dataclasses.replace(build, timings=tuple(timings)), export,
                               items=items, _summary=planned)


def _check_compiled(compiled, where: str) -> None:
    """DecodeInputError unless `compiled` is a CompiledConstraints."""
    if not isinstance(compiled, CompiledConstraints):
        raise DecodeInputError(f"{where}: compiled={str(compiled)[:60]!r} is a "
                               f"{type(compiled).__name__}, expected a CompiledConstraints "
                               "(sc.compile_constraints, sc.load)")


def beam_search(compiled: CompiledConstraints, logits_fn, *, batch_size: int, beam_size: int,
                subset: Optional[subsets.Subset] = None, subset_index=None, **options):
    """Constrained beam search over `compiled`.

    Options and semantics as `static_compiler.backend.decode.beam_search`
    (tokens_per_beam, start_token, carry, carry_axes, reorder, params,
    length_penalty, return_carry), summarized below. B = batch_size,
    M = beam_size (its last width for a schedule), V = `compiled.vocab_size`,
    T = `compiled.max_length`.

    Parameters
    ----------
    compiled : CompiledConstraints
        The set to decode over.
    logits_fn : callable
        ``(last_tokens int32 (B, M), step, carry) -> (logits float32
        (B, M, V), carry)``, or ``(params, last_tokens, step, carry)`` when
        `params` is given. step is an int32 scalar, traced inside the loops
        that run runs of similar steps: use it in jnp code, never in Python
        control flow. The returned carry keeps the carry's structure,
        shapes and dtypes. Logits of another float dtype (bfloat16) are
        read as float32.
    batch_size : int
        B >= 1.
    beam_size : int or sequence of int
        M >= 1, the beams kept after every step; or a beam schedule, one
        width per step (T ints >= 1, e.g. (16, 32, 64, 64)): step t keeps
        its best beam_size[t] candidates, the model at step t >= 1 sees the
        beam_size[t - 1] beams the step before kept (and beam_size[0] at
        step 0, where the start beam alone is valid), and a declared carry
        follows (it starts with beam_size[0] beams). The semantics are the
        fixed width's step by step (docs/business-rules.md, "Beam schedules").
    subset : Subset, optional
        Decode over those items only (`compiled.subset`, `stack_subsets`),
        exactly as over a set compiled from them (default: the items this
        version has not removed).
    subset_index : int array (B,), optional
        With stacked subsets, each row's subset.
    **options
        tokens_per_beam (None, an int: the most children each beam
        contributes from step 1 on, or one entry per step); start_token (an
        int or ints (B,)); carry (the model's state, any pytree);
        carry_axes (which axis of each carry leaf holds the beams, a pytree
        prefix of carry like jax.vmap's in_axes: an int for beams flattened
        as B*M, `BeamAxis(a, split=True)` for (B, M) on axes a, a + 1, or
        None; declared leaves are reordered by each step's parent beams; a
        carry with leaves must be declared, or `reorder` given, unless
        beam_size is 1); reorder (instead of carry_axes, ``fn(carry,
        parent int32 (B, M)) -> carry``); params (passed to logits_fn as a
        traced argument: new values of the same shapes reuse the compiled
        search); length_penalty (GNMT exponent for re-ranking the final
        beams, 0: off); return_carry (also return the final carry); prior
        (`compiled.prior(column, weight=...)`: item priors; the final
        scores are log-probability plus weight x prior).

    Returns
    -------
    DecodeResult or (DecodeResult, carry)
        tokens int32 (B, M, T), scores float32 (B, M), valid bool (B, M),
        lengths int32 (B, M); with return_carry=True also the final carry
        (with an end token, decoding stops once every valid beam has ended,
        so the model ran for fewer steps).

    Raises
    ------
    DecodeInputError
        For bad arguments: sizes, start tokens, carry axes, a subset of
        another set, a subset_index without a subset or of the wrong shape
        or range.
    """
    _check_compiled(compiled, "beam_search")
    return beam_search_over(compiled, logits_fn, batch_size, beam_size, subset, subset_index,
                            options)


def greedy_decode(compiled: CompiledConstraints, logits_fn, *, batch_size: int,
                  subset: Optional[subsets.Subset] = None, subset_index=None, **options):
    """Greedy constrained decoding: the most likely valid token at every step.

    Beam search with one beam (so the carry needs no beam axes); see
    backend.decode.greedy_decode. B = batch_size, V = `compiled.vocab_size`,
    T = `compiled.max_length`.

    Parameters
    ----------
    compiled : CompiledConstraints
        The set to decode over.
    logits_fn : callable
        ``(last_tokens int32 (B, 1), step, carry) -> (logits float32
        (B, 1, V), carry)`` (or with `params` first), as in `beam_search`.
    batch_size : int
        B >= 1.
    subset, subset_index : Subset, int array (B,), optional
        As in `beam_search`.
    **options
        start_token, carry, params, return_carry, as in `beam_search`.

    Returns
    -------
    DecodeResult or (DecodeResult, carry)
        tokens int32 (B, 1, T), scores float32 (B, 1), valid bool (B, 1),
        lengths int32 (B, 1); with return_carry=True also the final carry.

    Raises
    ------
    DecodeInputError
        For bad arguments, as in `beam_search`.
    """
    _check_compiled(compiled, "greedy_decode")
    return decode_over(compiled, decode.greedy_decode, "greedy_decode", (logits_fn,),
                       batch_size, subset, subset_index, options)


def sample(compiled: CompiledConstraints, logits_fn, key, *, batch_size: int,
           subset: Optional[subsets.Subset] = None, subset_index=None, **options):
    """Constrained sampling: one sequence per batch row.

    See backend.decode.sample: at each step the valid tokens'
    log-probabilities (log_softmax over the full vocabulary) are divided by
    `temperature`, optionally restricted to the `top_k` best, and one is
    drawn. Scores are the summed (untempered) log-probabilities. B =
    batch_size, V = `compiled.vocab_size`, T = `compiled.max_length`.

    Parameters
    ----------
    compiled : CompiledConstraints
        The set to sample from.
    logits_fn : callable
        As in `greedy_decode`: ``(last_tokens int32 (B, 1), step, carry) ->
        (logits float32 (B, 1, V), carry)``; step is an int32 scalar,
        traced inside the loops that run runs of similar steps, and the
        carry keeps its shapes (no `params`).
    key : jax PRNG key
        A typed key array of shape (), or raw key data uint32 (2,)
        (`jax.random.PRNGKey`).
    batch_size : int
        B >= 1.
    subset, subset_index : Subset, int array (B,), optional
        As in `beam_search`.
    **options
        temperature (a float > 0, default 1.0), top_k (an int >= 1, or
        None), start_token, carry.

    Returns
    -------
    DecodeResult
        With a beam axis of size 1: tokens int32 (B, 1, T), scores float32
        (B, 1), valid bool (B, 1), lengths int32 (B, 1).

    Raises
    ------
    DecodeInputError
        For bad arguments (a temperature, top_k or key out of range, and
        as in `beam_search`).
    """
    _check_compiled(compiled, "sample")
    return decode_over(compiled, decode.sample, "sample", (logits_fn, key), batch_size,
                       subset, subset_index, options)
