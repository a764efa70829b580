"""DeepSpeedStrategy: ZeRO stages 0-3 on current DeepSpeed, MMEngine's config keys unchanged.

The order, and why (each line is a rewrite below)::

    setup_env            precision checked against the accelerator before any
                         process group exists (fp16 on a CPU without it stops here)
    build_model          under deepspeed.zero.Init for stage 3: each parameter is
                         partitioned as it is created, no rank holds the model
    init_weights         (stage 3) on rank 0's whole copy of the model, gathered
                         one parameter at a time, then into every rank's
                         partitions one parameter at a time: no other rank
                         holds the whole model (.partitions)
                         (pruned when the loaded files set every weight: then
                         follow_init_draws makes its random draws into scratch
                         tensors, so the streams stay a one-device run's)
    load_checkpoint      (stage 3) before the engine, into the partitions: each
                         rank reads only its own elements of each parameter
    deepspeed_initialize wrap_model + build_optim_wrapper (+ the schedulers when
                         the DeepSpeed config has its own) fused: DeepSpeed builds
                         the engine and the ZeRO optimizer in one call
    load_checkpoint      (stages 0-2) after it, through DeepSpeed's checkpoint IO:
                         the engine owns the parameters (and their fp32 master
                         copies), so weights go in through it
    build_train_step     the engine's backward and step
    build_checkpointer   portable checkpoints: fp32 master weights and Adam moments
                         by parameter name through DeepSpeed's safe_get_full_*
                         (checkpoint_format='native': DeepSpeed's own directories)

Options are MMEngine's ``DeepSpeedStrategy`` keys (``config``, ``zero_optimization``,
``fp16``, ``bf16``, ``amp``, ``inputs_to_half``, ``gradient_clipping``,
``gradient_accumulation_steps``, ``train_micro_batch_size_per_gpu``, ...): they
override a full DeepSpeed ``config`` dict or JSON file. Batch sizes, clipping and
accumulation come from the config's dataloader and optimizer wrapper when unset;
ZeRO bucket sizes left unset are ``'auto'`` (sized from the model at run time).

This face holds the factory, the list of rewrites. Behind it: :mod:`.options`
(the options as one DeepSpeed config, checked), :mod:`.steps` (the step functions
the rewrites bring in), :mod:`.engine` (the engine in MMEngine's shapes, the
config completed at run time), :mod:`.checkpoint` (DeepSpeed's own checkpoints,
read safely), :mod:`.state` (portable checkpoints: the state by parameter name),
:mod:`.params` (ZeRO-3's parameters a forward cannot get, named), :mod:`.partitions`
(ZeRO-3's setup: whole values into the partitions one parameter at a time), :mod:`.inspect`
(``flexgraph ckpt inspect`` of DeepSpeed's directories) and :mod:`.memory` (what
a rank holds, for ``flexgraph plan --estimate``).
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

__all__ = ["deepspeed", "deepspeed_config"]

STEPS = "flexgraph.strategies.deepspeed.steps"
CHECKPOINTS = "flexgraph.strategies.deepspeed.checkpoint"
STATE = "flexgraph.strategies.deepspeed.state"
PARTITIONS = "flexgraph.strategies.deepspeed.partitions"


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
    """DeepSpeed ZeRO (stage 0-3) over a torch.distributed process group.

    The parameters are MMEngine's ``DeepSpeedStrategy`` ones; a DeepSpeed key
    given here overrides ``config``'s (see :func:`deepspeed_config`).

    Parameters
    ----------
    config : str or Mapping, optional
        A full DeepSpeed config, or the path of its JSON file.
    zero_optimization : Mapping, optional
        DeepSpeed's ``zero_optimization`` (``stage`` 0-3; MMEngine's
        ``cpu_offload`` becomes ``offload_optimizer``).
    gradient_clipping : float, optional
        The global L2 norm to clip to (default: the optimizer wrapper's
        ``clip_grad``).
    fp16, bf16, amp : Mapping, optional
        DeepSpeed's precision sections (at most one enabled).
    inputs_to_half : list of int or str, optional
        The inputs (positions or names) cast to the half precision before the
        forward, as MMEngine's ``DeepSpeedStrategy`` does.
    activation_checkpointing, aio : Mapping, optional
        DeepSpeed's sections of those names.
    train_micro_batch_size_per_gpu, train_batch_size, gradient_accumulation_steps : int, optional
        Batch sizes and accumulation; by default from the dataloader and the
        optimizer wrapper (``train_batch_size`` is checked against them).
    steps_per_print : int, optional
        DeepSpeed's own progress lines (off by default).
    exclude_frozen_parameters : bool, optional
        Leave frozen parameters out of DeepSpeed's own checkpoints.
    dist_cfg, device : optional
        As for :func:`~flexgraph.strategies.ddp.ddp`: the process group's
        ``backend`` and ``timeout``, the device to train on.
    checkpoint_format : {'portable', 'native'}, default 'portable'
        ``'portable'``: fp32 master weights and optimizer moments by parameter
        name, resumable under every strategy; ``'native'``: DeepSpeed's own
        ``save_checkpoint`` directories.

    Returns
    -------
    Strategy
        ``deepspeed``: the rewrites whose order the module docstring explains.

    Raises
    ------
    StrategyOptionError
        The config file is missing or not JSON, the ZeRO stage is not one
        DeepSpeed has, two precisions are enabled, or an option contradicts
        another.
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
        updates="model",
        params={"config": ds,
                "inputs_to_half": None if inputs_to_half is None else list(inputs_to_half)},
        doc="deepspeed.initialize: the engine and its ZeRO optimizer")
    rewrites = [
        Replace("setup_env", Step(
            "setup_env", f"{STEPS}:setup_env", requires="cfg", provides="env",
            params={"device": device, "precision": precision(ds),
                    "tensor_parallel": "tensor_parallel" in ds, **dict(dist_cfg or {})},
            doc="check the precision, join the process group")),
    ]
    if stage == 3:
        rewrites += [
            Configure("build_model", {"init_context": f"{STEPS}:zero_init",
                                      "init_options": {"config": ds}}),
            IfPresent("init_weights", Replace("init_weights", Step(
                "init_weights", f"{PARTITIONS}:init_on_rank0", requires="env",
                updates="model", doc="model.init_weights() on rank 0's whole copy, then "
                                     "into the partitions"))),
            IfAbsent("init_weights", Insert(Step(
                "follow_init_draws", f"{PARTITIONS}:follow_init_draws", requires="env",
                updates="model", doc="init_weights' random draws, into scratch tensors "
                                     "(the files set every weight)"), after="build_model")),
        ]
    rewrites += [Fuse(tuple(fused), initialize)]
    if stage < 3:
        rewrites.append(Move("load_checkpoint", after="deepspeed_initialize"))
    rewrites += [
        Replace("build_train_step", Step(
            "build_train_step", f"{STEPS}:build_train_step", requires=("model", "optim_wrapper"),
            provides="train_step", doc="the engine's backward and step")),
        Configure("build_checkpointer", {
            "io": f"{CHECKPOINTS}:DeepSpeedCheckpointIO",
            "io_options": {"exclude_frozen_parameters": bool(exclude_frozen_parameters)},
            "access": f"{STATE}:DeepSpeedStateAccess", "checkpoint_format": checkpoint_format}),
    ]
    checks = (
        Precedes("deepspeed_initialize", "load_checkpoint",
                 "the engine owns the parameters and the optimizer's master copies of "
                 "them; weights loaded before it are overwritten or never reach the "
                 "optimizer") if stage < 3 else
        Precedes("load_checkpoint", "deepspeed_initialize",
                 "under ZeRO-3 the weights go into the partitions zero.Init made, each "
                 "rank reading its own elements, and the engine takes its fp32 master "
                 "partitions from them; loaded after it, every rank would gather "
                 "parameters the optimizer then has to copy again"),
    )
    return Strategy(DEEPSPEED.name, rewrites, doc=f"DeepSpeed ZeRO stage {stage}",
                    world_size="many", checks=checks,
                    memory_model=DEEPSPEED.memory_model, memory_options={"config": ds},
                    prunable=("init_weights",) if stage == 3 else ())
