"""DeepSpeed ZeRO-1/2/3 on a model with MMDetection's habits.

0-d parameters, ``torch.Tensor(list)`` / ``torch.Tensor(numpy array)`` and
numpy-sized ``torch.empty`` in a constructor (under ``zero.Init`` for ZeRO-3),
a frozen stem with ``norm_eval``, torch's SGD. Real processes
(``flexgraph run --nproc-per-node 2``, gloo): one epoch, resumed for a second,
against a two-epoch DDP run from the same initial weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flexgraph.training.errors import ConfigError
from tests.strategies.detector_like import check_like_ddp, run_ddp_reference, run_detector_like

deepspeed = pytest.importorskip("deepspeed")

from flexgraph.strategies.deepspeed.models import (  # noqa: E402
    _sizes_or_data,
    allow_torch_optimizer,
    norm_statistics_cast,
    saved_shape,
)


def _sgd():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def _adam_only(optimizer):
    """ZeRO's tested list, in short (DeepSpeed's own check needs a process group)."""
    return isinstance(optimizer, torch.optim.Adam)


def test_an_untested_torch_optimizer_is_allowed_and_said_so():
    lines: list[str] = []
    config = {"zero_optimization": {"stage": 2}}
    allow_torch_optimizer(config, _sgd(), lines.append, _adam_only)
    assert config["zero_allow_untested_optimizer"] is True
    assert len(lines) == 1 and "SGD" in lines[0] and "zero_allow_untested_optimizer" in lines[0]


def test_refusing_untested_optimizers_is_one_line_naming_the_key():
    config = {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": False}
    with pytest.raises(ConfigError, match=r"SGD.*zero_allow_untested_optimizer.*=True"):
        allow_torch_optimizer(config, _sgd(), print, _adam_only)


class LARS(torch.optim.SGD):
    """A layer-wise optimizer's shape: each parameter's step scaled by its own norm."""


def test_an_optimizer_not_known_element_wise_is_refused_unless_the_key_is_set():
    lars = LARS([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    config = {"zero_optimization": {"stage": 2}}
    with pytest.raises(ConfigError, match=(
            r"^strategy 'deepspeed': ZeRO-2 hands LARS one flat partition per parameter group, "
            r"not the parameters.*LARS's and LAMB's trust ratios.*use DDPStrategy or "
            r"FSDPStrategy.*\['zero_allow_untested_optimizer'\]=True if LARS updates each "
            r"element on its own$")):
        allow_torch_optimizer(config, lars, pytest.fail, _adam_only)
    config["zero_allow_untested_optimizer"] = True  # the user vouches for it
    allow_torch_optimizer(config, lars, pytest.fail, _adam_only)


def test_tested_optimizers_and_stage_0_are_left_alone():
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    for config, optimizer in (({"zero_optimization": {"stage": 2}}, adam),
                              ({"zero_optimization": {"stage": 0}}, _sgd())):
        allow_torch_optimizer(config, optimizer, pytest.fail, _adam_only)
        assert "zero_allow_untested_optimizer" not in config


def test_data_goes_to_torchs_constructor_and_sizes_to_zeros():
    calls = []
    new = _sizes_or_data(lambda cls, *a, **k: calls.append(("sizes", a)),
                         lambda cls, *a, **k: calls.append(("data", a)))
    new(torch.Tensor, 2, np.int64(3))
    new(torch.Tensor, torch.Size([4]))
    new(torch.Tensor, [0.5, 1.0, 2.0])
    new(torch.Tensor, np.array([8.0, 16.0]))
    new(torch.Tensor, 2.0)
    assert [kind for kind, _ in calls] == ["sizes", "sizes", "data", "data", "data"]
    assert calls[0][1] == (2, 3) and all(type(n) is int for n in calls[0][1])


def test_a_zero3_scalar_is_saved_in_its_own_shape():
    param = torch.nn.Parameter(torch.zeros(1))
    assert saved_shape(param, torch.ones(1)).shape == torch.Size([1])
    param.flexgraph_saved_shape = torch.Size([])
    assert saved_shape(param, torch.ones(1)).shape == torch.Size([])


def _cast_as_deepspeed_does(model: torch.nn.Module) -> torch.nn.Module:
    """DeepSpeed 0.19's bf16: the parameters cast, every buffer kept as it was."""
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16)
    return model


def test_bf16_batch_norm_statistics_follow_their_weights_and_run():
    model = _cast_as_deepspeed_does(torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.BatchNorm1d(8, affine=False)))
    model.register_buffer("mean", torch.ones(4))  # a data preprocessor's: kept
    inputs = torch.randn(6, 4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        model(inputs)  # what ResNet's BatchNorm layers met under ZeRO-1 and 2
    assert norm_statistics_cast(model, {"bf16": {"enabled": True}}) == 1
    assert model[1].running_mean.dtype == model[1].running_var.dtype == torch.bfloat16
    assert model[1].num_batches_tracked.dtype == torch.int64
    assert model[2].running_mean.dtype == torch.float32  # no weight: runs beside bf16 inputs
    assert model.mean.dtype == torch.float32
    assert model(inputs).dtype == torch.bfloat16


def test_a_chosen_buffer_dtype_is_left_to_deepspeed():
    model = _cast_as_deepspeed_does(torch.nn.BatchNorm1d(8))
    assert norm_statistics_cast(model, {"data_types": {"buffer_dtype": "fp32"}}) == 0
    assert model.running_mean.dtype == torch.float32


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("detector_like")
    return root, run_ddp_reference(root)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_trains_a_detector_like_model_like_ddp_and_saves_0d_parameters(reference, stage):
    root, ddp = reference
    work, logs = run_detector_like(root, f"zero{stage}")
    check_like_ddp(root, ddp, work)
    assert "SGD, an optimizer DeepSpeed has not tested: zero_allow_untested_optimizer=True" \
        in logs
    assert "AssertionError" not in logs
