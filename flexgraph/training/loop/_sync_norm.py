"""MMDetection's ``SyncNormHook`` for every strategy: it averages what ranks hold apart.

Under FSDP the norm weights are shards (DTensors), on which MMDetection's
concatenation fails; a shard is the one copy of its rows, so only the running
statistics and unsharded parameters need averaging.
"""

from __future__ import annotations

from typing import Any

import torch
from mmengine.hooks import Hook
from torch import nn


def replaces(hook: Any) -> bool:
    """Whether ``hook`` is MMDetection's ``SyncNormHook``, which flexgraph's stands in for."""
    kind = type(hook)
    return kind.__name__ == "SyncNormHook" and kind.__module__.startswith("mmdet.")


class SyncNormHook(Hook):
    """Before validation, each norm layer's state averaged over the ranks, shards left be."""

    def before_val_epoch(self, runner: Any) -> None:
        """Average as MMDetection's hook does: one float tensor, summed, divided by the ranks."""
        from torch.distributed.tensor import DTensor

        if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
            return
        states = {f"{name}.{key}": value for name, layer in runner.model.named_modules()
                  if isinstance(layer, nn.modules.batchnorm._NormBase)
                  for key, value in layer.state_dict().items() if not isinstance(value, DTensor)}
        if not states:
            return
        flat = torch.cat([value.flatten().float() for value in states.values()])
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        parts = flat.split([value.numel() for value in states.values()])
        runner.model.load_state_dict({key: part.reshape(value.shape) for (key, value), part
                                      in zip(states.items(), parts, strict=True)}, strict=False)
