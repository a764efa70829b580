"""MMPreTrain's MAE fine-tuning configs, as installed, made small only by overrides.

The configs are the ones MMEngine's FlexibleRunner was introduced with
(``configs/mae/benchmarks/vit-{large,huge}-p*_8xb128[-fsdp|-ds]-coslr-50e_in1k.py``),
read from the installed package (``mmpretrain/.mim/configs``). What changes, all
through ``--cfg-options``: a tiny ``arch``, 32 px images of 5 classes in
ImageNet's folder layout, batch 4, two workers, the pretrained checkpoint's
path; under DeepSpeed, bf16 for fp16, which most CPUs lack.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

CLASSES = ("class0", "class1", "class2", "class3", "class4")
ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)
CONFIGS = {
    "large": "vit-large-p16_8xb128{}-coslr-50e_in1k.py",
    "huge": "vit-huge-p14_8xb128{}-coslr-50e_in1k.py",
}
#: each strategy's config variant and the overrides that choose it
STRATEGIES = {
    "ddp": ("", []),
    "fsdp": ("-fsdp", []),
    "zero1": ("-ds", []),
    "zero3": ("-ds", ["strategy.zero_optimization.stage=3"]),
}
ROOT = Path(__file__).resolve().parents[2]


def config_path(model: str, strategy: str) -> Path:
    import mmpretrain

    variant = STRATEGIES[strategy][0]
    folder = Path(mmpretrain.__file__).parent / ".mim" / "configs" / "mae" / "benchmarks"
    return folder / CONFIGS[model].format(variant)


def write_images(root: Path) -> Path:
    """``root/{train,val}/classK/*.png``: 8 and 4 images of 32 px per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 4)):
        for k, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            base = np.array([40 * k, 255 - 40 * k, 128], np.uint8)
            for i in range(count):
                pixels = base + rng.integers(0, 60, (32, 32, 3))
                Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                    folder / f"{i}.png")
    return root


def write_pretrained(path: Path, patch_size: int) -> Path:
    """An MAE-style backbone checkpoint (keys ``backbone.*``) of the tiny arch."""
    from mmpretrain.models import VisionTransformer

    torch.manual_seed(123)
    backbone = VisionTransformer(arch=ARCH, img_size=32, patch_size=patch_size,
                                 out_type="avg_featmap", final_norm=False)
    weights = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    torch.save({"state_dict": weights, "meta": {}}, path)
    return path


def overrides(data: Path, pretrained: Path, strategy: str, *, fp32: bool = False,
              epochs: int = 2) -> list[str]:
    """The ``--cfg-options`` that make a config of ``strategy`` small (and CPU-able)."""
    classes = "[" + ",".join(CLASSES) + "]"
    options = [
        "model.backbone.arch._delete_=True",
        *(f"model.backbone.arch.{k}={v}" for k, v in ARCH.items()),
        "model.backbone.img_size=32", f"model.backbone.init_cfg.checkpoint={pretrained}",
        "model.head.num_classes=5", f"model.head.in_channels={ARCH['embed_dims']}",
        "data_preprocessor.num_classes=5",
        f"train_cfg.max_epochs={epochs}",
        "test_dataloader=None", "test_evaluator=None",
    ]
    for loader, crop in (("train_dataloader", None), ("val_dataloader", 32)):
        options += [f"{loader}.batch_size=4", f"{loader}.num_workers=2",
                    f"{loader}.dataset.data_root={data}",
                    f"{loader}.dataset.metainfo.classes={classes}",
                    f"{loader}.dataset.pipeline.1.scale=32"]
        if crop:
            options.append(f"{loader}.dataset.pipeline.2.crop_size={crop}")
    options += STRATEGIES[strategy][1]
    if strategy.startswith("zero"):
        # The shipped configs train DeepSpeed in fp16, which most CPUs lack: bf16 on
        # every CPU, so that the run is the same whatever CPU the tests land on.
        options += ["strategy.fp16.enabled=False"]
        options += [] if fp32 else ["strategy.bf16.enabled=True"]
    if strategy == "fsdp" and fp32:
        options.append("optim_wrapper.type=OptimWrapper")  # the shipped AmpOptimWrapper: bf16
    return options


def flexgraph_run(config: Path, work_dir: Path, options: list[str], *extra: str,
                  cwd: Path) -> subprocess.CompletedProcess:
    """``flexgraph run CONFIG --nproc-per-node 2 --work-dir W --cfg-options ...``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir", str(work_dir),
         "--nproc-per-node", "2", *extra, "--cfg-options", *options],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
