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

import logging
import weakref
from typing import Optional

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from static_compiler.errors import DecodeInputError
from static_compiler.integrations.vllm import sets as set_lib
from static_compiler.integrations.vllm.options import parse_options
from static_compiler.integrations.vllm.slots import SlotTable
from static_compiler.torch_backend.ops import TorchState

try:  # MRV2's interface (import-light); absent in a vLLM without it
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
    _BASES: tuple = (V1LogitsProcessor, V2LogitsProcessor)
except ImportError:  # pragma: no cover (vLLM < 0.32)
    _BASES = (V1LogitsProcessor,)

log = logging.getLogger(__name__)

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


class _Request:
    """An opted-in request in the engine: its set version, subset, step
    (tokens taken inside the set, sc_prefix included), output tokens read,
    state row, end of sequence; ended: only the end of sequence is left;
    group, position: the `_Group` that masked it last and its row there."""

    __slots__ = ("constraints", "subset", "step", "read", "output", "row", "eos", "ended",
                 "slot", "group", "position")

    def __init__(self, constraints, subset, step, row, eos, output=None, slot=None):
        self.constraints, self.subset, self.step = constraints, subset, step
        self.read, self.output, self.row, self.eos = 0, output, row, eos
        self.ended, self.slot = False, slot
        self.group, self.position = None, 0


def _group(request: _Request) -> tuple:
    """The rows one door call takes together: those of one set version and
    subset at one step."""
    return id(request.constraints), id(request.subset), request.step


class _Group:
    """Rows masked together by one `processor_step`: members (the requests,
    row i of the state is members[i]; a member that left keeps its row
    until the group is rebuilt), the state and columns at `step`, and the
    rows' indices in `_Rows`. The next step advances the whole group with
    these columns when every member still in it took exactly one token."""

    __slots__ = ("members", "step", "result", "rows", "allowed")

    def __init__(self, members, step, result, rows):
        self.members, self.step, self.result, self.rows = members, step, result, rows
        self.allowed = result.allowed


class _Rows:
    """The requests' processor states on the device, one row each:
    node int64, valid and finished bool (capacity,)."""

    def __init__(self, capacity: int, device):
        self.device = device
        self.node = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.valid = torch.ones(capacity, dtype=torch.bool, device=device)
        self.finished = torch.zeros(capacity, dtype=torch.bool, device=device)

    def fit(self, capacity: int) -> None:
        """Room for rows [0, capacity) (doubling)."""
        have = self.node.shape[0]
        grow = max(capacity, 2 * have) - have if capacity > have else 0
        if grow > 0:
            pad = lambda t: torch.cat([t, torch.zeros(grow, dtype=t.dtype, device=self.device)])
            self.node, self.valid, self.finished = pad(self.node), pad(self.valid), \
                pad(self.finished)

    def put(self, rows, state: TorchState) -> None:
        self.node[rows], self.valid[rows], self.finished[rows] = state

    def get(self, rows) -> TorchState:
        return TorchState(self.node[rows], self.valid[rows], self.finished[rows])


_REBUILD = 4
"""A group is rebuilt (its rows gathered again) once fewer than 1 in
_REBUILD of its rows still belong to a request."""


class _Engine:
    """What both model runners share: the engine process's sets, the state
    rows, a request's start, and each step's advance and mask."""

    def __init__(self, vllm_config, device, capacity: int):
        self.device = torch.device(device)
        self.sets = set_lib.SetCache(self.device)
        self.rows = _Rows(capacity, self.device)
        model = getattr(vllm_config, "model_config", None)
        self.vocab_width = model.get_vocab_size() if model is not None else None
        self.eos = _model_eos(model)
        self._warned = set()
        for name, path in set_lib.registered_sets().items():  # checked at start-up
            problem = set_lib.end_token_problem(self.sets.current(path), self.eos,
                                                self.vocab_width)
            if problem:
                raise DecodeInputError(f"{set_lib.ENV}: set {name!r}: {problem}")

    def warn(self, key, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.error("static_compiler vLLM processor: %s", message)

    def start(self, row: int, params, output=None, slot=None) -> Optional[_Request]:
        """The `_Request` of a request entering the batch (its state put at
        `row`), or None when it did not opt in."""
        eos = getattr(params, "eos_token_id", None)
        eos = self.eos if eos is None else eos
        try:
            options = parse_options(params.extra_args)
            if options is None:
                return None
            resolved = self.sets.resolve(options)
            problem = set_lib.end_token_problem(resolved.constraints, eos, self.vocab_width)
            if problem:
                raise DecodeInputError(f"extra_args sc_set={options.set!r}: {problem}")
        except DecodeInputError as err:  # (admission checked it: the set changed since)
            self.warn(str(err), f"{err}; the request ends at once")
            request = _Request(None, None, 0, row, 0 if eos is None else eos, output, slot)
            request.ended = True
            return request
        if eos is None:  # (a model without one: the set's end token ends the request)
            eos = resolved.constraints.end_token if resolved.constraints.end_token is not None \
                else 0
        self.rows.fit(row + 1)
        self.rows.put(row, resolved.state)
        request = _Request(resolved.constraints, resolved.subset, resolved.step, row, eos,
                           output, slot)
        request.ended = resolved.step >= resolved.constraints.max_length
        return request

    def step(self, logits: torch.Tensor, entries: list, tokens) -> torch.Tensor:
        """One step: entries (logits row, request, new output tokens) for
        the opted-in rows; each request advances along its new tokens
        (tokens(requests, offsets) -> int64 (n,) on the device: each
        request's output token at its offset; an entry None may read any
        token), then `logits` are masked in place.

        A group of the last step whose members all took one token (or
        left) advances as it is, reading the columns its mask read; the
        other requests advance through `_Rows` (several tokens one at a
        time) and are masked in new groups of one set version, subset and
        step. Every group is one door call (`processor_step`)."""
        groups, general = [], []
        kept: dict = {}
        for _, request, new in entries:
            if request.ended:
                continue
            group = request.group
            if new == 1 and group is not None and request.step == group.step:
                kept.setdefault(id(group), (group, []))[1].append(request)
            else:
                general.append((request, new))
        for group, present in kept.values():
            if len(present) * _REBUILD > len(group.members):
                groups.append(self._advance_group(group, present, tokens))
            else:
                general.extend((r, 1) for r in present)
        groups.extend(self._advance_rows(general, tokens))
        return self._mask(logits, [(index, request) for index, request, _ in entries], groups)

    def _advance_group(self, group: _Group, present: list, tokens) -> Optional[_Group]:
        """The group one token on, with the columns of its last mask (None
        when its members are past the set's last step: they end)."""
        members = group.members
        first = present[0]
        step = group.step + 1
        for r in present:
            r.read += 1
            r.step = step
        if step >= first.constraints.max_length:
            for r in present:
                r.ended, r.group = True, None
            return None
        still = set(map(id, present))
        members = [m if id(m) in still else None for m in members]
        taken = tokens([m if m is not None else first for m in members],
                       [m.read - 1 if m is not None else first.read - 1 for m in members])
        previous = group.result
        result = first.constraints.processor_step(previous.state, step, tokens=taken,
                                                  columns=previous.columns,
                                                  subset=first.subset)
        rows = group.rows
        if len(present) == len(members):
            self.rows.put(rows, result.state)
        else:  # (a row that left may be another request's now: not written)
            alive = torch.tensor([i for i, m in enumerate(members) if m is not None],
                                 device=self.device)
            rows = rows.index_select(0, alive)
            self.rows.put(rows, TorchState(*(f.index_select(0, alive) for f in result.state)))
        out = _Group(members, step, result, group.rows)
        for position, m in enumerate(members):
            if m is not None:
                m.group, m.position = out, position
        return out

    def _advance_rows(self, pending: list, tokens) -> list:
        """pending: (request, new tokens) of requests outside a kept group.
        All but the last token advance one step at a time (rows batched
        per set version, subset and step); the last one and the mask are
        one `processor_step` per group. Returns the new groups."""
        while True:
            several = [(r, n) for r, n in pending if n > 1 and not r.ended]
            if not several:
                break
            by_key: dict = {}
            for request, _ in several:
                by_key.setdefault(_group(request), []).append(request)
            for members in by_key.values():
                first = members[0]
                rows = torch.tensor([r.row for r in members], device=self.device)
                taken = tokens(members, [r.read for r in members])
                state = first.constraints.advance(self.rows.get(rows), taken, first.step,
                                                  subset=first.subset)
                self.rows.put(rows, state)
                for r in members:
                    r.read += 1
                    r.step += 1
                    r.ended = r.step >= r.constraints.max_length
            pending = [(r, n - 1 if n > 1 else n) for r, n in pending]
        by_key = {}
        for request, new in pending:
            if request.ended:
                continue
            request.group = None
            by_key.setdefault((*_group(request), new > 0), []).append(request)
        groups = []
        for (_, _, step, moves), members in by_key.items():
            first = members[0]
            taken = None
            if moves:
                taken = tokens(members, [r.read for r in members])
                step += 1
                for r in members:
                    r.read += 1
                    r.step = step
                if step >= first.constraints.max_length:
                    for r in members:
                        r.ended = True
                    continue
            rows = torch.tensor([r.row for r in members], device=self.device)
            result = first.constraints.processor_step(self.rows.get(rows), step, tokens=taken,
                                                      subset=first.subset)
            self.rows.put(rows, result.state)
            group = _Group(members, step, result, rows)
            for position, r in enumerate(members):
                r.group, r.position = group, position
            groups.append(group)
        return groups

    def _mask(self, logits: torch.Tensor, entries: list, groups: list) -> torch.Tensor:
        """Masks `logits` in place: entries are (logits row, request), each
        request's rows in `groups` (an ended request: only its end of
        sequence). One masked_fill over the whole batch (rows without an
        entry keep an all-True row): indexing the logits by rows runs a
        parallel region, slow on a busy CPU."""
        if not entries:
            return logits
        rows, width = logits.shape
        groups = [g for g in groups if g is not None]
        blocks, offsets, at = [], {}, 0
        for g in groups:
            allowed = g.allowed
            pad = width - allowed.shape[1]
            blocks.append(torch.nn.functional.pad(allowed, (0, pad)) if pad else allowed)
            offsets[id(g)] = at
            at += allowed.shape[0]
        closed, opened = at, at + 1  # an all-False row, an all-True row
        where = [opened] * rows
        eos = set()
        for index, request in entries:
            eos.add(request.eos)
            g = request.group
            where[index] = closed if request.ended or g is None else \
                offsets[id(g)] + request.position
        if len(groups) == 1 and at == rows and where == list(range(rows)):
            ok = blocks[0].clone() if blocks[0] is groups[0].allowed else blocks[0]
        else:
            blocks += [torch.zeros((1, width), dtype=torch.bool, device=self.device),
                       torch.ones((1, width), dtype=torch.bool, device=self.device)]
            ok = torch.cat(blocks).index_select(0, torch.tensor(where, device=self.device))
        # (a row left with nothing: the end of sequence only, never all -inf)
        none = ~ok.any(dim=1)
        if len(eos) == 1:
            ok[:, eos.pop()] |= none
        else:
            ends = [0] * rows
            for index, request in entries:
                ends[index] = request.eos
            ok[torch.arange(rows, device=self.device),
               torch.tensor(ends, device=self.device)] |= none
        return logits.masked_fill_(~ok.to(logits.device), float("-inf"))


def _model_eos(model_config) -> Optional[int]:
    """The model's end of sequence (its generation config's, else its config's)."""
    if model_config is None:
        return None
    for source in (lambda: model_config.try_get_generation_config(),
                   lambda: model_config.hf_config.to_dict()):
        try:
            eos = source().get("eos_token_id")
        except Exception:  # (a config without it)
            eos = None
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if isinstance(eos, int):
            return eos
    return None


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
        self.engine = _Engine(vllm_config, device, capacity)

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
