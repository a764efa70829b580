"""Second copies of a sharded model's weights, and the writes sharding loses.

MMEngine's averaged models (EMA) deep-copy the model, which FSDP2 refuses: the copy is
made of this rank's shards instead. A model that updates its own weights in place (MoCo
v3's momentum encoder) loses those writes under FSDP, and is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from flexgraph.training.errors import TrainingError

__all__ = ["ShardedCopy", "allow_sharded_copies", "forward_writes", "refuse_stale_parameters",
           "watch_forward_writes"]


class ShardedCopy(nn.Module):
    """A module's parameters and buffers, copied as this rank's shards, under the same names."""

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # a whole tensor (a DDP checkpoint's average) is cut to this rank's shard
        from torch.distributed.tensor import DTensor, distribute_tensor

        for name, mine in self._parameters.items():
            value = state_dict.get(prefix + name)
            if isinstance(mine, DTensor) and value is not None and not isinstance(value, DTensor):
                state_dict[prefix + name] = distribute_tensor(
                    value.to(mine.device), mine.device_mesh, mine.placements, src_data_rank=None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a copy of a sharded model holds this rank's shards only: it can be "
                           "averaged, swapped and saved, not run; run the model itself")


def sharded_copy(module: nn.Module, memo: dict[int, Any] | None = None) -> ShardedCopy:
    """``module``'s parameters and buffers as a :class:`ShardedCopy`."""
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    node = memo[id(module)] = ShardedCopy()
    for name, param in module._parameters.items():
        if param is not None and id(param) not in memo:
            memo[id(param)] = nn.Parameter(param.detach().clone(), requires_grad=False)
        node.register_parameter(name, None if param is None else memo[id(param)])
    for name, buffer in module._buffers.items():
        node.register_buffer(name, None if buffer is None else buffer.detach().clone(),
                             persistent=name not in module._non_persistent_buffers_set)
    for name, child in module._modules.items():
        node.add_module(name, None if child is None else sharded_copy(child, memo))
    return node


def allow_sharded_copies(model: nn.Module) -> None:
    """``copy.deepcopy`` of ``model``'s sharded modules gives a :class:`ShardedCopy`."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            # deepcopy looks __deepcopy__ up on the instance: this model alone changes
            module.__dict__["__deepcopy__"] = functools.partial(sharded_copy, module)


def _fsdp_params(model: nn.Module) -> dict[str, Any]:
    """Each sharded parameter's dotted name and FSDP's record of it."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(m): n for n, m in model.named_modules()}
    found: dict[str, Any] = {}
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(
            module, FSDPModule) else None
        for fsdp_param in group.fsdp_params if group is not None else ():
            info = fsdp_param._module_info
            found[".".join(filter(None, (names[id(info.module)], info.param_name)))] = fsdp_param
    return found


def _written(fsdp_param: Any) -> bool:
    """Whether this rank's rows of the gathered parameter differ from its shard."""
    import torch

    gathered = getattr(fsdp_param, "_unsharded_param", None)
    if gathered is None or gathered.untyped_storage().size() == 0:
        return False  # not gathered now: nothing to compare
    gathered = gathered.to_local() if hasattr(gathered, "to_local") else gathered
    info = fsdp_param.mesh_info
    rows = torch.chunk(gathered.detach(), info.shard_mesh_size, dim=0)
    mine = fsdp_param.sharded_param.to_local().detach()
    if info.shard_mesh_rank >= len(rows):
        return False
    return not torch.equal(rows[info.shard_mesh_rank], mine.to(gathered.dtype))


def forward_writes(model: nn.Module) -> str | None:
    """What the last ``forward`` wrote in place to a gathered parameter, if anything.

    Called while the copies are gathered: this rank's rows of each against its shard.
    """
    written = [name for name, fsdp_param in _fsdp_params(model).items() if _written(fsdp_param)]
    if not written:
        return None
    more = f" and {len(written) - 1} more" if len(written) > 1 else ""
    return (f"FSDP: the forward wrote in place to parameter {written[0]!r}{more} (a momentum "
            f"encoder updated in place?); FSDP frees that write with the gathered copy, so "
            f"those weights never change; use DDPStrategy or DeepSpeed ZeRO-1/2, which keep "
            f"the weights whole")


def watch_forward_writes(model: nn.Module, report: Callable[[str], Any]) -> None:
    """``report`` :func:`forward_writes` after each sharded unit's first training forward."""
    from torch.distributed.fsdp import FSDPModule

    def after_forward(module: nn.Module, args: Any, output: Any) -> None:
        if module.training:
            handles.pop(id(module)).remove()
            problem = forward_writes(module)
            if problem:
                report(problem)

    handles = {id(m): m.register_forward_hook(after_forward, prepend=True)
               for m in model.modules() if isinstance(m, FSDPModule)}


def refuse_stale_parameters(model: nn.Module) -> None:
    """Refuse a sharded model whose modules hold on to parameters ``fully_shard`` replaced."""
    current = {id(p) for p in model.parameters()}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            items = value.values() if isinstance(value, dict) else value if isinstance(
                value, (list, tuple)) else ()
            if not attr.startswith("_") and any(
                    isinstance(v, nn.Parameter) and id(v) not in current for v in items):
                raise TrainingError(
                    f"FSDP: {name or 'the model'} ({type(module).__name__}) keeps parameters "
                    f"of its own in {attr!r}, which fully_shard replaced: what it writes into "
                    f"them (a momentum encoder's update) never reaches the weights trained; "
                    f"use DDPStrategy or DeepSpeed ZeRO-1/2, which keep the weights whole")
