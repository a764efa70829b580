"""Random draws recorded on one rank and made again on another (ZeRO-3's setup on rank 0)."""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch
from mmengine.model import initialize
from torch import nn

from flexgraph.training.runtime import (
    capture_rng,
    host_generators_moved,
    recording_draws,
    replay_draws,
)


def _initialise(model: nn.Module) -> None:
    """MMEngine's initialisers, torch's, a view's draw and a fresh random tensor."""
    initialize(model, [dict(type="TruncNormal", layer="Linear", std=0.02),
                       dict(type="Kaiming", layer="Conv2d"),
                       dict(type="Xavier", layer="Linear", distribution="normal")])
    nn.init.orthogonal_(model[0].weight)
    nn.init.normal_(model[2].weight[:, :3])
    torch.randn(17)


def test_replayed_draws_leave_another_seed_where_its_own_initialisation_would():
    model = nn.Sequential(nn.Linear(300, 70), nn.LayerNorm(70), nn.Linear(70, 5),
                          nn.Conv2d(3, 8, 3))
    torch.manual_seed(3)
    with recording_draws() as draws:
        _initialise(model)
    assert {d.op for d in draws} >= {"aten::uniform_.default", "aten::normal_.default",
                                     "aten::randn.default"}
    draws = pickle.loads(pickle.dumps(draws))  # as they travel to the other ranks
    torch.manual_seed(4)  # another rank's seed (diff_rank_seed)
    _initialise(model)
    initialised = torch.get_rng_state()
    torch.manual_seed(4)
    replay_draws(draws)
    assert torch.equal(torch.get_rng_state(), initialised)


def test_draws_from_an_explicit_generator_are_not_the_global_streams():
    with recording_draws() as draws:
        torch.randn(5, generator=torch.Generator().manual_seed(0))
        torch.rand(3)
    assert [d.op for d in draws] == ["aten::rand.default"]


def test_draws_from_python_or_numpy_are_told_apart():
    before = capture_rng()
    torch.rand(3)
    assert not host_generators_moved(before)
    np.random.rand()
    assert host_generators_moved(before)
    before = capture_rng()
    random.random()
    assert host_generators_moved(before)
