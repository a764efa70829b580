"""Models built on the meta device: what exists, and what is refused."""

from __future__ import annotations

import pytest
import torch
from mmengine.registry import MODELS
from torch import nn

from flexgraph.training import steps
from flexgraph.training.errors import CheckpointError, ConfigError
from tests.training.training_helpers import run_steps


@MODELS.register_module(force=True)
class NormNet(nn.Module):
    """Linear + BatchNorm, and a bare parameter no module method initialises."""

    def __init__(self, bare: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("table", torch.arange(4.0))  # computed, no way to recompute it
        if bare:
            self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.bn(self.fc(x)) * self.table, y)


def _meta_model(make_cfg, **model):
    cfg = make_cfg(model=dict(type="NormNet", **model))
    env = run_steps(cfg, last="setup_env")["env"]
    return cfg, env, steps.build_model(cfg, env, device="meta")


def test_meta_build_has_parameters_without_storage_and_real_buffers(make_cfg):
    _, _, model = _meta_model(make_cfg)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.table.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert model.bn.running_var.device.type == "cpu"


def test_loading_or_initialising_a_meta_model_is_refused(make_cfg, tmp_path):
    cfg, env, model = _meta_model(make_cfg)
    torch.save(NormNet().state_dict(), tmp_path / "w.pth")
    cfg.load_from = str(tmp_path / "w.pth")
    built = run_steps(cfg, last=("build_hooks", "build_checkpointer"))
    with pytest.raises(CheckpointError, match="parameters on the meta device.*materialized"):
        steps.load_checkpoint(built["settings"], built["run_context"], built["hooks"], model,
                              built["checkpointer"])
    with pytest.raises(ConfigError, match="still on the meta device"):
        steps.init_weights(env, model)
