"""A save on a full device: one clear error, nothing half-written, the previous checkpoint intact.

Each checkpoint of the model below takes about 160 KiB, so the 300 KiB tmpfs
(``small_device``, a real filesystem) holds the first and runs out during the
second, the moment a user meets.
"""

from __future__ import annotations

import pytest
import torch
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO

from flexgraph.training.checkpoint import (
    Checkpointer,
    FileCheckpointIO,
    PortableCheckpointIO,
)
from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.errors import CheckpointError, DeviceFullError


def _save(checkpointer: Checkpointer, model: torch.nn.Module, iteration: int):
    checkpoint = checkpointer.snapshot(model=model, optim_wrapper=None, param_schedulers=None,
                                       epoch=0, iteration=iteration, batch_idx=0, seed=0)
    return checkpointer.save(checkpoint, f"iter_{iteration}", model=model)


@pytest.mark.parametrize("io", [FileCheckpointIO(), DistributedCheckpointIO(),
                                PortableCheckpointIO()], ids=["single-file", "dcp", "portable"])
def test_a_full_device_names_the_checkpoint_its_size_and_the_intact_one(small_device, io):
    model = torch.nn.Linear(200, 200)  # 157 KiB of fp32 weights
    checkpointer = Checkpointer(small_device / "work", CheckpointPolicy(keep_last=3), io=io)
    first = _save(checkpointer, model, 1)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)

    with pytest.raises(DeviceFullError) as failed:
        _save(checkpointer, model, 2)

    message = str(failed.value)
    assert isinstance(failed.value, CheckpointError)
    assert "\n" not in message
    assert message.startswith("the device is full: saving checkpoint ")
    assert f"{str(small_device / 'work' / ('iter_2' + io.suffix))!r}" in message
    assert "needs about 157.0 KiB" in message  # the state's size: weights, bias, no more
    assert f"the previous checkpoint {str(first)!r} is intact" in message
    assert sorted(p.name for p in (small_device / "work").iterdir()) == [
        first.name, "last_checkpoint"], "the half-written one is gone, the pointer kept"
    assert checkpointer.latest() == first
    restored = torch.nn.Linear(200, 200)
    checkpointer.apply(checkpointer.read(first, model=restored, optim_wrapper=None), first,
                       model=restored, optim_wrapper=None)
    for key, value in expected.items():
        assert torch.equal(restored.state_dict()[key], value), key


def test_the_first_save_on_a_full_device_says_no_checkpoint_exists(small_device):
    checkpointer = Checkpointer(small_device / "work", io=FileCheckpointIO())
    with pytest.raises(DeviceFullError, match="needs about 313.3 KiB .*; no earlier "
                                              "checkpoint exists; free some space"):
        _save(checkpointer, torch.nn.Linear(400, 200), 1)
    assert list((small_device / "work").iterdir()) == []

