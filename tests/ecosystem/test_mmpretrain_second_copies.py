"""MMPreTrain's ConvNeXt-T (EMAHook), MoCo v3, SimSiam, DeiT-T and ResNet-18 under every strategy.

The installed configs, shrunk (:mod:`mmpretrain_configs`), on two processes over
gloo in fp32. Each run is held to DDP's: the same training losses, and the
same weights in the epoch-2 checkpoint (ConvNeXt's are its EMAHook's average,
which the hook swaps in to save; FSDP keeps that average as shards like the
model's, ZeRO-3 as partitions). What cannot work is refused before training with
one line: MoCo v3's momentum encoder under FSDP and ZeRO-3, and its optimizer,
LARS, under ZeRO-1/2 (ZeRO would take its trust ratios over flat partitions);
with SGD in LARS's place, MoCo v3 under ZeRO-1/2 trains as under DDP. The default
tier runs ConvNeXt and MoCo v3 under DDP and the sharding strategies; the rest is
the longer tier (``-m long``).
"""

from __future__ import annotations

import pytest
import torch

from tests.ecosystem.mae_finetune import write_images
from tests.ecosystem.mmpretrain_configs import records, saved_weights, train

pytestmark = pytest.mark.slow

pytest.importorskip("mmpretrain", reason="make test-ecosystem installs mmpretrain")

LONG = pytest.mark.long
REFUSED = {
    ("mocov3", "zero3"): "'momentum_encoder.module.0.conv1.weight' and 63 more are empty",
    ("mocov3", "fsdp"): "FSDP: momentum_encoder (CosineEMA) keeps parameters of its own",
    ("mocov3", "hsdp"): "FSDP: momentum_encoder (CosineEMA) keeps parameters of its own",
    ("mocov3", "zero1"): "ZeRO-1 hands LARS one flat partition per parameter group",
    ("mocov3", "zero2"): "ZeRO-2 hands LARS one flat partition per parameter group",
}
TOLERANCE = {"zero1": 2e-6, "zero2": 2e-6, "zero3": 2e-6}  # DeepSpeed sums gradients its way


@pytest.fixture(scope="module")
def root(module_folder):
    root = module_folder
    write_images(root / "data")
    return root


def _trained(root, model, strategy):
    work = root / f"{model}-{strategy}"
    if not (work / "metrics.jsonl").exists():
        done = train(root, model, strategy, root / "data")
        assert done.returncode == 0, f"{model} under {strategy}:\n{done.stderr[-4000:]}"
    return work


def _like_ddp(root, model, strategy):
    ddp, work = _trained(root, model, "ddp"), _trained(root, model, strategy)
    tolerance = TOLERANCE.get(strategy, 0.0)
    ours, theirs = records(work), records(ddp)
    assert [r["iter"] for r in ours] == [r["iter"] for r in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a["loss"] - b["loss"]) <= tolerance * max(1.0, abs(b["loss"])), (a, b)
    expected, saved = saved_weights(ddp, 2), saved_weights(work, 2)
    assert set(saved) == set(expected)
    for key, value in expected.items():
        worst = (saved[key].double() - value.double()).abs().max().item() if value.numel() else 0
        assert worst <= tolerance, f"{model} under {strategy}: {key} off DDP's by {worst}"
    assert records(work, "val") == records(ddp, "val") or tolerance, "validated as DDP's"


def _refused(root, model, strategy):
    done = train(root, model, strategy, root / "data")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert REFUSED[model, strategy] in errors[0], errors[0]
    assert "Traceback" not in done.stderr
    assert not list((root / f"{model}-{strategy}").glob("epoch_*")), "refused before training"


def _case(model, strategy, long=False):
    marks = [LONG] if long else []
    return pytest.param(model, strategy, marks=marks, id=f"{model}-{strategy}")


@pytest.mark.parametrize("model,strategy", [
    _case("convnext", "fsdp"), _case("convnext", "zero2"), _case("convnext", "zero3"),
    _case("convnext", "single", True), _case("convnext", "hsdp", True),
    _case("convnext", "zero1", True),
    _case("mocov3", "single", True),
    *(_case(model, strategy, True) for model in ("simsiam", "deit", "resnet")
      for strategy in ("single", "fsdp", "hsdp", "zero1", "zero2", "zero3")),
])
def test_the_config_trains_as_under_ddp(root, model, strategy):
    if strategy == "single":  # one process: its own reference, the config must train
        work = _trained(root, model, strategy)
        assert len(records(work)) == 2 * 40 // 4, "2 epochs of 40 images, batch 4"
        return
    _like_ddp(root, model, strategy)


@pytest.mark.parametrize("strategy", ["zero2", pytest.param("zero1", marks=LONG)])
def test_moco_v3_with_an_element_wise_optimizer_trains_as_under_ddp_under_zero(root, strategy):
    """Its in-place update reaches the weights (under ZeRO-1/2 they are whole), and with SGD
    every loss and weight is DDP's."""
    _like_ddp(root, "mocov3-sgd", strategy)
    work = _trained(root, "mocov3-sgd", strategy)
    before, after = saved_weights(work, 1), saved_weights(work, 2)
    key = "momentum_encoder.module.0.conv1.weight"
    assert not torch.equal(before[key], after[key]), "the momentum encoder moved"


@pytest.mark.parametrize("model,strategy", [
    _case("mocov3", "fsdp"), _case("mocov3", "zero3"), _case("mocov3", "zero2"),
    _case("mocov3", "hsdp", True), _case("mocov3", "zero1", True),
])
def test_what_cannot_work_is_refused_before_training(root, model, strategy):
    _refused(root, model, strategy)


def test_the_ema_checkpoint_holds_the_average_and_the_weights_trained(root):
    """EMAHook swaps the average into ``state_dict`` to save, the trained weights aside."""
    work = _trained(root, "convnext", "fsdp")
    extra = torch.load(work / "epoch_2.ckpt" / "extra.pth", weights_only=False)
    averaged, trained = saved_weights(work, 2), extra["ema_state_dict"]
    key = "backbone.stages.0.0.depthwise_conv.weight"
    assert not torch.equal(averaged[key], trained[f"module.{key}"]), "two different copies"
    ddp = torch.load(_trained(root, "convnext", "ddp") / "epoch_2.pth", weights_only=False)
    assert torch.equal(trained[f"module.{key}"], ddp["ema_state_dict"][f"module.{key}"])
