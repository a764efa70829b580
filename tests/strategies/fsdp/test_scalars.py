"""FSDP2 on a model with MMDetection's habits: 0-d parameters, a frozen stem, torch's SGD.

Real processes (``flexgraph run --nproc-per-node 2``, gloo): one epoch, resumed
for a second, against a two-epoch DDP run from the same initial weights.
"""

from __future__ import annotations

import pytest
import torch
from flexgraph.strategies.fsdp.scalars import scalar_parameters
from torch import nn

from tests.strategies.detector_like import check_like_ddp, run_ddp_reference, run_detector_like


def test_scalar_parameters_are_the_0d_ones_each_once():
    scale = nn.Parameter(torch.tensor(1.0))
    model = nn.Module()
    model.linear = nn.Linear(2, 2)
    model.a = nn.Module()
    model.a.scale = scale
    model.b = model.a  # shared: listed once
    assert scalar_parameters(model) == [scale]


@pytest.mark.slow
def test_fsdp_trains_0d_parameters_like_ddp_and_saves_them_0d(tmp_path):
    reference = run_ddp_reference(tmp_path)
    work, _ = run_detector_like(tmp_path, "fsdp")
    check_like_ddp(tmp_path, reference, work)
