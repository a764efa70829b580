"""Wrap policies pick the units FSDP1 would have wrapped; checkpointing keeps state keys."""

from __future__ import annotations

import pytest
import torch
from flexgraph.strategies.fsdp.units import checkpoint_activations, resolve_wrap_policy, wrap_units
from torch import nn

from flexgraph.training.errors import ConfigError


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 32)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


SIZE = "torch.distributed.fsdp.wrap.size_based_auto_wrap_policy"
LAYERS = "torch.distributed.fsdp.wrap.transformer_auto_wrap_policy"


def names(model, units):
    index = {id(m): n for n, m in model.named_modules()}
    return [index[id(u)] for u in units]


def test_size_policy_wraps_the_blocks_innermost_first_never_the_root():
    net = Net()  # a block is 8352 parameters, a Linear inside it 4224
    policy = resolve_wrap_policy(dict(type=SIZE, min_num_params=8000), net, what="policy")
    assert names(net, wrap_units(net, policy)) == ["blocks.0", "blocks.1"]
    small = resolve_wrap_policy(dict(type=SIZE, min_num_params=4000), net, what="policy")
    assert names(net, wrap_units(net, small)) == [
        "blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]
    assert wrap_units(net, None) == [], "no policy: only the root is sharded"


def test_transformer_policy_takes_layer_classes_by_name():
    net = Net()
    policy = resolve_wrap_policy(dict(type=LAYERS, transformer_layer_cls=["Block"]), net,
                                 what="policy")
    assert names(net, wrap_units(net, policy)) == ["blocks.0", "blocks.1"]
    with pytest.raises(ConfigError, match="no module of class 'Blok' \\(did you mean 'Block'"):
        resolve_wrap_policy(dict(type=LAYERS, transformer_layer_cls=["Blok"]), net, what="p")


def test_activation_checkpointing_recomputes_and_keeps_state_dict_keys():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 4)
    keys = list(net.state_dict())
    expected = net(x).sum()
    expected.backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    assert checkpoint_activations(net, lambda m: isinstance(m, Block)) == 2
    assert list(net.state_dict()) == keys
    out = net(x).sum()
    out.backward()
    assert torch.equal(out, expected)
    assert all(torch.allclose(p.grad, g) for p, g in zip(net.parameters(), grads, strict=True))


def test_without_a_check_fn_the_wrap_units_are_checkpointed():
    from flexgraph.strategies.fsdp.units import checkpoint_selected

    policy = dict(type=SIZE, min_num_params=8000)
    assert checkpoint_selected(Net(), {}, policy) == 2
    with pytest.raises(ConfigError, match="there are none"):
        checkpoint_selected(Net(), {}, None)
    with pytest.raises(ConfigError, match="activation_checkpointing.offload is not supported"):
        checkpoint_selected(Net(), {"offload": True}, policy)
