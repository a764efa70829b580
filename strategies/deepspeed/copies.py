"""ZeRO-3 and second copies of the weights: an averaged copy held as partitions.

MMEngine's averaged models (EMA) deep-copy the model, whose parameters are empty
placeholders under ZeRO-3; the copy is made of this rank's partitions instead, and
MMEngine's update and swap work on partitions, no rank holding the average whole.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
from flexgraph.strategies.deepspeed.models import saved_shape
from torch import nn

__all__ = ["PartitionedCopy", "Partitions", "allow_partitioned_copies"]


class PartitionedCopy(nn.Module):
    """A ZeRO-3 model's partitions and buffers, copied under the same names; it cannot run."""

    def __init__(self, sources: dict[str, nn.Parameter], tree: dict[str, Any]) -> None:
        super().__init__()
        self.__dict__["sources"] = sources  # each parameter's ZeRO-3 source, not a submodule
        self.__dict__["tree"] = tree  # shared by the copy's modules: its root, what to save

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Its partitions when asked directly; whole tensors inside its averaged model's."""
        if self.tree["root"] is self:
            self.tree["whole"] = bool(kwargs.get("prefix", args[1] if len(args) > 1 else ""))
        return super().state_dict(*args, **kwargs)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, mine in self._parameters.items() if self.tree["whole"] else ():
            if mine is None:
                continue
            source = self.sources[name]
            world = torch.distributed.get_world_size(group=source.ds_process_group)
            pieces = [torch.empty_like(mine) for _ in range(world)]
            torch.distributed.all_gather(pieces, mine.detach(), group=source.ds_process_group)
            whole = torch.cat(pieces)[:source.ds_numel].view(source.ds_shape)
            destination[prefix + name] = saved_shape(source, whole)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # a whole tensor (a checkpoint's, any strategy's) is cut to this rank's partition
        for name, mine in self._parameters.items():
            value = state_dict.get(prefix + name)
            source = self.sources[name]
            if mine is not None and value is not None and value.numel() == source.ds_numel:
                size = mine.numel()
                rank = torch.distributed.get_rank(group=source.ds_process_group)
                piece = value.reshape(-1)[rank * size:(rank + 1) * size]
                state_dict[prefix + name] = torch.zeros_like(mine)
                state_dict[prefix + name][:piece.numel()] = piece
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a copy of a ZeRO-3 model holds this rank's partitions only: it can "
                           "be averaged, swapped and saved, not run; run the model itself")


def partitioned_copy(module: nn.Module, memo: dict[int, Any] | None = None) -> PartitionedCopy:
    """``module``'s parameters as copies of this rank's partitions, its buffers copied."""
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    tree = memo.setdefault("tree", {"whole": False})
    node = memo[id(module)] = PartitionedCopy(dict(module._parameters), tree)
    tree.setdefault("root", node)
    for name, param in module._parameters.items():
        if param is not None and id(param) not in memo:
            memo[id(param)] = nn.Parameter(param.ds_tensor.detach().clone(), requires_grad=False)
        node.register_parameter(name, None if param is None else memo[id(param)])
    for name, buffer in module._buffers.items():
        node.register_buffer(name, None if buffer is None else buffer.detach().clone(),
                             persistent=name not in module._non_persistent_buffers_set)
    for name, child in module._modules.items():
        node.add_module(name, None if child is None else partitioned_copy(child, memo))
    return node


class Partitions:
    """A ZeRO-3 model as its averaged copy sees it: partitions and buffers."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((name, param.ds_tensor) for name, param in self.model.named_parameters())

    def parameters(self) -> Iterator[torch.Tensor]:
        return (partition for _, partition in self.named_parameters())

    def buffers(self) -> Iterator[torch.Tensor]:
        return self.model.buffers()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**dict(self.named_parameters()), **{
            name: buffer for name, buffer in self.model.named_buffers()}}

    def release(self) -> None:
        """Free the parameters held gathered."""
        whole = [p for p in self.model.parameters() if p.data.numel()]
        if whole:
            whole[0].partition(param_list=whole)


def _update_partitions(self: Any, update: Any, model: Any) -> None:
    partitioned = isinstance(self.module, PartitionedCopy) and not isinstance(model, Partitions)
    update(self, Partitions(model) if partitioned else model)


def _hook_on_partitions(self: Any, method: Any, *args: Any, release: bool = False,
                        **kwargs: Any) -> None:
    """``EMAHook``'s ``method``, its source model seen as partitions where its copy is one."""
    if not isinstance(self.ema_model.module, PartitionedCopy):
        method(self, *args, **kwargs)
        return
    source, self.src_model = self.src_model, Partitions(self.src_model)
    if release:
        self.src_model.release()
    try:
        method(self, *args, **kwargs)
    finally:
        self.src_model = source


def allow_partitioned_copies(model: nn.Module) -> None:
    """``copy.deepcopy(model)`` gives a :class:`PartitionedCopy` (this model alone)."""
    from mmengine.hooks import EMAHook
    from mmengine.model import BaseAveragedModel

    model.__dict__["__deepcopy__"] = functools.partial(partitioned_copy, model)
    if "partitions" not in vars(BaseAveragedModel):  # once per process
        BaseAveragedModel.partitions = True
        BaseAveragedModel.update_parameters = functools.partialmethod(
            _update_partitions, BaseAveragedModel.update_parameters)
        EMAHook._swap_ema_parameters = functools.partialmethod(
            _hook_on_partitions, EMAHook._swap_ema_parameters, release=True)
        EMAHook.after_train_iter = functools.partialmethod(
            _hook_on_partitions, EMAHook.after_train_iter)
