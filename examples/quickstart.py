import jax.numpy as jnp
import numpy as np

import static_compiler as sc
from static_compiler import report

V = 2048                                                     # vocabulary size
sids = np.random.default_rng(0).integers(0, V, (10_000, 8))  # 1e4 Semantic IDs, L = 8
compiled = sc.compile_constraints(sids, vocab_size=V)        # the trie as per-layer tables
print(report.stats_table(compiled))                          # per layer: states, layout, bytes

emb = jnp.asarray(np.random.default_rng(1).standard_normal((V, V), dtype=np.float32))
def logits_fn(last_tokens, step, carry):                     # a stand-in model: logits
    return emb[last_tokens], carry                           # (B, M, V) from the last token

result = sc.beam_search(compiled, logits_fn, batch_size=2, beam_size=8)  # compiles: seconds
assert result.valid.all()                                    # every beam is an item of the set
for tokens, score in zip(result.tokens[0, :3], result.scores[0, :3]):
    print("beam", tokens.tolist(), f"score {score:.2f}")    # the top beams of batch row 0
