"""Quick start for PyTorch without JAX: compile a set of Semantic IDs,
save it (tables only), load it into the torch backend and run a
constrained beam search with a stand-in torch model.

    pip install 'static-compiler[torch]'    # numpy, networkx, numba, torch; no jax
    python examples/quickstart_torch.py

Nothing here imports jax (the compiler and the saved tables need numpy
alone; decoding is torch ops): docs/integrations.md#pytorch-without-jax.
"""

import numpy as np
import torch

import static_compiler as sc
from static_compiler.torch_backend import TorchConstraints

V, L = 256, 4                                                 # vocabulary size, tokens per item
sids = np.unique(np.random.default_rng(0).integers(0, V, (12_000, L)), axis=0)[:10_000]
compiled = sc.compile_constraints(sids, vocab_size=V)         # numpy: no jax needed
compiled.save("ids.static", modules=False, overwrite=True)    # tables only: no StableHLO modules

tc = TorchConstraints.load("ids.static", device="cpu")        # numpy + torch
torch.manual_seed(0)
table = torch.randn(L, V, V)                                  # a stand-in model: logits from


def logits_fn(last_tokens, step, carry):                      # the last token and the step
    return table[step][last_tokens], carry                    # -> float (B, M, V), carry


queries = [7, 42]                                             # each row's first input token
result = tc.beam_search(logits_fn, batch_size=2, beam_size=4, start_token=queries)
assert result.valid.all()                                     # every beam is an item of the set
items = {tuple(row) for row in sids.tolist()}
for b, query in enumerate(queries):
    print(f"query {query}: top beams")
    for tokens, score in zip(result.tokens[b].tolist(), result.scores[b].tolist()):
        assert tuple(tokens) in items
        print(f"  {tokens}  log-prob {score:.3f}")
