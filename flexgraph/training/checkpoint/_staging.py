"""Staging for background saves: one copy of the state, into buffers kept between saves.

The copy blocks training; a fresh allocation would fault in every page, so
buffers are reused, as DCP's ``cache_staged_state_dict`` does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter


class StagedWriter(FileSystemWriter):
    """DCP's file writer, taking the state as :class:`Staging` already copied it."""

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict


def _same_layout(buffer: torch.Tensor, value: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    if type(buffer) is not type(value) or buffer.shape != value.shape \
            or buffer.dtype != value.dtype:
        return False
    if isinstance(value, DTensor):
        return (buffer.placements == value.placements
                and buffer.device_mesh == value.device_mesh
                and buffer.to_local().shape == value.to_local().shape)
    return buffer.stride() == value.stride()


def _fresh_copy(value: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``value`` (of a DTensor: its shard, as a DTensor)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.detach().to("cpu", copy=True)
    buffer = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                 device="cpu", pin_memory=torch.cuda.is_available())
    return buffer.copy_(value.detach())


def _copy_into(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """``value``'s data into ``buffer`` (DTensors: shard into shard)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        if isinstance(value, DTensor):
            buffer.to_local().copy_(value.detach().to_local())
        else:
            buffer.copy_(value.detach())


class Staging:
    """CPU copies of a state's tensors, in buffers reused from one save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def stage(self, value: Any) -> Any:
        """``value`` with every tensor copied to CPU memory that training does not touch."""
        seen: set[tuple[Any, ...]] = set()
        staged = self._stage(value, (), seen)
        for key in set(self._buffers) - seen:  # tensors the state no longer holds
            del self._buffers[key]
        return staged

    def _stage(self, value: Any, key: tuple[Any, ...], seen: set[tuple[Any, ...]]) -> Any:
        if isinstance(value, torch.Tensor):
            seen.add(key)
            buffer = self._buffers.get(key)
            if buffer is not None and _same_layout(buffer, value):
                _copy_into(buffer, value)
                return buffer
            self._buffers[key] = _fresh_copy(value)
            return self._buffers[key]
        if isinstance(value, dict):
            return {k: self._stage(v, (*key, k), seen) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._stage(v, (*key, i), seen) for i, v in enumerate(value))
        return value
