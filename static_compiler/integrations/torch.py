"""A PyTorch logits processor for Hugging Face ``generate``.

``generate`` owns the beam search: it reorders, forks and drops beams itself
and hands the processor every row's tokens so far. `StaticLogitsProcessor`
therefore keeps no per-row state: each call masks with `allowed` (the
stateless mask from prefixes, `static_compiler.backend.decode.prefix`); with
backend="torch" in torch ops (`static_compiler.torch_backend`, no jax
imported), with backend="jax" (the default for a CompiledConstraints) as one
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
import importlib.util

import numpy as np
import torch

from static_compiler import arguments
from static_compiler.errors import DecodeInputError
from static_compiler.torch_backend import TorchConstraints
from static_compiler.torch_backend import checks as torch_checks
from static_compiler.torch_backend import ops as torch_ops

BACKENDS = ("jax", "torch")
"""The processor's backends: "jax" runs `allowed` as one jitted XLA program
per prefix length (tokens and mask passed through DLPack); "torch" runs
`static_compiler.torch_backend` (torch ops, no jax imported)."""


def default_backend(constraints) -> str:
    """"torch" for a `TorchConstraints` or where jax is not installed, else
    "jax" (see docs/integrations.md for the measurements behind it)."""
    if isinstance(constraints, TorchConstraints) or importlib.util.find_spec("jax") is None:
        return "torch"
    return "jax"


@functools.lru_cache(maxsize=None)
def _jax_allowed_tokens():
    """The jitted JAX program (jax imported on first use of the jax backend)."""
    import jax
    import jax.numpy as jnp

    from static_compiler.backend.decode.prefix import prefix_mask

    @functools.partial(jax.jit, static_argnums=(0, 3))
    def allowed_tokens(plan, tables, prefixes, width: int, subset=None):
        """prefixes int32 (N, t) -> bool (N, width): the tokens each row may
        take next (width = the model's vocabulary, >= the set's; tokens at or
        beyond the set's are never allowed). Tokens after a row's first end
        token are read as the end token. One program per plan, N, t and
        width; subset: a `LiveMask` with one subset row per prefix row."""
        end = plan.end_token
        if end is not None and prefixes.shape[1]:
            is_end = prefixes == end
            after_end = jnp.cumsum(is_end, axis=1) - is_end > 0
            prefixes = jnp.where(after_end, end, prefixes)
        ok = prefix_mask(plan, tables, prefixes, subset)
        return jnp.pad(ok, ((0, 0), (0, width - plan.vocab_size)))

    return allowed_tokens


def _torch_allowed_tokens(tc: TorchConstraints, prefixes: torch.Tensor, width: int, sub):
    """`_jax_allowed_tokens` in torch: prefixes int64 (N, t) -> bool (N, width)."""
    end = tc.end_token
    if end is not None and prefixes.shape[1]:
        is_end = prefixes == end
        after_end = torch.cumsum(is_end.long(), dim=1) - is_end.long() > 0
        prefixes = torch.where(after_end, torch.full_like(prefixes, end), prefixes)
    ok = torch_ops.prefix_mask(tc.plan, tc.tables, prefixes, sub)
    return torch.nn.functional.pad(ok, (0, width - tc.vocab_size))


def _described(value) -> str:
    """`value` for a message: a tensor's dtype and shape, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


class StaticLogitsProcessor:
    """transformers' LogitsProcessor protocol over a compiled constraint set.

    Args:
      compiled: a `CompiledConstraints` (``sc.compile_constraints(...)``), or
        a `TorchConstraints` (``TorchConstraints.from_artifact(path)``: the
        torch backend, with no jax imported).
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
      backend: "jax" (one jitted XLA program per prefix length) or "torch"
        (`static_compiler.torch_backend`: torch ops on the scores' device,
        jax never imported); default `default_backend(compiled)`: "torch"
        for a `TorchConstraints` or without jax installed, else "jax". Both
        give the same masks bit for bit.

    ``__call__(input_ids LongTensor (N, cur_len), scores float tensor (N,
    V_model)) -> scores' dtype and device (N, V_model)``, V_model >= the
    set's vocab_size; differentiable in the scores.
    See the module docstring for the semantics.
    """

    def __init__(self, compiled, prompt_length: int, *, subset=None, subset_index=None,
                 backend=None):
        backend = default_backend(compiled) if backend is None else backend
        if backend not in BACKENDS:
            raise DecodeInputError(f"StaticLogitsProcessor: backend={backend!r}, expected one of "
                                   f"{BACKENDS}")
        self.backend = backend
        if isinstance(compiled, TorchConstraints):
            if backend != "torch":
                raise DecodeInputError("StaticLogitsProcessor: a TorchConstraints runs on "
                                       "backend='torch' only (pass the CompiledConstraints for jax)")
            self.compiled, self.torch_constraints = None, compiled
            fingerprint = compiled.fingerprint
        else:
            if importlib.util.find_spec("jax") is None:  # so no CompiledConstraints exists
                raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected a "
                                       "TorchConstraints (TorchConstraints.from_artifact(path)"
                                       "; a CompiledConstraints needs jax, not installed here)")
            from static_compiler.compiled import CompiledConstraints  # imports jax
            if not isinstance(compiled, CompiledConstraints):
                raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected the "
                                       "CompiledConstraints of sc.compile_constraints (or a "
                                       "TorchConstraints)")
            self.compiled = compiled
            self.torch_constraints = TorchConstraints.from_compiled(compiled) \
                if backend == "torch" else None
            fingerprint = compiled.fingerprint
        self.plan = (self.torch_constraints or compiled).plan
        self.tables = None if backend == "torch" else compiled.device_tables
        self.prompt_length = arguments.check_int("prompt_length", prompt_length, low=0)
        self.subset = subset
        if subset is not None:
            from static_compiler.live.liveness import checked_subset_index
            where = "StaticLogitsProcessor"
            index = np.zeros(1, np.int32)
            if subset_index is not None:
                try:
                    index = np.asarray(subset_index)
                except (TypeError, ValueError, RuntimeError):  # ragged, or on a device
                    index = None
                if index is None or index.ndim != 1 or index.dtype.kind not in "iu":
                    got = f"={subset_index!r}" if index is None else \
                        f" has shape {index.shape} and dtype {index.dtype}"
                    raise DecodeInputError(f"{where}: subset_index{got}: expected ints (batch,), "
                                           "one subset per prompt of generate's batch")
            checked_subset_index(subset, fingerprint, index, index.shape[0],
                                 where)  # checks subset and index values now
            if subset_index is None and subset.num_subsets != 1:  # as every front door refuses
                raise DecodeInputError(f"{where}: {subset.num_subsets} stacked subsets: pass "
                                       "subset_index, ints (batch,), one per prompt of "
                                       "generate's batch")
            self.subset_index = index.astype(np.int32)
        elif subset_index is not None:
            raise DecodeInputError("StaticLogitsProcessor: subset_index without a subset")
        self._subsets = {}  # n -> `_subset_arg(n)`

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        where = "StaticLogitsProcessor"
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 \
                or not torch_checks.is_int_dtype(input_ids.dtype):
            raise DecodeInputError(f"{where}: input_ids are {_described(input_ids)}: expected "
                                   "an int tensor (N, cur_len) of token ids (a LongTensor)")
        if not isinstance(scores, torch.Tensor):
            raise DecodeInputError(f"{where}: scores are {_described(scores)}: expected a float "
                                   f"tensor (N, V) with V >= the set's vocab_size "
                                   f"{plan.vocab_size}")
        n, length = input_ids.shape
        t = length - self.prompt_length
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
        sub = self._subset_arg(n, where)
        if self.backend == "torch":
            tc = self.torch_constraints
            ok = _torch_allowed_tokens(tc, prefixes.to(tc.device), scores.shape[1], sub)
        else:
            import jax
            prefixes = jax.dlpack.from_dlpack(prefixes.to(torch.int32).contiguous()) if t \
                else np.zeros((n, 0), np.int32)
            ok = torch.from_dlpack(_jax_allowed_tokens()(plan, self.tables, prefixes,
                                                         scores.shape[1], sub))
        # Masked in torch: the scores keep their dtype, device and autograd graph
        # (the gradient of an allowed score is 1, of a masked one 0).
        return scores.masked_fill(~ok.to(scores.device), float("-inf"))

    def _subset_arg(self, n: int, where: str):
        """What the backend reads for a call of n rows: each prompt's subset
        for its n / batch consecutive rows (without a subset, the set's live
        items): the jax backend's `LiveMask` or the torch backend's
        (LiveBits, rows), or None. Checked and put on the device once per n,
        not at every generate step."""
        if n in self._subsets:
            return self._subsets[n]
        rows = None
        if self.subset is not None:
            per = self.subset_index.shape[0]
            if self.subset_index.shape == (1,) and self.subset.num_subsets == 1:
                per = 1  # one subset for every row, whatever the batch
            if n % per:
                raise DecodeInputError(f"{where}: {n} rows are not a multiple of the {per} "
                                       "prompts subset_index gives subsets for")
            rows = np.repeat(self.subset_index, n // per)
        if self.backend == "torch":
            arg = self.torch_constraints.subset_bits(self.subset, rows, n, where)
        else:
            import jax
            arg = self.compiled.live_mask(self.subset, rows, n, where)
            if arg is not None:
                arg = arg._replace(rows=jax.device_put(arg.rows))
        self._subsets[n] = arg
        return arg
