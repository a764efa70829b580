"""DeepSpeed's state by parameter name: how a ZeRO engine writes and reads portable checkpoints.

ZeRO's flat fp32 partitions say nothing of which parameter a slice belongs to;
DeepSpeed's ``safe_get_full_*`` / ``safe_set_full_*`` collectives assemble or scatter one
parameter's master weight or moment, walked in the same order on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from flexgraph.strategies.deepspeed.models import saved_shape

from flexgraph.training.checkpoint import StateAccess, TorchStateAccess, as_on_rank0

__all__ = ["DeepSpeedStateAccess"]


def _zero(model: Any) -> tuple[Any, Any, torch.optim.Optimizer]:
    """The engine, its ZeRO optimizer, and the torch optimizer over the flat partitions."""
    engine = model.engine
    zero = engine.optimizer
    return engine, zero, getattr(zero, "optimizer", zero)


def _partitioned(module: torch.nn.Module) -> bool:
    """Whether ZeRO holds this module's fp32 masters (stage 1-3), not torch's optimizer."""
    return any(hasattr(p, "_hp_mapping") or hasattr(p, "ds_id") for p in module.parameters())


def _buffers(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The persistent buffers, by name (what ``state_dict`` holds besides parameters)."""
    for prefix, sub in module.named_modules():
        for name, buffer in sub.named_buffers(recurse=False):
            if buffer is not None and name not in sub._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), buffer


def _group_params(zero: Any, base: torch.optim.Optimizer) -> list[list[torch.nn.Parameter]]:
    """The module parameters of each of the optimizer's param groups."""
    if hasattr(zero, "bit16_groups"):  # ZeRO-1/2
        return [list(g) for g in zero.bit16_groups]
    if hasattr(zero, "bf16_groups"):  # bf16 optimizer (ZeRO-1 with bf16)
        return [list(g) for g in zero.bf16_groups]
    groups: list[list[torch.nn.Parameter]] = [[] for _ in base.param_groups]
    for sub_group, params in enumerate(zero.fp16_groups):  # ZeRO-3: sub-groups of groups
        groups[zero.sub_group_to_group_id[sub_group]] += list(params)
    return groups


def _flat_partitions(zero: Any, base: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's flat fp32 partitions (ZeRO-3's are in the param groups only as it steps)."""
    for attr in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups",
                 "fp32_groups_flat_partition"):
        flats = getattr(zero, attr, None)
        if flats:
            return list(flats)
    return [p for group in base.param_groups for p in group["params"]]


def _link_optimizer_state(zero: Any, base: torch.optim.Optimizer) -> None:
    """Point every parameter's fragment at its group's optimizer state as it is now.

    ZeRO-1/2 link them at their first step only: a group not stepped then has no state
    (``safe_get_full_optimizer_state`` raises "exp_avg not found").
    """
    from deepspeed.utils import lazy_init_hp_params_optimizer_state

    groups = getattr(zero, "bit16_groups", None) or getattr(zero, "bf16_groups", None)
    if groups is None:  # ZeRO-3: fragments are read from the partitions directly
        link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)
        if callable(link) and base.state:
            link()
        return
    for params, flat in zip(groups, _flat_partitions(zero, base), strict=True):
        if flat in base.state:
            lazy_init_hp_params_optimizer_state(params, flat, base.state)


def _set_fp32(param: torch.nn.Parameter, value: torch.Tensor, key: str | None = None) -> None:
    """Put a whole tensor into ZeRO's fp32 partitions: the master weight, or state ``key``.

    Under ZeRO-3 the partition is cut and padded here: DeepSpeed's ``safe_set_full_*``
    fails where the ranks do not divide a parameter's size.
    """
    from deepspeed.utils import (
        safe_set_full_fp32_param,
        safe_set_full_optimizer_state,
        safe_set_local_fp32_param,
        safe_set_local_optimizer_state,
    )

    value = value.to(torch.float32)
    if not hasattr(param, "ds_id"):  # ZeRO-1/2: DeepSpeed maps the fragments itself
        value = value.to(param.device)
        if key is None:
            safe_set_full_fp32_param(param, value)
        else:
            safe_set_full_optimizer_state(param, value, key)
        return
    size = param.ds_tensor.numel()
    start = torch.distributed.get_rank(group=param.ds_process_group) * size
    piece = value.reshape(-1)[start:start + size]
    partition = torch.zeros(size, dtype=torch.float32, device=param.ds_tensor.device)
    partition[:piece.numel()] = piece
    if key is None:
        safe_set_local_fp32_param(param, partition)
    else:
        safe_set_local_optimizer_state(param, partition, key)


def _full_weight(param: torch.nn.Parameter) -> torch.Tensor:
    """One parameter whole: its fp32 master, else (frozen) the gathered parameter itself."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    value = safe_get_full_fp32_param(param)
    if value is None:
        if hasattr(param, "ds_id"):
            with deepspeed.zero.GatheredParameters([param]):
                value = param.data.clone()
        else:
            value = param.data.clone()
    return value.detach().cpu()


def _state_keys(base: torch.optim.Optimizer) -> tuple[list[str], torch.Tensor | None]:
    """The optimizer's per-element state keys (``exp_avg``, ...) and its step count."""
    for flat, state in base.state.items():
        keys = [k for k, v in state.items() if isinstance(v, torch.Tensor)
                and k != "step" and v.numel() == flat.numel()]
        step = state.get("step")
        step = torch.as_tensor(step, dtype=torch.float32).detach().clone().cpu() \
            if step is not None else None
        return keys, step
    return [], None


class DeepSpeedStateAccess(StateAccess):
    """A ZeRO engine's fp32 master weights and optimizer state, by parameter name."""

    name = "deepspeed"

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        module = model.engine.module
        # every name of a shared parameter, as in a state_dict
        out = {name: saved_shape(p, _full_weight(p))
               for name, p in module.named_parameters(remove_duplicate=False)}
        buffers = dict(_buffers(module))
        out.update({name: b.detach().cpu().clone()
                    for name, b in as_on_rank0(buffers, list(buffers)).items()})
        return out

    def optimizer_state(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        from deepspeed.utils import safe_get_full_optimizer_state

        engine, zero, base = _zero(model)
        module = engine.module
        if not _partitioned(module):
            return TorchStateAccess().optimizer_state(module, optim_wrapper)
        _link_optimizer_state(zero, base)
        keys, step = _state_keys(base)
        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            entry = {k: saved_shape(param, safe_get_full_optimizer_state(param, k).detach().cpu())
                     for k in keys}
            if step is not None:
                entry["step"] = step.clone()
            state[name] = entry
        name_of = {id(p): n for n, p in module.named_parameters()}
        groups = [{**{k: v for k, v in group.items() if k != "params"},
                   "params": [name_of[id(p)] for p in params]}
                  for group, params in zip(base.param_groups, _group_params(zero, base),
                                           strict=True)]
        return {"state": state, "param_groups": groups}

    def parameter_names(self, model: Any) -> list[str]:
        """ZeRO's groups hold only the trained parameters; a ``.pth`` numbered them all."""
        return [name for name, _ in model.engine.module.named_parameters()]

    def templates(self, model: Any, optim_wrapper: Any, saved: dict[str, tuple[int, ...]]
                  ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        module = model.engine.module
        if not _partitioned(module) and optim_wrapper is not None:
            return TorchStateAccess().templates(module, optim_wrapper, saved)
        names = [n for n, _ in module.named_parameters()] + [n for n, _ in _buffers(module)]
        model_part = {n: torch.empty(saved[f"model.{n}"]) for n in names
                      if f"model.{n}" in saved}
        if optim_wrapper is None:
            return model_part, None
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        optimizer_part: dict[str, dict[str, torch.Tensor]] = {}
        for key, shape in saved.items():
            name, _, state_key = key.removeprefix("optimizer.").rpartition(".")
            if key.startswith("optimizer.") and name in trainable:
                optimizer_part.setdefault(name, {})[state_key] = torch.empty(shape)
        return model_part, optimizer_part

    def set_state(self, model: Any, optim_wrapper: Any, model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, full: bool,
                  strict: bool = True) -> None:
        engine, zero, base = _zero(model)
        module = engine.module
        if not _partitioned(module):
            TorchStateAccess().set_state(module, optim_wrapper, model_state, optimizer_state,
                                         full=True, strict=strict)
            return
        own = [n for n, _ in module.named_parameters()] + [n for n, _ in _buffers(module)]
        missing = [n for n in own if n not in model_state]
        if strict and missing:
            raise KeyError(f"the checkpoint has no weights for {missing[:5]}")
        self._set_weights(module, model_state)
        if optimizer_state is not None and optim_wrapper is not None:
            self._set_optimizer(module, zero, base, optimizer_state)

    @staticmethod
    def _set_weights(module: torch.nn.Module, model_state: dict[str, Any]) -> None:
        """Parameters (gathered one at a time under ZeRO-3), fp32 masters, buffers."""
        import deepspeed

        with torch.no_grad():
            for name, param in module.named_parameters():
                if name not in model_state:
                    continue
                value = model_state[name]
                if hasattr(param, "ds_id"):
                    with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                        param.data.copy_(value)
                else:
                    param.data.copy_(value)
                if param.requires_grad:
                    _set_fp32(param, value)
            for name, buffer in _buffers(module):
                if name in model_state:
                    buffer.copy_(model_state[name])

    @staticmethod
    def _set_optimizer(module: torch.nn.Module, zero: Any, base: torch.optim.Optimizer,
                       optimizer_state: dict[str, Any]) -> None:
        """Step count and zero state into every partition first, then each parameter's moments."""
        state = optimizer_state.get("state") or {}
        keys = sorted({k for entry in state.values() for k in entry if k != "step"})
        step = next((entry["step"] for entry in state.values() if "step" in entry), None)
        for flat in _flat_partitions(zero, base):
            held = base.state[flat]
            for key in keys:
                if key not in held:
                    held[key] = torch.zeros_like(flat)
            if step is not None:
                held["step"] = torch.as_tensor(step, dtype=torch.float32).clone()
        link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)
        if callable(link):
            link()
        for name, param in module.named_parameters():
            if param.requires_grad and name in state:
                for key in keys:
                    _set_fp32(param, state[name][key], key)
        saved_groups = optimizer_state.get("param_groups") or []
        if len(saved_groups) == len(base.param_groups):
            for group, saved in zip(base.param_groups, saved_groups, strict=True):
                group.update({k: v for k, v in saved.items() if k != "params" and k in group})
