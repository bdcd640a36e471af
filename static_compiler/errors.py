"""Every error class this package raises on purpose.

The root of the import graph: this module imports nothing but the standard
library, so every other module (the serving loader included) can import it
without pulling in jax or the compiler. Each error message names the offending
value, what was expected and where it was found, so a user can fix the input
without reading our code. `except StaticCompilerError` catches them all.
"""


class StaticCompilerError(Exception):
    """Base class of every error this package raises on purpose."""


# The environment.

class MissingDependencyError(StaticCompilerError, ImportError):
    """A package this operation needs is not installed; the message names the
    package, what needs it, and the command that installs it."""


JAX_INSTALL = "pip install 'static-compiler[jax]'"
"""The install command of the JAX decoders and exported modules (the
compiler, artifacts' tables and the torch backend need no jax)."""


def installed(module: str) -> bool:
    """Whether the package `module` can be imported (without importing it)."""
    import importlib.util
    return importlib.util.find_spec(module) is not None


def require(module: str, purpose: str, install: str):
    """The module `module`, imported; raises MissingDependencyError naming it,
    `purpose` (what needs it) and `install` (the pip command) when it is not
    installed. An import error raised inside an installed package (a broken
    install) is passed on as it is."""
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != module.split(".")[0]:
            raise
        raise MissingDependencyError(f"{purpose} needs the {module.split('.')[0]!r} package, "
                                     f"which is not installed: {install}") from None


# Input to the compiler.

class ConstraintSetError(StaticCompilerError, ValueError):
    """The constraint set given to the frontend is malformed (empty, ragged
    without an end token, token out of range, wrong dtype, ...)."""


class AttributeColumnError(ConstraintSetError):
    """An item attribute column is malformed (wrong length, NaN in an
    integer column, mixed types, a bad name), or an addition lacks one; the
    message names the column."""


class FilterExpressionError(ConstraintSetError):
    """A filter expression (`subset(where=...)`) does not parse, or does not
    fit the set's attributes and masks (unknown name, a comparison its
    column's kind has no meaning for); the message names the position and
    the attribute."""


class IRVerificationError(StaticCompilerError, ValueError):
    """An automaton IR violates an invariant (see `ir.verify`)."""


class IRParseError(StaticCompilerError, ValueError):
    """An IR text dump could not be parsed back."""


class PipelineError(StaticCompilerError, ValueError):
    """A pipeline spec is malformed, names an unknown pass or option, gives an
    option of the wrong type, or a pass failed while running."""


class BuildError(StaticCompilerError, RuntimeError):
    """A task of a partitioned build failed (its worker died, or it raised);
    the message names the partition."""


class MemoryBudgetError(PipelineError):
    """No layout fits the memory budget; the message says what the smallest
    layout needs."""


# Decoding.

class DecodeInputError(StaticCompilerError, ValueError):
    """Arguments of a decoding entry point have the wrong shape, dtype or value."""


# Saved artifacts.

class ArtifactError(StaticCompilerError):
    """Base class of problems with a saved artifact."""


class ArtifactFormatError(ArtifactError, ValueError):
    """The artifact is structurally wrong: missing or extra files, a manifest
    that is not JSON, a truncated module."""


class ArtifactChecksumError(ArtifactError, ValueError):
    """A file's sha256 or size does not match the manifest (corruption)."""


class ArtifactVersionError(ArtifactError, ValueError):
    """The artifact's format version, or its jax.export calling-convention
    version, is outside the range this reader supports, or its modules were
    exported by a JAX this one cannot read (`static-compiler re-export`)."""


class ArtifactExpiryWarning(UserWarning):
    """An artifact's modules near (or passed) the end of jax.export's
    backward-compatibility window: newer JAX releases may refuse them
    (`static-compiler re-export` renews them)."""


class ArtifactExistsError(ArtifactError, FileExistsError):
    """Saving would replace an existing artifact and `overwrite` was not set."""


class ArtifactBusyError(ArtifactError, BlockingIOError):
    """Another process is updating the artifact (its lock is held)."""


# Reports and applications.

class ReportInputError(StaticCompilerError, ValueError):
    """A report was asked for something the automaton does not have (a layer
    index out of range, an object that is not an automaton)."""


class CliInputError(StaticCompilerError, ValueError):
    """A command-line argument is wrong (missing file, unknown extension, ...)."""


class MainJobError(StaticCompilerError, RuntimeError):
    """The fresh serving process failed, or imported more than the loader."""


class CompilationCacheError(StaticCompilerError, OSError):
    """The persistent compilation cache's directory cannot be used (not a
    directory, not writable, not readable)."""
