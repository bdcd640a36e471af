"""The served artifact's per-request item arguments (a mixin of
`serving.Artifact`): its attributes and fingerprint, item subsets
(`subset`, the base subset after removals) and item priors (`prior`), and
the extra arguments their modules take, put on the device once per
subset or prior (their `placements`).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from static_compiler.errors import DecodeInputError
from static_compiler.item_bits.liveness import Subset, checked_subset_index
from static_compiler.item_bits.padding import pad_subsets
from static_compiler.items.attributes import ItemAttributes
from static_compiler.rules.priors import check_prior


class ServedItems:
    """Item subsets and priors of `serving.Artifact` (it reads `set_view`,
    `items`, `manifest`, `path`, `placement` and `_warmth`)."""

    @property
    def attributes(self) -> Optional[ItemAttributes]:
        """The items' attribute columns (items/attr.*.npy, memory-mapped:
        name -> `items.attributes.Column`, one value per input row), or
        None when the artifact has none."""
        return None if self.items is None else self.items.attributes

    @property
    def fingerprint(self) -> str:
        """The sha256 of the artifact's IR text, and the removal tag of its
        items (`ItemIndex.removal_tag`): subsets of this set carry it."""
        return self.set_view.fingerprint

    def _base_subset(self) -> Optional[Subset]:
        """All items but those an update removed, or None when none was."""
        return self.set_view.base_subset()

    def subset(self, selection=None, *, where=None, masks=None) -> Subset:
        """The items `selection` picks, bool (N,) over the rows the set was
        compiled from (duplicate rows are one item), as a `Subset` for
        `beam_step` / `mask` / `advance`.
        Or `where`: a filter expression over the items' attributes
        (``"in_stock and category in ('shoes', 'hats') and not seen"``,
        text or built with `static_compiler.attr`), with `masks` the named
        bool (N,) item masks it reads (``{"seen": mask}``): docs/business-rules.md.
        Needs an artifact saved with export_subsets=True; raises
        DecodeInputError otherwise, ConstraintSetError for a mask of the
        wrong shape or dtype, FilterExpressionError for a bad expression."""
        return self.set_view.pick(selection, where, masks, "Artifact.subset")

    def prior(self, column: str, weight: float = 1.0, selection=None, *, where=None,
              masks=None):
        """Item priors from the float or int attribute `column`, for
        `beam_step` / `beam_search(..., prior=...)`: `CompiledConstraints.prior`'s
        (a `rules.priors.Prior`, computed on the host). Decoding with it
        needs an artifact exported with export_priors=True."""
        return self.set_view.prior(column, weight, selection, where, masks, "Artifact.prior")

    def _prior_args(self, prior, where: str) -> list:
        """The prior modules' extra argument: the prior's best terms, on
        the device (once per Prior); [] for None."""
        if prior is None:
            return []
        check_prior(prior, self.fingerprint, where, "Artifact.prior")
        if not self.manifest.exports_priors:
            raise DecodeInputError(f"{where}: artifact {str(self.path)!r} exports no item-prior "
                                   "modules (compile with export_priors=True)")
        return [self._put_prior(prior)]

    def _put_prior(self, prior):
        return prior.placements.get(("jax", None), lambda: jax.device_put(prior.best))

    def _subset_args(self, subset, subset_index, batch_size: int, where: str) -> list:
        """The subset modules' extra arguments: the bits, then subset_index."""
        if self.items is None:
            raise DecodeInputError(f"{where}: artifact {str(self.path)!r} exports no subset "
                                   "modules (compile with export_subsets=True)")
        index = checked_subset_index(subset, self.fingerprint, subset_index, batch_size, where)
        on = None if self.placement is None else self.placement.sharding(None)
        rows = self._warmth.padded_rows(subset.num_subsets)  # after warm(): one shape

        def put():  # once per device (or mesh) and padded rows: the subset's `placements`
            live, ends = pad_subsets(subset, rows).placed(lambda w: jax.device_put(w, on))
            return [w for w in live + ends if w is not None]

        return [*subset.placements.get((on, rows), put), jnp.asarray(index, jnp.int32)]
