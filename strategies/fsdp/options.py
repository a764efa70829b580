"""The FSDP strategy's options: MMEngine's keys, checked and translated for FSDP2 at plan time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import refuse
from flexgraph.strategies.names import FSDP

from flexgraph.core.strategy import StrategyOptionError

__all__ = ["FROM_LAUNCH", "checkpoint_io", "shard_options"]

DCP_IO = "flexgraph.strategies.fsdp.checkpoint:DistributedCheckpointIO"
FULL_IO = "flexgraph.strategies.fsdp.checkpoint:FullStateFileIO"
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False,
            "HYBRID_SHARD": True, "_HYBRID_SHARD_ZERO2": False}
_WRAPPER_KEYS = ("type", "auto_wrap_policy", "sharding_strategy", "mixed_precision",
                 "cpu_offload", "use_orig_params", "device_mesh")
FROM_LAUNCH = "nodes x processes per node"  # a hybrid mesh sized by the launch
_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


def _refuse(key: str, why: str) -> StrategyOptionError:
    return refuse(FSDP.name, key, why)


def shard_options(model_wrapper: Mapping[str, Any] | None) -> dict[str, Any]:
    """MMEngine's ``model_wrapper`` keys as the params of the ``fully_shard`` step."""
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
    """``device_mesh=(replicas, shard size)``: HYBRID_SHARD's mesh."""
    if (not isinstance(mesh, (tuple, list)) or len(mesh) != 2
            or not all(isinstance(n, int) and n >= 1 for n in mesh)):
        raise _refuse(f"model_wrapper.device_mesh={mesh!r}", "must be (replicas, shard size), "
                      "e.g. (2, 8) for 2 nodes of 8; without it the launch sizes the mesh")
    return int(mesh[0]), int(mesh[1])


def checkpoint_io(state_dict_cfg: str | Mapping[str, Any]) -> str:
    """``state_dict_cfg`` (``'local'``, ``'full'``, a dict) as the checkpoint IO it names."""
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
