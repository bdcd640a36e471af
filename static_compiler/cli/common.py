"""What the subcommand modules share: the `Subcommand` row, reading an input
file with the flags that go with it, the library's messages in the CLI's
terms, and progress logging."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import threading
import time
from typing import Callable, Optional

from static_compiler.errors import (
    ArtifactExistsError,
    CliInputError,
    ConstraintSetError,
    DecodeInputError,
    PipelineError,
    installed,
)

INPUT_FORMATS = ("a .npy (N, L) int array (variable-length rows padded with -1), .jsonl (one "
                 "JSON list of token ids per line), an IR text dump, or text (one "
                 "space-separated sequence per line); with --tokenizer a catalogue of names: "
                 "text (one name per line) or .jsonl (one JSON string, or object with a "
                 "\"name\", per line)")
"""The input formats of every command that reads a set (`compile`,
`show-ir`, `verify --input`): their help shares this text."""


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name, one-line help, and two functions.
    `run(args)` returns the process exit status. `compiles`: the command
    runs XLA programs, so it takes --no-compilation-cache and runs with
    jax's persistent compilation cache on by default (`compilation_cache_help`)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    compiles: bool = False


def add_cache_argument(parser: argparse.ArgumentParser) -> None:
    """--no-compilation-cache, with the cache's directory in its help."""
    from static_compiler.jax_support import compilation_cache as cc

    parser.add_argument(
        "--no-compilation-cache", action="store_true",
        help=f"do not use jax's persistent compilation cache (default: on, in "
             f"{cc.default_cache_dir()}, or ${cc.CACHE_DIR_ENV}; ${cc.NO_CACHE_ENV}=1 also "
             "turns it off): a program an earlier run compiled is read from there instead of "
             "compiled again. The cache holds executables: keep it private to this user")


def add_keep_versions_argument(parser: argparse.ArgumentParser) -> None:
    """--keep-versions K: how many replaced versions a writer keeps
    (`artifact.history.keep_count`: default $STATIC_COMPILER_KEEP_VERSIONS,
    else 5; 0 keeps none)."""
    parser.add_argument("--keep-versions", type=int, default=None, metavar="K",
                        help="how many replaced versions to keep for rollback in .ART.versions/ "
                             "(default $STATIC_COMPILER_KEEP_VERSIONS, else 5; 0 keeps none; "
                             "each costs disk: see docs/serving.md#versions-and-rollback)")


def start_compilation_cache(args: argparse.Namespace, stream) -> Optional[str]:
    """Turns jax's persistent cache on for a command unless
    --no-compilation-cache or $STATIC_COMPILER_NO_CACHE say not to; returns
    its directory, or None when off. A directory that cannot be used is
    warned about on `stream` and the command runs without the cache."""
    from static_compiler.errors import CompilationCacheError
    from static_compiler.jax_support import compilation_cache as cc

    if getattr(args, "no_compilation_cache", False) or cc.disabled_by_environment():
        return None
    if not installed("jax"):  # nothing compiles (the command says why)
        return None
    try:
        return cc.enable_compilation_cache()
    except CompilationCacheError as err:
        stream.write(f"warning: running without the compilation cache: {err} (set "
                     f"{cc.CACHE_DIR_ENV}=DIR, or {cc.NO_CACHE_ENV}=1 to silence this)\n")
        return None


TORCH_INSTEAD = ("without jax, compile and save with `static-compiler compile INPUT -o ART`, "
                 "then decode with static_compiler.torch_backend.TorchConstraints.load(ART)")
"""What a command that needs jax suggests to a user without it."""


def require_jax(command: str, why: str) -> None:
    """MissingDependencyError (one line on the CLI, exit status 2) naming
    `static-compiler COMMAND`, `why` it needs jax, the install command and the
    torch route, when jax is not installed; checked before anything is read
    or written."""
    from static_compiler.errors import JAX_INSTALL, require

    require("jax", f"static-compiler {command} ({why})", f"{JAX_INSTALL}; {TORCH_INSTEAD}")


def read_input(path: str, *, vocab_size: Optional[int], end_token: Optional[int]):
    """`readers.read_constraints(path)` and the vocabulary size to compile it
    with: `vocab_size` for a constraint set, the dump's own for an IR dump.

    Raises CliInputError when a constraint set comes without --vocab-size, or
    when --vocab-size / --end-token differ from an IR dump's values."""
    from static_compiler.frontend import readers
    from static_compiler.ir import Automaton

    constraints = readers.read_constraints(path)
    if not isinstance(constraints, Automaton):
        if vocab_size is None:
            raise CliInputError(f"input {path!r}: --vocab-size is required for a constraint set")
        return constraints, vocab_size
    for flag, value, own in (("--vocab-size", vocab_size, constraints.vocab_size),
                             ("--end-token", end_token, constraints.end_token)):
        if value is not None and value != own:
            raise CliInputError(f"input {path!r}: {flag} {value} differs from the dump's "
                                f"value {own}")
    return constraints, constraints.vocab_size


def beam_size_entry(text: str):
    """A beam size or schedule as the CLI writes it: "70" -> 70, and the
    widths of a beam schedule joined by "/" -> a tuple, "16/32/64/64" ->
    (16, 32, 64, 64) (an argparse type: argparse.ArgumentTypeError
    otherwise, which argparse reports with the option's name)."""
    try:
        widths = tuple(int(w) for w in text.split("/"))
    except ValueError:
        widths = ()
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a beam size (an int >= 1, e.g. 70) or a beam "
                            "schedule (one int >= 1 per step joined by '/', e.g. 16/32/64/64)")
    return widths[0] if len(widths) == 1 else widths


def parse_mesh(text: str) -> list[tuple[str, int]]:
    """--mesh NAME=SIZE[,NAME=SIZE...] as [(name, size)]; CliInputError
    naming the flag's value otherwise."""
    axes = []
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or not name.isidentifier() or not size.strip().isdigit() or int(size) < 1 \
                or name in dict(axes):
            raise CliInputError(f"--mesh {text!r}: expected NAME=SIZE[,NAME=SIZE...] with "
                                "distinct names and sizes >= 1 (e.g. d=8)")
        axes.append((name, int(size)))
    return axes


def device_mesh(axes: list, where: str):
    """A `jax.sharding.Mesh` of this process's first devices with `axes`
    [(name, size)]; CliInputError when there are too few."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    sizes = [size for _, size in axes]
    need, have = int(np.prod(sizes)), len(jax.devices())
    if need > have:
        shape = ", ".join(f"{name}: {size}" for name, size in axes)
        raise CliInputError(f"{where}: a mesh {{{shape}}} needs {need} devices, this process has "
                            f"{have} (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count="
                            f"{need})")
    return Mesh(np.array(jax.devices()[:need]).reshape(sizes), tuple(name for name, _ in axes))


@contextlib.contextmanager
def progress(what: str, stream, after: float = 3.0, every: float = 5.0):
    """Logs `[what] still running, N s` to `stream` for work lasting more
    than `after` seconds, then every `every` seconds, and the total at the end."""
    start = time.perf_counter()
    done = threading.Event()

    def tick():
        wait = after
        while not done.wait(wait):
            stream.write(f"[{what}] still running, {time.perf_counter() - start:.0f} s\n")
            stream.flush()
            wait = every

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    stream.write(f"[{what}] done in {time.perf_counter() - start:.3f} s\n")


def add_input_arguments(parser: argparse.ArgumentParser, input_help: str) -> None:
    """INPUT and --tokenizer, which every command reading a set takes."""
    parser.add_argument("input", help=input_help)
    parser.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON",
                        help="a tokenizers JSON file (tokenizer.json): INPUT is then a "
                             "catalogue of names (text, one per line, or .jsonl), encoded "
                             "without special tokens (needs the 'tokenizers' package)")


def read_any_input(path: str, *, vocab_size: Optional[int], end_token: Optional[int],
                   tokenizer: Optional[str]):
    """(constraints, vocab size, tokenizer adapter or None): a text catalogue
    and its tokenizer when `tokenizer` (a tokenizers JSON file, read by the
    library's loader) is given, with the tokenizer's vocabulary size when
    --vocab-size is not (`text.catalogue_vocab_size`), else `read_input`'s
    constraint set."""
    if tokenizer is None:
        return (*read_input(path, vocab_size=vocab_size, end_token=end_token), None)
    from static_compiler.frontend import readers, text

    adapter = text.as_adapter(tokenizer)
    return readers.read_names(path), text.catalogue_vocab_size(vocab_size, adapter), adapter


def read_attributes(path: str, flag: str = "--attributes") -> dict:
    """{name: array} of the .npz file at `path` (no pickled objects): item
    attributes, each array a column named by its key (`compile
    --attributes`, and the added rows' values for `update --attributes`)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as columns:
            return {name: columns[name] for name in columns.files}
    except (OSError, ValueError) as e:
        raise CliInputError(f"{flag} {path!r}: not a readable .npz file of arrays "
                            f"({e})") from None


FLAGS = {
    "end_token": ("--end-token", "E"),
    "vocab_size": ("--vocab-size", "V"),
    "export_beam_sizes": ("--beam-sizes", "M,..."),
    "export_tokens_per_beam": ("--tokens-per-beam", "K"),
    "export_subsets": ("--export-subsets", None),
    "export_priors": ("--export-priors", None),
    "capacity": ("--capacity", "GROWTH"),
    "spellings": ("--spellings", "canonical|any"),
    "tokenizer": ("--tokenizer", "TOKENIZER_JSON"),
    "beam_size": ("--beam-size", "M"),
    "batch_size": ("--batch-size", "B"),
    "overwrite": ("--force", None),
    "add": ("--add", "FILE"),
    "remove": ("--remove", "FILE"),
    "attributes": ("--attributes", "FILE.npz"),
    "where": ("--where", "EXPR"),
}
"""The library's parameters that a CLI flag sets: {parameter: (flag, its
metavar, None for a switch)}, for `in_cli_terms`."""

_WORDED = (ConstraintSetError, PipelineError, DecodeInputError, ArtifactExistsError)
"""Errors about the arguments of a call, which the CLI's flags made; the
others describe a file's contents (an IR dump, a manifest) in its own terms."""


def in_cli_terms(error: Exception) -> str:
    """`error`'s message with the library's parameters named as the CLI's
    flags (`FLAGS`): "pass end_token=..." becomes "pass --end-token E",
    "export_subsets=True" "--export-subsets", "end_token=9:" "--end-token
    9:", a bare "export_subsets" "--export-subsets", and the advice to read
    names with `read_names` the --tokenizer flag."""
    from static_compiler.frontend import readers

    message = str(error)
    if not isinstance(error, _WORDED):
        return message
    message = message.replace(readers.NAMES_HINT,
                              "a file of names is compiled with --tokenizer TOKENIZER_JSON")
    return _PARAMETER.sub(_flag, message)


_PARAMETER = re.compile(r"(?<![\w./'-])(" + "|".join(FLAGS) + r")"
                        r"(?:=(\.\.\.|'([^']*)'|[^\s,:;)(\[\]]+))?(?![\w=])")
"""A parameter of `FLAGS`, alone or with "=..." / "=VALUE" (not part of a
longer name, an attribute or a quoted path: 'out/end_token.npy')."""


def _flag(match: re.Match) -> str:
    name, value, quoted = match.group(1), match.group(2), match.group(3)
    flag, metavar = FLAGS[name]
    if value is None:  # a bare word: only an identifier with "_" is surely the parameter
        return flag if "_" in name else match.group(0)
    if metavar is None:  # a switch: "export_subsets=True"
        return flag if value in ("True", "...") else match.group(0)
    return f"{flag} {metavar if value == '...' else quoted if quoted is not None else value}"
