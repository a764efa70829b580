"""FSDPStrategy's memory: fp32 shards, plus the units gathered while they compute.

Buffers are modelled as two of the largest unit gathered in the compute dtype (one
computing, one prefetched) plus its unsharded gradients, and the root's own parameters
gathered for the whole step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import refuse_stages
from flexgraph.strategies.names import FSDP

from flexgraph.training.estimate import Allocation, SetupMemory, StrategyMemory, bytes_per

_LOW = {"float16": "fp16", "bfloat16": "bf16", "float32": None}


def candidate_options(options: Mapping[str, Any], stage: str | None,
                      precision: str | None) -> dict[str, Any]:
    """``fsdp[:fp16|:bf16]``: a precision becomes ``mixed_precision.param_dtype``."""
    refuse_stages(FSDP.name, stage)
    chosen = dict(options)
    if precision in ("fp16", "bf16"):
        wrapper = dict(chosen.get("model_wrapper") or {})
        dtype = {"fp16": "float16", "bf16": "bfloat16"}[precision]
        wrapper["mixed_precision"] = dict(wrapper.get("mixed_precision") or {},
                                          param_dtype=dtype)
        chosen["model_wrapper"] = wrapper
    return chosen


def _unit_sizes(model: Any, policy: Any) -> tuple[int, int]:
    """(the largest unit's own parameters, the root's own parameters)."""
    from flexgraph.strategies.fsdp.units import resolve_wrap_policy, wrap_units

    units = wrap_units(model, resolve_wrap_policy(policy, model, what="auto_wrap_policy"))
    owned: set[int] = set()
    largest = 0
    for unit in units:  # innermost first: a unit's own are those no inner unit took
        own = [p for p in unit.parameters() if id(p) not in owned]
        owned.update(id(p) for p in own)
        largest = max(largest, sum(p.numel() for p in own))
    root = sum(p.numel() for p in model.parameters() if id(p) not in owned)
    return largest, root


def traced_model(model: Any, *, activation_checkpointing: Any = None,
                 auto_wrap_policy: Any = None, **_: Any) -> Any:
    """The model with the blocks the run checkpoints checkpointed (``None``: none)."""
    if activation_checkpointing is None:
        return None
    from flexgraph.strategies.fsdp.units import checkpoint_selected

    checkpoint_selected(model, activation_checkpointing, auto_wrap_policy)
    return model


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    auto_wrap_policy: Any = None, reshard_after_forward: bool = True,
                    mixed_precision: Mapping[str, Any] | None = None,
                    cpu_offload: bool = False, hybrid_mesh: Any = None,
                    activation_checkpointing: Any = None) -> StrategyMemory:
    """fp32 shards; gathered units and unsharded gradients modelled as buffers."""
    n = max(world_size, 1)
    if isinstance(hybrid_mesh, (tuple, list)):
        n = int(hybrid_mesh[1])
    param_dtype = _LOW.get(str((mixed_precision or {}).get("param_dtype")).removeprefix("torch."))
    reduce_dtype = _LOW.get(str((mixed_precision or {}).get("reduce_dtype")).removeprefix(
        "torch."), param_dtype)
    gathered = bytes_per(param_dtype)
    largest, root = _unit_sizes(census.model, auto_wrap_policy)
    if reshard_after_forward:
        buffers = (2 * largest + root) * gathered + largest * bytes_per(reduce_dtype)
    else:
        buffers = census.total * gathered + largest * bytes_per(reduce_dtype)
    notes = [f"sharded over {n} ranks; largest unit {largest:,} parameters, root "
             f"{root:,} (gathered while they compute; modelled)"]
    params = census.total * 4 // n
    optim = optimizer_states * census.trainable * 4 // n
    if cpu_offload:
        params, optim = 0, 0
        notes.append("cpu_offload: parameter shards and optimizer states in CPU memory")
    if activation_checkpointing is not None:
        notes.append("activation_checkpointing: applied in the trace, as the run applies it")
    compute = f"half:{param_dtype}" if param_dtype else (f"amp:{amp}" if amp else "fp32")
    stepped = (0, 0) if cpu_offload else (-(-census.largest_param // n),
                                          census.trainable // n)  # each parameter's shard
    return StrategyMemory(label=FSDP.name, parameters=params,
                          gradients=census.trainable * 4 // n, optimizer=optim,
                          buffers=buffers, compute=compute, notes=tuple(notes),
                          stepped=stepped)


def _setup_parts(census: Any, world_size: int, target_device: str, auto_wrap_policy: Any,
                 cpu_offload: bool, hybrid_mesh: Any) -> tuple[int, int, int, str]:
    """(this rank's shards on the host, one unit on the host, its parameters, where shards are)."""
    n = int(hybrid_mesh[1]) if isinstance(hybrid_mesh, (tuple, list)) else max(world_size, 1)
    on_host = target_device == "cpu" or bool(cpu_offload)
    largest, root = _unit_sizes(census.model, auto_wrap_policy)
    shards = census.total * 4 // n if on_host else 0
    unit = max(largest, root) * 4 if on_host else 0
    where = "its shards" if on_host else "nothing of the model (its shards are the GPU's)"
    return shards, unit, max(largest, root), where


def _in_flight(census: Any) -> int:
    """One run of parameters made on the host from the record, and packed to be scattered."""
    return 2 * 4 * census.largest_param


def estimate_setup(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   auto_wrap_policy: Any = None, cpu_offload: bool = False,
                   hybrid_mesh: Any = None, **_: Any) -> SetupMemory:
    """Shards plus what is in flight, on every rank alike: no rank holds the model."""
    shards, unit, unit_params, where = _setup_parts(census, world_size, target_device,
                                                    auto_wrap_policy, cpu_offload, hybrid_mesh)
    if weights_loaded:
        notes = (f"each rank: {where}, plus one unit ({unit_params:,} parameters) as it is "
                 f"read", "init_weights pruned")
        return SetupMemory(rank0=shards + unit, others=shards + unit, notes=notes)
    held = shards + _in_flight(census)
    notes = (f"each rank: {where}, plus one parameter's worth ({census.largest_param:,} at "
             f"most) made from the one-device record and scattered; no rank holds the model",)
    return SetupMemory(rank0=held, others=held, notes=notes)


def estimate_steps(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   memory: StrategyMemory, auto_wrap_policy: Any = None,
                   cpu_offload: bool = False, hybrid_mesh: Any = None, **_: Any
                   ) -> tuple[Allocation, ...]:
    """Built on meta, shards at ``materialize``, filled a bounded amount at a time."""
    shards, unit, _, _ = _setup_parts(census, world_size, target_device, auto_wrap_policy,
                                      cpu_offload, hybrid_mesh)
    steps = [Allocation("build_model", 0, "on the meta device: no storage"),
             Allocation("materialize", shards, "this rank's shards")]
    if target_device != "cpu" and memory.parameters:
        steps.append(Allocation("materialize", memory.parameters, "this rank's shards",
                                memory="device"))
    if weights_loaded:
        return (*steps, Allocation("load_checkpoint", unit, "one unit's rows as they are read",
                                   transient=True))
    return (*steps, Allocation("init_weights", _in_flight(census), "one parameter's worth "
                               "made from the record and packed for the scatter",
                               transient=True))
