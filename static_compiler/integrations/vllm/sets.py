"""The sets a vLLM engine constrains to: names registered at start-up, each
artifact loaded once per version (`TorchConstraints`), and a request's
options resolved against the version current at its admission.

Registering names. ``sc_set`` takes an artifact path, or a name from

* the environment variable ``STATIC_COMPILER_VLLM_SETS="name=path,name2=path2"``
  (read on every look-up, so set it before starting ``vllm serve`` or
  ``LLM(...)``: the engine's processes inherit it), or
* `register_set(name, path)` (this process only: vLLM validates requests in
  the front-end process and runs the processor in the engine's own process,
  so a registration must happen in both; the environment variable does).

A name registered both ways takes `register_set`'s path. The sets of the
environment variable are loaded and checked (end token, vocabulary) when
the processor starts, so a wrong one stops the engine at start-up.

Versions. `SetCache.current(path)` stats the artifact's manifest.json
(through the path) on every call (no read while its stat is unchanged); when
a stat changed, it compares the manifest on disk with the version it holds
(a read of manifest.json and a stat of each file, no hashing) and loads the
new version when they differ (`TorchConstraints.reload`, checksums
verified): requests admitted after an update see it; running requests keep
the version they started with (each slot holds its own `TorchConstraints`).
Every save and update writes a new directory and manifest and swaps it in
at the path, so a new version has a new inode there (the version it
replaced, kept in the artifact's history, still holds the old one), a new
mtime or size besides: two saves in one clock tick are told apart too.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import threading
from typing import Optional

import torch

from static_compiler.errors import ArtifactError, ConstraintSetError, DecodeInputError
from static_compiler.format import snapshot
from static_compiler.format.spec import MANIFEST_FILE
from static_compiler.integrations.vllm.options import Options
from static_compiler.torch_backend import TorchConstraints
from static_compiler.torch_backend.ops import TorchState

ENV = "STATIC_COMPILER_VLLM_SETS"
"""The environment variable of the sets registered at start-up: ``name=path`` pairs
separated by commas."""

RANKED_ENV = "STATIC_COMPILER_VLLM_RANKED_FROM_ROWS"
"""The environment variable that overrides `RANKED_FROM_ROWS` (an int >= 0;
0: every filter ranked), read at each new filter."""
RANKED_FROM_ROWS = 1 << 18
"""Rows of a set from which a request's ``sc_where`` is made a ranked
subset (`TorchConstraints.ranked_subset`) instead of a `Subset`: measured
per request (`python -m tools.bench.request_filters`: made twice, one row
decoded on the CPU), a ranked filter cost 1.17x a `Subset`'s at 1e5 rows
and 0.58x, 0.34x, 0.36x at 3e5, 1e6, 1e7: from here a subset's walk up the
trie costs more than the dearer reads of a ranked one over a request's
steps (docs/integrations.md, "What to know")."""


def ranked_from_rows() -> int:
    """`RANKED_FROM_ROWS`, or the int of ``STATIC_COMPILER_VLLM_RANKED_FROM_ROWS``
    when set; DecodeInputError naming the variable for a value that is not
    an int >= 0."""
    text = os.environ.get(RANKED_ENV)
    if text is None:
        return RANKED_FROM_ROWS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise DecodeInputError(f"{RANKED_ENV}={text!r}: expected an int >= 0 (the rows of a set "
                               "from which a filter is a ranked subset)")
    return value

_REGISTERED: dict = {}
_LOCK = threading.Lock()


def register_set(name: str, path) -> None:
    """Registers `name` for ``sc_set`` in this process (see the module
    docstring for the front-end / engine split). Raises DecodeInputError for
    a name that is not a non-empty str without ``=`` or ``,``."""
    if not isinstance(name, str) or not name or "=" in name or "," in name:
        raise DecodeInputError(f"register_set: name={name!r}: expected a non-empty str "
                               "without '=' or ','")
    _REGISTERED[name] = str(path)


def registered_sets() -> dict:
    """name -> artifact path: the environment variable's, then `register_set`'s.
    Raises DecodeInputError for a malformed ``STATIC_COMPILER_VLLM_SETS``.
    (The variable's value is parsed once per value: admission looks up
    every request's name here.)"""
    text = os.environ.get(ENV, "")
    parsed = _PARSED.get(text)
    if parsed is None:
        parsed = _parse_registry(text)
        _PARSED.clear()
        _PARSED[text] = parsed
    if not _REGISTERED:
        return dict(parsed)
    return {**parsed, **_REGISTERED}


_PARSED: dict = {}


def _parse_registry(text: str) -> dict:
    found = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, eq, path = part.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise DecodeInputError(f"{ENV}: {part!r}: expected name=path pairs separated by "
                                   "commas")
        found[name.strip()] = path.strip()
    return found


def set_path(name: str) -> pathlib.Path:
    """The artifact path ``sc_set`` names: a registered name's, else `name`
    itself when it is a directory. Raises DecodeInputError otherwise."""
    names = registered_sets()
    if name in names:
        return pathlib.Path(names[name])
    if os.path.isdir(name):
        return pathlib.Path(name)
    raise DecodeInputError(f"extra_args sc_set={name!r}: expected the path of an artifact "
                           f"directory or a registered set name (registered: {sorted(names)}, "
                           f"from {ENV} or register_set)")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A request's constraint as admitted: the set's version, its subset
    (None: the version's live items), the processor state of one row after
    the prefix, and the step it is at (the prefix's length)."""

    constraints: TorchConstraints
    subset: object
    state: TorchState
    step: int


class SetCache:
    """The loaded sets of one process, on `device`: one `TorchConstraints`
    per artifact path (its newest version; older ones live on in the slots
    that use them), the requests' subsets and their resolved options (the
    last `subsets` of each kept)."""

    def __init__(self, device=None, subsets: int = 64):
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._sets: dict = {}
        self._named: dict = {}  # the path as named -> (set, stamp), for the look-up above
        self._by_options: collections.OrderedDict = collections.OrderedDict()
        self._subsets: collections.OrderedDict = collections.OrderedDict()
        self._resolved: collections.OrderedDict = collections.OrderedDict()
        self._keep = subsets

    def current(self, path) -> TorchConstraints:
        """The set at `path` as saved now: loaded on first use, reloaded
        when the manifest on disk changed (looked at only when the stat of
        the directory or its manifest changed: see the module docstring).
        Raises DecodeInputError naming the artifact's error."""
        named = str(path)
        held = self._named.get(named)
        if held is not None and held[1] is not None and _stamp(named) == held[1]:
            return held[0]  # (the stats follow links: the same directory, unchanged)
        key = os.path.realpath(path)  # (pathlib's resolve: twice the time)
        with _LOCK:
            stamp = _stamp(key)  # (before reading: a version swapped in later shows next time)
            held = self._sets.get(key)
            if held is not None and stamp is not None and held[1] == stamp:
                return held[0]
            try:
                if held is None:
                    loaded = TorchConstraints.load(key, device=self.device)
                else:
                    loaded = held[0]
                    with snapshot.open_snapshot(key, verify_checksums=False) as snap:
                        changed = snap.manifest.seal() != loaded._manifest.seal()
                    if changed:
                        loaded = loaded.reload()
            except ArtifactError as err:
                raise DecodeInputError(f"extra_args sc_set: the artifact {key!r} cannot be "
                                       f"loaded: {err}") from None
            self._sets[key] = self._named[named] = (loaded, stamp)
            return loaded

    def subset(self, constraints: TorchConstraints, options: Options):
        """The subset of `options` (sc_where or sc_subset) over this
        version, or None for neither: a filter (sc_where) over a set of
        `ranked_from_rows()` rows or more as a ranked subset (made in the time
        of its item bits: a rule per request), else, and a named subset
        (sc_subset: one rule for many requests), a `Subset`. Raises
        DecodeInputError naming the key."""
        if options.where is None and options.subset is None:
            return None
        key = (id(constraints), constraints.fingerprint, options.where, options.subset)
        with _LOCK:  # (vLLM's front end admits requests from several threads)
            found = self._subsets.get(key)
            if found is not None and found[0] is constraints:
                self._subsets.move_to_end(key)
                return found[1]
        if options.subset is not None:
            what = f"sc_subset={options.subset!r}"
            columns = constraints.attributes or {}
            column = columns.get(options.subset)
            if column is None or column.kind != "bool":
                bools = sorted(n for n, c in columns.items() if c.kind == "bool")
                raise DecodeInputError(
                    f"extra_args {what}: the set {constraints.path!s} has no named subset "
                    f"{options.subset!r}: expected one of its bool attribute columns "
                    f"{bools}" + ("" if bools else " (it has none: compile the set with a bool "
                                  "attribute, or pass sc_where)"))
            expression = options.subset
        else:
            what, expression = f"sc_where={options.where!r}", options.where
        ranked = options.where is not None and constraints.attributes is not None and \
            constraints.attributes.num_rows >= ranked_from_rows()
        try:
            subset = constraints.ranked_subset(where=expression) if ranked else \
                constraints.subset(where=expression)
        except (ConstraintSetError, DecodeInputError) as err:
            raise DecodeInputError(f"extra_args {what}: {err}") from None
        if int(subset.sizes[0]) == 0:
            raise DecodeInputError(f"extra_args {what}: selects no item of the set "
                                   f"{constraints.path!s}: expected a filter that keeps at least "
                                   "one item (an empty subset has no continuation)")
        with _LOCK:
            self._subsets[key] = (constraints, subset)
            while len(self._subsets) > self._keep:
                self._subsets.popitem(last=False)
        return subset

    def resolve(self, options: Options) -> Resolved:
        """`options` against the set's current version: its subset and the
        state after sc_prefix (kept per version, subset and prefix: the
        requests of a batch mostly share them; the state is never written
        to). Raises DecodeInputError naming the key for a set that cannot
        be loaded, a bad filter or subset, and a prefix that leaves the set
        or has no continuation there."""
        named = registered_sets().get(options.set, options.set)
        held = self._by_options.get(options)
        if held is not None and held[1] == named and _stamp(held[2]) == held[3]:
            return held[0]  # (the same set, unchanged: admission's common case)
        path = str(set_path(options.set))
        constraints = self.current(path)
        resolved = self._resolve(constraints, options)
        stamp = self._named.get(path, (None, None))[1]
        if stamp is not None and resolved.constraints is constraints:
            with _LOCK:
                self._by_options[options] = (resolved, named, path, stamp)
                while len(self._by_options) > self._keep:
                    self._by_options.popitem(last=False)
        return resolved

    def _resolve(self, constraints: TorchConstraints, options: Options) -> Resolved:
        subset = self.subset(constraints, options)
        key = (id(constraints), id(subset), options.prefix)
        with _LOCK:
            found = self._resolved.get(key)
            if found is not None and found.constraints is constraints and \
                    found.subset is subset:
                self._resolved.move_to_end(key)
                return found
        resolved = self._walk(constraints, subset, options)
        with _LOCK:
            self._resolved[key] = resolved
            while len(self._resolved) > self._keep:
                self._resolved.popitem(last=False)
        return resolved

    def _walk(self, constraints: TorchConstraints, subset, options: Options) -> Resolved:
        prefix = options.prefix
        what = f"extra_args sc_prefix={list(prefix)!r}"
        if len(prefix) > constraints.max_length:
            raise DecodeInputError(f"{what}: {len(prefix)} tokens, expected at most the set's "
                                   f"max_length {constraints.max_length}")
        if any(t >= constraints.vocab_size for t in prefix):
            raise DecodeInputError(f"{what}: expected token ids below the set's vocab_size "
                                   f"{constraints.vocab_size}")
        state = constraints.init_processor(1)
        for step, token in enumerate(prefix):
            state = constraints.advance(state, torch.tensor([token], device=self.device), step,
                                        subset=subset)
        step = len(prefix)
        if prefix and not bool(state.valid[0]):  # (admission: one host read)
            raise DecodeInputError(f"{what}: not a prefix of an item of the set "
                                   f"{constraints.path!s}" + (" in the request's subset"
                                                              if subset is not None else ""))
        if step < constraints.max_length and \
                not bool(constraints.allowed_tokens(state, step, subset=subset).any()):
            raise DecodeInputError(f"{what}: no item of the set {constraints.path!s} continues "
                                   "it" + (" in the request's subset" if subset is not None
                                           else ""))
        return Resolved(constraints, subset, state, step)


def _stamp(path: str) -> Optional[tuple]:
    """What changes when a new version is swapped in at `path`: the (inode,
    device, mtime ns, size) of its manifest.json, reached through the path
    as it resolves now (every version writes its own manifest, in the
    directory swapped in: a new inode, and the old one is kept in the
    history); None when it cannot be stat'ed (the load then names the
    error). One stat: admission and a request's start each take one."""
    try:
        s = os.stat(os.path.join(path, MANIFEST_FILE))
    except OSError:
        return None
    return s.st_ino, s.st_dev, s.st_mtime_ns, s.st_size


def end_token_problem(constraints: TorchConstraints, eos: Optional[int],
                      vocab_width: Optional[int]) -> Optional[str]:
    """Why `constraints` cannot constrain a model whose end of sequence is
    `eos` and whose logits are `vocab_width` wide (None when it can)."""
    if vocab_width is not None and constraints.vocab_size > vocab_width:
        return (f"the set {constraints.path!s} has vocab_size {constraints.vocab_size}, wider "
                f"than the model's logits ({vocab_width}): compile it with the model's tokenizer")
    end = constraints.end_token
    if end is not None and eos is not None and end != eos:
        return (f"the set {constraints.path!s} ends its items with token {end}, the model's "
                f"end of sequence is {eos}: after an item the request could only take token "
                f"{end}, which does not stop it (compile the set with end_token={eos}, the "
                "tokenizer's eos)")
    return None
