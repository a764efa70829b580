"""Five of MMPreTrain's configs, as installed, shrunk in data, image size and epochs only.

ConvNeXt-T (with its ``EMAHook``), DeiT-T, ResNet-18, MoCo v3 and SimSiam, read
from the installed package, are written out as configs of their own with: 32 px
images of 5 classes in ImageNet's folder layout (``mae_finetune.write_images``),
batch 4, 2 epochs (schedulers that would begin later dropped), a checkpoint
every epoch, fp32 (``AmpOptimWrapper`` becomes ``OptimWrapper``); the
self-supervised two also get ResNet-18 for ResNet-50 and BN for SyncBN, which a
CPU process group cannot run, and no hue jitter (mmcv's shifts a ``uint8`` by a
negative number, which NumPy 2 refuses).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.ecosystem.mae_finetune import CLASSES

CONFIGS = {
    "convnext": "convnext/convnext-tiny_32xb128_in1k.py",
    "deit": "deit/deit-tiny_4xb256_in1k.py",
    "resnet": "resnet/resnet18_8xb32_in1k.py",
    "mocov3": "mocov3/mocov3_resnet50_8xb512-amp-coslr-100e_in1k.py",
    "mocov3-sgd": "mocov3/mocov3_resnet50_8xb512-amp-coslr-100e_in1k.py",
    "simsiam": "simsiam/simsiam_resnet50_8xb32-coslr-100e_in1k.py",
    "swav": "swav/swav_resnet50_8xb32-mcrop-coslr-200e_in1k-224px-96px.py",
}
STRATEGIES = {
    "single": None,
    "ddp": "dict(type='DDPStrategy')",
    "fsdp": "dict(type='FSDPStrategy')",
    "hsdp": "dict(type='FSDPStrategy', model_wrapper=dict(sharding_strategy='HYBRID_SHARD'))",
    "zero1": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=1))",
    "zero2": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=2))",
    "zero3": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))",
}
_SIZES = {"scale": {224: 32, 256: 36}, "crop_size": {224: 32}}


def _shrunk_images(value: Any) -> Any:
    """Pipelines with 32 px crops (36 px resizes) for 224 px (256 px) ones, nested views too."""
    if isinstance(value, list):
        return [_shrunk_images(v) for v in value]
    if isinstance(value, dict):
        if value.get("type") == "ColorJitter":  # mmcv's negative hue shift overflows on NumPy 2
            value = {**value, "hue": 0.0}
        return {k: _SIZES[k].get(v, v) if k in _SIZES and isinstance(v, int) else
                _shrunk_images(v) for k, v in value.items()}
    return value


def write_config(root: Path, model: str, strategy: str, data: Path,
                 edit: Callable[[Any], None] | None = None) -> Path:
    """The installed config of ``model``, shrunk, under ``strategy``: ``root/model-strategy.py``.

    ``edit`` changes the shrunk ``Config`` further before it is written.
    """
    import mmpretrain
    from mmengine.config import Config

    folder = Path(mmpretrain.__file__).parent / ".mim" / "configs"
    cfg = Config.fromfile(folder / CONFIGS[model])
    for split in ("train", "val"):
        loader = cfg.get(f"{split}_dataloader")
        if not loader:
            continue
        loader.update(batch_size=4, num_workers=0, persistent_workers=False)
        loader.dataset.update(data_root=str(data), split=split, pipeline=_shrunk_images(
            loader.dataset.pipeline), metainfo=dict(classes=list(CLASSES)))
    for key in ("test_dataloader", "test_evaluator", "test_cfg"):
        cfg[key] = None
    cfg.train_cfg.max_epochs = 2
    schedulers = cfg.param_scheduler if isinstance(cfg.param_scheduler, list) else [
        cfg.param_scheduler]
    cfg.param_scheduler = [s for s in schedulers if s.get("begin", 0) < 2]  # the rest: never
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=3)
    cfg.randomness = dict(seed=0)
    if cfg.optim_wrapper.get("type") == "AmpOptimWrapper":
        cfg.optim_wrapper.type = "OptimWrapper"
        cfg.optim_wrapper.pop("loss_scale", None)
    if "head" in cfg.model and "num_classes" in cfg.model.head:
        cfg.model.head.num_classes = len(CLASSES)
        cfg.data_preprocessor.num_classes = len(CLASSES)  # Mixup / CutMix's one-hot labels
    if "img_size" in cfg.model.backbone or cfg.model.backbone.type == "VisionTransformer":
        cfg.model.backbone.img_size = 32
    if cfg.model.backbone.get("norm_cfg", {}).get("type") == "SyncBN":
        cfg.model.backbone.update(depth=18, norm_cfg=dict(type="BN"))
        cfg.model.neck.update(in_channels=512, norm_cfg=dict(type="BN1d"))  # SyncBN by default
        if "predictor" in cfg.model.head:
            cfg.model.head.predictor.norm_cfg = dict(type="BN1d")
    if model.endswith("-sgd"):  # an element-wise optimizer in place of the config's LARS
        cfg.optim_wrapper.optimizer = dict(type="SGD", lr=0.5, weight_decay=1e-6, momentum=0.9)
    if STRATEGIES[strategy] is not None:
        cfg.strategy = eval(STRATEGIES[strategy])  # noqa: S307 (the table above)
    if edit is not None:
        edit(cfg)
    path = root / f"{model}-{strategy}.py"
    cfg.dump(path)
    return path


def train(root: Path, model: str, strategy: str, data: Path,
          edit: Callable[[Any], None] | None = None) -> subprocess.CompletedProcess:
    """``flexgraph run`` of :func:`write_config`'s config on 2 processes (1 for ``single``)."""
    config = write_config(root, model, strategy, data, edit)
    procs = "1" if strategy == "single" else "2"
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
         str(root / f"{model}-{strategy}"), "--nproc-per-node", procs],
        cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=900)


def records(work: Path, mode: str = "train") -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records of one mode."""
    lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("mode", "train") == mode]


def saved_weights(work: Path, epoch: int, unit: str = "epoch") -> dict[str, torch.Tensor]:
    """The model weights of ``work``'s checkpoint after ``epoch`` (``unit="iter"``: iteration)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if (work / f"{unit}_{epoch}.pth").exists():
        return torch.load(work / f"{unit}_{epoch}.pth", weights_only=False)["state_dict"]
    flat = work / f"{unit}_{epoch}.flat.pt"
    dcp_to_torch_save(work / f"{unit}_{epoch}.ckpt", flat)
    return torch.load(flat, weights_only=False)["model"]
