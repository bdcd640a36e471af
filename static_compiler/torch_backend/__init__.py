"""The PyTorch backend: a compiled set's tables lowered to torch tensors and
its decoding operations to torch ops, with no jax imported at call time.

* `tables`: the static plan (`TorchPlan`) read from an artifact's manifest
  or a compiled set, and the tables as tensors;
* `kernels`: per-layout candidate gathers and subset bits;
* `ops`: the logits-processor pair (`mask_at`, `advance_at`) and the prefix
  mask (`prefix_mask`);
* `checks`: argument validators (the messages of `decode_state`);
* `warm`: `TorchConstraints.warm`'s checks, run and report;
* `engine`: the device work under `decoding.decoder.Decoder` (`TorchEngine`),
  and `live_bits`;
* `constraints`: `TorchConstraints`, the public entry point.

Public: the package's names (`__all__`: `TorchConstraints`, `TorchState`,
`LiveBits`, `live_bits`); its modules are internal.

Imports numpy, torch and the numpy-only modules of the package (errors,
format.spec / manifest / snapshot, item_bits.layers / liveness), never jax
or the compiler (tests/repository/test_layering.py).
"""

from static_compiler.torch_backend.constraints import TorchConstraints
from static_compiler.torch_backend.engine import live_bits
from static_compiler.torch_backend.kernels import LiveBits
from static_compiler.torch_backend.ops import TorchState

__all__ = ["LiveBits", "TorchConstraints", "TorchState", "live_bits"]
