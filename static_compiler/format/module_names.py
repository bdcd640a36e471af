"""Module names and kinds of an artifact's exported modules: the kinds
(`STEP_KINDS`, `BEAM_MODULE_KINDS` ...), a module's name from its kind,
beam sizes and variant (`beam_module_name`, `step_module_name`,
`subset_module_name`, `ranked_module_name`) and back
(`parse_beam_module_name`), the modules a set of export beam sizes needs
(`beam_modules`). `format.spec` re-exports them.
"""

from __future__ import annotations

from typing import Optional

RESIZE_KINDS = ("beam_resize", "beam_resize_subset", "beam_resize_prior",
                "beam_resize_prior_subset", "beam_resize_ranked", "beam_resize_prior_ranked")
"""Module kinds of one beam-search step from M beams that keeps W != M."""


STEP_KINDS = ("beam_step", "beam_step_subset", "beam_step_prior", "beam_step_prior_subset",
              "beam_step_ranked", "beam_step_prior_ranked") + RESIZE_KINDS
"""Module kinds that record the per-step caps they apply: one beam-search
step, with item subsets (``_subset``), ranked subsets (``_ranked``, format
version 16) and item priors (``_prior``)."""


PRIOR_KINDS = tuple(kind for kind in STEP_KINDS if "_prior" in kind)
"""Step kinds that take item priors (compile_constraints(export_priors=True))."""


BEAM_MODULE_KINDS = ("init",) + STEP_KINDS
"""Module kinds exported once per beam size, named ``{kind}_m{M}``; the
resize kinds once per (M, W) a beam schedule steps through, named
``{kind}_m{M}_to{W}`` (`RESIZE_KINDS`)."""


def beam_module_name(kind: str, beam_size: int, beam_size_out: Optional[int] = None) -> str:
    """``{kind}_m{beam_size}``: the name of a per-beam-size module;
    ``{kind}_m{beam_size}_to{beam_size_out}`` for a resize kind."""
    return f"{kind}_m{beam_size}" if beam_size_out is None else \
        f"{kind}_m{beam_size}_to{beam_size_out}"


def parse_beam_module_name(name: str) -> tuple[str, Optional[int], Optional[int]]:
    """(kind, beam_size, beam_size_out) of a module name (`beam_module_name`;
    beam_size_out None but for resize kinds, both None for mask / advance)."""
    kind, sep, beams = name.rpartition("_m")
    if not sep or kind not in BEAM_MODULE_KINDS:
        return name, None, None
    m_in, _, m_out = beams.partition("_to")
    return kind, int(m_in), int(m_out) if m_out else None


def step_module_name(beam_size: int, beam_size_out: int, subset=False,
                     prior: bool = False) -> str:
    """The module of one beam-search step from beam_size beams keeping
    beam_size_out: ``beam_step_m{M}`` (the same width) or
    ``beam_resize_m{M}_to{W}``; its item-prior variant with `prior`
    (``beam_step_prior_m{M}``), item-subset variant with `subset` True or
    "subset", ranked-subset variant with `subset` "ranked"."""
    kind = ("beam_step" if beam_size == beam_size_out else "beam_resize") + \
        ("_prior" if prior else "")
    name = beam_module_name(kind, beam_size,
                            None if beam_size == beam_size_out else beam_size_out)
    if subset == "ranked":
        return ranked_module_name(name)
    return subset_module_name(name) if subset else name


def beam_modules(export_beam_sizes) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """(widths with an init module, (M, W) pairs with a step module), sorted,
    for export_beam_sizes (`arguments.check_export_beam_sizes`: ints and
    beam schedules, which start from the start beam alone: init_m1). Every
    width with a beam_step module has its init too (a beam size M is usable
    alone, as format version 1 has it)."""
    inits, steps = set(), set()
    for entry in export_beam_sizes:
        widths = (entry, entry) if isinstance(entry, int) else (1,) + tuple(entry)
        inits.add(widths[0])
        steps.update(zip(widths[:-1], widths[1:]))
    inits.update(m for m, w in steps if m == w)
    return tuple(sorted(inits)), tuple(sorted(steps))


def subset_module_name(name: str) -> str:
    """The name of module `name`'s item-subset variant: ``mask_subset``,
    ``beam_step_subset_m{M}``."""
    kind, sep, beams = name.rpartition("_m")
    return f"{kind}_subset_m{beams}" if sep and kind in BEAM_MODULE_KINDS else f"{name}_subset"


def ranked_module_name(name: str) -> str:
    """The name of module `name`'s ranked-subset variant (format version
    16): ``mask_ranked``, ``beam_step_ranked_m{M}``."""
    kind, sep, beams = name.rpartition("_m")
    return f"{kind}_ranked_m{beams}" if sep and kind in BEAM_MODULE_KINDS else f"{name}_ranked"


RANKED_MODULES_VERSION = 16
"""The format version that added the ``_ranked`` modules (a `static-compiler
re-export` of a version 15 artifact adds them and writes this version:
nothing else changed)."""


def is_ranked_module(name: str) -> bool:
    """Whether module `name` is a ranked-subset variant (`ranked_module_name`)."""
    kind, _, _ = parse_beam_module_name(name)
    return kind.endswith("_ranked")
