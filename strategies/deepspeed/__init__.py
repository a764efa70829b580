"""DeepSpeedStrategy: ZeRO stages 0-3 on current DeepSpeed, MMEngine's config keys unchanged.

The order, and why (each line is a rewrite below)::

    setup_env            precision checked against the accelerator before any
                         process group exists (fp16 on a CPU without it stops here)
    build_model          under deepspeed.zero.Init for stage 3: each parameter is
                         partitioned as it is created, no rank holds the model
    init_weights         (stage 3) with the parameters gathered, rank 0's values
                         broadcast
    deepspeed_initialize wrap_model + build_optim_wrapper (+ the schedulers when
                         the DeepSpeed config has its own) fused: DeepSpeed builds
                         the engine and the ZeRO optimizer in one call
    load_checkpoint      after it, through DeepSpeed's checkpoint IO: the engine
                         owns the parameters (and their fp32 master copies), so
                         weights go in through it
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
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from flexgraph.core.checks import Precedes
from flexgraph.core.rewrite import Configure, Fuse, Move, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy, StrategyOptionError

HERE = "flexgraph.strategies.deepspeed"
CHECKPOINTS = "flexgraph.strategies.deepspeed.checkpoint"
STATE = "flexgraph.strategies.deepspeed.state"
RUN_IMPORTS = ("deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer")
"""What the ranks import: DeepSpeed, and the optimizer module its ``initialize`` imports to
check the optimizer (compiling its kernels imports torch's inductor, 1.4 s a rank)."""
_AUTO_KEYS = {0: (), 1: ("reduce_bucket_size", "allgather_bucket_size"),
              2: ("reduce_bucket_size", "allgather_bucket_size"),
              3: ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                  "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size")}


def _refuse(key: str, why: str) -> StrategyOptionError:
    return StrategyOptionError(f"strategy 'deepspeed': {key} {why}")


def _base_config(config: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))
    path = Path(config)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _refuse(f"config={str(path)!r}", "does not exist") from None
    except json.JSONDecodeError as exc:
        raise _refuse(f"config={str(path)!r}", f"is not JSON: {exc}") from None


def _precision(config: Mapping[str, Any]) -> str:
    enabled = [name for name in ("fp16", "bf16", "amp")
               if isinstance(config.get(name), Mapping) and config[name].get("enabled")]
    if len(enabled) > 1:
        raise _refuse(f"{' and '.join(enabled)}", "are both enabled; choose one precision")
    return enabled[0] if enabled else "fp32"


def _check_hierarchical(zero: Mapping[str, Any], stage: int) -> None:
    """ZeRO++ hpZ (``zero_hpz_partition_size``): DeepSpeed's hybrid sharding.

    Each group of that many ranks (a node) keeps a secondary copy of stage 3's
    parameters, so the forward's all-gathers stay within the node. ``'auto'``
    is the launch's processes per node (filled in at run time, see
    ``flexgraph.strategies.deepspeed.engine.fill_config``). It runs on CPU too (gloo), measured with
    DeepSpeed 0.19.
    """
    hpz = zero.get("zero_hpz_partition_size", 1)
    if hpz == 1:
        return
    if hpz != "auto" and not (isinstance(hpz, int) and hpz > 1):
        raise _refuse(f"zero_optimization.zero_hpz_partition_size={hpz!r}",
                      "must be a whole number of ranks, or 'auto' (the processes per node)")
    if stage != 3:
        raise _refuse(f"zero_optimization.zero_hpz_partition_size={hpz!r}",
                      f"partitions stage 3's parameters within a node (ZeRO++ hpZ); it "
                      f"needs zero_optimization.stage=3, not {stage}")


def deepspeed_config(config: str | Mapping[str, Any] | None = None,
                     **keys: Any) -> dict[str, Any]:
    """The DeepSpeed config the options describe (plan time: no DeepSpeed import).

    ``keys`` override ``config``; MMEngine's ``zero_optimization.cpu_offload``
    becomes DeepSpeed's ``offload_optimizer``; unset ZeRO bucket sizes become
    ``'auto'``.
    """
    merged = _base_config(config)
    merged.update({k: json.loads(json.dumps(v)) for k, v in keys.items() if v is not None})
    zero = dict(merged.get("zero_optimization") or {})
    if zero.pop("cpu_offload", False):
        zero.setdefault("offload_optimizer", {"device": "cpu"})
    stage = zero.setdefault("stage", 0)
    if stage not in _AUTO_KEYS:
        raise _refuse(f"zero_optimization.stage={stage!r}", "must be 0, 1, 2 or 3")
    _check_hierarchical(zero, stage)
    for key in _AUTO_KEYS[stage]:
        zero.setdefault(key, "auto")
    merged["zero_optimization"] = zero
    merged.setdefault("steps_per_print", 10**12)  # DeepSpeed's own progress lines: off
    _precision(merged)
    return merged


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

    Parameters are mmengine's ``DeepSpeedStrategy`` ones, plus ``train_batch_size``
    (checked against the dataloader), ``dist_cfg`` and ``device`` as for DDP, and
    ``checkpoint_format``: ``'portable'`` (default: fp32 master weights and
    optimizer moments by parameter name, resumable under every strategy) or
    ``'native'`` (DeepSpeed's own ``save_checkpoint`` directories).
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
        "deepspeed_initialize", f"{HERE}:initialize", requires=("cfg", "env", "hooks"),
        provides=tuple(outputs), updates="model",
        params={"config": ds,
                "inputs_to_half": None if inputs_to_half is None else list(inputs_to_half)},
        doc="deepspeed.initialize: the engine and its ZeRO optimizer")
    rewrites = [
        Replace("setup_env", Step(
            "setup_env", f"{HERE}:setup_env", requires="cfg", provides="env",
            params={"device": device, "precision": _precision(ds),
                    "tensor_parallel": "tensor_parallel" in ds, **dict(dist_cfg or {})},
            doc="check the precision, join the process group")),
    ]
    if stage == 3:
        rewrites += [
            Configure("build_model", {"init_context": f"{HERE}:zero_init",
                                      "init_options": {"config": ds}}),
            Replace("init_weights", Step(
                "init_weights", f"{HERE}:init_gathered_weights", requires="env",
                updates="model", doc="model.init_weights() on the gathered parameters")),
        ]
    rewrites += [
        Fuse(tuple(fused), initialize),
        Move("load_checkpoint", after="deepspeed_initialize"),
        Replace("build_train_step", Step(
            "build_train_step", f"{HERE}:build_train_step", requires=("model", "optim_wrapper"),
            provides="train_step", doc="the engine's backward and step")),
        Configure("build_checkpointer", {
            "io": f"{CHECKPOINTS}:DeepSpeedCheckpointIO",
            "io_options": {"exclude_frozen_parameters": bool(exclude_frozen_parameters)},
            "access": f"{STATE}:DeepSpeedStateAccess", "checkpoint_format": checkpoint_format}),
    ]
    checks = (
        Precedes("deepspeed_initialize", "load_checkpoint",
                 "the engine owns the parameters (partitioned under ZeRO-3) and the "
                 "optimizer's master copies of them; weights loaded before it are "
                 "overwritten or never reach the optimizer"),
    )
    return Strategy("deepspeed", rewrites, doc=f"DeepSpeed ZeRO stage {stage}",
                    world_size="many", checks=checks, run_imports=RUN_IMPORTS,
                    memory_model="flexgraph.strategies.deepspeed.memory",
                    memory_options={"config": ds})


# -- step functions ---------------------------------------------------------------------------

def _import_deepspeed() -> Any:
    """Import DeepSpeed, telling it the accelerator instead of letting it guess aloud."""
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed
    except ImportError as exc:
        from flexgraph.training.errors import ConfigError

        raise ConfigError(f"strategy 'deepspeed' needs DeepSpeed: pip install deepspeed "
                          f"({exc})") from None
    import logging
    import warnings

    deepspeed.utils.logger.setLevel(logging.WARNING)  # its INFO lines go per rank, per step
    # DeepSpeed calls collectives torch has renamed; nothing a user can act on.
    warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated",
                            FutureWarning)
    return deepspeed


def setup_env(cfg: Any, *, precision: str = "fp32", tensor_parallel: bool = False,
              device: str | None = None, backend: str | None = None,
              timeout: float = 1800) -> Any:
    """Check the precision against the accelerator, then join the process group."""
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import setup_process_group

    deepspeed = _import_deepspeed()
    accelerator = deepspeed.accelerator.get_accelerator()
    if precision == "fp16" and not accelerator.is_fp16_supported():
        raise ConfigError(
            f"strategy 'deepspeed': fp16 is not supported on this machine's accelerator "
            f"({accelerator.device_name()}); use bf16=dict(enabled=True) instead of "
            f"fp16=dict(enabled=True)")
    if precision == "bf16" and not accelerator.is_bf16_supported():
        raise ConfigError(f"strategy 'deepspeed': bf16 is not supported on "
                          f"{accelerator.device_name()}; use fp16=dict(enabled=True)")
    if not tensor_parallel:
        _leave_out_shm_all_reduce(deepspeed)
    _warn_about_stale_build_locks()
    env = setup_process_group(cfg, device=device, backend=backend, timeout=timeout)
    # DeepSpeed reads LOCAL_RANK itself (its engine, zero.Init), which a process
    # started without a launcher lacks: it is then a world of one, rank 0.
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
    deepspeed.init_distributed(dist_backend=backend or ("nccl" if "cuda" in env.device
                                                        else "gloo"))
    return env


def _leave_out_shm_all_reduce(deepspeed: Any) -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op, which training never calls.

    On a CPU, ``init_distributed`` compiles that C++ op (about 40 s, once per
    environment) and every rank loads it, although only DeepSpeed's tensor-parallel
    layers call it (``inference_all_reduce``); ZeRO's collectives are torch's.
    DeepSpeed keeps the ops it may build in one dict that it probes once, so that edits
    to it persist. A config with a ``tensor_parallel`` section keeps the op.
    """
    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def _warn_about_stale_build_locks() -> None:
    """Say so (once per machine) when an interrupted op build would make this run hang."""
    import warnings

    from flexgraph.strategies.deepspeed.engine import stale_build_locks

    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    for lock, age in stale_build_locks():
        warnings.warn(f"{lock} is {age / 60:.0f} min old: a build of a DeepSpeed C++ op was "
                      f"interrupted, and a run that builds that op waits for the file to go, "
                      f"forever; delete it unless a build is running", stacklevel=2)


def zero_init(cfg: Any, env: Any, *, config: Mapping[str, Any]) -> Any:
    """``deepspeed.zero.Init``: ZeRO-3 partitions each parameter as it is created.

    Given the run's DeepSpeed config (batch sizes filled in: DeepSpeed checks
    them), so parameters are created in the training precision and placement.
    """
    from flexgraph.strategies.deepspeed.engine import fill_config

    deepspeed = _import_deepspeed()
    resolved, _ = fill_config(config, cfg=cfg, world_size=env.world_size, numel=0)
    return deepspeed.zero.Init(config_dict_or_path=resolved)


def init_gathered_weights(env: Any, model: Any) -> Any:
    """``model.init_weights()`` with the partitioned parameters gathered.

    Every rank holds the whole model for the duration of the call (rank 0's
    values are kept and re-partitioned); a model initialised by its
    constructors alone (no ``init_weights``) never gathers.
    """
    from flexgraph.training.checkpoint import load_pretrained
    from flexgraph.training.components import initialise

    if callable(getattr(model, "init_weights", None)):
        deepspeed = _import_deepspeed()
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            initialise(model, load_pretrained=load_pretrained)
    return model


def _optimizer(cfg: Any, model: Any) -> Any:
    """The torch optimizer the config's optim_wrapper describes (paramwise_cfg included)."""
    from mmengine.config import ConfigDict

    from flexgraph.training.components import build_optim_wrapper
    from flexgraph.training.errors import ConfigError

    ow_cfg = cfg.get("optim_wrapper")
    if ow_cfg is None:
        return None
    plain = dict(ow_cfg)
    kind = plain.pop("type", "OptimWrapper")
    kind = getattr(kind, "__name__", kind)
    if str(kind).rpartition(".")[2] not in ("OptimWrapper", "DeepSpeedOptimWrapper"):
        raise ConfigError(f"strategy 'deepspeed': optim_wrapper type {kind!r} does not apply; "
                          f"DeepSpeed does precision, clipping and accumulation itself: use "
                          f"type='DeepSpeedOptimWrapper' (or none) and the strategy's "
                          f"fp16/bf16 keys")
    for moved in ("clip_grad", "accumulative_counts"):  # became DeepSpeed config keys
        plain.pop(moved, None)
    with _full_shapes(model):
        return build_optim_wrapper(ConfigDict(optim_wrapper=plain), model).optimizer


@contextlib.contextmanager
def _full_shapes(model: Any) -> Iterator[None]:
    """ZeRO-3's partitioned parameters show their full shape, without storage.

    Under ``zero.Init`` a parameter's tensor is an empty placeholder (shape
    ``[0]``, so ``ndim == 1``) and its shape lives in ``ds_shape``. Optimizer
    constructors choose param groups by shape: MMEngine's and mmpretrain's put
    every 1-D parameter (biases, norms) in a group without weight decay, so on
    the placeholders every parameter would lose its weight decay. For the
    duration, each placeholder is swapped for one element expanded to the full
    shape (a tensor's data can only be swapped for one of the same device).
    """
    import torch

    swapped = [(p, p.data) for p in model.parameters() if hasattr(p, "ds_shape")]
    try:
        for param, placeholder in swapped:
            param.data = torch.empty(1, dtype=placeholder.dtype,
                                     device=placeholder.device).expand(param.ds_shape)
        yield
    finally:
        for param, placeholder in swapped:
            param.data = placeholder


def initialize(cfg: Any, env: Any, hooks: Any, model: Any, *, config: Mapping[str, Any],
               inputs_to_half: list[Any] | None = None) -> dict[str, Any]:
    """``deepspeed.initialize``: the engine, as a model, and its optimizer wrapper."""
    from flexgraph.strategies.deepspeed.checkpoint import safe_checkpoint_engine
    from flexgraph.strategies.deepspeed.engine import (
        DeepSpeedOptimWrapper,
        EngineModel,
        fill_config,
        write_config_file,
    )
    from flexgraph.strategies.deepspeed.params import refuse_empty_parameters

    deepspeed = _import_deepspeed()
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    resolved, filled = fill_config(config, cfg=cfg, world_size=env.world_size, numel=numel)
    optimizer = _optimizer(cfg, model)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=resolved)
    refuse_empty_parameters(engine.module)  # before any checkpoint or batch
    safe_checkpoint_engine(engine)
    write_config_file(resolved, hooks.runner.work_dir)
    wrapped = EngineModel(engine, inputs_to_half)
    if env.is_main:
        if filled:
            chosen = ", ".join(f"{k}={v}" for k, v in sorted(filled.items()))
            hooks.runner.logger.info(f"DeepSpeed config filled in: {chosen}")
        if inputs_to_half is None and wrapped.compute_dtype is not None:
            hooks.runner.logger.info(
                f"DeepSpeed runs the model in {wrapped.compute_dtype}: floating-point "
                f"inputs are cast to it (inputs_to_half=[...] names which instead)")
    outputs: dict[str, Any] = {"model": wrapped,
                               "optim_wrapper": DeepSpeedOptimWrapper(engine, optimizer)}
    if "scheduler" in resolved:
        outputs["param_schedulers"] = []  # the engine steps its own LR scheduler
    return outputs


def build_train_step(model: Any, optim_wrapper: Any) -> Any:
    """The engine's backward and step, behind MMEngine's ``train_step`` contract."""
    from flexgraph.strategies.deepspeed.engine import engine_train_step

    return engine_train_step(model, optim_wrapper)
