"""Failures are caught before training, as one clear FlexgraphError each."""

from __future__ import annotations

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS

from flexgraph.core.errors import FlexgraphError
from flexgraph.training import steps
from flexgraph.training.errors import (
    ConfigError,
    EmptyDatasetError,
    NoLossError,
    UnknownComponentError,
)
from flexgraph.training.graph import LOOP_INPUTS
from tests.training.training_helpers import run_steps


def test_empty_dataset_is_refused_when_dataloaders_are_built(make_cfg):
    cfg = make_cfg(train_dataloader=dict(batch_size=4, dataset=dict(type="ToyDataset", n=0)))
    with pytest.raises(EmptyDatasetError, match="train_dataloader: dataset ToyDataset has no"):
        run_steps(cfg, last="build_dataloaders")


def test_dataset_smaller_than_a_dropped_batch_is_refused(make_cfg):
    cfg = make_cfg(train_dataloader=dict(batch_size=8, drop_last=True,
                                         dataset=dict(type="ToyDataset", n=5)))
    with pytest.raises(EmptyDatasetError, match="drop_last"):
        run_steps(cfg, last="build_dataloaders")


def test_plain_model_without_loss_fails_before_any_update(make_cfg):
    ctx = run_steps(make_cfg(model=dict(type="NoLossNet")), last=("resume", "build_train_step"))
    before = {k: v.clone() for k, v in ctx["model"].state_dict().items()}
    with pytest.raises(NoLossError, match=r"NoLossNet returned a dict with keys \['logits'\]"):
        steps.train(**{k: ctx[k] for k in LOOP_INPUTS})
    after = ctx["model"].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_plain_model_returning_a_detached_tensor_has_no_loss(make_cfg):
    @MODELS.register_module(force=True)
    class DetachedLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.lin(x), y).detach()

    with pytest.raises(NoLossError, match="does not require grad"):
        run_steps(make_cfg(model=dict(type="DetachedLoss")))


def test_plain_model_returning_logits_has_no_loss(make_cfg):
    @MODELS.register_module(force=True)
    class ReturnsLogits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x, y):
            return self.lin(x)  # forgot the loss: minimising mean logits would "train"

    with pytest.raises(NoLossError, match=r"tensor of shape \(\d+, 3\).*not a scalar loss"):
        run_steps(make_cfg(model=dict(type="ReturnsLogits")))


def test_base_model_without_loss_key_fails_clearly(make_cfg):
    @MODELS.register_module(force=True)
    class MetricsOnly(BaseModel):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x, y, mode="tensor"):
            return {"acc": (self.lin(torch.stack(x)).argmax(1) == torch.stack(y)).float()}

    train_dl = dict(batch_size=4, dataset=dict(type="ToyDataset", as_dict=True))
    cfg = make_cfg(model=dict(type="MetricsOnly"), train_dataloader=train_dl,
                   val_dataloader=None)
    with pytest.raises(NoLossError, match=r"MetricsOnly.forward\(mode='loss'\) returned \['acc'\]"):
        run_steps(cfg)


def test_unknown_type_suggests_close_names(make_cfg):
    with pytest.raises(UnknownComponentError, match="did you mean 'ToyNet'"):
        run_steps(make_cfg(model=dict(type="ToyNett")), last="build_model")
    with pytest.raises(UnknownComponentError, match="did you mean 'AdamW'"):
        run_steps(make_cfg(optim_wrapper=dict(optimizer=dict(type="AdamWW", lr=0.1))),
                  last="build_optim_wrapper")


def test_the_registration_hint_names_mmengine_s_registry_constant(make_cfg):
    """``@MODELS.register_module()``, as the registry is imported, not its name ``model``."""
    with pytest.raises(UnknownComponentError, match=r"@MODELS\.register_module\(\)"):
        run_steps(make_cfg(model=dict(type="NoSuchNet")), last="build_model")
    with pytest.raises(UnknownComponentError, match=r"@OPTIMIZERS\.register_module\(\)"):
        run_steps(make_cfg(optim_wrapper=dict(optimizer=dict(type="NoSuchOptim", lr=0.1))),
                  last="build_optim_wrapper")


def test_dotted_path_and_class_objects_work_as_type(make_cfg):
    ctx = run_steps(make_cfg(model=dict(type="torch.nn.Linear", in_features=2, out_features=1)),
                    last="build_model")
    assert isinstance(ctx["model"], torch.nn.Linear)
    ctx = run_steps(make_cfg(optim_wrapper=dict(optimizer=dict(type=torch.optim.SGD, lr=0.1))),
                    last="build_optim_wrapper")
    assert isinstance(ctx["optim_wrapper"].optimizer, torch.optim.SGD)


@pytest.mark.parametrize("train_cfg, message", [
    (dict(by_epoch=True), "max_epochs >= 1"),
    (dict(type="IterBasedTrainLoop"), "max_iters >= 1"),
    (dict(type="FancyLoop", max_epochs=1), "FancyLoop"),
])
def test_bad_train_cfg_is_a_config_error(make_cfg, train_cfg, message):
    with pytest.raises(ConfigError, match=message) as info:
        run_steps(make_cfg(train_cfg=train_cfg, param_scheduler=None))
    assert isinstance(info.value, FlexgraphError) and isinstance(info.value, ValueError)
