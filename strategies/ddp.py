"""DDPStrategy: one process per device, gradients averaged by DistributedDataParallel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import format_rewrites, join_process_group
from flexgraph.strategies.names import DDP

from flexgraph.core.rewrite import Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy

HERE = "flexgraph.strategies.ddp"


def ddp(
    model_wrapper: Mapping[str, Any] | None = None,
    sync_bn: str | None = None,
    dist_cfg: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_format: str = "native",
) -> Strategy:
    """DistributedDataParallel over a torch.distributed process group (MMEngine's ``DDPStrategy``).

    Parameters
    ----------
    model_wrapper : Mapping, optional
        ``type`` and options, defaulting as under MMEngine's Runner
        (``broadcast_buffers=False``, the config's ``find_unused_parameters``).
    sync_bn : str, optional
        ``'torch'`` converts BatchNorm to SyncBatchNorm (CUDA only).
    dist_cfg, device : optional
    checkpoint_format : {'native', 'portable'}, default 'native'

    Returns
    -------
    Strategy
    """
    return Strategy(
        DDP.name,
        [
            join_process_group(device, dist_cfg),
            Replace(
                "wrap_model",
                Step(
                    "wrap_model",
                    f"{HERE}:wrap_ddp",
                    requires=("env", "cfg"),
                    updates="model",
                    params={"model_wrapper": dict(model_wrapper or {}), "sync_bn": sync_bn},
                    doc="wrap in DistributedDataParallel",
                    gives="on_device",
                    ends="unwrapped",
                ),
                why="DistributedDataParallel averages the gradients across ranks; it wraps "
                    "the loaded model, so its first broadcast carries the loaded weights",
            ),
            *format_rewrites(checkpoint_format),
        ],
        doc="DistributedDataParallel, one process per device",
        world_size="many",
        memory_model=DDP.memory_model,
        memory_options={"model_wrapper": dict(model_wrapper or {})},
    )


def wrap_ddp(
    model: Any, env: Any, cfg: Any, *, model_wrapper: Mapping[str, Any],
    sync_bn: str | None = None
) -> Any:
    """Wrap ``model`` for data-parallel training on ``env.device``.

    Parameters
    ----------
    model, env, cfg, model_wrapper, sync_bn

    Returns
    -------
    torch.nn.Module
    """
    import torch
    from mmengine.model import BaseModel
    from mmengine.registry import MODEL_WRAPPERS

    from flexgraph.training.errors import ConfigError

    model = model.to(env.device)
    if sync_bn:
        if not str(env.device).startswith("cuda"):
            raise ConfigError("sync_bn needs CUDA devices; drop strategy.sync_bn for a CPU run")
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    options = {"broadcast_buffers": False, **model_wrapper}
    if cfg.get("find_unused_parameters"):  # the Runner's top-level key; the strategy's wins
        options.setdefault("find_unused_parameters", True)
    default = "MMDistributedDataParallel" if isinstance(model, BaseModel) else (
        "DistributedDataParallel"
    )
    wrapper_type = options.pop("type", default)
    device_ids = [env.local_rank] if str(env.device).startswith("cuda") else None
    return MODEL_WRAPPERS.build(
        dict(type=wrapper_type, module=model, device_ids=device_ids, **options)
    )
