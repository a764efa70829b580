"""0-d parameters under FSDP2: replicated on every rank, their gradients averaged as DDP's are.

``fully_shard`` refuses a 0-d parameter (MMDetection's ``Scale``), and making them 1-d
would change the model and its checkpoints; FSDP averages nothing it ignores.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["replicate_scalars", "scalar_parameters"]


def scalar_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The 0-d parameters of ``model``, each once, in ``named_parameters`` order."""
    return [p for p in model.parameters() if p.dim() == 0]


def replicate_scalars(model: nn.Module, scalars: list[nn.Parameter], device: Any
                      ) -> list[nn.Parameter]:
    """Rank 0's ``scalars`` on every rank, on ``device``, gradients averaged; returns them.

    A rank that built the model on the meta device gets new ones.
    """
    scalars = _materialized(model, scalars, device)
    with torch.no_grad():
        for param in scalars:
            param.data = param.data.to(device)
            torch.distributed.broadcast(param.data, src=0)
    pending = {"queued": False}

    def average() -> None:
        pending["queued"] = False
        _average_gradients(scalars)

    def queue(_: Any) -> None:
        if not pending["queued"]:
            pending["queued"] = True
            torch.autograd.Variable._execution_engine.queue_callback(average)

    def after_forward(_module: nn.Module, _args: Any, output: Any) -> None:
        needing = [t for t in _tensors(output) if t.requires_grad]
        if needing and torch.is_grad_enabled():
            torch.autograd.graph.register_multi_grad_hook(needing, queue, mode="any")

    model.register_forward_hook(after_forward)
    return scalars


def _materialized(model: nn.Module, scalars: list[nn.Parameter], device: Any
                  ) -> list[nn.Parameter]:
    """``scalars`` with meta ones replaced in their modules by parameters with storage."""
    meta = {id(p) for p in scalars if p.is_meta}
    if not meta:
        return scalars
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) in meta:
                setattr(module, name, nn.Parameter(
                    torch.empty(param.shape, dtype=param.dtype, device=device),
                    requires_grad=param.requires_grad))
    return scalar_parameters(model)


def _average_gradients(scalars: list[nn.Parameter]) -> None:
    """One all-reduce: each gradient (0 where absent) and whether this rank has it."""
    first = scalars[0]
    packed = torch.zeros(2, len(scalars), dtype=torch.float32, device=first.device)
    world = torch.distributed.get_world_size()
    for index, param in enumerate(scalars):
        if param.grad is not None:
            packed[0, index] = param.grad.float() / world  # divided first, as DDP does
            packed[1, index] = 1.0
    torch.distributed.all_reduce(packed)
    for index, param in enumerate(scalars):
        if packed[1, index] > 0:
            param.grad = packed[0, index].to(param.dtype).reshape(())


def _tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a model's output."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for value in output.values() for t in _tensors(value)]
    if isinstance(output, (list, tuple)):
        return [t for value in output for t in _tensors(value)]
    return []
