"""The DeepSpeed strategy's step functions; each imports DeepSpeed when it runs, not at plan."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any


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

    deepspeed.utils.logger.setLevel(logging.WARNING)  # its INFO lines go per rank, per step
    # DeepSpeed calls collectives torch has renamed; nothing a user can act on.
    warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated",
                            FutureWarning)
    return deepspeed


def setup_env(cfg: Any, *, precision: str = "fp32", tensor_parallel: bool = False,
              device: str | None = None, backend: str | None = None,
              timeout: float | None = None) -> Any:
    """Check the precision against the accelerator, then join the process group."""
    from flexgraph.strategies.deepspeed.options import amp_sections

    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import setup_process_group

    deepspeed = _import_deepspeed()
    accelerator = deepspeed.accelerator.get_accelerator()
    if precision == "fp32":  # an AmpOptimWrapper's precision becomes DeepSpeed's
        precision = next(iter(amp_sections(cfg.get("optim_wrapper") or {})), precision)
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
    # DeepSpeed reads LOCAL_RANK itself, which a process started without a launcher lacks
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
    deepspeed.init_distributed(dist_backend=backend or ("nccl" if "cuda" in env.device
                                                        else "gloo"))
    return env


def _leave_out_shm_all_reduce(deepspeed: Any) -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op, which training never calls.

    On a CPU ``init_distributed`` compiles it for every rank, though only tensor-parallel
    layers call it; DeepSpeed probes its dict of buildable ops once, so the edit persists.
    """
    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def _warn_about_stale_build_locks() -> None:
    """Say so (once per machine) when an interrupted op build would make this run hang."""
    from flexgraph.strategies.deepspeed.engine import stale_build_locks

    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    for lock, age in stale_build_locks():
        warnings.warn(f"{lock} is {age / 60:.0f} min old: a build of a DeepSpeed C++ op was "
                      f"interrupted, and a run that builds that op waits for the file to go, "
                      f"forever; delete it unless a build is running", stacklevel=2)


def zero_init(cfg: Any, env: Any, *, config: Mapping[str, Any]) -> Any:
    """``deepspeed.zero.Init`` with the run's config: each parameter partitioned as created."""
    from flexgraph.strategies.deepspeed.engine import fill_config
    from flexgraph.strategies.deepspeed.models import data_constructors_kept, scalar_safe_init

    deepspeed = _import_deepspeed()
    resolved, _ = fill_config(config, cfg=cfg, world_size=env.world_size, numel=0)
    stack = contextlib.ExitStack()
    stack.enter_context(scalar_safe_init(deepspeed)(config_dict_or_path=resolved))
    stack.enter_context(data_constructors_kept())
    return stack


def _optimizer(cfg: Any, model: Any, *, warn: bool) -> Any:
    """The torch optimizer the config's optim_wrapper describes; ``warn`` of keys dropped."""
    from flexgraph.strategies.deepspeed.options import wrapper_options
    from mmengine.config import ConfigDict

    from flexgraph.training.components import build_optim_wrapper

    ow_cfg = cfg.get("optim_wrapper")
    if ow_cfg is None:
        return None
    plain, dropped = wrapper_options(ow_cfg)
    if dropped and warn:
        warnings.warn(f"{', '.join('optim_wrapper.' + key for key in dropped)}: dropped, "
                      f"DeepSpeed's optimizer wrapper does not take them (its precision is "
                      f"the strategy's fp16/bf16 keys)", UserWarning, stacklevel=2)
    for moved in ("type", "clip_grad", "accumulative_counts"):  # DeepSpeed config keys now
        plain.pop(moved, None)
    with _full_shapes(model):
        return build_optim_wrapper(ConfigDict(optim_wrapper=plain), model).optimizer


@contextlib.contextmanager
def _full_shapes(model: Any) -> Iterator[None]:
    """ZeRO-3's parameters show their full shape, without storage.

    A placeholder's shape is ``[0]``, which optimizer constructors take for a 1-D
    parameter and leave without weight decay.
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


def initialize(cfg: Any, settings: Any, run_context: Any, env: Any, model: Any, *,
               config: Mapping[str, Any], inputs_to_half: list[Any] | None = None
               ) -> dict[str, Any]:
    """``deepspeed.initialize``: the engine, as a model, and its optimizer wrapper."""
    from flexgraph.strategies.deepspeed.checkpoint import safe_checkpoint_engine
    from flexgraph.strategies.deepspeed.engine import (
        DeepSpeedOptimWrapper,
        EngineModel,
        fill_config,
        write_config_file,
    )
    from flexgraph.strategies.deepspeed.models import (
        allow_torch_optimizer,
        norm_statistics_cast,
        scalars_as_vectors,
        scalars_restored,
    )

    deepspeed = _import_deepspeed()
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    resolved, filled = fill_config(config, cfg=cfg, world_size=env.world_size, numel=numel)
    optimizer = _optimizer(cfg, model, warn=env.is_main)
    logger = run_context.logger
    allow_torch_optimizer(resolved, optimizer, logger.info if env.is_main else lambda _: None)
    scalars = scalars_as_vectors(model)  # DeepSpeed broadcasts them as bytes
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=resolved)
    scalars_restored(scalars, engine.optimizer)
    normalised = norm_statistics_cast(engine.module, resolved)
    safe_checkpoint_engine(engine)
    write_config_file(resolved, settings.work_dir)
    wrapped = EngineModel(engine, inputs_to_half)
    if env.is_main:
        if filled:
            chosen = ", ".join(f"{k}={v}" for k, v in sorted(filled.items()))
            logger.info(f"DeepSpeed config filled in: {chosen}")
        if normalised:
            logger.info(
                f"DeepSpeed keeps buffers in their dtype: the running statistics of "
                f"{normalised} normalisation layers are cast to their weights' "
                f"{wrapped.compute_dtype}, as module.to(dtype) casts them "
                f"(data_types.buffer_dtype chooses for every buffer instead)")
        if inputs_to_half is None and wrapped.compute_dtype is not None:
            logger.info(
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
