"""DeepSpeed's runtime besides checkpoints: its config, its engine in MMEngine's shapes.

flexgraph's loop, hooks and schedulers talk to MMEngine-shaped objects; MMEngine's own
DeepSpeed wrappers no longer import with current DeepSpeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.deepspeed.options import amp_sections, precision
from flexgraph.strategies.deepspeed.params import named_parameter_errors
from mmengine.optim import BaseOptimWrapper
from mmengine.registry import MODEL_WRAPPERS

from flexgraph.training.components import forward, loss_of, uses_step_api
from flexgraph.training.errors import ConfigError
from flexgraph.training.runtime import this_rank

__all__ = [
    "DeepSpeedOptimWrapper",
    "EngineModel",
    "cast_inputs",
    "engine_train_step",
    "fill_config",
    "stale_build_locks",
    "write_config_file",
]

AUTO = "auto"


def _clamp(value: float, low: float, high: float) -> int:
    return int(min(max(value, low), high))


def _set(config: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Fill ``config[key]`` from ``source`` unless the user set a different value."""
    current = config.get(key)
    if current is None or current == AUTO:
        config[key] = value
    elif current != value:
        raise ConfigError(f"strategy 'deepspeed': {key}={current!r} contradicts {source} "
                          f"({value!r}); set one of them")


def fill_config(config: Mapping[str, Any], *, cfg: Any, world_size: int,
                numel: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The DeepSpeed config with what flexgraph derives filled in; returns (config, filled).

    Batch sizes, precision, clipping and accumulation come from the run's config; what the
    user set is never overwritten. ZeRO sizes left ``'auto'`` follow ``numel``: DeepSpeed's
    defaults suit far larger models and cost more memory than ZeRO saves on smaller ones.
    """
    config = json.loads(json.dumps(config))
    before = json.loads(json.dumps(config))
    optim_cfg = dict(cfg.get("optim_wrapper") or {})
    for name, amp in amp_sections(optim_cfg).items():
        if precision(config) not in ("fp32", name):
            raise ConfigError(f"strategy 'deepspeed': {precision(config)} contradicts "
                              f"optim_wrapper's AmpOptimWrapper ({name}); set one of them")
        if precision(config) == "fp32":
            config[name] = amp
    loader = cfg.get("train_dataloader") or cfg.get("val_dataloader") or {}
    accumulation = int(optim_cfg.get("accumulative_counts", 1))
    if accumulation != 1 or config.get("gradient_accumulation_steps") in (None, AUTO):
        _set(config, "gradient_accumulation_steps", accumulation,
             "optim_wrapper.accumulative_counts")
    clip = optim_cfg.get("clip_grad")
    if clip:
        if float(clip.get("norm_type", 2)) != 2.0 or set(clip) - {"max_norm", "norm_type"}:
            raise ConfigError("strategy 'deepspeed': DeepSpeed clips by the global L2 norm "
                              "only; use optim_wrapper.clip_grad=dict(max_norm=...)")
        _set(config, "gradient_clipping", float(clip["max_norm"]), "optim_wrapper.clip_grad")
    else:
        # no clip_grad: no clipping, as under every other strategy (DeepSpeed's default clips)
        config.setdefault("gradient_clipping", 0.0)
    batch = loader.get("batch_size") if isinstance(loader, Mapping) else None
    if batch is not None:
        _set(config, "train_micro_batch_size_per_gpu", int(batch),
             "train_dataloader.batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    if isinstance(micro, int):
        _set(config, "train_batch_size",
             micro * int(config["gradient_accumulation_steps"]) * world_size,
             f"micro batch {micro} x accumulation x world size {world_size}")
    zero = config.setdefault("zero_optimization", {})
    bucket = _clamp(numel / 16, 1e6, 5e7)
    # ZeRO-1/2 refuse an all-gather bucket that is not a multiple of their alignment (2)
    sizes = {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket + bucket % 2,
             "stage3_prefetch_bucket_size": bucket, "sub_group_size": bucket,
             "stage3_max_live_parameters": _clamp(numel / 8, 1e6, 1e9),
             "stage3_max_reuse_distance": _clamp(numel / 8, 1e6, 1e9)}
    for key, value in sizes.items():
        if zero.get(key) == AUTO:
            zero[key] = value
    _fill_hierarchical(zero, world_size)
    filled = {k: v for k, v in config.items() if before.get(k) != v and k != "zero_optimization"}
    filled.update({f"zero_optimization.{k}": v for k, v in zero.items()
                   if before.get("zero_optimization", {}).get(k) != v})
    return config, filled


def _fill_hierarchical(zero: dict[str, Any], world_size: int) -> None:
    """ZeRO++ hpZ's group: ``'auto'`` is the launch's processes per node."""
    hpz = zero.get("zero_hpz_partition_size")
    if hpz == AUTO:
        hpz = zero["zero_hpz_partition_size"] = int(os.environ.get("LOCAL_WORLD_SIZE",
                                                                   world_size))
    if isinstance(hpz, int) and hpz > 1 and world_size % hpz:
        raise ConfigError(f"strategy 'deepspeed': zero_optimization.zero_hpz_partition_size="
                          f"{hpz} does not divide the world size {world_size}; use the "
                          f"processes per node, or 'auto'")


def cast_inputs(data: Any, keys: list[Any] | None, dtype: torch.dtype | None) -> Any:
    """``data`` with the floating tensors under ``keys`` cast to ``dtype``.

    ``keys`` are dict keys or positions (MMEngine's ``inputs_to_half=[0]``); ``None`` casts
    every floating tensor, so a config switched to bf16 by its ``strategy`` alone trains.
    """
    if dtype is None or keys == []:
        return data

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.is_floating_point() else value
        if isinstance(value, Mapping):
            return type(value)({k: cast(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        return value

    if keys is None:
        return cast(data)
    if isinstance(data, Mapping):
        names = list(data)
        chosen = {names[k] if isinstance(k, int) and 0 <= k < len(names) else k for k in keys}
        return type(data)({k: cast(v) if k in chosen else v for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(cast(v) if i in keys else v for i, v in enumerate(data))
    return cast(data) if 0 in keys else data


@MODEL_WRAPPERS.register_module(force=True)
class EngineModel:
    """A DeepSpeed engine as an MMEngine model wrapper; ``module`` is the user's model."""

    def __init__(self, engine: Any, inputs_to_half: list[Any] | None = None) -> None:
        self.engine = engine
        self.module = engine.module
        self.inputs_to_half = inputs_to_half
        self.compute_dtype = _compute_dtype(engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _prepared(self, data: Any, training: bool) -> Any:
        return cast_inputs(self.module.data_preprocessor(data, training), self.inputs_to_half,
                           self.compute_dtype)

    def _run(self, data: Any, mode: str) -> Any:
        with named_parameter_errors(self.module):
            if isinstance(data, Mapping):
                return self.engine(**data, mode=mode)
            return self.engine(*data, mode=mode)

    def train_step(self, data: Any, optim_wrapper: Any) -> dict[str, torch.Tensor]:
        losses = self._run(self._prepared(data, True), "loss")
        loss, log_vars = self.module.parse_losses(losses)
        with named_parameter_errors(self.module):
            optim_wrapper.update_params(loss)
        return log_vars

    def val_step(self, data: Any) -> list[Any]:
        return self._run(self._prepared(data, False), "predict")

    test_step = val_step


def _compute_dtype(engine: Any) -> torch.dtype | None:
    if engine.fp16_enabled():
        return torch.float16
    if engine.bfloat16_enabled():
        return torch.bfloat16
    return None


def engine_train_step(model: EngineModel, optim_wrapper: Any) -> Any:
    """The loop's per-batch function: the engine does backward and step."""
    if uses_step_api(model.module):
        train_step = model.train_step

        def step_api(batch: Any) -> Any:
            return train_step(batch, optim_wrapper)

        return step_api
    engine = model.engine
    keys, dtype = model.inputs_to_half, model.compute_dtype

    def plain(batch: Any) -> Any:
        batch = cast_inputs(batch, keys, dtype)
        with named_parameter_errors(model.module):
            loss, logged = loss_of(forward(engine, batch), model.module)
            engine.backward(loss)
            engine.step()
        return logged

    return plain


class DeepSpeedOptimWrapper(BaseOptimWrapper):
    """MMEngine's optimizer-wrapper interface over a DeepSpeed engine.

    Made over the torch optimizer, then pointed at the engine's, as MMEngine's DeepSpeed
    strategy does: MMEngine reads the optimizer's ``defaults``, which ZeRO's lack.
    """

    def __init__(self, engine: Any, torch_optimizer: Any = None) -> None:
        if torch_optimizer is None:  # the DeepSpeed config's own optimizer
            torch_optimizer = getattr(engine.optimizer, "optimizer", engine.optimizer)
        super().__init__(torch_optimizer)
        self.optimizer = engine.optimizer
        self.engine = engine

    def update_params(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.backward(loss)
        self.step()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.engine.backward(loss)

    def step(self, **kwargs: Any) -> None:
        self.engine.step()

    def zero_grad(self, **kwargs: Any) -> None:
        """The engine zeroes gradients in ``step``."""

    def initialize_count_status(self, model: Any, init_counts: int, max_counts: int) -> None:
        """The engine counts accumulation."""

    def state_dict(self) -> dict[str, Any]:
        """Empty: the engine's checkpoint holds the optimizer state."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The engine's checkpoint holds the optimizer state."""

    @contextlib.contextmanager
    def optim_context(self, model: Any):
        yield


def write_config_file(config: Mapping[str, Any], work_dir: str) -> None:
    """Rank 0 leaves the DeepSpeed config it ran with in the work_dir."""
    if this_rank() != 0:
        return
    folder = Path(work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deepspeed_config.json").write_text(json.dumps(config, indent=2) + "\n")


STALE_LOCK_SECONDS = 600


def stale_build_locks(now: float | None = None) -> list[tuple[Path, float]]:
    """Lock files older than :data:`STALE_LOCK_SECONDS`, with their ages in seconds.

    A killed build of a DeepSpeed op leaves one, which every later build waits for forever.
    """
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    now = time.time() if now is None else now
    found = []
    for lock in sorted({*root.glob("*/lock"), *root.glob("*/*/lock")}):
        with contextlib.suppress(OSError):  # a build may finish and remove it meanwhile
            age = now - lock.stat().st_mtime
            if age > STALE_LOCK_SECONDS:
                found.append((lock, age))
    return found
