"""MMEngine's EMAHook under every strategy: the average DDP's is, sharded like the model.

``DetectorLike`` (see :mod:`tests.strategies.detector_like`) with
``custom_hooks=[EMAHook]`` trains two epochs on two processes over gloo, in fp32.
The checkpoint holds the averaged weights (EMAHook swaps them in to save); each
strategy's must equal DDP's bit for bit, and so must the accuracy validated on
them. A probe hook records what each rank's averaged copy holds.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from tests.cli.cli_helpers import launch_two
from tests.strategies.detector_like import (
    STRATEGIES,
    reference_weights,
    saved_state,
    write_detector_config,
)

pytestmark = pytest.mark.slow

PROBE = '''
"""Records the bytes each rank's averaged copy holds, against a whole copy's."""
import json
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


@HOOKS.register_module(force=True)
class EmaProbe(Hook):
    priority = "LOWEST"

    def after_train(self, runner):
        ema = next(h for h in runner.hooks.hooks if hasattr(h, "ema_model")).ema_model.module
        tensors = [*ema.parameters(), *ema.buffers()]
        held = sum(_local(t).numel() * t.element_size() for t in tensors)
        whole = sum(t.numel() * t.element_size() for t in tensors)
        with open(f"{runner.work_dir}/ema-rank{runner.rank}.json", "w") as f:
            json.dump({"held": held, "whole": whole}, f)
'''

EMA = ("custom_imports = dict(imports=['digits', 'detector_like', 'ema_probe'], "
       "allow_failed_imports=False)\n"
       "custom_hooks = [dict(type='EMAHook', momentum=0.01), dict(type='EmaProbe')]\n")


HSDP = "dict(type='FSDPStrategy', model_wrapper=dict(sharding_strategy='HYBRID_SHARD'))"


def _config(root, name):
    config = write_detector_config(root, f"ema-{name}", {**STRATEGIES, "hsdp": HSDP}[name], 2)
    start = root / "ema-init.pth"  # as MMEngine saves: EMAHook reads its 'state_dict'
    torch.save({"state_dict": torch.load(root / "init.pth", weights_only=True)}, start)
    config.write_text(config.read_text() + EMA + f"load_from = {str(start)!r}\n")
    (root / "ema_probe.py").write_text(textwrap.dedent(PROBE))
    return config


def _train(root, name):
    launch_two(_config(root, name), f"ema-{name}", root)
    return root / f"ema-{name}"


def _accuracy(work):
    lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("mode") == "val"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ema")


@pytest.fixture(scope="module")
def ddp(root):
    return _train(root, "ddp")


@pytest.mark.parametrize("name", ["fsdp", "hsdp", "zero1", "zero2", "zero3"])
def test_the_average_equals_ddps_and_each_rank_holds_its_share(root, ddp, name):
    work = _train(root, name)
    expected = reference_weights(ddp, 2)
    averaged, _ = saved_state(work, 2)
    for key, value in expected.items():
        assert torch.equal(averaged[key], value), f"{name}: averaged {key} differs from DDP's"
    assert _accuracy(work) == _accuracy(ddp), "validated on the averaged weights, as DDP"
    whole = torch.load(work / "epoch_2.ckpt" / "extra.pth", weights_only=False)
    assert "ema_state_dict" in whole, "the model's own weights ride along, as in MMEngine"
    probes = [json.loads((work / f"ema-rank{r}.json").read_text()) for r in (0, 1)]
    if name in ("fsdp", "hsdp"):  # 1/W of a whole copy, plus the replicated 0-d scales and buffers
        small = sum(4 * torch.Size(v.shape).numel() for k, v in expected.items()
                    if v.dim() == 0 or "running" in k or "num_batches" in k)
        assert all(p["held"] <= p["whole"] / 2 + small + 64 for p in probes), probes
    if name == "zero3":  # partitions: 1/W of a whole copy, each padded by under one element
        size = {k: v.numel() * v.element_size() for k, v in expected.items()}
        buffers = {k for k in size if "running" in k or "num_batches" in k}
        held = sum(size[k] for k in buffers) + sum(size[k] for k in size if k not in buffers) / 2
        assert all(p["held"] <= held + 4 * (len(size) - len(buffers)) for p in probes), probes


@pytest.mark.parametrize("first,then", [("fsdp", "fsdp"), ("fsdp", "ddp"), ("ddp", "fsdp"),
                                        ("fsdp", "zero2"), ("ddp", "zero3"), ("zero3", "ddp"),
                                        ("zero3", "zero3")])
def test_the_average_resumes_under_another_strategy(root, ddp, first, then):
    work = f"resume-{first}-{then}"
    for name, epochs, extra in ((first, 1, ()), (then, 2, ("--resume", "auto"))):
        config = _config(root, name)
        text = config.read_text().replace("max_epochs=2, val_interval=2",
                                          f"max_epochs={epochs}, val_interval={epochs}")
        (root / f"{work}-{epochs}.py").write_text(text)
        launch_two(root / f"{work}-{epochs}.py", work, root, *extra)
    _assert_ddps(ddp, root / work, f"{first} then {then}")


def test_zero3_trains_on_after_validating_on_the_average(root, ddp):
    config = _config(root, "zero3")
    text = config.read_text().replace("max_epochs=2, val_interval=2", "max_epochs=2, "
                                      "val_interval=1")
    (root / "ema-zero3-val.py").write_text(text)
    launch_two(root / "ema-zero3-val.py", "ema-zero3-val", root)
    _assert_ddps(ddp, root / "ema-zero3-val", "zero3 validating each epoch")


def test_zero3_averages_buffers_and_starts_late_as_ddp(root):
    """``update_buffers`` (the copy's own ``state_dict`` is averaged) and ``begin_iter``."""
    works = {}
    for name in ("ddp", "zero3"):
        text = _config(root, name).read_text().replace(
            "dict(type='EMAHook', momentum=0.01)",
            "dict(type='EMAHook', momentum=0.01, update_buffers=True, begin_iter=5)")
        (root / f"late-{name}.py").write_text(text)
        launch_two(root / f"late-{name}.py", f"late-{name}", root)
        works[name] = root / f"late-{name}"
    _assert_ddps(works["ddp"], works["zero3"], "zero3 averaging buffers from iteration 5")


def _assert_ddps(ddp, work, label):
    """``work``'s epoch 2 holds DDP's average and DDP's trained weights, bit for bit."""
    expected = torch.load(ddp / "epoch_2.pth", weights_only=False)
    resumed = work / "epoch_2"
    if resumed.with_suffix(".pth").exists():
        saved = torch.load(resumed.with_suffix(".pth"), weights_only=False)
        averaged, trained = saved["state_dict"], saved["ema_state_dict"]
    else:
        averaged = saved_state(work, 2)[0]
        trained = torch.load(resumed.with_suffix(".ckpt") / "extra.pth",
                             weights_only=False)["ema_state_dict"]
    for key, value in expected["state_dict"].items():
        assert torch.equal(averaged[key], value), f"{label}: averaged {key}"
    for key, value in expected["ema_state_dict"].items():
        assert torch.equal(trained[key], value), f"{label}: trained {key}"
