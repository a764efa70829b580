"""Second copies of the weights under sharding: copies laid out like the model, lost writes.

FSDP2 on a one-process gloo group shards like any other: each parameter a
DTensor, gathered for the forward into a copy FSDP frees after it.
"""

from __future__ import annotations

import pytest
import torch
from flexgraph.strategies.deepspeed.params import empty_parameters
from flexgraph.strategies.fsdp.contracts import forward_writes_kept
from flexgraph.strategies.fsdp.copies import (
    ShardedCopy,
    allow_sharded_copies,
    forward_writes,
    refuse_stale_parameters,
)
from torch import nn

from flexgraph import ContractError
from flexgraph.training.errors import TrainingError
from tests.strategies.deepspeed.test_deepspeed_params import _as_zero3


class Momentum(nn.Module):
    """MoCo v3's habit: ``forward`` moves a momentum copy towards the encoder, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.momentum = nn.Linear(4, 4).requires_grad_(False)
        self.register_buffer("seen", torch.zeros(()))
        self.tied = self.encoder  # the same module twice: one copy of its weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for mine, theirs in zip(self.momentum.parameters(), self.encoder.parameters(),
                                strict=True):
            mine.data.lerp_(theirs.data, 0.1)  # as MMEngine's averaged models write
        return self.encoder(x) + self.momentum(x)


@pytest.fixture
def group():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    allow_sharded_copies(model)
    return model


def test_a_deep_copy_is_laid_out_like_the_model_and_averages_locally(group):
    from mmengine.model import ExponentialMovingAverage
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = _sharded(Momentum())
    ema = ExponentialMovingAverage(model, momentum=0.5)  # MMEngine deep-copies here
    assert isinstance(ema.module, ShardedCopy)
    assert list(ema.module.state_dict()) == list(model.state_dict())
    assert [n for n, _ in ema.module.named_parameters()] == \
           [n for n, _ in model.named_parameters()], "tied weights once, in the model's order"
    for (name, mine), theirs in zip(ema.module.named_parameters(), model.parameters(),
                                    strict=True):
        assert isinstance(mine, DTensor) and mine.placements == theirs.placements, name
        assert mine.to_local().data_ptr() != theirs.to_local().data_ptr(), "a copy"
    ema.update_parameters(model)
    before = model.encoder.weight.to_local().detach().clone()
    with torch.no_grad():
        model.encoder.weight.to_local().add_(2.0)
    ema.update_parameters(model)
    expected = torch.lerp(before, before + 2.0, 0.5)  # on this rank's shards, as DDP's
    assert torch.equal(ema.module.encoder.weight.to_local(), expected)
    with pytest.raises(RuntimeError, match="holds this rank's shards only"):
        ema(torch.ones(1, 4))


def _arm_forward_writes_kept(model: nn.Module) -> None:
    """``fully_shard``'s contract as the executor runs it after the step."""
    from flexgraph import Executor, Step

    ref = "flexgraph.strategies.fsdp.contracts:forward_writes_kept"
    step = Step("fully_shard", "flexgraph.strategies.fsdp.steps:shard", updates="model",
                contracts=ref)
    Executor().check_contracts(step, step.contracts, {ref: forward_writes_kept},
                               {"model": model}, "after it ran")


def test_an_in_place_write_in_forward_to_a_sharded_parameter_breaks_a_contract(group):
    model = _sharded(Momentum())
    assert forward_writes(model) is None  # nothing written yet
    _arm_forward_writes_kept(model)
    with pytest.raises(ContractError, match=(
            r"^step 'fully_shard' broke contract 'forward_writes_kept' during training: FSDP: "
            r"the forward wrote in place to parameter 'momentum.weight' and 1 more .*DDPStrategy"
    )) as caught:
        model(torch.ones(2, 4)).sum().backward()
    assert (caught.value.step, caught.value.contract) == ("fully_shard", "forward_writes_kept")


def test_a_forward_that_writes_nothing_passes_every_iteration(group):
    model = _sharded(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    _arm_forward_writes_kept(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        assert forward_writes(model) is None


def test_zero3_sends_a_momentum_encoder_to_whole_weights_not_to_fsdp():
    model = _as_zero3(Momentum(), empty=("momentum.weight", "momentum.bias"))
    message = empty_parameters(model)
    assert "'momentum.weight' and 1 more are empty" in message
    assert "stage 1 or 2, or DDPStrategy" in message and "FSDP" not in message


def test_a_momentum_encoder_holding_its_own_parameters_is_refused_at_setup(group):
    from mmengine.model import ExponentialMovingAverage
    from torch.distributed.fsdp import fully_shard

    class MoCoLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Linear(4, 4)
            self.momentum_encoder = ExponentialMovingAverage(self.encoder)

    model = MoCoLike()
    fully_shard(model)
    with pytest.raises(TrainingError, match=r"^FSDP: momentum_encoder \(ExponentialMovingAverage"
                                            r"\) keeps parameters of its own in 'avg_parameters'"
                                            r".*DDPStrategy"):
        refuse_stale_parameters(model)
    refuse_stale_parameters(_sharded(nn.Linear(2, 2)))  # a model without: nothing to say


def test_a_whole_average_loads_into_the_sharded_copy_as_shards(group):
    from mmengine.model import ExponentialMovingAverage

    model = _sharded(nn.Linear(4, 4))
    ema = ExponentialMovingAverage(model)
    whole = {"module.weight": torch.arange(16.0).reshape(4, 4), "module.bias": torch.ones(4),
             "steps": torch.tensor(3)}
    ema.load_state_dict(whole)  # what EMAHook does resuming a DDP checkpoint
    assert torch.equal(ema.module.weight.full_tensor(), whole["module.weight"])
    assert int(ema.steps) == 3
