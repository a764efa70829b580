"""The hooks OpenMMLab's configs name for their own models, under single, DDP and FSDP.

Each config is the installed one, shrunk in data, image size and epochs (2):
MMDetection's YOLOX-tiny (``YOLOXModeSwitchHook``, which turns off Mosaic and
switches the head to its L1 loss for the last epochs, here the second; its
EMAHook left out under FSDP, whose sharding is its own matter) on
:func:`~tests.ecosystem.mmdet_coco.write_coco`'s images at 128 px, and
MMPreTrain's SwAV (``SwAVHook``, which keeps a queue of features from a given
epoch, here the second) as :mod:`tests.ecosystem.mmpretrain_configs` shrinks
it, and MMPreTrain's ArcFace retriever on In-Shop (``PrepareProtoBeforeValLoopHook``,
which extracts the gallery's features again before each validation) on
``write_images``' set laid out as In-Shop's, with ResNet-18 for ResNet-50. Each
test asserts what the hook did. SwAV's loss normalises its prototypes in place
in ``forward``: FSDP would lose that write, and the run stops at it.

MMDetection's soft teacher (``MeanTeacherHook``, which copies the student into
the teacher, then averages it in) trains 4 iterations with the same set as
labelled and unlabelled.

Not run here: ``TrackVisualizationHook`` (the
trackers' video sets and models) and ``GroundingVisualizationHook`` (GLIP's
BERT, a download). MMPreTrain's
``SimSiamHook`` trains in ``test_mmpretrain_second_copies.py``'s SimSiam config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ecosystem.mae_finetune import write_images
from tests.ecosystem.mmdet_coco import CLASSES, flexgraph_run, write_coco
from tests.ecosystem.mmpretrain_configs import records, saved_weights, train

pytestmark = [pytest.mark.slow, pytest.mark.long]

pytest.importorskip("mmdet", reason="make test-ecosystem installs mmpretrain and mmdet")

STRATEGIES = ["single", "ddp", "fsdp"]
#: YOLOX's sizes at 128 px: Mosaic's and Resize's scale, RandomAffine's border,
#: the batch resize's range
_YOLOX_SIZES = {"img_scale": (128, 128), "scale": (128, 128), "border": (-64, -64),
                "random_size_range": (96, 160)}


def _shrunk(value, sizes):
    if isinstance(value, list):
        return [_shrunk(v, sizes) for v in value]
    if isinstance(value, dict):
        return {k: sizes[k] if k in sizes else _shrunk(v, sizes) for k, v in value.items()}
    return value


def _resized(value):
    """The semi-supervised pipelines at 128 px."""
    if isinstance(value, list):
        return [_resized(v) for v in value]
    if not isinstance(value, dict):
        return value
    value = {k: _resized(v) for k, v in value.items()}
    if value.get("type") in ("RandomResize", "Resize"):
        value["scale"] = [(128, 96), (128, 128)] if value["type"] == "RandomResize" else (128, 128)
    return value


def _written(cfg, path: Path) -> Path:
    """``cfg`` at ``path``, with no test pass, seed 0 and gloo."""
    for key in ("test_dataloader", "test_evaluator", "test_cfg"):
        cfg[key] = None
    cfg.randomness = dict(seed=0)
    cfg.env_cfg.dist_cfg.backend = "gloo"
    cfg.dump(path)
    return path


def _mmdet_config(root: Path, *path: str) -> tuple[Any, dict[str, Any]]:
    """An installed mmdet config, and the dataset keys that point it at the fake COCO set."""
    import mmdet
    from mmengine.config import Config

    cfg = Config.fromfile(Path(mmdet.__file__).parent.joinpath(".mim", "configs", *path))
    images = dict(data_root=str(root / "coco") + os.sep, ann_file="annotations/train.json",
                  data_prefix=dict(img="images/"), metainfo=dict(classes=CLASSES))
    return cfg, images


def _yolox_config(root: Path, strategy: str) -> Path:
    cfg, images = _mmdet_config(root, "yolox", "yolox_tiny_8xb8-300e_coco.py")
    cfg.train_dataloader.dataset.dataset.update(images)
    cfg.val_dataloader.dataset.update(images)
    for key in ("train_dataloader", "val_dataloader"):
        cfg[key].update(batch_size=2, num_workers=0, persistent_workers=False)
        cfg[key].dataset.pipeline = _shrunk(cfg[key].dataset.pipeline, _YOLOX_SIZES)
    cfg.model.data_preprocessor = _shrunk(cfg.model.data_preprocessor, _YOLOX_SIZES)
    cfg.model.bbox_head.num_classes = len(CLASSES)
    cfg.val_evaluator.ann_file = str(root / "coco" / "annotations" / "train.json")
    cfg.train_cfg.update(max_epochs=2, val_interval=2)
    cfg.param_scheduler = [s for s in cfg.param_scheduler if s.get("begin", 0) < 2]
    hooks = [h for h in cfg.custom_hooks if not (strategy == "fsdp" and h.type == "EMAHook")]
    for hook in hooks:
        if hook.type == "YOLOXModeSwitchHook":
            hook.num_last_epochs = 0  # (epoch + 1) >= max_epochs: the second epoch
    cfg.custom_hooks = hooks
    cfg.default_hooks.logger.interval = 1
    return _written(cfg, root / f"yolox-{strategy}.py")


def _run(root: Path, config: Path, strategy: str):
    """``flexgraph run`` of ``config`` into ``root/<its stem>``, on 1 process or 2."""
    work = root / config.stem
    done = flexgraph_run(config, work, ["randomness.seed=0"], "--strategy", strategy,
                         "--nproc-per-node", "1" if strategy == "single" else "2", cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    return work, done


@pytest.fixture(scope="module")
def root(module_folder) -> Path:
    root = module_folder
    write_coco(root / "coco")
    write_images(root / "data")
    return root


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_yolox_mode_switch_turns_mosaic_off_and_l1_on_in_the_last_epoch(root, strategy):
    work, done = _run(root, _yolox_config(root, strategy), strategy)
    logged = done.stdout + done.stderr
    assert "No mosaic and mixup aug now!" in logged and "Add additional L1 loss now!" in logged
    epochs = [(r["epoch"], "loss_l1" in r) for r in records(work)]
    assert {with_l1 for epoch, with_l1 in epochs if epoch == 1} == {False}, epochs
    assert {with_l1 for epoch, with_l1 in epochs if epoch == 2} == {True}, epochs


def _swav(cfg) -> None:
    """SwAV's queue from the second epoch, 16 features long; prototypes frozen 2 iterations."""
    cfg.train_dataloader.dataset.ann_file = ""
    cfg.train_dataloader.dataset.pipeline[1].transforms[1][0].scale = 16  # the 96 px crops
    cfg.custom_hooks = [dict(type="SwAVHook", priority="VERY_HIGH", batch_size=4,
                             epoch_queue_starts=1, crops_for_assign=[0, 1], feat_dim=128,
                             queue_length=16, frozen_layers_cfg=dict(prototypes=2))]


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_swav_fills_and_uses_its_queue_from_the_epoch_set(root, strategy):
    done = train(root, "swav", strategy, root / "data", _swav)
    assert done.returncode == 0, done.stderr[-4000:]
    work = root / f"swav-{strategy}"
    assert len(records(work)) == (20 if strategy == "single" else 10)
    for name, rows in [("queue.pth", 16)] if strategy == "single" else [
            ("queue0.pth", 8), ("queue1.pth", 8)]:
        queue = torch.load(work / name)["queue"]
        assert queue.shape == (2, rows, 128)
        assert bool(queue.abs().sum(-1).gt(0).all()), "every row of the queue filled"


def test_swav_under_fsdp_is_stopped_at_its_first_write_to_the_prototypes(root):
    """SwAV's loss normalises its prototypes in place in ``forward``, which FSDP would lose."""
    done = train(root, "swav", "fsdp", root / "data", _swav)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert "'head.loss_module.prototypes.weight'" in errors[0], errors[0]
    assert "use DDPStrategy" in errors[0] and "Traceback" not in done.stderr
    assert not list((root / "swav-fsdp").glob("epoch_*")), "stopped in the first epoch"


def _write_inshop(root: Path) -> Path:
    """In-Shop's partition file over ``write_images``' set: train, then query/gallery halves."""
    data = root / "data"
    lines = [f"{path.relative_to(data)} {path.parent.name} "
             f"{'train' if split == 'train' else ('query', 'gallery')[int(path.stem) % 2]}"
             for split in ("train", "val") for path in sorted((data / split).glob("*/*.png"))]
    (data / "Eval").mkdir(exist_ok=True)
    (data / "Eval" / "list_eval_partition.txt").write_text(
        "\n".join([str(len(lines)), "image_name item_id evaluation_status", *lines]) + "\n")
    return data


def _retriever_config(root: Path, strategy: str) -> Path:
    import mmpretrain
    from mmengine.config import Config

    cfg = Config.fromfile(Path(mmpretrain.__file__).parent / ".mim" / "configs" / "arcface"
                          / "resnet50-arcface_8xb32_inshop.py")
    data = _write_inshop(root)
    crop = [dict(type="LoadImageFromFile"), dict(type="Resize", scale=36)]
    pipelines = {"train": [*crop, dict(type="RandomCrop", crop_size=32), dict(type="PackInputs")],
                 "test": [*crop, dict(type="CenterCrop", crop_size=32), dict(type="PackInputs")]}
    for loader, split in ((cfg.train_dataloader, "train"), (cfg.val_dataloader, "query"),
                          (cfg.model.prototype, "gallery")):
        loader.update(batch_size=4, num_workers=0)
        loader.dataset.update(data_root=str(data), data_prefix="", split=split,
                              pipeline=pipelines["train" if split == "train" else "test"])
    cfg.model.image_encoder[0].update(depth=18, init_cfg=None)  # no download
    cfg.model.head.update(num_classes=5, in_channels=512)
    cfg.data_preprocessor.num_classes = 5
    cfg.train_cfg.max_epochs = 2  # validated after each
    cfg.param_scheduler = cfg.param_scheduler[:1]
    cfg.custom_imports = dict(imports=["retriever_parts"], allow_failed_imports=False)
    cfg.custom_hooks.append(dict(type="PrototypeProbe"))
    return _written(cfg, root / f"retriever-{strategy}.py")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_retriever_s_prototype_is_prepared_before_validation(root, strategy):
    work, _ = _run(root, _retriever_config(root, strategy), strategy)
    validated = records(work, "val")
    assert len(validated) == 2 and all("retrieval/Recall@1" in v for v in validated), validated
    # the retriever prepares it itself only once, at its first prediction: the hook again
    first, second = json.loads((work / "prototype.json").read_text())
    assert first != second, "the gallery's features of the weights trained another epoch"


def _soft_teacher_config(root: Path, strategy: str) -> Path:
    cfg, images = _mmdet_config(
        root, "soft_teacher", "soft-teacher_faster-rcnn_r50-caffe_fpn_180k_semi-0.1-coco.py")
    for dataset in [*cfg.train_dataloader.dataset.datasets, cfg.val_dataloader.dataset]:
        dataset.update(images, pipeline=_resized(dataset.pipeline))  # labelled and not: one set
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.sampler.update(batch_size=2, source_ratio=[1, 1])
    cfg.model.detector.backbone.init_cfg = None  # no download
    cfg.model.detector.roi_head.bbox_head.num_classes = len(CLASSES)
    cfg.val_evaluator.ann_file = str(root / "coco" / "annotations" / "train.json")
    cfg.train_cfg.update(max_iters=4, val_interval=4)
    cfg.default_hooks.checkpoint.interval = 4
    return _written(cfg, root / f"soft-teacher-{strategy}.py")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mean_teacher_copies_the_student_then_follows_it(root, strategy):
    work, _ = _run(root, _soft_teacher_config(root, strategy), strategy)
    weights = saved_weights(work, 4, "iter")
    # teacher and student are built apart, each with its own random initial weights
    frozen, trained = "backbone.conv1.weight", "roi_head.bbox_head.fc_cls.weight"
    assert torch.allclose(weights[f"teacher.{frozen}"], weights[f"student.{frozen}"],
                          rtol=1e-5, atol=1e-7), "the hook copied the student at the start"
    assert not torch.allclose(weights[f"teacher.{trained}"], weights[f"student.{trained}"]), \
        "an average that lags the student, not a copy"
