"""Compiler passes, one module each, and the registry that maps spec names to them."""

from passes.base import ByteSize, Pass
from passes.choose_layout import ChooseLayoutPass
from passes.minimize import MinimizePass
from passes.pack_dtypes import PackDtypesPass
from passes.pad_branches import PadBranchesPass
from passes.split_heavy import SplitHeavyPass
from passes.verify import VerifyPass

REGISTRY = {cls.name: cls for cls in (
    VerifyPass, ChooseLayoutPass, SplitHeavyPass, PadBranchesPass, PackDtypesPass, MinimizePass)}
"""Pass classes by their spec name."""

__all__ = ["ByteSize", "Pass", "REGISTRY"]
