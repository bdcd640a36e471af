"""Typed errors raised by every public entry point.

Each error message names the offending value, what was expected and where it
was found, so a user can fix the input without reading our code.
"""


# The base class, DecodeInputError and the artifact errors are defined in
# `serving` (which may import nothing else of ours) and re-exported here: one
# class hierarchy, no import cycle.
from static_compiler.serving import (ArtifactChecksumError, ArtifactError,  # noqa: F401
                                     ArtifactExistsError, ArtifactFormatError,
                                     ArtifactVersionError, DecodeInputError,
                                     StaticCompilerError)


class ConstraintSetError(StaticCompilerError, ValueError):
    """The constraint set given to the frontend is malformed (empty, ragged
    without an end token, token out of range, wrong dtype, ...)."""


class IRVerificationError(StaticCompilerError, ValueError):
    """An automaton IR violates an invariant (see `ir.verify`)."""


class IRParseError(StaticCompilerError, ValueError):
    """An IR text dump could not be parsed back."""


class PipelineError(StaticCompilerError, ValueError):
    """A pipeline spec is malformed, names an unknown pass or option, gives an
    option of the wrong type, or a pass failed while running."""


class MemoryBudgetError(PipelineError):
    """No layout fits the memory budget; the message says what the smallest
    layout needs."""
