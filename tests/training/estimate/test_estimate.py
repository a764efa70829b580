"""Estimates checked against what runs: DeepSpeed's own estimator, and a real step's bytes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flexgraph.core.strategy import get_strategy
from flexgraph.spec import load_spec
from flexgraph.training import standard_graph
from flexgraph.training.estimate import Candidate, estimate
from flexgraph.training.estimate._census import take_census
from flexgraph.training.estimate._trace import UntraceableModelError, trace_step


def _candidate(name: str, **options) -> Candidate:
    return Candidate(label=name, strategy=get_strategy(name, **options), amp=None, name=name)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 48)
        self.blocks = nn.Sequential(*(nn.Linear(48, 48) for _ in range(3)))
        self.head = nn.Linear(48, 7)


@pytest.mark.parametrize("stage, world", [(1, 8), (2, 8), (2, 3), (3, 8), (3, 5)])
def test_zero_model_states_tie_to_deepspeeds_estimator(stage: int, world: int) -> None:
    """Stage 2 model states are DeepSpeed's figure; stage 1's and 3's reference is too, and
    they differ from it where DeepSpeed holds more (stage 1: whole fp16 gradients) or less
    (stage 3: no whole fp32 gradient partition) than its estimator counts."""
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    from flexgraph.strategies.deepspeed.memory import estimate_memory

    model = _Model()
    ds_estimate = (stage3.estimate_zero3_model_states_mem_needs if stage == 3
                   else stage_1_and_2.estimate_zero2_model_states_mem_needs)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    args = (total, largest) if stage == 3 else (total,)
    expected = ds_estimate(*args, num_gpus_per_node=world, cpu_offload=False)[1]  # GPU bytes
    memory = estimate_memory(take_census(model), world_size=world, amp=None,
                             optimizer_states=2,
                             config={"fp16": {"enabled": True},
                                     "zero_optimization": {"stage": stage}})
    assert memory.reference == expected
    if stage == 1:  # fp16 gradients stay whole: more than DeepSpeed counts
        assert memory.model_states == expected + 2 * total - int(2 * total / world)
    elif stage == 3:  # the fp32 gradients exist a sub-group at a time, in the step
        fp32_partition = (int(18 * total / world) - int(12 * total / world)
                          - 2 * int(2 * total / world))  # what DeepSpeed counts beyond
        assert memory.model_states == expected - fp32_partition
    else:
        assert memory.model_states == expected


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_fp32_gradients_are_one_partition_at_the_step(stage: int) -> None:
    """Counted live on 2 CPU ranks (benchmarks/memory.py --estimate): in fp32 the gradient
    partition is the master's gradient too; stage 1 holds the whole gradients until they
    are reduced, and steps with the partition alone."""
    from flexgraph.strategies.deepspeed.memory import estimate_memory

    census = take_census(_Model())
    p, n = census.trainable, 4
    memory = estimate_memory(census, world_size=n, amp=None, optimizer_states=2,
                             config={"zero_optimization": {"stage": stage}})
    assert memory.gradients == 4 * p // n + (4 * p if stage == 1 else 0)
    assert (memory.step_gradients or memory.gradients) == 4 * p // n
    assert memory.stepped[1] == p // n  # one flat partition stepped per rank


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_half_precision_steps_with_the_fp32_gradients_alone(stage: int) -> None:
    """Counted live on 2 CPU ranks in bf16 (benchmarks/memory.py --estimate): by the step,
    stages 1 and 2 hold only the fp32 gradient partition and no bucket; stage 3 keeps its
    bf16 gradient partition and one reduce bucket, and has the fp32 gradients of the
    sub-group it is stepping."""
    from flexgraph.strategies.deepspeed.memory import estimate_memory

    census = take_census(_Model())
    p, n = census.trainable, 4
    memory = estimate_memory(census, world_size=n, amp=None, optimizer_states=2,
                             config={"bf16": {"enabled": True},
                                     "zero_optimization": {"stage": stage,
                                                           "reduce_bucket_size": 100,
                                                           "sub_group_size": 200}})
    assert memory.buffers > 0
    if stage < 3:
        assert (memory.step_gradients, memory.step_buffers) == (4 * p // n, 0)
    else:
        assert memory.stepped[0] == 200
        assert memory.step_gradients == int(2 * p / n) + 4 * 200
        assert memory.step_buffers == 2 * 100


def test_the_step_phase_counts_the_buffers_the_strategy_keeps_through_it() -> None:
    """A candidate whose peak is its optimizer step shows the step's gradients and buffers."""
    from flexgraph.training.estimate import StrategyMemory
    from flexgraph.training.estimate._estimate import CandidateEstimate

    memory = StrategyMemory(label="m", parameters=10, gradients=40, optimizer=20,
                            buffers=30, compute="fp32", step_gradients=8, step_buffers=0)
    row = CandidateEstimate(label="m", strategy="m", memory=memory, trace=None, world_size=1,
                            step_temporaries=5)
    assert row.parts == {"parameters": 10, "gradients": 8, "optimizer": 25,
                         "activations": None, "buffers": 0}
    assert row.peak == 43


def test_adam_step_temporaries_follow_torchs_kernels() -> None:
    """for-loop (CPU's default): sqrt, then divide, of one tensor at a time; foreach (CUDA's
    default): one square root of every state at once; fused: none; not Adam: not modelled."""
    from flexgraph.training.estimate._config import step_temporaries

    def cfg(**optimizer):
        return {"optim_wrapper": {"optimizer": {"type": "AdamW", **optimizer}}}

    stepped = (1000, 5000)  # the largest tensor, all elements
    assert step_temporaries(cfg(), stepped, "cpu")[0] == 2 * 4 * 1000
    assert step_temporaries(cfg(), stepped, "cuda")[0] == 4 * 5000
    assert step_temporaries(cfg(foreach=False), stepped, "cuda")[0] == 2 * 4 * 1000
    assert step_temporaries(cfg(foreach=True), stepped, "cpu")[0] == 4 * 5000
    assert step_temporaries(cfg(fused=True), stepped, "cuda") == (0, None)
    assert step_temporaries(cfg(type="SGD"), stepped, "cpu") == (0, None)
    assert "foreach" in step_temporaries(cfg(), stepped, "cuda")[1]


def test_all_live_estimators_count_the_same_model(capsys: pytest.CaptureFixture) -> None:
    """The model-walking variants read the same counts as our census (what ties the two)."""
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    model = _Model()
    census = take_census(model)
    assert stage_1_and_2.model_to_params(model) == census.total
    assert stage3.model_to_params(model) == (census.total, census.largest_layer)


def _live_peak_of_real_steps(cfg) -> int:
    """Peak live tensor bytes of the second real AdamW step, measured by torch's MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from flexgraph.training.estimate._config import first_batch
    from flexgraph.training.steps import build_model, setup_env

    torch.manual_seed(0)
    model = build_model(cfg, setup_env(cfg, device="cpu")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = first_batch(cfg)

    def step() -> None:
        data = model.data_preprocessor(batch, True)
        loss, _ = model.parse_losses(model._run_forward(data, mode="loss"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's states exist from the first step on
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_single_device_estimate_within_10_percent_of_a_real_step(tiny_vit) -> None:
    spec = load_spec(tiny_vit, default_graph=standard_graph)
    result = estimate(spec.cfg, [_candidate("single")], world_size=1, device="cpu")
    measured = _live_peak_of_real_steps(spec.cfg)
    estimated = result.candidates[0].peak
    print(f"estimate {estimated}, measured {measured}, ratio {estimated / measured:.3f}")
    assert abs(estimated / measured - 1) < 0.10, (estimated, measured)


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pick = _Pick()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pick(x).sum()


class _Pick(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x[x > 0])  # a shape only the values decide


def test_untraceable_model_names_module_and_operator() -> None:
    with torch.device("meta"):
        model = _DataDependent()
    with pytest.raises(UntraceableModelError, match=r"module 'pick'.*meta") as info:
        trace_step(model, torch.ones(2, 4), "fp32")
    assert "nonzero" in str(info.value) or "data-dependent" in str(info.value) \
        or "index" in str(info.value)


def _is_vit_block(module: nn.Module) -> bool:
    return type(module).__name__ == "Block"


def test_fsdp_activation_checkpointing_is_traced_as_the_run_applies_it(tiny_vit) -> None:
    """The same blocks checkpointed as the run would (``checkpoint_selected``): each keeps
    only its input through forward, so the traced activations drop, and the note says so."""
    from mmengine.registry import FUNCTIONS

    FUNCTIONS.register_module(name="is_vit_block", module=_is_vit_block, force=True)
    spec = load_spec(tiny_vit, default_graph=standard_graph)
    plain, checkpointed = estimate(spec.cfg, [
        _candidate("fsdp"),
        _candidate("fsdp", activation_checkpointing=dict(check_fn="is_vit_block")),
    ], world_size=2, device="cpu").candidates
    print("activations", plain.trace.activations, checkpointed.trace.activations)
    assert 0 < checkpointed.trace.activations < 0.6 * plain.trace.activations, (
        checkpointed.trace.activations, plain.trace.activations)
    assert any("applied in the trace" in note for note in checkpointed.memory.notes)


class _Numbers(torch.utils.data.Dataset):
    """Sample ``i`` is the number ``i``: a batch shows which samples it holds."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


class _NumberStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(1000))


@pytest.mark.parametrize("dataset", [_Numbers, _NumberStream])
def test_the_traced_batch_is_the_datasets_first_samples_in_order(dataset) -> None:
    from flexgraph.training.estimate._config import first_batch

    sampler = dict(type="DefaultSampler", shuffle=True) if dataset is _Numbers else None
    loader = dict(batch_size=4, dataset=dict(type=dataset), sampler=sampler)
    batch = first_batch({"train_dataloader": {k: v for k, v in loader.items() if v}})
    assert [int(sample) for sample in batch] == [0, 1, 2, 3]


def test_a_trace_that_remembers_meta_kernels_counts_what_one_that_runs_them_counts(
        tiny_vit, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo (repeated blocks reuse their operators' output layouts) changes nothing
    a trace reports, in any compute mode, with one memo shared by the modes as an
    estimate shares it; and it is used: the 12 blocks' operators are remembered once."""
    from flexgraph.training.estimate._config import first_batch
    from flexgraph.training.estimate._estimate import build_meta_model
    from flexgraph.training.estimate._live_bytes import LiveBytes

    spec = load_spec(tiny_vit, default_graph=standard_graph)
    batch = first_batch(spec.cfg)
    memo: dict = {}
    dispatched = []
    original = LiveBytes.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        dispatched.append(func)
        return original(self, func, types, args, kwargs)

    for compute in ("fp32", "amp:fp16", "half:bf16"):
        plain = trace_step(build_meta_model(spec.cfg), batch, compute)
        with monkeypatch.context() as patch:
            patch.setattr(LiveBytes, "__torch_dispatch__", counted)
            remembered = trace_step(build_meta_model(spec.cfg), batch, compute, memo)
        assert remembered == plain, compute
    assert 0 < len(memo) < len(dispatched) / 4
