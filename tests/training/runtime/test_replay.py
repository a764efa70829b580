"""The replay of ``init_weights`` one part at a time (``runtime/_replay.py``), not yet
used by any strategy: each part gets the values a one-device ``init_weights`` gives it,
and an ``init_weights`` whose draws depend on values is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from mmengine.model import BaseModule
from torch import nn

from flexgraph.training.runtime._replay import ReplayError, init_part, record_init


class _Model(BaseModule):
    def __init__(self) -> None:
        super().__init__(init_cfg=[dict(type="TruncNormal", layer="Linear", std=0.02),
                                   dict(type="Constant", layer="LayerNorm", val=1.0, bias=0.0)])
        self.a = nn.Linear(8, 16)
        self.n = nn.LayerNorm(16)
        self.b = nn.Linear(16, 4)


class _ReadsValues(BaseModule):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def init_weights(self) -> None:
        if self.a.weight.sum() > 0:  # a value decides whether b draws
            nn.init.normal_(self.b.weight)


def _fresh(model: nn.Module) -> None:
    for module in model.modules():  # MMEngine marks what it initialised
        if hasattr(module, "_is_init"):
            module._is_init = False


@pytest.mark.parametrize("part", ["a", "n", "b"])
def test_each_part_gets_the_values_one_device_gives_it(part):
    torch.manual_seed(0)
    model = _Model()
    built = {id(p): p.detach().clone() for p in model.parameters()}
    one_device = copy.deepcopy(model)
    torch.manual_seed(1)
    one_device.init_weights()
    end = torch.get_rng_state()
    torch.manual_seed(1)
    record = record_init(model, model.init_weights)
    assert torch.equal(record.end, end), "recording advances the generator as init does"
    assert all(torch.equal(p, built[id(p)]) for p in model.parameters()), "nothing touched"
    _fresh(model)
    values = {id(p): built[id(p)].clone() for p in getattr(model, part).parameters()}
    init_part(model, values, model.init_weights, record, part)
    for mine, theirs in zip(getattr(model, part).parameters(),
                            getattr(one_device, part).parameters(), strict=True):
        assert torch.equal(values[id(mine)], theirs)
    assert torch.equal(torch.get_rng_state(), end)


def test_an_init_whose_draws_depend_on_values_is_refused():
    model = _ReadsValues()
    with torch.no_grad():
        model.a.weight.fill_(1.0)
    record = record_init(model, model.init_weights)  # values read as 0: b draws nothing
    values = {id(p): p.detach().clone() for p in model.a.parameters()}
    with pytest.raises(ReplayError, match="depend on values"):
        init_part(model, values, model.init_weights, record, "a")
