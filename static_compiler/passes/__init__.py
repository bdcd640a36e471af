"""Compiler passes, one module each, and the registry that maps spec names to them.

Public: `REGISTRY`, `Pass` and `ByteSize` (here), and `pipeline`
(`DEFAULT_PIPELINE`, `parse_pipeline`, `format_pipeline`, re-exported at the
package root); the pass modules are internal (reach a pass by its spec name).
"""

from static_compiler.passes.base import ByteSize, Pass
from static_compiler.passes.choose_layout import ChooseLayoutPass
from static_compiler.passes.minimize import MinimizePass
from static_compiler.passes.pack_dtypes import PackDtypesPass
from static_compiler.passes.pad_branches import PadBranchesPass
from static_compiler.passes.reserve_capacity import ReserveCapacityPass
from static_compiler.passes.split_heavy import SplitHeavyPass
from static_compiler.passes.verify import VerifyPass

REGISTRY = {cls.name: cls for cls in (
    VerifyPass, ChooseLayoutPass, SplitHeavyPass, PadBranchesPass, PackDtypesPass, MinimizePass,
    ReserveCapacityPass)}
"""Pass classes by their spec name."""

__all__ = ["ByteSize", "Pass", "REGISTRY"]
