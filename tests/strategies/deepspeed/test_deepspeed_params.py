"""ZeRO-3's not-gathered assertion, turned into an error that names the parameter.

DeepSpeed stops a forward with ``AssertionError(param.ds_summary())``, a dict
naming the parameter by its ``ds_id``. These tests raise that assertion from a
module's forward, with the parameters carrying the ``ds_id`` / ``ds_numel``
that ``deepspeed.zero.Init`` gives them, and check what the user reads instead.
The real ZeRO-3 run of a TransformerEncoder, refused before training, is in
tests/cli/test_deepspeed_cli.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from flexgraph.strategies.deepspeed.params import (
    ZeroParameterError,
    empty_parameters,
    named_parameter_errors,
)
from torch import nn

from flexgraph.core.errors import FlexgraphError


def _as_zero3(model: nn.Module, *, empty: tuple[str, ...] = ()) -> nn.Module:
    """Give each parameter the ``ds_id`` and ``ds_numel`` zero.Init gives it."""
    for ds_id, (name, param) in enumerate(model.named_parameters()):
        param.ds_id = ds_id
        param.ds_numel = 0 if name in empty else param.numel()
    return model


def _not_gathered(param: nn.Parameter) -> AssertionError:
    """DeepSpeed's assertion (``partitioned_param_coordinator``), its ``ds_summary()``."""
    return AssertionError({"id": param.ds_id, "status": "NOT_AVAILABLE", "numel": 0,
                           "ds_numel": param.ds_numel, "shape": (0,), "persist": False,
                           "active_sub_modules": {3}, "ds_tensor.shape": torch.Size([0])})


class TiedHead(nn.Module):
    """Reads the embedding's weight, which its own forward does not own."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.tied = [embed]  # not a submodule: the weight belongs to the embedding

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        raise _not_gathered(self.tied[0].weight)


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = TiedHead(self.embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def test_a_parameter_read_outside_its_module_is_named_with_the_module_and_the_fixes():
    model = _as_zero3(TiedModel())
    with pytest.raises(ZeroParameterError) as info, named_parameter_errors(model):
        model(torch.tensor([1, 2]))
    message = str(info.value)
    assert "parameter 'embed.weight' was not gathered when 'head' (TiedHead)" in message
    for fix in ("deepspeed.zero.register_external_parameter", "zero_optimization.stage 1 or 2",
                "FSDPStrategy"):
        assert fix in message
    assert "\n" not in message and isinstance(info.value, FlexgraphError)
    assert isinstance(info.value.__cause__, AssertionError), "DeepSpeed's own, for --debug"


def test_an_empty_copy_inside_a_transformer_encoder_names_the_encoder():
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    weight = "0.layers.1.linear1.weight"
    _as_zero3(model, empty=(weight,))
    with pytest.raises(ZeroParameterError) as info, named_parameter_errors(model):
        raise _not_gathered(model.get_parameter(weight))
    assert f"parameter {weight!r} is empty (0 elements): '0' (TransformerEncoder) " \
           "deep-copies its layer" in str(info.value)
    problem = empty_parameters(_as_zero3(model, empty=tuple(n for n, _ in
                                                          model.named_parameters())))
    assert re.search(r"'0.layers.0.self_attn.in_proj_weight' and \d+ more are empty", problem)


def test_other_assertions_and_models_without_zero3_pass_through():
    with pytest.raises(AssertionError, match="^shapes differ$"), \
            named_parameter_errors(nn.Linear(2, 2)):
        raise AssertionError("shapes differ")
    assert empty_parameters(nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, batch_first=True), 2, enable_nested_tensor=False)) is None
