"""Buffers no collective keeps equal are saved as rank 0 holds them, under every strategy.

BatchNorm's running statistics differ between ranks wherever nothing broadcasts
them: DDP as MMEngine's Runner wraps it (``broadcast_buffers=False``), FSDP and
ZeRO. The Runner saves rank 0's. DCP, left to itself, writes each replicated
tensor from whichever rank balances its writes, so a sharded run's checkpoint
held another rank's statistics (SimSiam's, under every sharding strategy).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.cli.cli_helpers import QUICKSTART, launch_two
from tests.strategies.detector_like import STRATEGIES, reference_weights, saved_state

pytestmark = pytest.mark.slow

MODEL = '''
from digits import DigitsMLP
from mmengine.registry import MODELS
from torch import nn


@MODELS.register_module(force=True)
class NormedDigits(DigitsMLP):
    """The quickstart's MLP with a BatchNorm that trains: its statistics are each rank's."""

    def __init__(self, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                 nn.Linear(32, 10))
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("buffers")
    (root / "normed_digits.py").write_text(MODEL)
    return root


def _train(root, name):
    config = root / f"{name}.py"
    config.write_text(textwrap.dedent(f"""
        _base_ = [{str(QUICKSTART)!r}]
        custom_imports = dict(imports=['digits', 'normed_digits'], allow_failed_imports=False)
        model = dict(_delete_=True, type='NormedDigits')
        train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=10)
        default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1))
        visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])
        strategy = {STRATEGIES[name]}
        """))
    launch_two(config, name, root)
    return root / name


@pytest.fixture(scope="module")
def ddp(root):
    return _train(root, "ddp")


@pytest.mark.parametrize("name", ["fsdp", "zero2"])
def test_the_running_statistics_saved_are_rank_0s_as_under_ddp(root, ddp, name):
    expected = reference_weights(ddp, 1)
    saved, _ = saved_state(_train(root, name), 1)
    for key in ("net.1.running_mean", "net.1.running_var"):
        worst = (saved[key] - expected[key]).abs().max().item()
        assert worst <= 1e-6, f"{name}: {key} is {worst} off rank 0's"
    assert saved["net.1.num_batches_tracked"] == expected["net.1.num_batches_tracked"]
    assert torch.allclose(saved["net.0.weight"], expected["net.0.weight"], atol=1e-6)
