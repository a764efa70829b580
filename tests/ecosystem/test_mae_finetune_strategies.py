"""MMPreTrain's MAE fine-tuning configs, unchanged, under DDP, FSDP and DeepSpeed ZeRO-1/3.

Each shipped config is the ``_base_`` of a two-line wrapper that only adds an
observing hook (``minipre.hooks.Snapshot``: the weights before training and after
the first epoch, the learning rate and weight decay of every param group); the
rest is made small by ``--cfg-options`` (see :mod:`mae_finetune`). Two processes
over gloo, the precision each config ships with (bf16 where it says fp16), and
fp32 for the comparisons of weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.ecosystem.mae_finetune import (
    ROOT,
    STRATEGIES,
    config_path,
    flexgraph_run,
    overrides,
    write_images,
    write_pretrained,
)

pytestmark = pytest.mark.slow

pytest.importorskip("mmpretrain", reason="make test-ecosystem installs mmpretrain")


def _wrapper(folder: Path, model: str, strategy: str) -> Path:
    config = folder / f"{model}-{strategy}.py"
    config.write_text(f"_base_ = [{str(config_path(model, strategy))!r}]\n"
                      "custom_hooks = [dict(type='minipre.hooks.Snapshot')]\n")
    return config


@pytest.fixture(scope="module")
def root(module_folder):
    root = module_folder
    shutil.copytree(ROOT / "tests" / "cli" / "standins" / "minipre", root / "minipre")
    write_images(root / "data")
    write_pretrained(root / "pretrained-p16.pth", patch_size=16)
    write_pretrained(root / "pretrained-p14.pth", patch_size=14)
    return root


def _train(root: Path, model: str, strategy: str, *extra: str, fp32: bool, work: str,
           epochs: int = 2) -> Path:
    pretrained = root / f"pretrained-p{16 if model == 'large' else 14}.pth"
    options = overrides(root / "data", pretrained, strategy, fp32=fp32, epochs=epochs)
    done = flexgraph_run(_wrapper(root, model, strategy), root / work, options, *extra,
                         cwd=root)
    assert done.returncode == 0, f"{work}:\n{done.stderr[-4000:]}"
    return root / work


def _records(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def fp32(root):
    """vit-large under each strategy in fp32, one epoch."""
    return {name: _train(root, "large", name, fp32=True, work=f"fp32-{name}", epochs=1)
            for name in STRATEGIES}


@pytest.mark.parametrize("model", ["large", "huge"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_shipped_config_trains_validates_and_resumes(root, model, strategy):
    work = _train(root, model, strategy, fp32=False, work=f"{model}-{strategy}")
    records = _records(work)
    evals = [r for r in records if r.get("mode") == "val"]
    assert [r["epoch"] for r in evals] == [1, 2], "mmpretrain's Accuracy after each epoch"
    assert {"accuracy/top1", "accuracy/top5"} <= set(evals[0])
    if model == "huge":
        return
    # Resume from the first epoch's checkpoint: the second epoch's losses are the same.
    resumed = root / f"{model}-{strategy}-resumed"
    resumed.mkdir()
    first = next(p for p in work.iterdir() if p.name.startswith("epoch_1"))
    (shutil.copytree if first.is_dir() else shutil.copy)(first, resumed / first.name)
    (resumed / "last_checkpoint").write_text(str(resumed / first.name))
    _train(root, model, strategy, "--resume", "auto", fp32=False, work=resumed.name)
    losses = {r["iter"]: r["loss"] for r in records if "mode" not in r}
    again = {r["iter"]: r["loss"] for r in _records(resumed) if "mode" not in r}
    assert again and min(again) == max(losses) // 2 + 1, "the resumed run starts at epoch 2"
    assert again == {i: v for i, v in losses.items() if i in again}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_pretrained_backbone_is_loaded(root, fp32, strategy):
    pretrained = torch.load(root / "pretrained-p16.pth", weights_only=True)["state_dict"]
    initial = torch.load(fp32[strategy] / "initial.pt", weights_only=True)
    assert pretrained.keys() <= initial.keys()
    for key, value in pretrained.items():
        assert torch.equal(initial[key], value.float()), f"{strategy}: {key}"


def test_initial_weights_are_bit_identical_across_strategies(fp32):
    ddp = torch.load(fp32["ddp"] / "initial.pt", weights_only=True)
    for name in ("fsdp", "zero1", "zero3"):
        other = torch.load(fp32[name] / "initial.pt", weights_only=True)
        for key, value in ddp.items():
            assert torch.equal(other[key], value), f"{name}: {key}"


def test_layer_decay_is_the_same_under_every_strategy(fp32):
    ddp = torch.load(fp32["ddp"] / "lrs.pt", weights_only=True)
    lrs = {lr for lr, _ in ddp[-1].values()}
    assert len(lrs) == 4, "the two layers, the embeddings and the head: one lr each"
    for name in ("fsdp", "zero1", "zero3"):
        assert torch.load(fp32[name] / "lrs.pt", weights_only=True) == ddp, name


@pytest.mark.parametrize("strategy", ["fsdp", "zero1", "zero3"])
def test_fp32_weights_after_an_epoch_are_ddp_s(fp32, strategy):
    """Bit for bit: the setup gives every strategy DDP's weights, and a ViT's gradients
    add up alike under each (a tensor read by two consumers sums one way; ZeRO-3's
    module-edge functions regroup only sums of three or more, see the MMDetection
    guide)."""
    ddp = torch.load(fp32["ddp"] / "epoch1.pt", weights_only=True)
    other = torch.load(fp32[strategy] / "epoch1.pt", weights_only=True)
    differing = {k: float((other[k] - ddp[k]).abs().max()) for k in ddp
                 if not torch.equal(other[k], ddp[k])}
    assert not differing, f"{strategy}: {len(differing)} of {len(ddp)} tensors: {differing}"
