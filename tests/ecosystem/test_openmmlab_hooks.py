"""OpenMMLab's own hooks train under every strategy, and every rank validates as under the Runner.

MMPreTrain's ResNet-18 config, as installed, made small by ``--cfg-options``
(32 px images of 5 classes, batch 4, one epoch), trains on 2 CPU processes with
the hooks that MMPreTrain's and MMDetection's configs name in ``custom_hooks``
and that apply to a classifier, under a single device, DDP and FSDP (there
without EMA, whose sharding is its own matter; MMDetection's SyncNormHook is
flexgraph's there, which leaves the norm weights' shards as they are). Under DDP
its validation outputs, rank by rank, are those of MMEngine's ``Runner``: each
rank keeps its own BatchNorm statistics, as the Runner's DDP does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ecosystem.mae_finetune import CLASSES, write_images
from tests.ecosystem.mmdet_coco import flexgraph_run, runner_run

pytestmark = pytest.mark.slow

pytest.importorskip("mmdet", reason="make test-ecosystem installs mmpretrain and mmdet")

#: the hooks these packages' configs name that a classifier can run (the detectors',
#: trackers' and self-supervised models' own need those models); the loop does the
#: default hooks' work itself
HOOKS = [
    "dict(type='SwitchRecipeHook', schedule=[dict(action_epoch=1, train_pipeline=["
    "dict(type='LoadImageFromFile'), dict(type='RandomResizedCrop', scale=32), "
    "dict(type='PackInputs')])])",
    # RTMDet's: its epoch counts from 0, where SwitchRecipeHook's counts from 1
    "dict(type='mmdet.PipelineSwitchHook', switch_epoch=0, switch_pipeline=["
    "dict(type='LoadImageFromFile'), dict(type='RandomResizedCrop', scale=32), "
    "dict(type='RandomFlip', prob=0.5), dict(type='PackInputs')])",
    "dict(type='WarmupParamHook', param_name='loss_weight', module_name='head.loss_module', "
    "warmup_epochs=1)",
    "dict(type='PreciseBNHook', num_samples=8)",
    "dict(type='VisualizationHook')",
    "dict(type='mmdet.CheckInvalidLossHook', interval=1)",
    "dict(type='mmdet.NumClassCheckHook')",
    "dict(type='mmdet.SyncNormHook')",
    "dict(type='mmdet.DetVisualizationHook')",
    "dict(type='SyncBuffersHook')",
    "dict(type='RankOutputs')",
]
#: MMPreTrain's EMAHook reads ``runner._resume`` and, evaluating the original
#: weights too, ``runner.val_loop``; under FSDP it is another matter (sharding)
EMA = "dict(type='EMAHook', momentum=0.01, evaluate_on_origin=True, priority='ABOVE_NORMAL')"


def _config(root: Path, hooks: list[str]) -> Path:
    import mmpretrain

    base = (Path(mmpretrain.__file__).parent / ".mim" / "configs" / "resnet"
            / "resnet18_8xb32_in1k.py")
    config = root / f"resnet18-{len(hooks)}.py"
    config.write_text(
        f"_base_ = [{str(base)!r}]\n"
        "custom_imports = dict(imports=['rank_outputs_parts'], allow_failed_imports=False)\n"
        f"custom_hooks = [{', '.join(hooks)}]\n")
    return config


def _options(data: Path) -> list[str]:
    classes = "[" + ",".join(CLASSES) + "]"
    options = ["model.head.num_classes=5", "data_preprocessor.num_classes=5",
               "train_cfg.max_epochs=1", "val_evaluator.topk=(1,)", "randomness.seed=0",
               "env_cfg.dist_cfg.backend=gloo",
               "test_dataloader=None", "test_evaluator=None", "test_cfg=None"]
    for loader in ("train_dataloader", "val_dataloader"):
        options += [f"{loader}.batch_size=4", f"{loader}.num_workers=0",
                    f"{loader}.dataset.data_root={data}",
                    f"{loader}.dataset.metainfo.classes={classes}",
                    f"{loader}.dataset.pipeline.1.scale=32"]
    return [*options, "val_dataloader.dataset.pipeline.2.crop_size=32"]


def _validations(work_dir: Path) -> list[list[list[list[float]]]]:
    return [json.loads((work_dir / "probe" / f"val-rank{rank}.json").read_text())
            for rank in (0, 1)]


@pytest.fixture(scope="module")
def root(module_folder) -> Path:
    root = module_folder
    write_images(root / "data")
    return root


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_the_hooks_openmmlab_configs_name_train_under_each_strategy(root, strategy):
    hooks = HOOKS if strategy == "fsdp" else [EMA, *HOOKS]
    nproc = "1" if strategy == "single" else "2"
    done = flexgraph_run(_config(root, hooks), root / strategy, _options(root / "data"),
                         "--strategy", strategy, "--nproc-per-node", nproc, cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Switch pipeline now!" in done.stdout + done.stderr, "PipelineSwitchHook switched"
    ranks = [0] if strategy == "single" else [0, 1]
    validations = [json.loads((root / strategy / "probe" / f"val-rank{r}.json").read_text())
                   for r in ranks]
    evaluated = 20 // len(ranks) * (2 if hooks[0] == EMA else 1)  # the EMA's, the origin's
    assert all(len(v[0]) == evaluated for v in validations), [len(v[0]) for v in validations]


def test_every_rank_validates_as_under_mmengine_s_runner(root):
    """DDP's BatchNorm statistics stay each rank's (``broadcast_buffers=False``)."""
    config, options = _config(root, HOOKS[-1:]), _options(root / "data")
    theirs = runner_run(config, root / "runner", options, cwd=root)
    assert theirs.returncode == 0, theirs.stderr[-4000:]
    ours = flexgraph_run(config, root / "flexgraph", options, "--strategy", "ddp", cwd=root)
    assert ours.returncode == 0, ours.stderr[-4000:]
    runner, flexgraph = _validations(root / "runner"), _validations(root / "flexgraph")
    assert runner[0] != runner[1], "each rank validates its own half"
    assert flexgraph == runner
