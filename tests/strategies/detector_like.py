"""A small model with the habits of MMDetection's detectors, and runs of it under a strategy.

``DetectorLike`` (on the quickstart's digits) holds what stopped ATSS and
Faster R-CNN under FSDP and DeepSpeed, each in a few lines:

* ``Scale``: a module whose parameter is 0-d (mmdet's ``Scale``, in ATSS's head);
* ``torch.Tensor(list of floats)`` and ``torch.Tensor(numpy array)`` in a
  constructor (mmdet's anchor generators), and a ``torch.empty`` sized by numpy
  integers;
* a frozen stem (``frozen_stages``: ``requires_grad=False``) whose BatchNorm
  stays in eval mode (``norm_eval=True``) while the model trains;
* the configs' optimizer, torch's SGD with momentum.

:func:`run_detector_like` trains it for an epoch on two processes under one
strategy (from the same initial weights each time), then resumes that run for a
second epoch; :func:`check_like_ddp` holds it to a two-epoch DDP run
(:func:`run_ddp_reference`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from tests.cli.cli_helpers import QUICKSTART, launch_two, train_losses

MODEL = '''
"""A digits classifier with the habits of MMDetection's detectors (see detector_like.py)."""
import numpy as np
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import nn


class Scale(nn.Module):
    """mmdet's Scale: a learnable 0-d factor."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(scale, dtype=torch.float))

    def forward(self, x):
        return x * self.scale


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)
        self.bn = nn.BatchNorm1d(32)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


@MODELS.register_module(force=True)
class DetectorLike(BaseModel):
    def __init__(self, data_preprocessor=None, spare=False):
        super().__init__(data_preprocessor=data_preprocessor)
        if spare:  # a stage the forward never uses (out_indices leaving one out)
            self.spare = nn.Linear(32, 32)
            self.spare_scale = Scale(2.0)
        # anchor generators: legacy data constructors, from a list and from numpy
        self.ratios = torch.Tensor([0.5, 1.0, 2.0])
        self.scales = torch.Tensor(np.array([8.0]) * 2 ** np.arange(2))
        self.stem = Stem()
        self.neck = nn.Linear(32, 32)
        width = np.int64(10)  # a size computed with numpy
        self.head_weight = nn.Parameter(torch.empty(width, 32))
        self.head_bias = nn.Parameter(torch.zeros(width))
        nn.init.normal_(self.head_weight, std=0.1)
        self.scales_per_level = nn.ModuleList([Scale(1.0), Scale(0.5)])
        self.stem.requires_grad_(False)  # frozen_stages=1

    def train(self, mode=True):
        """norm_eval=True: the frozen stem's BatchNorm keeps its statistics."""
        super().train(mode)
        self.stem.bn.eval()
        return self

    def forward(self, inputs, labels=None, mode="tensor"):
        x = torch.stack(list(inputs)) if isinstance(inputs, (list, tuple)) else inputs
        features = torch.relu(self.neck(self.stem(x)))
        logits = sum(scale(F.linear(features, self.head_weight, self.head_bias))
                     for scale in self.scales_per_level)
        logits = logits * (self.ratios.sum() / 3.5) * (self.scales.sum() / 24.0)
        if mode == "loss":
            y = torch.stack(list(labels)) if isinstance(labels, (list, tuple)) else labels
            return {"loss": F.cross_entropy(logits, y)}
        if mode == "predict":
            y = torch.stack(list(labels)) if isinstance(labels, (list, tuple)) else labels
            return [{"pred": p, "label": int(t)}
                    for p, t in zip(logits.argmax(1).tolist(), y.tolist(), strict=True)]
        return logits
'''

SCALARS = ("scales_per_level.0.scale", "scales_per_level.1.scale")
FROZEN = ("stem.fc.weight", "stem.fc.bias", "stem.bn.weight", "stem.bn.bias",
          "stem.bn.running_mean", "stem.bn.running_var")

STRATEGIES = {
    "ddp": "dict(type='DDPStrategy')",
    "fsdp": "dict(type='FSDPStrategy')",
    "zero1": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=1))",
    "zero2": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=2))",
    "zero3": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))",
}


def initial_weights(root: Path) -> Path:
    """One fixed start for every strategy's run (built without any strategy)."""
    import sys

    path = root / "init.pth"
    if not path.exists():
        (root / "detector_like.py").write_text(MODEL)
        sys.path.insert(0, str(root))
        from detector_like import DetectorLike  # noqa: PLC0415

        torch.manual_seed(0)
        model = DetectorLike()
        with torch.no_grad():  # statistics that norm_eval must keep
            model.stem.bn.running_mean.uniform_(-0.1, 0.1)
            model.stem.bn.running_var.uniform_(0.5, 1.5)
        torch.save(model.state_dict(), path)
    return path


def write_detector_config(root: Path, name: str, strategy: str, epochs: int) -> Path:
    """The quickstart's data and schedule with ``DetectorLike`` and mmdet's SGD."""
    start = initial_weights(root)
    config = root / f"{name}-{epochs}.py"
    config.write_text(textwrap.dedent(f"""
        _base_ = [{str(QUICKSTART)!r}]
        custom_imports = dict(imports=['digits', 'detector_like'], allow_failed_imports=False)
        model = dict(_delete_=True, type='DetectorLike')
        optim_wrapper = dict(_delete_=True, type='OptimWrapper',
                             optimizer=dict(type='SGD', lr=0.05, momentum=0.9,
                                            weight_decay=1e-4))
        param_scheduler = []
        train_cfg = dict(by_epoch=True, max_epochs={epochs}, val_interval={epochs})
        default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1),
                             logger=dict(type='LoggerHook', interval=5))
        visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])
        load_from = {str(start)!r}
        strategy = {strategy}
        """))
    return config


def run_detector_like(root: Path, name: str) -> tuple[Path, str]:
    """One epoch under strategy ``name``, then resumed for a second; (work dir, logs)."""
    first = launch_two(write_detector_config(root, name, STRATEGIES[name], 1), name, root)
    second = launch_two(write_detector_config(root, name, STRATEGIES[name], 2), name, root,
                        "--resume", "auto")
    return root / name, first.stdout + first.stderr + second.stdout + second.stderr


def run_ddp_reference(root: Path) -> Path:
    """Two epochs under DDP in one run: what every strategy must train like."""
    launch_two(write_detector_config(root, "ddp", STRATEGIES["ddp"], 2), "ddp", root)
    return root / "ddp"


def saved_state(work: Path, epoch: int) -> tuple[dict, dict]:
    """(model weights, optimizer state by parameter name) of ``work``'s checkpoint.

    Portable checkpoints only (a folder of DCP shards): ``{name: {key: tensor}}``.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = work / f"epoch_{epoch}.pt"
    dcp_to_torch_save(work / f"epoch_{epoch}.ckpt", flat)
    state = torch.load(flat, weights_only=False)
    return state["model"], state["optimizer"]


def reference_weights(work: Path, epoch: int) -> dict:
    """DDP's model weights after ``epoch`` (one torch file)."""
    return torch.load(work / f"epoch_{epoch}.pth", weights_only=True)["state_dict"]


def check_like_ddp(root: Path, reference: Path, work: Path) -> None:
    """The run at ``work`` trained as DDP's did, and saved what MMDetection's tools load.

    Per-iteration losses within 1e-5 of DDP's over both epochs (the second
    resumed from the first's checkpoint); 0-d parameters saved 0-d, with their
    optimizer state, at DDP's values; the frozen stem and its BatchNorm
    statistics (``norm_eval``) saved as they started.
    """
    ddp, ours = train_losses(reference), train_losses(work)
    assert sorted(ours) == sorted(ddp) == list(range(1, 47))
    worst = max(abs(ours[i] - ddp[i]) for i in ddp)
    assert worst <= 1e-5, f"losses differ from DDP's by up to {worst}"
    start = torch.load(root / "init.pth", weights_only=True)
    for epoch in (1, 2):
        model, optimizer = saved_state(work, epoch)
        expected = reference_weights(reference, epoch)
        for name in SCALARS:
            assert model[name].shape == torch.Size([]), (epoch, name, model[name].shape)
            assert optimizer[name]["momentum_buffer"].shape == torch.Size([]), (epoch, name)
            assert torch.allclose(model[name], expected[name], atol=1e-5), (epoch, name)
        for name in FROZEN:
            assert torch.equal(model[name], start[name]), f"{name} changed (frozen, norm_eval)"
            assert name not in optimizer, f"{name} is frozen: no optimizer state"
        assert not torch.equal(model["neck.weight"], start["neck.weight"]), "the rest trains"


__all__ = ["FROZEN", "SCALARS", "STRATEGIES", "check_like_ddp", "run_ddp_reference",
           "run_detector_like", "saved_state", "write_detector_config"]
