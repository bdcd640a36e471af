"""`StaticLogitsProcessor` driven through vLLM's own interface objects, no
engine: V1's ``BatchUpdate`` (requests added, removed, moved, swapped, as
the persistent batch makes them; output lists appended to in place) and
MRV2's ``LogitsProcRequestState`` / ``LogitsContext`` (rows reordered every
step). Each step, every opted-in row allows exactly what the door's
stateless ``allowed`` gives for the request's tokens so far (an independent
walk from the root), its allowed logits bit for bit; every other row is
untouched, bit for bit. Also: one processor per engine when loaded twice,
and the package's entry point."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
from vllm_cases import condense

pytest.importorskip("vllm")
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    LogitsProcRequestState,
)

import static_compiler as sc  # noqa: E402
from static_compiler.integrations.vllm import (
    StaticLogitsProcessor,  # noqa: E402
    steps,  # noqa: E402
)
from static_compiler.integrations.vllm import sets as set_lib  # noqa: E402
from static_compiler.torch_backend import TorchConstraints  # noqa: E402

END, WIDTH, V = 1, 20, 16  # the model's logits are wider than the set's vocabulary
ITEMS = [[5, 6, 7], [5, 6, 8], [5, 9], [10, 11, 12], [10, 13], [14, 3, 2]]
OPTIONS = [None, {}, {"sc_where": "idx >= 2"}, {"sc_subset": "even"}, {"sc_prefix": [5]},
           {"sc_prefix": [10], "sc_where": "idx != 4"}]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("proc") / "set.sc"
    sc.compile_constraints(ITEMS, vocab_size=V, end_token=END, export_subsets=True,
                           attributes={"idx": np.arange(len(ITEMS)),
                                       "even": np.arange(len(ITEMS)) % 2 == 0}
                           ).save(path, modules=False)
    return path


@pytest.fixture(params=["host", "tensor", "ranked"], autouse=True)
def masking(request, monkeypatch):
    """Every test three times: CPU logits masked by the host kernel (numba),
    by the tensor ops (what other devices and dtypes run), and with every
    sc_where a ranked subset (`sets.ranked_from_rows`: large sets')."""
    if request.param == "ranked":
        monkeypatch.setenv(set_lib.RANKED_ENV, "0")
    else:
        monkeypatch.delenv(set_lib.RANKED_ENV, raising=False)
    if request.param == "tensor":
        start = steps.Engine.__init__

        def without_host_kernel(self, *args, **kwargs):
            start(self, *args, **kwargs)
            self._fill = None

        monkeypatch.setattr(steps.Engine, "__init__", without_host_kernel)
    return request.param


def config(max_num_seqs=2):
    model = types.SimpleNamespace(get_vocab_size=lambda: WIDTH,
                                  try_get_generation_config=lambda: {"eos_token_id": END})
    return types.SimpleNamespace(speculative_config=None, model_config=model,
                                 scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs))


class Oracle:
    """A request's expected mask: the door's stateless `allowed` over its
    prefix and output tokens (none of the processor's state)."""

    def __init__(self, artifact):
        self.tc = TorchConstraints.load(artifact)

    def allowed(self, options, tokens) -> torch.Tensor:
        where = options.get("sc_where")
        if "sc_subset" in options:
            where = options["sc_subset"]
        subset = None if where is None else self.tc.subset(where=where)
        prefix = torch.tensor([list(options.get("sc_prefix", [])) + list(tokens)],
                              dtype=torch.int64).reshape(1, -1)
        ok = self.tc.allowed(prefix, subset=subset)[0]
        return torch.nn.functional.pad(ok, (0, WIDTH - V))


def check_rows(before, after, expected: dict) -> None:
    """Rows in `expected` (row -> bool mask) keep their allowed logits and
    are -inf elsewhere; every other row is unchanged, bit for bit."""
    for row in range(before.shape[0]):
        if row in expected:
            want = torch.where(expected[row], before[row], torch.tensor(float("-inf")))
            assert torch.equal(after[row], want), (row, expected[row], after[row])
        else:
            assert torch.equal(after[row], before[row]), row


def pick(rng, row_logits) -> int:
    return rng.choice(torch.nonzero(torch.isfinite(row_logits)).flatten().tolist())


@pytest.mark.parametrize("seed", range(10))
def test_v1_rows_follow_adds_removes_moves_and_swaps(artifact, seed, masking):
    rng = random.Random(seed)
    oracle = Oracle(artifact)
    proc = StaticLogitsProcessor(config(), torch.device("cpu"), False)
    assert proc.is_argmax_invariant() is False
    assert (proc.engine._fill is not None) == (masking != "tensor")
    batch = []  # index -> (options or None, output list)
    for _ in range(25):
        removed, added, moved = [], [], []
        for index, entry in enumerate(batch):  # finished requests leave
            if entry is not None and (entry[1][-1:] == [END] or rng.random() < 0.1):
                batch[index] = None
                removed.append(index)
        free = sorted(removed)
        for _ in range(rng.randint(0, 2 + seed % 3)):  # (groups that lose and gain rows)
            keys = rng.choice(OPTIONS)
            options = None if keys is None else {"sc_set": str(artifact), **keys}
            index = free.pop(0) if free else len(batch)
            if index == len(batch):
                batch.append(None)
            output = []
            batch[index] = (options, output)
            added.append((index, vllm.SamplingParams(extra_args=options), None, output))
        moved += condense(batch, free, MoveDirectionality.UNIDIRECTIONAL)
        if len(batch) > 1 and rng.random() < 0.5:
            a, b = rng.sample(range(len(batch)), 2)
            batch[a], batch[b] = batch[b], batch[a]
            moved.append((a, b, MoveDirectionality.SWAP))
        changed = removed or added or moved
        proc.update_state(BatchUpdate(len(batch), sorted(removed, reverse=True), added, moved)
                          if changed else None)
        if not batch:
            continue
        logits = torch.randn(len(batch), WIDTH)
        before = logits.clone()
        after = proc.apply(logits)
        expected = {i: oracle.allowed(e[0], e[1]) for i, e in enumerate(batch) if e[0]}
        check_rows(before, after, expected)
        for index, (options, output) in enumerate(batch):
            output.append(pick(rng, after[index]))  # (vLLM appends to the same list)


def test_v1_groups_that_lose_rows_and_a_resumed_request(artifact):
    """Four requests masked together (one group of rows); the last leaves
    and the batch shrinks (the group keeps its row); a new request takes
    it; the first leaves and a new one takes its batch index and state row
    in the same update (the group advances without writing the row it
    lost); a request resumes with three output tokens at once (vLLM re-adds
    a preempted request so). Every step, every row as the oracle says."""
    rng = random.Random(3)
    oracle = Oracle(artifact)
    proc = StaticLogitsProcessor(config(max_num_seqs=4), torch.device("cpu"), False)
    options = {"sc_set": str(artifact)}
    params = vllm.SamplingParams(extra_args=options)
    outputs = [[] for _ in range(4)]

    def step():
        logits = torch.randn(len(outputs), WIDTH)
        before = logits.clone()
        after = proc.apply(logits)
        check_rows(before, after, {i: oracle.allowed(options, out) if END not in out
                                   else torch.arange(WIDTH) == END  # (ended: only END)
                                   for i, out in enumerate(outputs)})
        for i, out in enumerate(outputs):
            if END not in out:
                out.append(pick(rng, after[i]))

    proc.update_state(BatchUpdate(4, [], [(i, params, None, outputs[i]) for i in range(4)], []))
    step()
    proc.update_state(BatchUpdate(3, [3], [], []))
    outputs.pop()
    step()
    outputs.append([])
    proc.update_state(BatchUpdate(4, [], [(3, params, None, outputs[3])], []))
    step()
    outputs[0] = []
    proc.update_state(BatchUpdate(4, [0], [(0, params, None, outputs[0])], []))
    step()
    step()
    resumed = [14, 3, 2]
    assert oracle.allowed(options, resumed).nonzero().flatten().tolist() == [END]
    outputs[2] = list(resumed)
    proc.update_state(BatchUpdate(4, [2], [(2, params, None, outputs[2])], []))
    step()
    step()


def test_v2_rows_follow_slots_and_reordered_batches(artifact):
    rng = random.Random(7)
    oracle = Oracle(artifact)
    slots, length = 4, 32
    tokens = torch.zeros((slots, length), dtype=torch.int32)
    prompt = np.zeros(slots, dtype=np.int32)
    state = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=slots, vocab_size=WIDTH,
        # (the runner's StagedWriteTensor / UvaBackedTensor need pinned memory, an
        # accelerator: stand-ins with the fields the processor reads)
        all_token_ids=types.SimpleNamespace(gpu=tokens), prompt_len=types.SimpleNamespace(np=prompt),
        prefill_len=None, total_len=None)
    proc = StaticLogitsProcessor(config(), state)
    live = {}  # slot -> (options or None, total length)
    for step in range(30):
        for slot in range(slots):  # finished requests leave; new ones take free slots
            entry = live.get(slot)
            if entry is not None and (tokens[slot, entry[1] - 1] == END and
                                      entry[1] > prompt[slot] or entry[1] >= length - 1):
                del live[slot]
            if slot not in live and rng.random() < 0.5:
                keys = rng.choice(OPTIONS)
                options = None if keys is None else {"sc_set": str(artifact), **keys}
                prompt[slot] = rng.randint(1, 5)
                tokens[slot, :prompt[slot]] = torch.randint(0, WIDTH, (int(prompt[slot]),))
                opted = proc.add_request(slot, vllm.SamplingParams(extra_args=options))
                assert opted == bool(options)
                live[slot] = (options, int(prompt[slot]))
        proc.apply_staged_writes()
        order = list(live)
        rng.shuffle(order)  # rows are reordered every step
        if not order:
            continue
        mapping = torch.tensor(order)
        ctx = LogitsContext(expanded_idx_mapping=mapping, idx_mapping=mapping,
                            idx_mapping_np=np.array(order), expanded_local_pos=torch.zeros_like(mapping),
                            input_ids=torch.zeros_like(mapping), pos=torch.zeros_like(mapping),
                            seq_lens_upper_bound_np=np.array([live[s][1] for s in order]))
        logits = torch.randn(len(order), WIDTH)
        before = logits.clone()
        after = proc.apply(logits, ctx)
        expected = {}
        for row, slot in enumerate(order):
            options, total = live[slot]
            if options:
                expected[row] = oracle.allowed(options, tokens[slot, prompt[slot]:total].tolist())
        check_rows(before, after, expected)
        for row, slot in enumerate(order):
            options, total = live[slot]
            tokens[slot, total] = pick(rng, after[row])
            live[slot] = (options, total + 1)


def test_a_second_processor_of_one_engine_stays_idle(artifact):
    engine = config()
    first = StaticLogitsProcessor(engine, torch.device("cpu"), False)
    second = StaticLogitsProcessor(engine, torch.device("cpu"), False)
    assert first.active and not second.active  # (entry point and --logits-processors)
    assert StaticLogitsProcessor(config(), torch.device("cpu"), False).active  # another engine
    output = []
    second.update_state(BatchUpdate(1, [], [(0, vllm.SamplingParams(
        extra_args={"sc_set": str(artifact)}), None, output)], []))
    logits = torch.randn(1, WIDTH)
    assert torch.equal(second.apply(logits.clone()), logits)


def test_speculative_decoding_is_refused():
    engine = config()
    engine.speculative_config = object()
    with pytest.raises(ValueError, match="speculative decoding is on"):
        StaticLogitsProcessor(engine, torch.device("cpu"), False)


def test_the_entry_point_loads_the_processor():
    from importlib.metadata import entry_points
    found = [e for e in entry_points(group="vllm.logits_processors")
             if e.value == "static_compiler.integrations.vllm:StaticLogitsProcessor"]
    if not found:
        pytest.skip("static-compiler is not installed in this environment (pip install -e .)")
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins
    assert StaticLogitsProcessor in _load_logitsprocs_plugins()
    assert StaticLogitsProcessor in _load_v2_logitsprocs_plugins()  # (MRV2 accepts it too)


def eos_only(row) -> bool:
    return bool(torch.isfinite(row).nonzero().flatten().tolist() == [END])


@pytest.mark.parametrize("taken", [[15], [5, 12], [-1]])
def test_a_row_left_with_nothing_or_an_unknown_token_gets_the_end_of_sequence(artifact, taken):
    """A token from outside the mask (another processor's, a forced one) or
    an async placeholder (-1): the row allows the end of sequence alone,
    never nothing (an all -inf row) and never everything."""
    proc = StaticLogitsProcessor(config(), torch.device("cpu"), False)
    output = []
    proc.update_state(BatchUpdate(1, [], [(0, vllm.SamplingParams(
        extra_args={"sc_set": str(artifact)}), None, output)], []))
    assert not eos_only(proc.apply(torch.randn(1, WIDTH))[0])
    output.extend(taken)
    assert eos_only(proc.apply(torch.randn(1, WIDTH))[0])


def test_a_registered_set_that_does_not_fit_the_model_stops_the_start(artifact, monkeypatch):
    from static_compiler.errors import DecodeInputError
    monkeypatch.setenv("STATIC_COMPILER_VLLM_SETS", f"mine={artifact}")
    engine = config()
    engine.model_config.try_get_generation_config = lambda: {"eos_token_id": 2}
    with pytest.raises(DecodeInputError, match="set 'mine': the set .* ends its items with "
                                               "token 1, the model's end of sequence is 2"):
        StaticLogitsProcessor(engine, torch.device("cpu"), False)
    assert StaticLogitsProcessor(config(), torch.device("cpu"), False).active  # eos 1 fits
