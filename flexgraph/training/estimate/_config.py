"""What an estimate reads from the training config: batch, AMP precision, optimizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.config import section

OPTIMIZER_STATES = {
    "Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "FusedAdam": 2,
    "DeepSpeedCPUAdam": 2, "Lamb": 2, "FusedLamb": 2, "Lion": 1, "Adagrad": 1,
    "RMSprop": 1, "Adadelta": 2, "SGD": 0, "ASGD": 2, "LBFGS": 2, "Rprop": 2,
}
"""fp32 states per parameter, by optimizer class name (SGD gains one with ``momentum``)."""

_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp16": "fp16",
           "bf16": "bf16"}


def amp_precision(cfg: Any) -> str | None:
    """``'fp16'`` / ``'bf16'`` for an ``AmpOptimWrapper`` (float16 by default), else ``None``.

    Parameters
    ----------
    cfg : Config or Mapping

    Returns
    -------
    str or None
    """
    wrapper = section(cfg, "optim_wrapper") or {}
    kind = str(wrapper.get("type", "")).rpartition(".")[2]
    if not kind.endswith("AmpOptimWrapper"):
        return None
    dtype = str(wrapper.get("dtype") or "float16").removeprefix("torch.")
    return _DTYPES.get(dtype, "fp16")


def optimizer_states(cfg: Any) -> tuple[int, str]:
    """(fp32 states per trainable parameter, the optimizer's name) of ``optim_wrapper``."""
    name, optimizer = _optimizer_cfg(cfg)
    states = OPTIMIZER_STATES.get(name, 2)
    if name == "SGD" and float(optimizer.get("momentum", 0) or 0) > 0:
        states = 1
    return states, name


def _optimizer_cfg(cfg: Any) -> tuple[str, Mapping[str, Any]]:
    wrapper = section(cfg, "optim_wrapper") or {}
    optimizer = wrapper.get("optimizer") or {}
    if not isinstance(optimizer, Mapping):
        return "SGD", {}
    return str(optimizer.get("type", "SGD")).rpartition(".")[2], optimizer


def step_temporaries(cfg: Any, stepped: tuple[int, int], device: str) -> tuple[int, str | None]:
    """The bytes torch's Adam / AdamW allocate during their step and free again, with a note.

    The for-loop kernel (the CPU default) takes two temporaries the size of the largest
    tensor, the foreach kernels (CUDA's) one per stepped tensor, a fused step none.
    """
    name, optimizer = _optimizer_cfg(cfg)
    largest, total = stepped
    if name not in ("Adam", "AdamW") or not total or optimizer.get("fused"):
        return 0, None
    foreach = optimizer.get("foreach")
    if foreach is None:
        foreach = device == "cuda"
    if foreach:
        return 4 * total, (f"optimizer step: {name}'s foreach kernels, one fp32 temporary "
                           f"per stepped tensor ({total:,} elements; modelled)")
    return 8 * largest, (f"optimizer step: {name}, two fp32 temporaries the size of the "
                         f"largest tensor it steps ({largest:,} elements; modelled)")


def first_batch(cfg: Any) -> Any:
    """A batch of ``train_dataloader``: its dataset's first ``batch_size`` samples, collated.

    In index order, not through the sampler: the same batch every call, without
    shuffling a large index. Other loaders give their first batch as in a run.
    """
    from torch.utils.data import IterableDataset

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
    size, dataset = loader.batch_size, loader.dataset
    if (size is None or isinstance(dataset, IterableDataset)
            or not hasattr(dataset, "__len__")):
        return next(iter(loader))
    return loader.collate_fn([dataset[i] for i in range(min(size, len(dataset)))])
