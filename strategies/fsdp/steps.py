"""The FSDP strategy's step functions: what its rewrites bring into the plan.

* :func:`shard`: ``fully_shard`` on every wrap-policy unit, innermost first,
  then the root (``fully_shard``), on a hybrid mesh for HYBRID_SHARD.
* :func:`shard_from_source`: the same, for a model that one rank built and
  initialised whole and the others built on the meta device: that rank
  scatters each rank its shards, one unit at a time.
* :func:`materialize`: storage for this rank's shards of a model built on the
  meta device (no ``init_weights`` planned: files cover the model, or
  ``skip_init_weights=True``).
* :func:`checkpoint_blocks`: MMEngine's ``activation_checkpointing``.
* :func:`check_initialised`: parameters neither init nor ``load_from`` set,
  refused on every rank together.

Each imports torch when it runs, never when the plan is made.
"""

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
    """``fully_shard`` every unit the wrap policy picks (innermost first), then the root.

    ``hybrid_mesh`` (HYBRID_SHARD): shard over a 2-D mesh instead of every rank,
    see :func:`_hybrid_mesh`.

    0-d parameters, which ``fully_shard`` refuses, are replicated instead
    (:mod:`flexgraph.strategies.fsdp.scalars`).

    ``broadcast_from_rank0``: every rank first takes rank 0's parameters and
    buffers, as DDP does when it wraps. Ranks seeded apart
    (``randomness.diff_rank_seed``) initialise different weights; the run's are
    rank 0's, which are a single-device run's.
    """
    import torch
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
    scalars = scalar_parameters(model)  # fully_shard refuses 0-d parameters: replicated
    if scalars:
        scalars = replicate_scalars(model, scalars, env.device)
        options["ignored_params"] = set(scalars)
    wrap = resolve_wrap_policy(auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy")
    for unit in wrap_units(model, wrap):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


def shard_from_source(env: Any, model: Any, *, source_rank: int = 0,
                      **options: Any) -> Any:
    """:func:`shard`, the weights coming from the one rank that built the model whole.

    ``source_rank`` built and initialised the whole model (``build_model`` and
    ``init_weights`` configured with it); every other rank built it on the
    meta device and holds no weight. Every rank shards (``options`` are
    :func:`shard`'s): the source's shards are cut from its whole tensors, the
    others' get storage (:func:`materialize`). Then the source sends each
    rank its shards one wrap unit at a time, a ``scatter`` of each rank's rows
    (:func:`_scatter_units`), so that no other rank ever holds more than its
    shards and one unit's share, and the source lets go of each unit's whole
    tensors once sent. Buffers (replicated, small) are broadcast. The random
    generators already stand where a DDP rank's would (``init_weights`` with
    ``source_rank`` saw to it, ``diff_rank_seed`` or not).
    """
    from flexgraph.strategies.fsdp.shards import materialize_module

    from flexgraph.training.runtime import broadcast_buffers

    source = env.rank == source_rank
    whole = {name: p.detach() for name, p in model.named_parameters()} if source else {}
    shard(env, model, **options)
    if not source:
        materialize_module(model, env.device)
    _scatter_units(model, whole, source_rank, env.device)
    broadcast_buffers(model, rank=source_rank)
    return model


def _units(model: Any) -> list[list[str]]:
    """Parameter names by the FSDP module (wrap unit, or the root) that manages them,
    innermost unit first."""
    from torch.distributed.fsdp import FSDPModule

    units = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    owned: dict[str, list[str]] = {unit: [] for unit in reversed(units)}
    for name, _ in model.named_parameters():
        owner = max((u for u in units if u == "" or name.startswith(u + ".")), key=len,
                    default="")
        owned.setdefault(owner, []).append(name)
    return [names for names in owned.values() if names]


def _scatter_units(model: Any, whole: dict[str, Any], source_rank: int, device: Any) -> None:
    """Each rank's rows of every parameter, from ``whole`` on ``source_rank``, unit by unit.

    One ``scatter`` per unit (and dtype): the source packs each rank's rows of
    the unit's parameters into one flat buffer (padded to the longest rank's),
    every rank unpacks its own into its local shards. ``whole`` is emptied
    unit by unit as it goes.
    """
    import torch
    import torch.distributed as dist
    from flexgraph.strategies.fsdp.shards import local_rows, local_tensor

    params = dict(model.named_parameters())
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, {name: local_rows(p) for name, p in params.items()})
    source = dist.get_rank() == source_rank
    for names in _units(model):
        for dtype in dict.fromkeys(params[n].dtype for n in names):
            group = [n for n in names if params[n].dtype == dtype]
            sizes = [sum((r[n][1] - r[n][0]) * _row_numel(params[n]) for n in group)
                     for r in rows]
            received = torch.empty(max(sizes), dtype=dtype, device=device)
            packed = None
            if source:
                packed = [_packed([whole[n] for n in group], [r[n] for n in group],
                                  max(sizes)).to(device) for r in rows]
            dist.scatter(received, packed, src=source_rank)
            del packed
            offset = 0
            with torch.no_grad():
                for n in group:
                    local = local_tensor(params[n])
                    count = local.numel()
                    local.copy_(received[offset:offset + count].view_as(local))
                    offset += count
        for n in names:
            whole.pop(n, None)


def _row_numel(tensor: Any) -> int:
    """Elements in one row of ``tensor`` (dimension 0); a 0-d tensor is one row of one."""
    return math.prod(tensor.shape[1:])


def _packed(tensors: list[Any], rows: list[tuple[int, int]], length: int) -> Any:
    """The given rows of each tensor, flattened one after the other, padded to ``length``."""
    import torch

    flat = torch.cat([t.reshape(1) if t.dim() == 0 else t[start:stop].reshape(-1)
                      for t, (start, stop) in zip(tensors, rows, strict=True)])
    return torch.nn.functional.pad(flat, (0, length - flat.numel()))


def _hybrid_mesh(env: Any, shape: str | tuple[int, int]) -> Any:
    """The 2-D mesh of hybrid sharding: parameters sharded within a row, rows replicated.

    Rows are consecutive ranks, which launchers place on one node: each node
    holds a whole copy of the model in shards, and only the gradients'
    all-reduce crosses nodes. :data:`FROM_LAUNCH` sizes a row by the launch's
    processes per node (``LOCAL_WORLD_SIZE``, set by torch's launcher and by
    flexgraph's SLURM launch).
    """
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
    """Storage on ``env.device`` for this rank's shards; see ``materialize_module``.

    Only where no ``init_weights`` is planned (pruned because the run's files
    cover the model, or ``skip_init_weights``): the weights come from the
    files, so nothing is initialised here, and a parameter they lack is found
    (it holds NaN) and refused by :func:`check_initialised`.
    """
    from flexgraph.strategies.fsdp.shards import materialize_module

    return materialize_module(model, env.device)


def checkpoint_blocks(model: Any, *, options: Mapping[str, Any],
                      auto_wrap_policy: Any = None) -> Any:
    """MMEngine's ``activation_checkpointing=dict(check_fn=...)``; see ``checkpoint_selected``."""
    from flexgraph.strategies.fsdp.units import checkpoint_selected

    checkpoint_selected(model, options, auto_wrap_policy)
    return model


def check_initialised(env: Any, model: Any) -> Any:
    """Refuse, by name and on every rank together, parameters nothing initialised.

    Only where no ``init_weights`` is planned: ``materialize`` fills new
    storage with NaN, so a parameter that neither a ``reset_parameters()`` nor
    the loaded files set is found here, before it trains on garbage.
    """
    import torch
    from flexgraph.strategies.fsdp.shards import uninitialised_parameters

    from flexgraph.training.errors import ConfigError

    bad: list[list[str]] = [[] for _ in range(env.world_size)]
    torch.distributed.all_gather_object(bad, uninitialised_parameters(model))
    names = sorted({name for rank in bad for name in rank})
    if names:
        raise ConfigError(
            f"{len(names)} parameters were never initialised after materialize (e.g. "
            f"{names[0]!r}): their module has no reset_parameters(), init_weights is not "
            f"planned (skip_init_weights=True, or pruned because the files cover the model) "
            f"and the loaded files did not set them (a hook dropped them?); give the module "
            f"a reset_parameters() or load them from a checkpoint")
    return model
