"""FSDPStrategy: FSDP2 (``torch.distributed.fsdp.fully_shard``) over a process group.

The order, and why (each line is a rewrite below)::

    build_model              on the CPU, as a single-device run builds it: the
                             constructors draw the same random numbers
    activation_checkpointing (when asked) wraps blocks before they are sharded
    init_weights             the model's own init (MMEngine's init_cfg:
                             Pretrained, TruncNormal, ...) on whole tensors, so
                             the weights are bit-identical to a single-device
                             run's; MMEngine's initialisers cannot write into shards
    compile                  (when planned) before sharding, as FSDP2 expects
    fully_shard              every rank takes rank 0's weights (as DDP does when
                             it wraps), then each wrap-policy unit is sharded,
                             innermost first, then the root: every parameter
                             becomes this rank's DTensor shard, on its device
    load_checkpoint          through the sharded checkpoint IO: rank 0 reads a
                             full file and each rank receives its shard; a DCP
                             checkpoint is read shard by shard
    build_optim_wrapper      on the sharded parameters (built before sharding it
                             would hold the full tensors fully_shard replaced)

Building and initialising whole costs each rank the full model in host memory
for the duration of setup, as DDP and MMEngine's FSDPStrategy do; the
accelerator holds shards only. With ``skip_init_weights=True`` (the weights come
from ``load_from``) no rank ever holds the whole model: it is built on the meta
device, sharded, and only each rank's shards get storage (``materialize``)
before they are loaded.

Checkpoints are portable directories (torch.distributed.checkpoint, every rank
writes its own shards, keyed by parameter name, with a manifest), which every
strategy resumes; ``checkpoint_format='native'`` writes the older ``.dcp``
directories, ``state_dict_cfg='full'`` one full file instead.
The option names are MMEngine's ``FSDPStrategy`` / ``MMFullyShardedDataParallel``
ones where they carry over to FSDP2; a key with no FSDP2 meaning is refused by
name rather than ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, IfPresent, Insert, Move, Remove, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy, StrategyOptionError

HERE = "flexgraph.strategies.fsdp"
DCP_IO = "flexgraph.training.checkpoint:DistributedCheckpointIO"
FULL_IO = "flexgraph.training.checkpoint:FullStateFileIO"
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False,
            "HYBRID_SHARD": True, "_HYBRID_SHARD_ZERO2": False}
_WRAPPER_KEYS = ("type", "auto_wrap_policy", "sharding_strategy", "mixed_precision",
                 "cpu_offload", "use_orig_params", "device_mesh")
FROM_LAUNCH = "nodes x processes per node"
"""A hybrid mesh sized by the launch: replicate across nodes, shard within one."""
_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


def _refuse(key: str, why: str) -> StrategyOptionError:
    return StrategyOptionError(f"strategy 'fsdp': {key} {why}")


def _shard_options(model_wrapper: Mapping[str, Any] | None) -> dict[str, Any]:
    """MMEngine's ``model_wrapper`` keys, checked and translated to ``fully_shard`` params."""
    wrapper = dict(model_wrapper or {})
    for key in wrapper:
        if key not in _WRAPPER_KEYS:
            raise _refuse(f"model_wrapper.{key}", f"has no FSDP2 meaning; FSDP2 takes "
                          f"{', '.join(_WRAPPER_KEYS[1:])}")
    if wrapper.get("type", "MMFullyShardedDataParallel") != "MMFullyShardedDataParallel":
        raise _refuse("model_wrapper.type", f"{wrapper['type']!r}: FSDP2 is applied, not a "
                      "wrapper class; drop the type")
    if wrapper.get("use_orig_params", True) is not True:
        raise _refuse("model_wrapper.use_orig_params=False", "has no FSDP2 meaning: FSDP2 "
                      "always keeps the original parameters; drop it")
    sharding = str(wrapper.get("sharding_strategy", "FULL_SHARD")).rpartition(".")[2]
    if sharding not in _RESHARD:
        hint = " (use DDPStrategy)" if sharding == "NO_SHARD" else ""
        raise _refuse(f"model_wrapper.sharding_strategy={sharding!r}",
                      f"is not supported{hint}; use one of {', '.join(_RESHARD)}")
    precision = wrapper.get("mixed_precision")
    if precision is not None:
        precision = {k: str(v).removeprefix("torch.") if k != "cast_forward_inputs" else v
                     for k, v in dict(precision).items()}
        for key in precision:
            if key not in _PRECISION_KEYS:
                raise _refuse(f"model_wrapper.mixed_precision.{key}",
                              f"has no FSDP2 meaning; FSDP2 takes {', '.join(_PRECISION_KEYS)}")
    offload = wrapper.get("cpu_offload") or False
    if isinstance(offload, Mapping):
        offload = bool(offload.get("offload_params", False))
    options = {"auto_wrap_policy": wrapper.get("auto_wrap_policy"),
               "reshard_after_forward": _RESHARD[sharding],
               "mixed_precision": precision, "cpu_offload": bool(offload)}
    mesh = wrapper.get("device_mesh")
    if "HYBRID" in sharding:
        options["hybrid_mesh"] = _mesh_shape(mesh) if mesh is not None else FROM_LAUNCH
    elif mesh is not None:
        raise _refuse("model_wrapper.device_mesh", f"shapes a hybrid mesh; {sharding} shards "
                      "over every rank: use sharding_strategy='HYBRID_SHARD' or drop it")
    return options


def _mesh_shape(mesh: Any) -> tuple[int, int]:
    """``device_mesh=(replicas, shard size)``: HYBRID_SHARD's mesh, given by the config."""
    if (not isinstance(mesh, (tuple, list)) or len(mesh) != 2
            or not all(isinstance(n, int) and n >= 1 for n in mesh)):
        raise _refuse(f"model_wrapper.device_mesh={mesh!r}", "must be (replicas, shard size), "
                      "e.g. (2, 8) for 2 nodes of 8; without it the launch sizes the mesh")
    return int(mesh[0]), int(mesh[1])


def _checkpoint_io(state_dict_cfg: str | Mapping[str, Any]) -> str:
    """``'local'`` / ``'full'`` or MMEngine's dict -> sharded (DCP) or full-file checkpoints."""
    if isinstance(state_dict_cfg, Mapping):
        kind = str(state_dict_cfg.get("state_dict_type", "")).rpartition(".")[2]
        full = kind == "FULL_STATE_DICT"
        if not full and kind not in ("SHARDED_STATE_DICT", "LOCAL_STATE_DICT"):
            raise _refuse("state_dict_cfg.state_dict_type", f"{kind!r} is not one of "
                          "FULL_STATE_DICT, SHARDED_STATE_DICT, LOCAL_STATE_DICT")
        return FULL_IO if full else DCP_IO
    if state_dict_cfg not in ("local", "full"):
        raise _refuse(f"state_dict_cfg={state_dict_cfg!r}", "must be 'local' (sharded) or "
                      "'full' (one file), or MMEngine's dict(state_dict_type=...)")
    return FULL_IO if state_dict_cfg == "full" else DCP_IO


def fsdp(
    model_wrapper: Mapping[str, Any] | None = None,
    skip_init_weights: bool = False,
    state_dict_cfg: str | Mapping[str, Any] = "local",
    activation_checkpointing: Mapping[str, Any] | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_format: str | None = None,
) -> Strategy:
    """Fully sharded data parallel over a torch.distributed process group.

    Parameters follow mmengine's ``FSDPStrategy``: ``model_wrapper`` (wrap
    policy, sharding strategy, mixed precision, CPU offload), ``skip_init_weights``
    (the weights come from ``load_from``), ``state_dict_cfg`` (``'local'``:
    sharded checkpoints; ``'full'``: one file), ``activation_checkpointing``
    (``dict(check_fn=...)``; without one, the wrap policy's units are
    checkpointed), plus ``dist_cfg`` and ``device`` as for DDP.
    ``checkpoint_format``: ``'portable'`` (the default, unless ``state_dict_cfg``
    asks for something else: sharded, by parameter name, resumable under every
    strategy) or ``'native'`` (what ``state_dict_cfg`` says: ``.dcp`` shards or
    one full file).
    """
    if checkpoint_format is None:
        checkpoint_format = "portable" if state_dict_cfg == "local" else "native"
    if not isinstance(skip_init_weights, bool):
        raise _refuse(f"skip_init_weights={skip_init_weights!r}", "must be True or False")
    shard = _shard_options(model_wrapper)
    rewrites = [
        Replace("setup_env", Step(
            "setup_env", "flexgraph.training.runtime:setup_process_group",
            requires="cfg", provides="env", params={"device": device, **dict(dist_cfg or {})},
            doc="join the process group, pick this rank's device")),
    ]
    if skip_init_weights:
        rewrites.append(Configure("build_model", {"device": "meta"}))
    first = "build_model"
    if activation_checkpointing is not None:
        rewrites.append(Insert(Step(
            "activation_checkpointing", f"{HERE}:checkpoint_blocks", updates="model",
            params={"options": dict(activation_checkpointing),
                    "auto_wrap_policy": shard["auto_wrap_policy"]},
            doc="recompute the chosen blocks' activations in backward"), after=first))
        first = "activation_checkpointing"
    sharded_after = first if skip_init_weights else "init_weights"
    rewrites += [
        Insert(Step("fully_shard", f"{HERE}:shard", requires="env", updates="model",
                    params={**shard, "broadcast_from_rank0": not skip_init_weights},
                    doc="rank 0's weights to every rank, then fully_shard each wrap unit "
                        "and the root"),
               after=sharded_after),
        IfPresent("compile", Move("compile", before="fully_shard")),
    ]
    if skip_init_weights:
        rewrites += [
            Insert(Step("materialize", f"{HERE}:materialize", requires="env", updates="model",
                        doc="storage for this rank's shards, buffers"),
                   after="fully_shard"),
            Remove("init_weights"),
        ]
    loaded_after = "materialize" if skip_init_weights else "fully_shard"
    rewrites += [
        Move("load_checkpoint", after=loaded_after),
        Configure("build_checkpointer", {"io": _checkpoint_io(state_dict_cfg),
                                         "checkpoint_format": checkpoint_format}),
    ]
    if skip_init_weights:
        rewrites.append(Insert(Step(
            "check_initialised", f"{HERE}:check_initialised", requires="env", updates="model",
            doc="refuse parameters neither init nor load_from set"), after="load_checkpoint"))
    checks = [
        Precedes("fully_shard", "build_optim_wrapper",
                 "an optimizer built before sharding holds the full parameters that "
                 "fully_shard replaces with shards, and would update tensors the model "
                 "no longer uses"),
        Precedes(loaded_after, "load_checkpoint",
                 "the sharded checkpoint IO loads into this rank's shards, which exist "
                 "only once the model is sharded" + (" and materialized" if skip_init_weights
                                                    else "")),
    ]
    if not skip_init_weights:
        checks.append(Precedes(
            "init_weights", "fully_shard",
            "MMEngine's initialisers (init_cfg: Pretrained, TruncNormal, ...) copy whole "
            "tensors, which fails on shards; and a sharded init draws other random "
            "numbers than a single-device run"))
    memory = {k: v for k, v in shard.items() if k != "hybrid_mesh" or isinstance(v, tuple)}
    return Strategy("fsdp", rewrites, doc="fully sharded data parallel (FSDP2)",
                    world_size="many", checks=tuple(checks),
                    memory_model="flexgraph.strategies.fsdp.memory",
                    memory_options={**memory,
                                    "activation_checkpointing": activation_checkpointing})


# -- step functions ---------------------------------------------------------------------------

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

    ``broadcast_from_rank0``: every rank first takes rank 0's parameters and
    buffers, as DDP does when it wraps. Ranks seeded apart
    (``randomness.diff_rank_seed``) initialise different weights; the run's are
    rank 0's, which are a single-device run's.
    """
    import torch
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
    wrap = resolve_wrap_policy(auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy")
    for unit in wrap_units(model, wrap):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return model


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

    Only on the ``skip_init_weights`` path: the weights come from ``load_from``,
    so nothing is initialised here, and a parameter the file lacks is found
    (it holds NaN) and refused by the loader.
    """
    from flexgraph.training.runtime import materialize_module

    return materialize_module(model, env.device)


def checkpoint_blocks(model: Any, *, options: Mapping[str, Any],
                      auto_wrap_policy: Any = None) -> Any:
    """MMEngine's ``activation_checkpointing=dict(check_fn=...)``; see ``checkpoint_selected``."""
    from flexgraph.strategies.fsdp.units import checkpoint_selected

    checkpoint_selected(model, options, auto_wrap_policy)
    return model


def check_initialised(env: Any, model: Any) -> Any:
    """Refuse, by name and on every rank together, parameters nothing initialised.

    Only on the ``skip_init_weights`` path: ``materialize`` fills new storage
    with NaN, so a parameter that neither a ``reset_parameters()`` nor
    ``load_from`` set is found here, before it trains on garbage.
    """
    import torch

    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import uninitialised_parameters

    bad: list[list[str]] = [[] for _ in range(env.world_size)]
    torch.distributed.all_gather_object(bad, uninitialised_parameters(model))
    names = sorted({name for rank in bad for name in rank})
    if names:
        raise ConfigError(
            f"{len(names)} parameters were never initialised after materialize (e.g. "
            f"{names[0]!r}): their module has no reset_parameters(), init_weights is "
            f"skipped (skip_init_weights=True), and load_from did not hold them; give the "
            f"module a reset_parameters() or load them from a checkpoint")
    return model
