"""Where one item subset's bits have been put: the per-device placement
cache every front door reads its subsets' device copies from.

A `liveness.Subset` holds one `Placements` (its ``placements`` field): the
served artifact keys it by (sharding, padded rows), the torch backend by
("torch", device), the compiled set by ("jax", None) (jax's default
device), `warm` by ("padded", K) for a stack padded to K subsets. Each
entry is made once; it lives as long as the subset, so a subset decoded
again reuses its device copy and a dropped subset frees it.
"""

from __future__ import annotations

from typing import Callable, Hashable


class Placements:
    """key -> what `place()` returned the first time the key was asked for
    (`get`); `puts` counts the placements made (a cache hit makes none)."""

    def __init__(self):
        self._placed: dict = {}
        self.puts = 0

    def get(self, key: Hashable, place: Callable[[], object]):
        """The entry of `key`, made by `place()` on the first call only (two
        threads racing for a new key may both place; one result is kept)."""
        found = self._placed.get(key, _MISSING)
        if found is _MISSING:
            self.puts += 1
            found = self._placed.setdefault(key, place())
        return found

    def __contains__(self, key) -> bool:
        return key in self._placed

    def __len__(self) -> int:
        return len(self._placed)

    def __repr__(self):
        return f"Placements({sorted(map(repr, self._placed))})"


_MISSING = object()
