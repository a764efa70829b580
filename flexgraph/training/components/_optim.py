"""Optimizer wrapper and parameter schedulers, built by MMEngine after ``type=`` names are
resolved and the scheduler defaults its Runner fills are filled."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from mmengine.registry import OPTIM_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS

from flexgraph.training.components._data import epoch_length_of
from flexgraph.training.config import RunSettings, build_from_cfg, resolve_type, section
from flexgraph.training.errors import ConfigError


def build_optim_wrapper(cfg: Any, model: torch.nn.Module, device: str = "cpu") -> Any:
    """``cfg.optim_wrapper`` -> an MMEngine optimizer wrapper over ``model``'s params.

    Build it after the model is placed and wrapped: the optimizer keeps the
    parameters it was given. On the CPU an ``AmpOptimWrapper`` becomes ``CPUAmpOptimWrapper``.

    Parameters
    ----------
    cfg, model
    device : str, default 'cpu'
        The device the model is on.

    Returns
    -------
    OptimWrapper or OptimWrapperDict
    """
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    from mmengine.optim import build_optim_wrapper as mm_build

    ow_cfg = section(cfg, "optim_wrapper")
    if ow_cfg is None:
        raise ConfigError(
            "no optim_wrapper in the config; add e.g. "
            "optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01))")
    if isinstance(ow_cfg, OptimWrapper):
        return ow_cfg
    ow_cfg = _resolved(ow_cfg)
    if str(device).startswith("cpu") and ow_cfg.get("type") is AmpOptimWrapper:
        from flexgraph.training.components._amp import CPUAmpOptimWrapper

        ow_cfg["type"] = CPUAmpOptimWrapper
    try:
        return mm_build(model, ow_cfg)
    except (KeyError, TypeError, AssertionError) as exc:
        raise ConfigError(f"optim_wrapper: {exc}") from exc


def _resolved(ow_cfg: Mapping[str, Any]) -> dict[str, Any]:
    args = dict(ow_cfg)
    if "type" in args:
        args["type"] = resolve_type(args["type"], OPTIM_WRAPPERS, what="optim_wrapper")
    optimizer = args.get("optimizer")
    if isinstance(optimizer, Mapping):
        if "type" not in optimizer:
            raise ConfigError("optim_wrapper.optimizer has no 'type'; e.g. type='AdamW'")
        args["optimizer"] = dict(optimizer, type=resolve_type(
            optimizer["type"], OPTIMIZERS, what="optim_wrapper.optimizer"))
    elif optimizer is None and "constructor" in args:
        # MultiOptimWrapperConstructor: one wrapper config per sub-module
        for key, value in args.items():
            if isinstance(value, Mapping) and "optimizer" in value:
                args[key] = _resolved(value)
    return args


def first_param_group(optim_wrapper: Any) -> dict[str, Any]:
    """The param group whose ``lr`` the loop logs (the first of the first optimizer).

    Parameters
    ----------
    optim_wrapper

    Returns
    -------
    dict
    """
    from mmengine.optim import OptimWrapperDict

    if isinstance(optim_wrapper, OptimWrapperDict):
        optim_wrapper = next(iter(optim_wrapper.optim_wrappers.values()))
    return optim_wrapper.optimizer.param_groups[0]


def build_param_schedulers(cfg: Any, settings: RunSettings, optim_wrapper: Any,
                           train_dataloader: Any) -> Any:
    """``cfg.param_scheduler`` -> MMEngine parameter schedulers, shaped as its Runner does.

    Parameters
    ----------
    cfg, settings, optim_wrapper, train_dataloader
        The last gives the epoch length.

    Returns
    -------
    list or dict
    """
    from mmengine.optim import OptimWrapperDict

    sched_cfg = section(cfg, "param_scheduler")
    if not sched_cfg:
        return {} if isinstance(optim_wrapper, OptimWrapperDict) else []
    if settings.train is None:
        raise ConfigError("param_scheduler needs train_cfg (max_epochs or max_iters)")
    epoch_length = epoch_length_of(train_dataloader)
    schedule = settings.train_schedule(epoch_length)
    per_optimizer = isinstance(sched_cfg, Mapping) and "type" not in sched_cfg
    if not isinstance(optim_wrapper, OptimWrapperDict):
        if per_optimizer:
            raise ConfigError(
                f"param_scheduler is a dict keyed by optimizer ({sorted(sched_cfg)}), but "
                f"optim_wrapper builds a single optimizer; give a scheduler dict or a list")
        return _schedulers(sched_cfg, optim_wrapper, schedule, epoch_length, "param_scheduler")
    if per_optimizer and set(sched_cfg) != set(optim_wrapper.optim_wrappers):
        raise ConfigError(
            f"param_scheduler has schedulers for {sorted(sched_cfg)} but optim_wrapper builds "
            f"the optimizers {sorted(optim_wrapper.optim_wrappers)}; use the same names")
    return {name: _schedulers(sched_cfg[name] if per_optimizer else sched_cfg, wrapper,
                              schedule, epoch_length, f"param_scheduler[{name!r}]")
            for name, wrapper in optim_wrapper.optim_wrappers.items()}


def _schedulers(sched_cfg: Any, optim_wrapper: Any, schedule: Any, epoch_length: int | None,
                what: str) -> list[Any]:
    entries = sched_cfg if isinstance(sched_cfg, (list, tuple)) else [sched_cfg]
    schedulers = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            schedulers.append(entry)  # already built
            continue
        args = copy.deepcopy(dict(entry))  # each optimizer gets its own scheduler objects
        by_epoch = args.get("by_epoch", True)
        args.setdefault("end", schedule.max_epochs if by_epoch else schedule.max_iters)
        where = what if len(entries) == 1 else f"{what}[{i}]"
        schedulers.append(build_from_cfg(
            args, PARAM_SCHEDULERS, what=where,
            default_args={"optimizer": optim_wrapper, "epoch_length": epoch_length}))
    return schedulers
