"""A PyTorch logits processor for Hugging Face ``generate``.

``generate`` owns the beam search: it reorders, forks and drops beams itself
and hands the processor every row's tokens so far. `StaticLogitsProcessor`
therefore keeps no per-row state: each call masks with `allowed` (the
stateless mask from prefixes, `static_compiler.backend.decode.prefix`), one
jitted XLA program per prefix length, with the token ids and the bool mask
passed between torch and jax through DLPack (no copy on the CPU) and no
Python loop over rows. The scores never leave torch: the mask is applied with
``masked_fill``, so they keep their dtype (float64, float16, bfloat16 stay
so) and their autograd graph (scores that require grad work).

    processor = StaticLogitsProcessor(compiled, prompt_length=input_ids.shape[1])
    out = model.generate(input_ids, num_beams=8, max_new_tokens=compiled.max_length,
                         logits_processor=[processor])

Semantics per row (t = the row's length minus ``prompt_length``, the tokens
generated so far):

* only the set's live items count: after ``compiled.update(remove=...)``
  the removed items are never allowed (the version's `base_subset`), and
  with ``subset=`` only that subset's items (per prompt with
  ``subset_index``);
* disallowed tokens get -inf, allowed ones keep their score (what
  ``prefix_allowed_tokens_fn`` gives for the same allowed tokens);
* tokens at or beyond the set's vocabulary (the model's vocabulary may be
  larger) are never allowed, and a generated token outside it makes its row
  allow nothing;
* a finished row (it generated the end token, which must be the model's
  ``eos_token_id``) allows exactly the end token, whatever ``generate`` pads
  it with afterwards (``pad_token_id``): tokens after a row's first end
  token are read as the end token. So sampling and greedy search, which
  keep calling the processor for finished rows, never see an all -inf row
  there;
* a row whose tokens are not a prefix of the set allows nothing (all -inf),
  as in beam search a beam that had to take a -inf candidate;
* ``generate`` must stop within the set's ``max_length`` new tokens (pass
  ``max_new_tokens=compiled.max_length``); a call with t >= max_length
  raises DecodeInputError.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from static_compiler.backend.decode.prefix import prefix_mask
from static_compiler.backend.lowering import Plan
from static_compiler.compiled import CompiledConstraints
from static_compiler.decode_state import check_int
from static_compiler.errors import DecodeInputError


@functools.partial(jax.jit, static_argnums=(0, 3))
def _allowed_tokens(plan: Plan, tables, prefixes, width: int, subset=None):
    """prefixes int32 (N, t) -> bool (N, width): the tokens each row may take
    next (width = the model's vocabulary, >= the set's; tokens at or beyond
    the set's are never allowed). Tokens after a row's first end token are
    read as the end token. The scores never enter this program, so their
    dtype (float64, bfloat16) and autograd graph stay torch's. One program
    per plan, N, t and width, shared by every processor over equal plans;
    subset: a `LiveMask` with one subset row per prefix row, or None."""
    end = plan.end_token
    if end is not None and prefixes.shape[1]:
        is_end = prefixes == end
        after_end = jnp.cumsum(is_end, axis=1) - is_end > 0
        prefixes = jnp.where(after_end, end, prefixes)
    ok = prefix_mask(plan, tables, prefixes, subset)
    return jnp.pad(ok, ((0, 0), (0, width - plan.vocab_size)))


class StaticLogitsProcessor:
    """transformers' LogitsProcessor protocol over a compiled constraint set.

    Args:
      compiled: a `CompiledConstraints` (``sc.compile_constraints(...)``).
      prompt_length: the length of ``generate``'s ``input_ids`` (the prompt,
        left-padded to one length per batch as ``generate`` requires); the
        tokens after it are the prefix the set constrains.
      subset, subset_index: per-request item subsets (`compiled.subset`,
        `sc.stack_subsets`), subset_index ints (batch,) one per prompt of
        ``generate``'s batch (default: subset 0 for every prompt); a call's
        N rows are taken as the prompts' rows in order, N / batch each (as
        ``generate`` expands beams and returned sequences). Without a
        subset: every live item of `compiled` (all but those its updates
        removed).

    ``__call__(input_ids LongTensor (N, cur_len), scores float tensor (N,
    V_model)) -> scores' dtype and device (N, V_model)``, V_model >= the
    set's vocab_size; differentiable in the scores.
    See the module docstring for the semantics.
    """

    def __init__(self, compiled: CompiledConstraints, prompt_length: int, *, subset=None,
                 subset_index=None):
        if not isinstance(compiled, CompiledConstraints):
            raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected the "
                                   "CompiledConstraints of sc.compile_constraints")
        self.compiled = compiled
        self.plan = compiled.plan
        self.tables = compiled.device_tables
        self.prompt_length = check_int("prompt_length", prompt_length, low=0)
        self.subset = subset
        if subset is not None:
            index = np.zeros(1, np.int32) if subset_index is None else np.asarray(subset_index)
            compiled.live_mask(subset, index, index.shape[0] if index.ndim == 1 else -1,
                               "StaticLogitsProcessor")  # checks subset and index now
            self.subset_index = index.astype(np.int32)
        elif subset_index is not None:
            raise DecodeInputError("StaticLogitsProcessor: subset_index without a subset")

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        n, length = input_ids.shape
        t = length - self.prompt_length
        where = "StaticLogitsProcessor"
        if not 0 <= t < plan.max_length:
            raise DecodeInputError(
                f"{where}: input_ids have {length} tokens, {t} after the prompt of "
                f"{self.prompt_length}: expected 0 to {plan.max_length - 1} (the set's max_length "
                f"is {plan.max_length}; pass max_new_tokens={plan.max_length} to generate)")
        if scores.ndim != 2 or scores.shape[0] != n or scores.shape[1] < plan.vocab_size \
                or not scores.is_floating_point():
            raise DecodeInputError(
                f"{where}: scores have shape {tuple(scores.shape)} dtype {scores.dtype}, expected "
                f"float ({n}, V) with V >= the set's vocab_size {plan.vocab_size}")
        # Any token outside [0, V) allows nothing; clamping keeps it outside and within int32.
        prefixes = input_ids[:, self.prompt_length:].clamp(-1, plan.vocab_size)
        prefixes = jax.dlpack.from_dlpack(prefixes.to(torch.int32).contiguous()) if t \
            else np.zeros((n, 0), np.int32)
        ok = _allowed_tokens(plan, self.tables, prefixes, scores.shape[1],
                             self._live_rows(n, where))
        # Masked in torch: the scores keep their dtype, device and autograd graph
        # (the gradient of an allowed score is 1, of a masked one 0).
        ok = torch.from_dlpack(ok).to(scores.device)
        return scores.masked_fill(~ok, float("-inf"))

    def _live_rows(self, n: int, where: str):
        """The LiveMask for a call of n rows: each prompt's subset for its
        n / batch consecutive rows; without a subset, the set's live items
        (all but those its updates removed; None if none was)."""
        if self.subset is None:
            return self.compiled.live_mask(None, None, n, where)
        per = self.subset_index.shape[0]
        if self.subset_index.shape == (1,) and self.subset.num_subsets == 1:
            per = 1  # one subset for every row, whatever the batch
        if n % per:
            raise DecodeInputError(f"{where}: {n} rows are not a multiple of the {per} prompts "
                                   "subset_index gives subsets for")
        return self.compiled.live_mask(self.subset, np.repeat(self.subset_index, n // per), n,
                                       where)
