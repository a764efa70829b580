"""The standard graph's contracts on real models, optimizers and loads."""

from __future__ import annotations

import torch
from mmengine.optim import OptimWrapper
from torch import nn

from flexgraph.training.checkpoint import Checkpointer
from flexgraph.training.contracts import (
    no_meta_parameters,
    optimizer_holds_model,
    weights_as_read,
)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_tensor_on_meta_is_named():
    assert no_meta_parameters(mlp()) is None
    with torch.device("meta"):
        unmade = mlp()
    problem = no_meta_parameters(unmade)
    assert "4 tensors of the model have no storage" in problem and "'0.weight'" in problem


def test_the_optimizer_must_hold_the_wrapped_model_s_own_parameters():
    model = mlp()
    assert optimizer_holds_model(model, OptimWrapper(torch.optim.SGD(model.parameters(), 0.1))) \
        is None
    copies = OptimWrapper(torch.optim.SGD([p.detach().clone() for p in model.parameters()], 0.1))
    assert "holds 4 tensors that are not the model's parameters" in optimizer_holds_model(
        model, copies)
    head_only = OptimWrapper(torch.optim.SGD(model[2].parameters(), 0.1))
    assert "2 trainable parameters are not in the optimizer (e.g. '0.weight')" in \
        optimizer_holds_model(model, head_only)
    model[0].requires_grad_(False)  # frozen: not trained, not asked for
    assert optimizer_holds_model(model, head_only) is None


def test_weights_must_stay_what_the_load_read(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": {k: v + 1 for k, v in mlp().state_dict().items()}}, path)
    model = mlp()
    checkpointer = Checkpointer(tmp_path / "work")
    assert weights_as_read(model, checkpointer) is None, "nothing loaded, nothing to compare"
    checkpointer.load_weights(path, model, on_read=lambda checkpoint: None)
    assert set(checkpointer.loaded.checksums) == set(model.state_dict())
    assert weights_as_read(model, checkpointer) is None
    assert "4 weights differ from what was read" in weights_as_read(mlp(), checkpointer)
