"""What an estimate reads from the training config: batch, AMP precision, optimizer.

Read from the config as the run would build it, without building the
optimizer (it needs real parameters) or the dataset's whole length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.config import section

__all__ = ["OPTIMIZER_STATES", "amp_precision", "first_batch", "optimizer_states"]

OPTIMIZER_STATES = {
    "Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "FusedAdam": 2,
    "DeepSpeedCPUAdam": 2, "Lamb": 2, "FusedLamb": 2, "Lion": 1, "Adagrad": 1,
    "RMSprop": 1, "Adadelta": 2, "SGD": 0, "ASGD": 2, "LBFGS": 2, "Rprop": 2,
}
"""fp32 state tensors per parameter the size of it, by optimizer class name (torch's
defaults; SGD gains one with ``momentum``)."""

_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp16": "fp16",
           "bf16": "bf16"}


def amp_precision(cfg: Any) -> str | None:
    """``'fp16'`` / ``'bf16'`` when ``optim_wrapper`` is MMEngine's ``AmpOptimWrapper``.

    Its default dtype is float16 on CUDA (what an estimate is for).
    """
    wrapper = section(cfg, "optim_wrapper") or {}
    kind = str(wrapper.get("type", "")).rpartition(".")[2]
    if not kind.endswith("AmpOptimWrapper"):
        return None
    dtype = str(wrapper.get("dtype") or "float16").removeprefix("torch.")
    return _DTYPES.get(dtype, "fp16")


def optimizer_states(cfg: Any) -> tuple[int, str]:
    """(fp32 states per trainable parameter, the optimizer's name) of ``optim_wrapper``."""
    wrapper = section(cfg, "optim_wrapper") or {}
    optimizer = wrapper.get("optimizer") or {}
    name = str(optimizer.get("type", "SGD")) if isinstance(optimizer, Mapping) else "SGD"
    name = name.rpartition(".")[2]
    states = OPTIMIZER_STATES.get(name, 2)
    if name == "SGD" and float(optimizer.get("momentum", 0) or 0) > 0:
        states = 1
    return states, name


def first_batch(cfg: Any) -> Any:
    """The first batch of ``train_dataloader``, loaded in this process (no workers)."""
    from flexgraph.training.components import build_dataloader
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import make_env

    loader_cfg = section(cfg, "train_dataloader")
    if loader_cfg is None:
        raise ConfigError("the estimate traces one training step and needs a "
                          "train_dataloader in the config")
    loader_cfg = dict(loader_cfg, num_workers=0, persistent_workers=False)
    loader_cfg.pop("prefetch_factor", None)
    loader = build_dataloader(loader_cfg, make_env(cfg, device="cpu"), name="train_dataloader",
                              model_cfg=section(cfg, "model"))
    return next(iter(loader))
