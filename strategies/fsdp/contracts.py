"""FSDP's contracts (:mod:`flexgraph.training.contracts`): what its steps leave, checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flexgraph.strategies.fsdp.shards import uninitialised_parameters

__all__ = ["dtypes_uniform", "every_parameter_set", "forward_writes_kept", "source_alone_whole"]

SOURCE_RANK = 0


def every_parameter_set(env: Any, model: Any) -> str | None:
    """Every parameter was set (none left NaN by ``materialize``), on every rank (a collective)."""
    bad: list[list[str]] = [[] for _ in range(env.world_size)]
    torch.distributed.all_gather_object(bad, uninitialised_parameters(model))
    names = sorted({name for rank in bad for name in rank})
    if not names:
        return None
    return (f"{len(names)} parameters were never initialised after materialize (e.g. "
            f"{names[0]!r}): their module has no reset_parameters(), init_weights is not "
            f"planned (skip_init_weights=True, or pruned because the files cover the model) and "
            f"the loaded files did not set them (a hook dropped them?); fix: give the module a "
            f"reset_parameters() or load them from a checkpoint")


def source_alone_whole(env: Any, model: Any) -> str | None:
    """No rank but the source holds the model's weights after ``build_model`` (a collective)."""
    made = [n for n, p in model.named_parameters() if p.device.type != "meta"]
    every: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(every, made[:1])
    whole = [rank for rank, names in enumerate(every) if names and rank != SOURCE_RANK]
    if not whole:
        return None
    return (f"rank {whole[0]} built the model whole (parameters with storage, e.g. "
            f"{every[whole[0]][0]!r}): every rank holds all of it before sharding; fix: leave "
            f"build_model on device='meta' as the strategy configures it")


def _signature(model: Any, params: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """Each unit fully_shard will make, in its order, with its trainable parameters' dtypes."""
    from flexgraph.strategies.fsdp.units import resolve_wrap_policy, wrap_units

    policy = resolve_wrap_policy(params.get("auto_wrap_policy"), model,
                                 what="model_wrapper.auto_wrap_policy")
    names = {id(m): n for n, m in model.named_modules()}
    units = [*wrap_units(model, policy), model]
    taken: set[int] = set()
    signature = []
    for unit in units:
        dtypes = sorted({str(p.dtype) for p in unit.parameters()
                         if p.requires_grad and id(p) not in taken})
        taken.update(id(p) for p in unit.parameters())
        signature.append((names[id(unit)] or "<root>", dtypes))
    return signature


def dtypes_uniform(env: Any, model: Any, params: Mapping[str, Any]) -> str | None:
    """Before ``fully_shard``: each unit's trainable parameters share one dtype on every rank."""
    mine = _signature(model, params)
    every: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(every, mine)
    mixed = next(((unit, dtypes) for unit, dtypes in mine if len(dtypes) > 1), None)
    if mixed is not None:
        return (f"unit {mixed[0]!r} mixes {' and '.join(mixed[1])} parameters, which "
                f"fully_shard flattens as one; fix: cast the model to one dtype before sharding "
                f"(model_wrapper.mixed_precision chooses the compute dtype)")
    other = next((rank for rank, theirs in enumerate(every) if theirs != mine), None)
    if other is None:
        return None
    pairs = zip(mine, every[other], strict=False)
    unit, dtypes, theirs = next(((u, d, t[1]) for (u, d), t in pairs if [u, d] != list(t)),
                                (mine[0][0], mine[0][1], "?"))
    return (f"ranks {env.rank} and {other} hold unit {unit!r} in different dtypes "
            f"({'/'.join(dtypes) or 'none'} and {'/'.join(theirs) or 'none'}); their shards "
            f"would be exchanged in sizes the ranks do not agree on, and the run would hang; "
            f"fix: cast the model the same way on every rank")


def forward_writes_kept(model: Any, report: Any) -> None:
    """Each unit's first training forward wrote nothing in place to a gathered parameter."""
    from flexgraph.strategies.fsdp.copies import watch_forward_writes

    watch_forward_writes(model, report)
