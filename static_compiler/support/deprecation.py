"""Deprecated calling forms, kept working until a named release: each call
warns with a `DeprecationWarning` that names the form to use instead and
the version and date the old form goes, then does what it did. Standard
library only.

Old names that were only another spelling of a current one went before the
first release (0.1.0, CHANGELOG.md); what is left here is a different way
of calling a verb (torch's two-argument ``mask(state, step)``).
"""

from __future__ import annotations

import warnings

REMOVED_IN = "0.2.0 (2027-03-01)"
"""The release, and its date, that removes the deprecated forms (listed in
CHANGELOG.md and beside each verb in docs/README.md)."""


def warn_deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warns that `old` is deprecated in favour of `new`, naming the release
    that removes it (a DeprecationWarning pointing at the caller of the
    function that calls this, with stacklevel=3)."""
    warnings.warn(f"{old} is deprecated and will be removed in {REMOVED_IN}: use {new}",
                  DeprecationWarning, stacklevel=stacklevel)
