"""DeepSpeed's contracts: ZeRO-3's partitions and lost writes, the engine's master copies."""

from __future__ import annotations

import math
from typing import Any

import torch
from flexgraph.strategies.deepspeed.params import empty_parameters, watch_forward_writes

from flexgraph.training.contracts import optimizer_holds_model

__all__ = ["engine_holds_model", "forward_writes_kept", "partitioned"]


def _module(model: Any) -> Any:
    """The user's module, under the engine's wrapper or not."""
    return model.module if hasattr(model, "engine") else model


def partitioned(env: Any, model: Any) -> str | None:
    """Under ZeRO-3, each parameter is partitioned over the whole data-parallel group."""
    module = _module(model)
    empty = empty_parameters(module)
    if empty:
        return empty
    whole = [n for n, p in module.named_parameters() if not hasattr(p, "ds_id")]
    if whole:
        return (f"{len(whole)} parameters are whole on every rank, not partitioned (e.g. "
                f"{whole[0]!r}): the model was built outside deepspeed.zero.Init, so every rank "
                f"held all of it; fix: keep build_model's init_context as the strategy sets it")
    world = env.world_size
    over = [(n, p) for n, p in module.named_parameters()
            if p.ds_tensor.numel() != math.ceil(p.ds_numel / world)]
    if not over:
        return None
    name, param = over[0]
    return (f"{len(over)} parameters are not split over the {world} ranks (e.g. {name!r}, "
            f"whose partition here holds {param.ds_tensor.numel()} of its {param.ds_numel} "
            f"elements): they were partitioned before the process group of all ranks existed; "
            f"fix: build the model after setup_env")


def forward_writes_kept(model: Any, report: Any) -> None:
    """Under ZeRO-3, the first training forward wrote nothing in place to a parameter."""
    watch_forward_writes(_module(model), report)


def engine_holds_model(model: Any, optim_wrapper: Any) -> str | None:
    """The engine's optimizer holds the model's weights (ZeRO-1/2: its master partitions)."""
    engine = model.engine
    optimizer = engine.optimizer
    masters = getattr(optimizer, "single_partition_of_fp32_groups", None)
    if masters is None:
        plain = not (engine.zero_optimization_partition_weights() or engine.fp16_enabled()
                     or engine.bfloat16_enabled())
        return optimizer_holds_model(model.module, optim_wrapper) if plain else None
    stale = []
    with torch.no_grad():
        for i, master in enumerate(masters):
            rank = torch.distributed.get_rank(group=optimizer.real_dp_process_group[i])
            weights = optimizer.parallel_partitioned_bit16_groups[i][rank]
            if not torch.equal(master.to(weights.dtype), weights):
                stale.append(i)
    if not stale:
        return None
    return (f"the optimizer's master copy of {len(stale)} of {len(masters)} parameter groups "
            f"differs from the model's weights: they went into the module past the engine, "
            f"so the first optimizer step writes the old masters back over them; fix: load "
            f"through the strategy's checkpoint IO (Configure('build_checkpointer') as the "
            f"strategy sets it), or before deepspeed_initialize")
