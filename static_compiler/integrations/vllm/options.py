"""A request's constraint options, parsed from vLLM's ``SamplingParams.extra_args``
(over HTTP the request's ``vllm_xargs``): the keys prefixed ``sc_``.

=============  ==============================================================
``sc_set``     the set: an artifact path (a directory `save` wrote), or a
               name registered at start-up (`sets.register_set`, or the
               environment variable ``STATIC_COMPILER_VLLM_SETS``)
``sc_where``   optional: a filter expression over the items' attributes
               (``"in_stock and price < 50"``), as ``door.subset(where=...)``
               takes it (docs/business-rules.md)
``sc_subset``  optional: a named subset, the name of a bool attribute column
               of the set's items (the items where it is true)
``sc_prefix``  optional: ints, the tokens already taken inside the
               constraint before this request's first output token (a beam
               driver continuing a beam)
=============  ==============================================================

A request without ``sc_set`` (and without any ``sc_`` key) is left
untouched. Any other ``sc_`` key, a value of the wrong type, ``sc_where``
with ``sc_subset``, or an ``sc_`` key without ``sc_set`` is a
`DecodeInputError` (a ValueError: vLLM rejects the request at admission,
HTTP 400) naming the key, the value and what was expected.

Pure Python: no torch, no vLLM (the main test suite tests it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from static_compiler.errors import DecodeInputError
from static_compiler.support import arguments

PREFIX = "sc_"
KEYS = ("sc_set", "sc_where", "sc_subset", "sc_prefix")
"""The request keys this integration reads (every other ``sc_`` key is refused)."""


@dataclasses.dataclass(frozen=True)
class Options:
    """One request's constraint: the set (a path or registered name, as
    given), at most one of where (a filter expression) and subset (a bool
    attribute column's name), and the prefix (ints) taken before its first
    output token."""

    set: str
    where: Optional[str] = None
    subset: Optional[str] = None
    prefix: tuple = ()


def _text(key: str, value, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DecodeInputError(f"extra_args {key}={value!r}: expected {what} (a non-empty str)")
    return value


def parse_options(extra_args: Optional[Mapping[str, Any]]) -> Optional[Options]:
    """The `Options` of a request's extra_args, or None when it opts out
    (no ``sc_`` key). Raises DecodeInputError as the module docstring says."""
    if not extra_args:
        return None
    if not isinstance(extra_args, Mapping):
        raise DecodeInputError(f"extra_args is a {type(extra_args).__name__}: expected a dict")
    ours = {k: v for k, v in extra_args.items() if isinstance(k, str) and k.startswith(PREFIX)}
    if not ours:
        return None
    unknown = sorted(set(ours) - set(KEYS))
    if unknown:
        raise DecodeInputError(f"extra_args {unknown[0]}={ours[unknown[0]]!r}: not a key of "
                               f"static_compiler's vLLM processor (expected one of {KEYS})")
    if "sc_set" not in ours:
        key = sorted(ours)[0]
        raise DecodeInputError(f"extra_args {key}={ours[key]!r} without sc_set: expected "
                               "sc_set, the artifact path or registered name of the set")
    name = _text("sc_set", ours["sc_set"], "an artifact path or a registered set name")
    where = ours.get("sc_where")
    subset = ours.get("sc_subset")
    if where is not None:
        where = _text("sc_where", where, "a filter expression over the items' attributes")
    if subset is not None:
        subset = _text("sc_subset", subset, "the name of a bool attribute column (a named "
                                            "subset)")
    if where is not None and subset is not None:
        raise DecodeInputError(f"extra_args sc_where={where!r} and sc_subset={subset!r}: "
                               "expected at most one of them (a named subset is the filter "
                               f"{subset!r}: write 'sc_where': '{subset} and (...)')")
    prefix = ours.get("sc_prefix", [])
    if isinstance(prefix, (str, bytes)) or not isinstance(prefix, (list, tuple)) or \
            not all(arguments.is_int(t) and 0 <= t < 2 ** 31 for t in prefix):
        raise DecodeInputError(f"extra_args sc_prefix={prefix!r}: expected a list of token "
                               "ids (ints >= 0), the tokens taken inside the set before this "
                               "request's first output token")
    return Options(name, where, subset, tuple(int(t) for t in prefix))
