"""DeepSpeedStrategy's memory: ZeRO's partitions, tied to DeepSpeed's own estimator.

Per rank, mixed precision, ``P`` parameters over ``N`` ranks, ``k`` fp32 optimizer states a
parameter: the fp32 master weights and states are (4 + 4k)P/N; parameters 2P below stage
3, 2P/N plus the largest layer gathered at it. DeepSpeed's
``estimate_zero2_model_states_mem_needs_all_live`` is the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.estimate import (
    Allocation,
    CandidateError,
    SetupMemory,
    StrategyMemory,
    bytes_per,
    trains_on,
    whole_model_setup,
    whole_model_steps,
)

_STAGES = {"zero0": (0, False), "zero1": (1, False), "zero2": (2, False), "zero3": (3, False),
           "zero1-offload": (1, True), "zero2-offload": (2, True), "zero3-offload": (3, True)}


def candidate_options(options: Mapping[str, Any], stage: str | None,
                      precision: str | None) -> dict[str, Any]:
    """``deepspeed[:zero0..3[-offload]][:fp16|:bf16|:fp32]`` as the strategy's options."""
    chosen = dict(options)
    if stage is not None:
        if stage not in _STAGES:
            raise CandidateError(f"candidate deepspeed:{stage}: the stages are "
                                 f"{', '.join(_STAGES)}")
        number, offload = _STAGES[stage]
        zero = dict(chosen.get("zero_optimization") or {}, stage=number)
        zero.pop("cpu_offload", None)
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        else:
            zero.pop("offload_optimizer", None)
        chosen["zero_optimization"] = zero
    if precision is not None:
        for key in ("fp16", "bf16", "amp"):
            chosen.pop(key, None)
        if precision in ("fp16", "bf16"):
            chosen[precision] = {"enabled": True}
            chosen.setdefault("inputs_to_half", ["inputs"])
    return chosen


def _precision(config: Mapping[str, Any]) -> str:
    for name in ("fp16", "bf16"):
        if isinstance(config.get(name), Mapping) and config[name].get("enabled"):
            return name
    return "fp32"


def _elements(value: Any, params: int) -> int:
    """A bucket size in elements; ``'auto'`` as flexgraph fills it at run time."""
    if value in (None, "auto"):
        return int(min(max(params / 16, 1e6), 5e7))
    return int(float(value))


def _states(total: int, trainable: int, n: int, k: int, stage: int, low: int,
            offload: bool) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) per rank, before stage 3's gathered layer."""
    if low == 4:  # fp32: the master partition is a copy all the same (DeepSpeed clones it)
        params = total * 4 if stage < 3 else total * 4 // n
        grads = trainable * 4 // n + (trainable * 4 if stage == 1 else 0)
        optim = 0 if offload else trainable * (4 + 4 * k) // n
        return params, grads, optim
    sharded = int((6 + 4 + 4 * k) * trainable / n)
    optim = int((4 + 4 * k) * trainable / n)
    params = 2 * total if stage < 3 else int(2 * total / n)
    grads = sharded - optim - (0 if stage < 3 else params)
    if stage == 1:
        grads += 2 * trainable - int(2 * trainable / n)  # fp16 gradients kept whole
    if offload:
        grads, optim = (2 * trainable - int(2 * trainable / n) if stage == 1 else 0), 0
    return params, grads, optim


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    config: Mapping[str, Any]) -> StrategyMemory:
    """Model states partitioned by ``config``'s ZeRO stage; buffers modelled."""
    zero = dict(config.get("zero_optimization") or {})
    stage = int(zero.get("stage", 0))
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    precision = _precision(config)
    low = bytes_per(precision)
    n = max(world_size, 1)
    params, grads, optim = _states(census.total, census.trainable, n, optimizer_states,
                                   stage, low, offload)
    notes = [f"ZeRO stage {stage}, {precision}" + (", optimizer offloaded to CPU" if offload
                                                    else "")]
    if stage == 3:
        params += 4 * census.largest_layer
        notes.append("parameters: this rank's partition + 4 bytes x the largest layer "
                     "(gathered, DeepSpeed's allowance)")
    reference = params + grads + optim
    if stage == 1 and low == 2:
        reference -= 0 if offload else 2 * census.trainable - int(2 * census.trainable / n)
        notes.append("stage 1 keeps the fp16 gradients whole until the step; DeepSpeed's "
                     "estimator counts it as stage 2")
    if stage == 3 and low == 2 and not offload:
        grads = int(2 * census.trainable / n)
        notes.append("gradients: the fp16 partition; the fp32 ones exist a sub-group at a "
                     "time, in the step (DeepSpeed's estimator counts a whole fp32 partition)")
    reduce = _elements(zero.get("reduce_bucket_size"), census.total)
    buffers = 0
    if stage >= 1:
        buffers = reduce * low * (2 if zero.get("overlap_comm", stage == 3) else 1)
        if stage < 3:
            buffers += _elements(zero.get("allgather_bucket_size"), census.total) * low
        else:
            buffers += _elements(zero.get("stage3_prefetch_bucket_size"), census.total) * low
        notes.append("buffers: reduce bucket(s) and the all-gather / prefetch bucket (modelled)")
    compute = f"half:{precision}" if low == 2 else "fp32"
    if isinstance(config.get("amp"), Mapping) and config["amp"].get("enabled"):
        compute = "amp:fp16"
    stepped = _stepped(census, config, zero, stage, offload, n)
    step_gradients, step_buffers = _at_the_step(census, stage, low, offload, n, grads,
                                                stepped, reduce)
    return StrategyMemory(label=f"deepspeed zero{stage}", parameters=params, gradients=grads,
                          optimizer=optim, buffers=buffers, compute=compute,
                          notes=tuple(notes), reference=reference if low == 2 else None,
                          step_gradients=step_gradients, step_buffers=step_buffers,
                          stepped=stepped)


def _at_the_step(census: Any, stage: int, low: int, offload: bool, n: int, grads: int,
                 stepped: tuple[int, int], reduce: int) -> tuple[int | None, int | None]:
    """(gradient bytes, buffer bytes) alive during the optimizer step, where they differ."""
    if offload or stage == 0:
        return None, None
    fp32_partition = census.trainable * 4 // n
    if stage < 3:
        return fp32_partition, 0
    if low == 4:
        return None, reduce * low
    return grads + 4 * stepped[0], reduce * low  # grads: the fp16 / bf16 partition


def _stepped(census: Any, config: Mapping[str, Any], zero: Mapping[str, Any], stage: int,
             offload: bool, n: int) -> tuple[int, int]:
    """(largest tensor, elements) torch's optimizer steps at a rank: flat partitions."""
    partition = census.trainable // n
    if offload or config.get("optimizer"):
        return 0, 0
    if stage == 0:
        return census.largest_param, census.trainable
    largest = partition
    if stage == 3:
        largest = min(partition, _elements(zero.get("sub_group_size"), census.total))
    return largest, partition


def _zero3_parts(census: Any, world_size: int, target_device: str, config: Mapping[str, Any]
                 ) -> tuple[int, int, int, int]:
    """ZeRO-3's setup on the host: (partitions, one module, a parameter in flight, the model)."""
    low = bytes_per(_precision(config))
    on_host = target_device == "cpu"
    partitions = census.total * low // max(world_size, 1) if on_host else 0
    built = low * census.largest_layer if on_host else 0  # one module whole as zero.Init makes it
    gathered = 2 * low * census.largest_param if on_host else 0  # and the scatter's buffer
    return partitions, built, gathered, census.total * low


def _stage(config: Mapping[str, Any]) -> int:
    return int(dict(config.get("zero_optimization") or {}).get("stage", 0))


def estimate_setup(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   config: Mapping[str, Any]) -> SetupMemory:
    """Stages 0-2: the whole model on every rank; stage 3: partitions, no rank whole."""
    if _stage(config) < 3:
        return whole_model_setup(census, notes=("the engine takes the model from there",))
    partitions, built, gathered, _ = _zero3_parts(census, world_size, target_device, config)
    where = ("its partitions" if target_device == "cpu"
             else "nothing of the model (its partitions are the GPU's)")
    notes = [f"each rank: {where}, plus one module whole as zero.Init makes it"]
    if weights_loaded:
        notes.append("init_weights pruned: each rank reads its own elements of the file")
        return SetupMemory(rank0=partitions + built, others=partitions + built,
                           notes=tuple(notes))
    held = partitions + max(built, gathered)
    notes.append("then one parameter at a time made from the one-device record and "
                 "scattered; no rank holds the model")
    return SetupMemory(rank0=held, others=held, notes=tuple(notes))


def estimate_steps(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   memory: StrategyMemory, config: Mapping[str, Any]) -> tuple[Allocation, ...]:
    """Stages 0-2: built whole, then the engine's states; stage 3: partitions from the start."""
    engine = "deepspeed_initialize"
    if _stage(config) < 3:
        return whole_model_steps(census, memory, target_device, placed_at=engine,
                                 states=memory.optimizer)
    partitions, built, gathered, whole = _zero3_parts(census, world_size, target_device, config)
    where = trains_on(target_device)
    held = whole // max(world_size, 1)  # this rank's partitions, where it trains
    steps = [Allocation("build_model", partitions, "this rank's partitions, made by zero.Init"),
             Allocation("build_model", built, "one module whole as zero.Init makes it",
                        transient=True)]
    if where == "device":
        steps.append(Allocation("build_model", held, "this rank's partitions", memory="device"))
    if not weights_loaded:
        steps.append(Allocation("init_weights", gathered, "one parameter made from the "
                                "record and scattered", transient=True))
    steps.append(Allocation(engine, memory.parameters + memory.optimizer - held,
                            "the gathered-layer allowance, master weights and optimizer states",
                            memory=where))
    return tuple(steps)
