"""A PyTorch logits processor for Hugging Face ``generate``.

``generate`` owns the beam search: it reorders, forks and drops beams itself
and hands the processor every row's tokens so far. `StaticLogitsProcessor`
therefore keeps no per-row state: each call masks with `allowed` (the
stateless mask from prefixes, `static_compiler.backend.decode.prefix`) of a
front door: with backend="torch" (the default) `TorchConstraints.allowed`,
eager torch ops (no jax imported, nothing compiled), with backend="jax"
`CompiledConstraints.allowed`, one jitted XLA program per row count for
every prefix length (the prefixes padded to max_length on the host, the
length traced: `padded_prefix_mask`), so a generate call compiles at most
once, on its first step, and nothing once `warm` has run for its row count;
the bool mask passes from jax to torch through DLPack, no Python loop over
rows. The scores never leave torch: the mask is applied with
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

import time

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.support import arguments
from static_compiler.support.decode_types import WarmReport
from static_compiler.torch_backend import TorchConstraints
from static_compiler.torch_backend import checks as torch_checks

BACKENDS = ("jax", "torch")
"""The processor's backends: "jax" runs `allowed` as one jitted XLA program
per row count and model vocabulary, for every prefix length (tokens and mask
passed through DLPack); "torch" runs `static_compiler.torch_backend` (eager
torch ops, no jax imported, nothing to compile)."""


def default_backend(constraints) -> str:
    """"torch", for every set: measured in Hugging Face ``generate`` (docs/
    integrations.md, ``python -m tools.bench.hf_first_call``), its first call
    costs milliseconds more than the second where the jax backend's first
    call compiles its program (seconds), and its steps cost no more than the
    jax backend's. `constraints` is taken so the choice may depend on the set
    again."""
    del constraints
    return "torch"


def _described(value) -> str:
    """`value` for a message: a tensor's dtype and shape, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


class StaticLogitsProcessor:
    """transformers' LogitsProcessor protocol over a compiled constraint set.

    Args:
      compiled: a `CompiledConstraints` (``sc.compile_constraints(...)``), or
        a `TorchConstraints` (``TorchConstraints.load(path)``: the
        torch backend, with no jax imported).
      prompt_length: the length of ``generate``'s ``input_ids`` (the prompt,
        left-padded to one length per batch as ``generate`` requires); the
        tokens after it are the prefix the set constrains.
      subset, subset_index: per-request item subsets (`compiled.subset`,
        or `compiled.ranked_subset`: made in the time of its item bits, a
        rule per request; `sc.stack_subsets`), subset_index ints (batch,) one per prompt of
        ``generate``'s batch (default: subset 0 for every prompt); a call's
        N rows are taken as the prompts' rows in order, N / batch each (as
        ``generate`` expands beams and returned sequences). Without a
        subset: every live item of `compiled` (all but those its updates
        removed).
      backend: "torch" (`static_compiler.torch_backend`: eager torch ops
        on the set's device, jax never imported, nothing compiled) or "jax"
        (one jitted XLA program per row count and model vocabulary, for
        every prefix length: compiled on the first call of a new row count,
        or ahead by `warm`); default `default_backend(compiled)`: "torch".
        Both give the same masks bit for bit.

    ``__call__(input_ids LongTensor (N, cur_len), scores float tensor (N,
    V_model)) -> scores' dtype and device (N, V_model)``, V_model >= the
    set's vocab_size; differentiable in the scores.
    See the module docstring for the semantics. `warm(batch_rows,
    model_vocab_size=...)` compiles (jax backend) what a generate call of
    those row counts runs, so that it compiles nothing; `compilations()`
    counts the XLA compilations the processor's calls and warm-ups ran.
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
            from static_compiler.compiled import CompiledConstraints  # (no jax needed)
            if not isinstance(compiled, CompiledConstraints):
                raise DecodeInputError(f"compiled is a {type(compiled).__name__}, expected the "
                                       "CompiledConstraints of sc.compile_constraints (or a "
                                       "TorchConstraints)")
            self.compiled = compiled
            self.torch_constraints = TorchConstraints.from_compiled(compiled) \
                if backend == "torch" else None
            fingerprint = compiled.fingerprint
        self.plan = (self.torch_constraints or compiled).plan
        self.prompt_length = arguments.check_int("prompt_length", prompt_length, low=0)
        self.subset = subset
        if subset is not None:
            from static_compiler.item_bits.liveness import checked_rows, checked_subset_index
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
            from static_compiler.item_bits.rank import RankedSubset
            if isinstance(subset, RankedSubset):  # (the door checks its tables at the first call)
                if subset.fingerprint != fingerprint:
                    raise DecodeInputError(f"{where}: the ranked subset was made from another "
                                           f"set (fingerprint {subset.fingerprint}, this set's "
                                           f"{fingerprint})")
                if subset_index is not None:
                    checked_rows(index, subset.num_subsets, index.shape[0], where)
            else:
                checked_subset_index(subset, fingerprint, index, index.shape[0],
                                     where)  # checks subset and index values now
            if subset_index is None and subset.num_subsets != 1:  # as every front door refuses
                raise DecodeInputError(f"{where}: {subset.num_subsets} stacked subsets: pass "
                                       "subset_index, ints (batch,), one per prompt of "
                                       "generate's batch")
            self.subset_index = index.astype(np.int32)
        elif subset_index is not None:
            raise DecodeInputError("StaticLogitsProcessor: subset_index without a subset")
        self._rows = {}  # n -> `_subset_rows(n)`
        self._counter = None  # a CompileCounter (jax backend), made on the first jax call

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
        # (the rule of every door: the model's vocabulary may be wider than V)
        torch_checks.check_logits(scores, (n,), plan.vocab_size, f"{where}: scores")
        prefixes = input_ids[:, self.prompt_length:]
        end = plan.end_token
        if end is not None and t:  # tokens after a row's first end token read as the end token
            is_end = (prefixes == end).long()
            prefixes = torch.where(torch.cumsum(is_end, dim=1) - is_end > 0,
                                   torch.full_like(prefixes, end), prefixes)
        outside = ((prefixes < 0) | (prefixes >= plan.vocab_size)).any(dim=1)  # allows nothing
        prefixes = torch.where(outside[:, None], torch.zeros_like(prefixes), prefixes)
        kw = dict(subset=self.subset, subset_index=self._subset_rows(n, where))
        if self.backend == "torch":
            tc = self.torch_constraints
            ok = tc.allowed(prefixes.to(tc.device), check_values=False, **kw)
        else:
            with self._compile_counter().counting():
                ok = torch.from_dlpack(self.compiled.allowed(prefixes.cpu().numpy(), **kw))
        ok = torch.nn.functional.pad(ok.to(scores.device) & ~outside[:, None].to(scores.device),
                                     (0, scores.shape[1] - plan.vocab_size))
        # Masked in torch: the scores keep their dtype, device and autograd graph
        # (the gradient of an allowed score is 1, of a masked one 0).
        return scores.masked_fill(~ok.to(scores.device), float("-inf"))

    def warm(self, batch_rows, *, model_vocab_size=None) -> WarmReport:
        """Runs what a ``generate`` call of each row count in `batch_rows`
        runs, so that afterwards such calls compile nothing: on the jax
        backend the one program per (row count, model vocabulary) that
        serves every step (compiled here, seconds each on a CPU), on the
        torch backend each step's eager ops once (nothing compiles; it
        takes milliseconds). Returns a `WarmReport`, as every front door's
        `warm` does: compilations, the XLA compilations it ran; calls, the
        processor calls made; seconds; batch_sizes, the row counts;
        beam_sizes () and subset_rows None (a row is a beam to the
        processor; its subsets are the processor's own).

        batch_rows: an int or ints, each the rows ``generate`` passes per
          step: batch x num_beams for beam search, batch x
          num_return_sequences for greedy search and sampling (batch for
          one returned sequence); with a subset_index, a multiple of its
          prompts.
        model_vocab_size: the scores' width, the model's vocabulary
          (``model.config.vocab_size``, >= the set's); default the set's
          vocab_size.

        Raises DecodeInputError for a row count that is not a positive int
        (or not a multiple of subset_index's prompts) or a model_vocab_size
        below the set's."""
        where = "StaticLogitsProcessor.warm"
        rows = [batch_rows] if arguments.is_int(batch_rows) else batch_rows
        try:
            rows = list(rows)
        except TypeError:  # not iterable
            rows = []
        if not rows or not all(arguments.is_int(n) and 1 <= n < 2 ** 31 for n in rows):
            raise DecodeInputError(f"{where}: batch_rows={batch_rows!r}, expected a positive "
                                   "int or ints (generate's rows per step: batch x num_beams)")
        width = self.plan.vocab_size if model_vocab_size is None else model_vocab_size
        if not arguments.is_int(width) or not self.plan.vocab_size <= width < 2 ** 31:
            raise DecodeInputError(f"{where}: model_vocab_size={model_vocab_size!r}, expected an "
                                   f"int >= the set's vocab_size {self.plan.vocab_size} (the "
                                   "scores' width, model.config.vocab_size)")
        device = self.torch_constraints.device if self.backend == "torch" else "cpu"
        start, before = time.perf_counter(), self.compilations()
        # One program serves every length on the jax backend: warm at length 0.
        lengths = range(self.plan.max_length) if self.backend == "torch" else (0,)
        rows = sorted(set(rows))
        for n in rows:
            scores = torch.zeros((n, width), device=device)
            for t in lengths:
                self(torch.zeros((n, self.prompt_length + t), dtype=torch.long, device=device),
                     scores)
        return WarmReport(self.compilations() - before, len(rows) * len(lengths),
                          time.perf_counter() - start, tuple(rows), (), None)

    def compilations(self) -> int:
        """The XLA compilations this processor's calls and warm-ups ran (jax
        backend; always 0 on the torch backend, which compiles nothing):
        after `warm` for a generate call's row count, that call adds 0."""
        return 0 if self._counter is None else self._counter.count

    def _compile_counter(self):
        """The processor's `CompileCounter` (imports jax: jax backend only)."""
        if self._counter is None:
            from static_compiler.jax_support.compile_events import CompileCounter
            self._counter = CompileCounter()
        return self._counter

    def _subset_rows(self, n: int, where: str):
        """Each of a call's n rows' subset: each prompt's for its n / batch
        consecutive rows (None without a subset), checked once per n."""
        if self.subset is None:
            return None
        if n not in self._rows:
            per = self.subset_index.shape[0]
            if self.subset_index.shape == (1,) and self.subset.num_subsets == 1:
                per = 1  # one subset for every row, whatever the batch
            if n % per:
                raise DecodeInputError(f"{where}: {n} rows are not a multiple of the {per} "
                                       "prompts subset_index gives subsets for")
            self._rows[n] = np.repeat(self.subset_index, n // per)
        return self._rows[n]
