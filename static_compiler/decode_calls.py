"""The decode drivers run over a compiled set: what `compiler.beam_search`,
`greedy_decode`, `sample` and the set's own `beam_search` method share
(the options checked against the backend driver, the row counts, the live
mask of a subset, the removal-aware program, the compile counting). Below
both: the method calls it without going through the module functions."""

from __future__ import annotations

import inspect

from static_compiler.backend import decode
from static_compiler.errors import DecodeInputError
from static_compiler.support.arguments import check_beam_schedule, check_rows

SET_BY_FRONT_DOOR = ("batch_size", "beam_size", "subset", "also_compile")
"""The backend drivers' keyword options the front door sets itself."""


def check_options(decoder, options: dict, where: str) -> None:
    """DecodeInputError unless every name in `options` is a keyword option
    of the backend `decoder` (not one the front door sets itself), named
    with the options there are."""
    known = [name for name, p in inspect.signature(decoder).parameters.items()
             if p.kind == p.KEYWORD_ONLY and name not in SET_BY_FRONT_DOOR]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DecodeInputError(f"{where}: unknown option(s) {unknown}: expected some of {known}")


def decode_over(compiled, decoder, where: str, args: tuple, batch_size: int, subset,
                subset_index, options: dict, **sizes):
    """Checks `options` against `decoder` (a `backend.decode` driver) and
    the row counts (batch_size and `sizes`, e.g. beam_size), then runs it
    over `compiled`'s plan and device tables with `args` (logits_fn, and
    sample's key) and the live mask of `subset` / `subset_index`, also
    compiling the removal-aware program (`_removal_program`); its
    compilations count in `compiled.compilations()`."""
    check_options(decoder, options, where)
    # before the subset index is read against batch_size
    if "beam_size" in sizes:
        check_beam_schedule(sizes["beam_size"], compiled.max_length, batch_size)
    else:
        check_rows(batch_size)
    live = compiled._live(subset, subset_index, batch_size, where)
    with compiled._counting():
        return decoder(compiled.plan, compiled.lowered.device_tables, *args, batch_size=batch_size,
                       subset=live, also_compile=compiled._removal_program(live, batch_size),
                       **sizes, **options)


def beam_search_over(compiled, logits_fn, batch_size: int, beam_size, subset, subset_index,
                     options: dict):
    """`compiler.beam_search` of `compiled` (see there): item priors read
    as the set's live prior, then `decode_over`."""
    if options.get("prior") is not None:
        options = dict(options, prior=compiled._ranking(options["prior"], "beam_search"))
    return decode_over(compiled, decode.beam_search, "beam_search", (logits_fn,), batch_size,
                       subset, subset_index, options, beam_size=beam_size)
