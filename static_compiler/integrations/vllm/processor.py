"""`StaticLogitsProcessor`: vLLM's logits processor over compiled sets, for
both model runners of vLLM 0.32 (one class: V1's ``update_state`` /
``apply(logits)`` and the newer MRV2's ``add_request`` / ``apply(logits,
ctx)``), so the one name serves ``--logits-processors`` and the
``vllm.logits_processors`` entry point whichever runner the engine picks.

Per request (see `options` for the ``sc_`` keys), in the engine process:

* admission (`validate_params`, in vLLM's front-end process): the options
  are parsed, the set is loaded (or reloaded, when a new version was saved
  at its path) and the subset and prefix checked; a bad request is refused
  there (HTTP 400) with a message naming the key, its value and what was
  expected. The request options ``min_tokens``, ``allowed_token_ids``,
  ``bad_words`` and structured outputs are refused with ``sc_set``: each can
  forbid every token the set allows (an all -inf row).
* start (the engine process): the request's set version, subset and the
  state after ``sc_prefix`` (`sets.SetCache.resolve`: the torch door's
  ``init_processor`` / ``advance``) go to a state row of its own on the
  device. A set whose end token is not the model's end of sequence (or
  wider than the model's vocabulary) is refused at start-up when it is
  registered (``STATIC_COMPILER_VLLM_SETS``), and ends a request at once
  (only the end of sequence allowed, an error logged) when it is named by
  path; so does a set that changed between admission and start so that the
  request no longer fits it.
* each step: every opted-in request's new output tokens (V1: the length
  and last element of the output list vLLM hands over, a host list; MRV2:
  the committed tokens on the device) advance its row, and the rows are
  masked with the door's ``allowed_tokens``, batched per (set version,
  subset, step); disallowed logits become -inf, in place. No value is read
  back from the device. Rows of other requests are not touched (their
  logits are bit for bit those of an engine without the processor).
* after a complete item: only the set's end token (the model's end of
  sequence), so greedy and sampled outputs are members of the request's set
  (or subset). A set without an end token (fixed-length items) allows only
  the model's end of sequence after max_length tokens. A row that has no
  allowed token left (a token forced from outside, e.g. another processor)
  gets the end of sequence only: never an all -inf row, never unconstrained.
  An output cut by ``max_tokens`` is a prefix of a member (finish_reason
  "length").

Settings. The V1 runner hands processors the output tokens only when a
custom processor was passed (``logits_processors=[...]`` /
``--logits-processors``); with async scheduling, a processor loaded by the
entry point alone sees placeholders: pass it explicitly too (a second
instance in one engine stays idle) or run ``--no-async-scheduling``; a
request that meets a placeholder is ended (logged). Speculative decoding is
refused (vLLM refuses custom processors with it on V1; on MRV2 its rows
are per draft token). Pooling models take no logits processors.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from static_compiler.errors import DecodeInputError
from static_compiler.integrations.vllm import sets as set_lib
from static_compiler.integrations.vllm.options import parse_options
from static_compiler.integrations.vllm.slots import SlotTable
from static_compiler.integrations.vllm.steps import Engine

try:  # MRV2's interface (import-light); absent in a vLLM without it
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
    _BASES: tuple = (V1LogitsProcessor, V2LogitsProcessor)
except ImportError:  # pragma: no cover (vLLM < 0.32)
    _BASES = (V1LogitsProcessor,)

_FRONT: Optional[set_lib.SetCache] = None  # the front-end process's sets (admission)
_ENGINES: dict = {}  # id(vllm_config) -> (weakref to it, the active processor's weakref)

REFUSED_WITH_A_SET = ("min_tokens", "allowed_token_ids", "bad_words", "structured_outputs")
"""SamplingParams fields refused with ``sc_set`` (each can forbid every token
the set allows)."""


def _front_cache() -> set_lib.SetCache:
    global _FRONT
    if _FRONT is None:
        _FRONT = set_lib.SetCache("cpu")
    return _FRONT


def check_request(sampling_params) -> None:
    """Admission: raises DecodeInputError (a ValueError: vLLM answers HTTP
    400) for a request whose ``sc_`` options are bad, or that combines
    ``sc_set`` with a field of `REFUSED_WITH_A_SET`."""
    options = parse_options(getattr(sampling_params, "extra_args", None))
    if options is None:
        return
    for name in REFUSED_WITH_A_SET:
        value = getattr(sampling_params, name, None)
        if value:
            raise DecodeInputError(f"extra_args sc_set={options.set!r} with {name}={value!r}: "
                                   f"expected no {name} (it can forbid every token the set "
                                   "allows)")
    _front_cache().resolve(options)


def _claim(processor, vllm_config) -> bool:
    """True for the first processor of this class built for `vllm_config`
    (an engine may load it both by entry point and by name: the second stays
    idle instead of masking twice)."""
    key = id(vllm_config)
    held = _ENGINES.get(key)
    if held is not None and held[0]() is vllm_config and held[1]() is not None:
        return False
    try:
        ref = weakref.ref(vllm_config)
    except TypeError:
        ref = (lambda config: lambda: config)(vllm_config)
    _ENGINES[key] = (ref, weakref.ref(processor))
    return True


class StaticLogitsProcessor(*_BASES):  # type: ignore[misc]
    """vLLM's logits processor over compiled sets (module docstring): pass
    ``logits_processors=[StaticLogitsProcessor]`` to ``vllm.LLM``, or
    ``--logits-processors static_compiler.integrations.vllm:StaticLogitsProcessor``
    to ``vllm serve``, or install the package (its ``vllm.logits_processors``
    entry point). Requests opt in with ``extra_args`` (``sc_set``, ...:
    `options`)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """vLLM's admission hook: `check_request`."""
        check_request(sampling_params)

    def __init__(self, vllm_config, *args):
        """V1: (vllm_config, device, is_pin_memory); MRV2: (vllm_config,
        req_states)."""
        speculative = getattr(vllm_config, "speculative_config", None)
        if speculative is not None:
            raise ValueError("StaticLogitsProcessor: speculative decoding is on: expected it "
                             "off (a draft token's row has no state of its own)")
        self.active = _claim(self, vllm_config)
        self.v2 = len(args) == 1
        if self.v2:
            (self.req_states,) = args
            device, capacity = self.req_states.device, self.req_states.max_num_reqs
            self.requests: dict = {}
        else:
            device = args[0]
            capacity = vllm_config.scheduler_config.max_num_seqs
            self.table = SlotTable(capacity)
        self.engine = Engine(vllm_config, device, capacity)

    def is_argmax_invariant(self) -> bool:
        """False: the constraint changes the greedy choice."""
        return False

    # V1 runner

    def update_state(self, batch_update) -> None:
        """Applies vLLM's batch update (V1): requests added, removed, moved."""
        if not self.active or not batch_update:
            return
        self.table.update(batch_update, self.engine.start)

    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        """Masks the opted-in rows of `logits` in place (V1: row = batch
        index; MRV2: the rows of `ctx`)."""
        if not self.active:
            return logits
        if self.v2:
            return self._apply_v2(logits, ctx)
        slots = self.table.slots
        if not slots:
            return logits
        entries = []
        for index, slot in slots.items():
            request = slot.data
            new = len(request.output) - request.read
            if new > 0 and not request.ended and request.output[-1] == -1:
                # an async placeholder: the token is unknown
                self.engine.warn("placeholder", "vLLM passed placeholder output tokens "
                                 "(async scheduling with the processor loaded only by "
                                 "its entry point): pass it in logits_processors / "
                                 "--logits-processors too, or --no-async-scheduling; "
                                 "such requests end at once")
                request.ended = True
            entries.append((index, request, new))
        device = self.engine.device
        return self.engine.step(logits, entries, lambda members, offsets: torch.tensor(
            [r.output[o] for r, o in zip(members, offsets)], dtype=torch.int64, device=device))

    # MRV2 runner

    def add_request(self, req_idx: int, sampling_params) -> bool:
        """MRV2: a request enters slot `req_idx`; True when it opted in."""
        if not self.active:
            return False
        request = self.engine.start(req_idx, sampling_params, slot=req_idx)
        if request is None:
            self.requests.pop(req_idx, None)
            return False
        self.requests[req_idx] = request
        return True

    def apply_staged_writes(self) -> None:
        """MRV2: nothing staged (`add_request` writes its row directly)."""

    def _apply_v2(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        if not self.requests:
            return logits
        prompt = self.req_states.prompt_len.np
        entries = []
        for b, slot in enumerate(ctx.idx_mapping_np.tolist()):
            request = self.requests.get(slot)
            if request is None:
                continue
            produced = int(ctx.seq_lens_upper_bound_np[b]) - int(prompt[slot])
            if produced < 0:  # (a chunk of the prompt: its sample is dropped)
                continue
            entries.append((b, request, max(produced - request.read, 0)))
        token_ids = self.req_states.all_token_ids.gpu
        device = self.engine.device

        def tokens(members, offsets):
            slots = torch.tensor([r.slot for r in members], device=token_ids.device)
            at = torch.tensor([int(prompt[r.slot]) + o for r, o in zip(members, offsets)],
                              device=token_ids.device)
            return token_ids[slots, at].to(device, torch.int64)

        return self.engine.step(logits, entries, tokens)
