"""The FSDP strategy's step functions; each imports torch when it runs, not at plan."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.fsdp.options import FROM_LAUNCH


def _dtype(name: str | None) -> Any:
    import torch

    return None if name is None else getattr(torch, name)


def shard(env: Any, model: Any, *, auto_wrap_policy: Any = None,
          reshard_after_forward: bool = True, mixed_precision: Mapping[str, Any] | None = None,
          cpu_offload: bool = False, broadcast_from_rank0: bool = False,
          hybrid_mesh: str | tuple[int, int] | None = None) -> Any:
    """``fully_shard`` every unit the wrap policy picks (innermost first), then the root."""
    import torch
    from flexgraph.strategies.fsdp.copies import allow_sharded_copies, refuse_stale_parameters
    from flexgraph.strategies.fsdp.scalars import replicate_scalars, scalar_parameters
    from flexgraph.strategies.fsdp.units import resolve_wrap_policy, wrap_units
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if broadcast_from_rank0:
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                torch.distributed.broadcast(tensor.data, src=0)

    precision = dict(mixed_precision or {})
    policy = MixedPrecisionPolicy(
        param_dtype=_dtype(precision.get("param_dtype")),
        reduce_dtype=_dtype(precision.get("reduce_dtype")),
        output_dtype=_dtype(precision.get("output_dtype")),
        cast_forward_inputs=precision.get("cast_forward_inputs", True))
    options: dict[str, Any] = {"reshard_after_forward": reshard_after_forward,
                               "mp_policy": policy}
    if cpu_offload:
        if not str(env.device).startswith("cuda"):
            import warnings

            warnings.warn("strategy 'fsdp': model_wrapper.cpu_offload is ignored on a CPU run "
                          "(the parameters already live in CPU memory)", stacklevel=1)
        else:
            options["offload_policy"] = CPUOffloadPolicy()
    if hybrid_mesh is not None:
        options["mesh"] = _hybrid_mesh(env, hybrid_mesh)
    scalars = scalar_parameters(model)  # fully_shard refuses 0-d parameters
    if scalars:
        scalars = replicate_scalars(model, scalars, env.device)
        options["ignored_params"] = set(scalars)
    wrap = resolve_wrap_policy(auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy")
    for unit in wrap_units(model, wrap):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    refuse_stale_parameters(model)
    allow_sharded_copies(model)
    return model


def _units(model: Any) -> list[list[str]]:
    """Parameter names by the FSDP module that manages them, innermost first."""
    from torch.distributed.fsdp import FSDPModule

    units = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    owned: dict[str, list[str]] = {unit: [] for unit in reversed(units)}
    for name, _ in model.named_parameters():
        owner = max((u for u in units if u == "" or name.startswith(u + ".")), key=len,
                    default="")
        owned.setdefault(owner, []).append(name)
    return [names for names in owned.values() if names]


def _chunks(names: list[str], numel: dict[str, int], limit: int) -> list[list[str]]:
    """``names`` cut into runs of at most ``limit`` elements (a larger parameter alone)."""
    chunks: list[list[str]] = []
    size = limit + 1
    for name in names:
        if size + numel[name] > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(name)
        size += numel[name]
    return chunks


def scatter_rows(env: Any, model: Any, record: Any, source_rank: int) -> None:
    """``init_weights``' placer: each rank's rows of every parameter, unit by unit.

    The ranks make runs of one dtype, no larger than the largest parameter, from
    ``record`` in turn; each maker scatters every rank's rows as one padded buffer.
    """
    import torch
    import torch.distributed as dist
    from flexgraph.strategies.fsdp.shards import local_rows, local_tensor

    params = dict(model.named_parameters())
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, {name: local_rows(p) for name, p in params.items()})
    numel = {name: p.numel() for name, p in params.items()}
    limit = max(numel.values(), default=0)
    runs = [chunk for names in _units(model)
            for dtype in dict.fromkeys(params[n].dtype for n in names)
            for chunk in _chunks([n for n in names if params[n].dtype == dtype], numel, limit)]
    turns = record.made_in_turn(runs, source=source_rank, rank=dist.get_rank(),
                                world=dist.get_world_size())
    for run, (maker, made) in zip(runs, turns, strict=True):
        sizes = [sum((r[n][1] - r[n][0]) * _row_numel(params[n]) for n in run) for r in rows]
        received = torch.empty(max(sizes), dtype=params[run[0]].dtype, device=env.device)
        packed = None if made is None else [
            _packed([made[n] for n in run], [r[n] for n in run], max(sizes)).to(env.device)
            for r in rows]
        del made
        dist.scatter(received, packed, src=maker)
        del packed
        offset = 0
        with torch.no_grad():
            for n in run:
                local = local_tensor(params[n])
                count = local.numel()
                local.copy_(received[offset:offset + count].view_as(local))
                offset += count


def _row_numel(tensor: Any) -> int:
    """Elements in one row of ``tensor`` (a 0-d tensor: one)."""
    return math.prod(tensor.shape[1:])


def _packed(tensors: list[Any], rows: list[tuple[int, int]], length: int) -> Any:
    """The given rows of each tensor, flattened one after the other, padded to ``length``."""
    import torch

    flat = torch.cat([t.reshape(1) if t.dim() == 0 else t[start:stop].reshape(-1)
                      for t, (start, stop) in zip(tensors, rows, strict=True)])
    return torch.nn.functional.pad(flat, (0, length - flat.numel()))


def _hybrid_mesh(env: Any, shape: str | tuple[int, int]) -> Any:
    """The 2-D mesh of hybrid sharding: sharded within a row of consecutive ranks (a node)."""
    import os

    from mmengine.logging import MMLogger
    from torch.distributed.device_mesh import init_device_mesh

    from flexgraph.training.errors import ConfigError

    if shape == FROM_LAUNCH:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        shape = (max(env.world_size // per_node, 1), per_node)
    if shape[0] * shape[1] != env.world_size:
        raise ConfigError(f"strategy 'fsdp': a hybrid mesh of {shape[0]} x {shape[1]} needs "
                          f"{shape[0] * shape[1]} ranks, the run has {env.world_size}; fix "
                          f"model_wrapper.device_mesh or the launch")
    MMLogger.get_current_instance().info(
        f"fully_shard: hybrid mesh {shape[0]} x {shape[1]} (replicated {shape[0]} times, each "
        f"copy sharded over {shape[1]} ranks)")
    return init_device_mesh(str(env.device).split(":")[0], shape,
                            mesh_dim_names=("replicate", "shard"))


def materialize(env: Any, model: Any) -> Any:
    """Storage on ``env.device`` for this rank's shards, NaN until something sets them."""
    from flexgraph.strategies.fsdp.shards import materialize_module

    return materialize_module(model, env.device)


def checkpoint_blocks(model: Any, *, options: Mapping[str, Any],
                      auto_wrap_policy: Any = None) -> Any:
    """MMEngine's ``activation_checkpointing=dict(check_fn=...)``."""
    from flexgraph.strategies.fsdp.units import checkpoint_selected

    checkpoint_selected(model, options, auto_wrap_policy)
    return model
