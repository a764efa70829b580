"""Where the one-device record cannot make an initialiser again, the estimate names the module
before the run: it alone is initialised whole on rank 0 (and sent), bit for bit.

Each case the record cannot follow: an ``init_weights`` that reads another
parameter's values through numpy, one whose result's shape depends on the
values (a boolean mask), one that writes through numpy, and one that draws
from a generator of its own. Reading values torch can see (``.tolist()``, a
branch on a value, a copy of another parameter) is recorded, and stays out.
"""

from __future__ import annotations

import torch
from mmengine.model import BaseModule
from torch import nn

from flexgraph.core.strategy import get_strategy
from flexgraph.training.components._weight_init import record_one_device_setup
from flexgraph.training.estimate import SetupMemory
from flexgraph.training.estimate._census import take_census


class ReadsNumpy(BaseModule):
    """Reads another parameter's values where the record cannot see them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

    def init_weights(self) -> None:
        with torch.no_grad():
            self.b.weight.copy_(torch.from_numpy(self.a.weight.detach().numpy() * 2))


class Masked(BaseModule):
    """Data-dependent: the bias takes the weight's positive entries (a shape from values)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def init_weights(self) -> None:
        with torch.no_grad():
            self.fc.bias.copy_(self.fc.weight[self.fc.weight > 0][:3])


class WritesNumpy(BaseModule):
    """Writes through numpy: code the record cannot see."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def init_weights(self) -> None:
        self.fc.weight.data.numpy()[:] = torch.randn(3, 4).numpy()


class OwnGenerator(BaseModule):
    """Draws from a generator of its own, whose state the record cannot follow."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def init_weights(self) -> None:
        nn.init.normal_(self.fc.weight, generator=torch.Generator().manual_seed(7))


class Seen(BaseModule):
    """Reads values torch sees: recorded, made again from the record."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

    def init_weights(self) -> None:
        with torch.no_grad():
            self.b.weight.copy_(torch.tensor(self.a.weight.tolist()) * 2)
            self.b.bias.fill_(1.0 if self.a.bias.sum() > 0 else -1.0)


class Net(BaseModule):
    def __init__(self) -> None:
        super().__init__(init_cfg=dict(type="TruncNormal", layer="Linear", std=0.02))
        self.body = nn.Linear(5, 4)
        self.seen = Seen()
        self.reads = ReadsNumpy()
        self.masked = Masked()
        self.writes = WritesNumpy()
        self.own = OwnGenerator()


WHOLE = ("reads", "masked", "writes", "own")
CFG = {"model": {"type": Net}}


def test_each_case_is_named_and_initialised_whole_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = Net()
    model.init_weights()
    end = torch.get_rng_state()
    torch.manual_seed(0)
    record = record_one_device_setup(CFG, None)
    assert record.whole == WHOLE
    assert len(record.reasons) == len(WHOLE)
    assert "DynamicOutputShape" in record.reasons[1]
    assert "generator of its own" in record.reasons[3]
    assert torch.equal(torch.get_rng_state(), end)
    made = record.values(list(record.params))
    for name, value in model.named_parameters():
        assert torch.equal(made[name], value.detach()), name
        held = type(record.params[name]).__name__
        assert held == ("Held" if name.split(".")[0] in WHOLE else "View"), name


def test_the_estimate_names_each_module_rank_0_initialises_whole() -> None:
    from flexgraph.training.estimate._estimate import (
        _replays_init,
        _with_whole,
        initialised_whole,
    )

    census = take_census(Net())
    before = torch.get_rng_state()
    whole = initialised_whole(CFG, census)
    assert torch.equal(torch.get_rng_state(), before)
    assert [name for name, _, _ in whole] == list(WHOLE)
    assert [size for _, size, _ in whole] == [
        sum(p.numel() * 4 for p in getattr(census.model, m).parameters()) for m in WHOLE]
    fsdp, zero3 = get_strategy("fsdp"), get_strategy("deepspeed", zero_optimization={"stage": 3})
    assert _replays_init(fsdp) and _replays_init(zero3) and not _replays_init(get_strategy("ddp"))
    setup = SetupMemory(rank0=100, others=100)
    named, steps = _with_whole(setup, (), whole)
    assert named.rank0 == 100 + sum(size for _, size, _ in whole) and named.others == 100
    said = [n for n in named.notes if "alone is initialised whole on rank 0" in n]
    assert [n.split()[1] for n in said] == list(WHOLE)
    assert steps[0].step == "init_weights" and steps[0].ranks == "rank0"
