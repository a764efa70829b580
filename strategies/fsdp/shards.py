"""This rank's shards of an FSDP2 model: their storage, their rows, and loading into them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flexgraph.training.checkpoint import Slices

__all__ = ["ROWS", "local_rows", "local_tensor", "materialize_module",
           "uninitialised_parameters"]


def materialize_module(model: nn.Module, device: str) -> nn.Module:
    """Give a meta-built model storage on ``device``, floating-point parameters NaN (unset)."""
    buffers = {name: b for name, b in model.named_buffers() if b.device.type != "meta"}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, saved in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            module._buffers[leaf] = saved.to(device)
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))
    return model


def uninitialised_parameters(model: nn.Module) -> list[str]:
    """Names of floating-point parameters holding NaN in this rank's shard."""
    from torch.distributed.tensor import DTensor

    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if local.is_floating_point() and local.numel() and torch.isnan(local).any():
                bad.append(name)
    return bad


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: a DTensor's local shard, else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_rows(tensor: torch.Tensor) -> tuple[int, int]:
    """The rows ``(start, stop)`` of dimension 0 that this rank holds of ``tensor``."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if tensor.dim() == 0:
        return 0, 1
    if not isinstance(tensor, DTensor):
        return 0, tensor.shape[0]
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                          tensor.placements)
    if any(offset[1:]) or tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise ValueError(f"a tensor of shape {tuple(tensor.shape)} sharded as "
                         f"{tensor.placements} is not split by rows alone")
    return offset[0], offset[0] + shape[0]


def read_own_rows(entry: torch.Tensor, value: torch.Tensor, mapped: Any) -> None:
    """This rank's rows of ``mapped``'s ``value`` into ``entry``."""
    start, stop = local_rows(entry)
    mapped.read_rows(value, start, stop, local_tensor(entry).detach())


def receive_rows(entry: torch.Tensor, value: torch.Tensor | None) -> None:
    """Rank 0's whole ``value`` to every rank, each keeping its rows of it (a collective)."""
    local = local_tensor(entry)
    if value is not None:
        whole = value.to(device=local.device, dtype=local.dtype).contiguous()
    else:
        whole = torch.empty(tuple(entry.shape), dtype=local.dtype, device=local.device)
    torch.distributed.broadcast(whole, src=0)
    start, stop = local_rows(entry)
    local.copy_(whole if entry.dim() == 0 else whole[start:stop])


ROWS = Slices(read_own=read_own_rows, receive=receive_rows)
"""FSDP2's slices for :func:`~flexgraph.training.checkpoint.load_into_slices`: rows."""
