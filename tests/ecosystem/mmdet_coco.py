"""MMDetection's ATSS and Faster R-CNN configs, as installed, on a COCO-format set of their own.

The configs are the two MMEngine's FlexibleRunner was validated on
(``atss/atss_r50_fpn_1x_coco.py``, ``faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py``),
read from the installed package (``mmdet/.mim/configs``). What changes:

* a data override file (:func:`write_wrapper`), the config's ``_base_`` plus
  what a user's own COCO-format set changes: its root, annotation files,
  image folder and classes, and the evaluator's annotation file;
* ``--cfg-options`` (:func:`overrides`): 3 classes in the head, images scaled
  to 128 px, few epochs validated after the last, a seed, training workers
  started each epoch, ATSS's score threshold at 0, no download of the
  ImageNet backbone (``model.backbone.init_cfg=None``: ``torchvision://resnet50``
  needs the network), gloo for the process group, and the strategy.

The set (:func:`write_coco`) is real JPEG files with coloured rectangles on
noise, one class per colour, landscape and portrait images (so that
MMDetection's ``AspectRatioBatchSampler`` has two groups to batch), and an
annotation file of their boxes. Validation runs on the training images: the
set is there to compare runners and strategies on, not to measure
generalisation, and a few hundred iterations reach a measurable mAP on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

CLASSES = ("red", "green", "blue")
COLOURS = ((220, 30, 30), (30, 200, 30), (30, 60, 220))
IMAGES = 8  # 2 iterations an epoch: 2 ranks x batch 2
ITERS_PER_EPOCH = IMAGES // 4
SIZES = ((128, 96), (96, 128))  # (width, height): landscape, portrait

CONFIGS = {
    "atss": "atss/atss_r50_fpn_1x_coco.py",
    "faster_rcnn": "faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py",
}
#: where each config keeps its number of classes
NUM_CLASSES = {"atss": "model.bbox_head.num_classes",
               "faster_rcnn": "model.roi_head.bbox_head.num_classes"}

#: each strategy's ``--cfg-options`` (fp32); DDP is what two processes get by default
STRATEGIES = {
    "ddp": ["strategy.type=DDPStrategy"],
    "fsdp": ["strategy.type=FSDPStrategy"],
    "zero1": ["strategy.type=DeepSpeedStrategy", "strategy.zero_optimization.stage=1"],
    "zero2": ["strategy.type=DeepSpeedStrategy", "strategy.zero_optimization.stage=2"],
    "zero3": ["strategy.type=DeepSpeedStrategy", "strategy.zero_optimization.stage=3"],
}
#: the options that make a strategy train in bf16 (where a CPU can: not fp16)
BF16 = {
    "fsdp": ["optim_wrapper.type=AmpOptimWrapper", "optim_wrapper.dtype=bfloat16"],
    "zero1": ["strategy.bf16.enabled=True"],
    "zero2": ["strategy.bf16.enabled=True"],
    "zero3": ["strategy.bf16.enabled=True"],
}
#: what each config's evaluation changes: ATSS's classifier starts at a probability of
#: 0.01 (focal loss's prior), under the config's score threshold of 0.05, so that a
#: few iterations in it detects nothing, and CocoMetric has nothing to score
EVALUATED = {"atss": ["model.test_cfg.score_thr=0.0"], "faster_rcnn": []}
#: the six numbers CocoMetric reports for boxes
BBOX_METRICS = tuple(f"coco/bbox_{name}" for name in
                     ("mAP", "mAP_50", "mAP_75", "mAP_s", "mAP_m", "mAP_l"))


def config_path(model: str) -> Path:
    """The installed config of ``model`` (``atss`` or ``faster_rcnn``)."""
    import mmdet

    return Path(mmdet.__file__).parent / ".mim" / "configs" / CONFIGS[model]


def write_coco(root: Path, count: int = IMAGES, seed: int = 0) -> Path:
    """``root/images/*.jpg`` and ``root/annotations/train.json``: ``count`` images, 1-3 boxes each.

    Each image is noise with one to three filled rectangles, each in its class's
    colour; the boxes are their outlines, in COCO's ``[x, y, w, h]``.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(count):
        width, height = SIZES[i % len(SIZES)]
        pixels = rng.integers(90, 160, (height, width, 3)).astype(np.uint8)
        for _ in range(int(rng.integers(1, 4))):
            label = int(rng.integers(len(CLASSES)))
            w, h = (int(v) for v in rng.integers(20, 56, 2))
            x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
            pixels[y:y + h, x:x + w] = COLOURS[label]
            annotations.append(dict(id=len(annotations) + 1, image_id=i + 1,
                                    category_id=label + 1, bbox=[x, y, w, h], area=w * h,
                                    iscrowd=0))
        name = f"{i:03d}.jpg"
        Image.fromarray(pixels).save(root / "images" / name, quality=95)
        images.append(dict(id=i + 1, file_name=name, width=width, height=height))
    categories = [dict(id=k + 1, name=name) for k, name in enumerate(CLASSES)]
    (root / "annotations" / "train.json").write_text(json.dumps(
        dict(images=images, annotations=annotations, categories=categories)))
    return root


def write_wrapper(folder: Path, model: str, data: Path, *extra: str) -> Path:
    """``folder/<model>.py``: the installed config as ``_base_``, and the data it trains on.

    ``extra`` lines are appended (a probe hook, ``custom_imports``).
    """
    annotations = str(data / "annotations" / "train.json")
    dataset = (f"dict(data_root={str(data) + os.sep!r}, ann_file='annotations/train.json', "
               f"data_prefix=dict(img='images/'), metainfo=dict(classes={CLASSES!r}))")
    text = "\n".join([
        f"_base_ = [{str(config_path(model))!r}]",
        f"train_dataloader = dict(dataset={dataset})",
        f"val_dataloader = dict(dataset={dataset})",
        "test_dataloader = val_dataloader",
        f"val_evaluator = dict(ann_file={annotations!r})",
        "test_evaluator = val_evaluator",
        *extra,
    ])
    config = folder / f"{model}.py"
    config.write_text(text + "\n")
    return config


def overrides(model: str, strategy: str | None = "ddp", *, epochs: int = 2,
              bf16: bool = False, warmup: int | None = None,
              steps_over_run: bool = False) -> list[str]:
    """The ``--cfg-options`` that make ``model``'s config small, under ``strategy``.

    ``strategy=None``: none named (MMEngine's Runner takes no ``strategy`` key).
    ``warmup``: iterations of the linear warm-up (the config's 500 when ``None``;
    a few iterations into it the heads still predict every class everywhere,
    which gives CocoMetric detections to score).
    ``steps_over_run``: the config's step schedule (``MultiStepLR``, learning rate
    divided by 10 after epochs 8 and 11 of 12, then left there) stretched over the
    ``epochs`` at the same fractions; otherwise a run longer than 12 epochs trains
    the rest at a hundredth of the config's learning rate.
    """
    options = [
        "model.backbone.init_cfg=None",
        f"{NUM_CLASSES[model]}={len(CLASSES)}",
        "train_dataloader.dataset.pipeline.2.scale=(128,128)",
        "val_dataloader.dataset.pipeline.1.scale=(128,128)",
        "test_dataloader.dataset.pipeline.1.scale=(128,128)",
        f"train_cfg.max_epochs={epochs}",
        # Validation after the last epoch only: MMEngine's validation draws from the
        # global RNGs that training then draws from, flexgraph's leaves them as they
        # were (docs/guide/parity.rst, "Deliberate differences"); validating in
        # between would make the Runner's next epoch differ from flexgraph's.
        f"train_cfg.val_interval={epochs}",
        "randomness.seed=0",  # unset, each runner draws one: runs would differ
        *([f"param_scheduler.0.end={warmup}"] if warmup is not None else []),
        *([f"param_scheduler.1.end={epochs}",
           f"param_scheduler.1.milestones=[{epochs * 8 // 12},{epochs * 11 // 12}]"]
          if steps_over_run else []),
        "env_cfg.dist_cfg.backend=gloo",
        "default_hooks.logger.interval=1",
        # Workers that persist across epochs continue their random flips into the next
        # epoch, and a resumed run's start theirs again from their seed
        # (docs/guide/parity.rst, "Deliberate differences"); workers started each
        # epoch draw the same in both.
        "train_dataloader.persistent_workers=False",
        *EVALUATED[model],
    ]
    if strategy is not None:
        options += STRATEGIES[strategy]
        options += BF16[strategy] if bf16 else []
    return options


def environment(**extra: str) -> dict[str, str]:
    """One thread a process, and this folder importable (the probe hook, the runner script)."""
    paths = [str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, paths)), **extra}


def flexgraph_run(config: Path, work_dir: Path, options: list[str], *extra: str,
                  cwd: Path, timeout: int = 1500) -> subprocess.CompletedProcess:
    """``flexgraph run CONFIG --nproc-per-node 2 --work-dir W ... --cfg-options ...``."""
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir", str(work_dir),
         "--nproc-per-node", "2", *extra, "--cfg-options", *options],
        cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout)


def runner_run(config: Path, work_dir: Path, options: list[str], *, cwd: Path,
               timeout: int = 1500) -> subprocess.CompletedProcess:
    """MMEngine's ``Runner`` on 2 CPU processes (``mmdet_parts.py`` under torch.distributed.run)."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(_free_port()), str(HERE / "mmdet_parts.py"), str(config),
         str(work_dir), "--cfg-options", *options],
        cwd=cwd, env=environment(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"),
        capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(work_dir: Path) -> dict[str, object]:
    """What :class:`mmdet_parts.DetectionProbe` wrote on each rank: losses, metrics, grads."""
    folder = work_dir / "probe"
    return {
        "losses": {rank: json.loads((folder / f"losses-rank{rank}.json").read_text())
                   for rank in (0, 1)},
        "metrics": json.loads((folder / "metrics.json").read_text()),
        "trainable": json.loads((folder / "trainable.json").read_text()),
    }
