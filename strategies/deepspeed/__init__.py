"""DeepSpeedStrategy: ZeRO stages 0-3 on current DeepSpeed, MMEngine's config keys unchanged.

``deepspeed_initialize`` fuses ``wrap_model`` and ``build_optim_wrapper``: DeepSpeed builds
the engine and its ZeRO optimizer in one call. Under ZeRO-3 the model is built partitioned
and the weights go into the partitions before the engine; below it they load through the
engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.deepspeed.options import deepspeed_config, precision
from flexgraph.strategies.names import DEEPSPEED

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, Fuse, IfAbsent, IfPresent, Insert, Move, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy

__all__ = ["deepspeed"]

STEPS = "flexgraph.strategies.deepspeed.steps"
PARTITIONS = "flexgraph.strategies.deepspeed.partitions"
PARTITIONED = "flexgraph.strategies.deepspeed.contracts:partitioned"
ENGINE_HOLDS_MODEL = "flexgraph.strategies.deepspeed.contracts:engine_holds_model"
FORWARD_WRITES = "flexgraph.strategies.deepspeed.contracts:forward_writes_kept"
ENGINE_OWNS = ("the engine owns the parameters and the optimizer's master copies of them; "
               "weights loaded before it are overwritten or never reach the optimizer")


def deepspeed(
    config: str | Mapping[str, Any] | None = None,
    zero_optimization: Mapping[str, Any] | None = None,
    gradient_clipping: float | None = None,
    fp16: Mapping[str, Any] | None = None,
    inputs_to_half: list[int | str] | None = None,
    bf16: Mapping[str, Any] | None = None,
    amp: Mapping[str, Any] | None = None,
    activation_checkpointing: Mapping[str, Any] | None = None,
    aio: Mapping[str, Any] | None = None,
    train_micro_batch_size_per_gpu: int | None = None,
    train_batch_size: int | None = None,
    gradient_accumulation_steps: int | None = None,
    steps_per_print: int | None = None,
    exclude_frozen_parameters: bool | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_format: str = "portable",
) -> Strategy:
    """DeepSpeed ZeRO (stage 0-3); MMEngine's ``DeepSpeedStrategy`` keys, over ``config``'s.

    Parameters
    ----------
    config : str or Mapping, optional
        A full DeepSpeed config, or its JSON file's path.
    zero_optimization : Mapping, optional
        ``stage`` 0-3; MMEngine's ``cpu_offload`` becomes ``offload_optimizer``.
    gradient_clipping : float, optional
        Global L2 norm (default: the optimizer wrapper's ``clip_grad``).
    fp16, bf16, amp, activation_checkpointing, aio : Mapping, optional
        DeepSpeed's sections of those names (one precision at most).
    inputs_to_half : list of int or str, optional
        Inputs cast to half precision before the forward, as in MMEngine.
    train_micro_batch_size_per_gpu, train_batch_size, gradient_accumulation_steps : int, optional
        Default: from the dataloader and the optimizer wrapper.
    steps_per_print : int, optional
        DeepSpeed's own progress lines (off by default).
    exclude_frozen_parameters : bool, optional
        Leave frozen parameters out of DeepSpeed's own checkpoints.
    dist_cfg, device : optional
        As for :func:`~flexgraph.strategies.ddp.ddp`.
    checkpoint_format : {'portable', 'native'}, default 'portable'
        ``'portable'``: by parameter name, resumable under every strategy;
        ``'native'``: DeepSpeed's own directories.

    Returns
    -------
    Strategy

    Raises
    ------
    StrategyOptionError
        A config file missing or not JSON, a ZeRO stage DeepSpeed lacks, two precisions.
    """
    ds = deepspeed_config(
        config, zero_optimization=zero_optimization, gradient_clipping=gradient_clipping,
        fp16=fp16, bf16=bf16, amp=amp, activation_checkpointing=activation_checkpointing,
        aio=aio, train_micro_batch_size_per_gpu=train_micro_batch_size_per_gpu,
        train_batch_size=train_batch_size, gradient_accumulation_steps=gradient_accumulation_steps,
        steps_per_print=steps_per_print)
    stage = ds["zero_optimization"]["stage"]
    owns_schedulers = "scheduler" in ds
    fused = ["wrap_model", "build_optim_wrapper"]
    outputs = ["optim_wrapper"]
    if owns_schedulers:
        fused.append("build_param_schedulers")
        outputs.append("param_schedulers")
    initialize = Step(
        "deepspeed_initialize", f"{STEPS}:initialize",
        requires=("cfg", "settings", "run_context", "env"), provides=tuple(outputs),
        updates="model", ends="unwrapped",
        gives=("in_engine", "on_device") + (("partitioned",) if stage == 3 else ()),
        contracts=(ENGINE_HOLDS_MODEL,) + ((PARTITIONED, FORWARD_WRITES) if stage == 3 else ()),
        params={"config": ds,
                "inputs_to_half": None if inputs_to_half is None else list(inputs_to_half)},
        doc="deepspeed.initialize: the engine and its ZeRO optimizer")
    rewrites = [
        Replace("setup_env", Step(
            "setup_env", f"{STEPS}:setup_env", requires="cfg", provides="env",
            params={"device": device, "precision": precision(ds),
                    "tensor_parallel": "tensor_parallel" in ds, **dict(dist_cfg or {})},
            doc="check the precision, join the process group"),
            why="the precision is checked against the accelerator before any process group "
                "exists"),
    ]
    if stage == 3:
        rewrites += [
            Configure("build_model", {"init_context": f"{STEPS}:zero_init",
                                      "init_options": {"config": ds}},
                      gives=("partitioned",), ends=("whole",), contracts=(PARTITIONED,),
                      why="zero.Init partitions each parameter as it is created: no rank "
                          "holds the model whole"),
            IfPresent("init_weights", Replace("init_weights", Step(
                "init_weights", "flexgraph.training.steps:init_from_record",
                requires=("cfg", "env"), updates="model", gives="initialised",
                params={"place": f"{PARTITIONS}:into_partitions"},
                doc="a one-device run's init_weights, made one parameter at a time on rank 0 "
                    "from its record, into the partitions"),
                why="MMEngine's initialisers need whole tensors and a one-device run's random "
                    "draws: rank 0 records that run's init and makes each parameter again from "
                    "the record, one at a time, into every rank's partitions")),
            IfAbsent("init_weights", Insert(Step(
                "follow_init_draws", f"{PARTITIONS}:follow_init_draws",
                requires=("cfg", "env"), updates="model",
                doc="the one-device setup's random draws, into scratch tensors (the files "
                    "set every weight)"), after="build_model",
                why="the files set every weight; init's random draws still happen, so the "
                    "random streams stay a one-device run's")),
        ]
    rewrites += [Fuse(tuple(fused), initialize, why=(
        "deepspeed.initialize builds the engine and its ZeRO optimizer in one call"))]
    if stage < 3:
        rewrites.append(Move("load_checkpoint", after="deepspeed_initialize", why=ENGINE_OWNS))
    rewrites += [
        Replace("build_train_step", Step(
            "build_train_step", f"{STEPS}:build_train_step", requires=("model", "optim_wrapper"),
            provides="train_step", expects=ENGINE_HOLDS_MODEL,
            doc="the engine's backward and step"),
            why="the engine owns backward and the optimizer step"),
        Configure("build_checkpointer", {
            "io": "flexgraph.strategies.deepspeed.checkpoint:DeepSpeedCheckpointIO",
            "io_options": {"exclude_frozen_parameters": bool(exclude_frozen_parameters)},
            "access": "flexgraph.strategies.deepspeed.state:DeepSpeedStateAccess",
            "checkpoint_format": checkpoint_format},
            why="checkpoints go through the engine: fp32 master weights and optimizer moments "
                "by parameter name"),
    ]
    checks = (
        Precedes("deepspeed_initialize", "load_checkpoint", ENGINE_OWNS) if stage < 3 else
        Precedes("load_checkpoint", "deepspeed_initialize",
                 "under ZeRO-3 the weights go into the partitions zero.Init made, each "
                 "rank reading its own elements, and the engine takes its fp32 master "
                 "partitions from them; loaded after it, every rank would gather "
                 "parameters the optimizer then has to copy again"),
    )
    return Strategy(DEEPSPEED.name, rewrites, doc=f"DeepSpeed ZeRO stage {stage}",
                    world_size="many", checks=checks,
                    memory_model=DEEPSPEED.memory_model, memory_options={"config": ds},
                    prunable=("init_weights",) if stage == 3 else (),
                    plan_notes="flexgraph.strategies.deepspeed.options:plan_notes")
