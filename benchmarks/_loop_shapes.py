"""The config shapes ``loop_overhead.py`` times: how long an epoch is, how big the model, which
optimizer, whether a scheduler steps every iteration.

One shape hides what another shows. The tiny shape (200 iterations an epoch,
SGD, no scheduler) spreads every per-epoch cost over 200 iterations and never
steps a scheduler; a config with 32-iteration epochs, AdamW and a ``LinearLR``
by iteration (``by_epoch=False``) pays each epoch's work (a new data
iterator, the epoch hooks, its log line) six times as often, and the
scheduler's step every iteration; a wide model allocates tensors of
megabytes, where the C allocator's settings start to matter. A runtime's cost
per iteration is only known on each of them.

Every shape trains the same kind of workload (``_tiny.py``'s: an MLP on fixed
random data, one CPU thread), in both of its forms: a plain ``nn.Module``
whose forward returns the loss, and an MMEngine ``BaseModel`` behind an
``OptimWrapper`` with MMEngine's default hooks. This module builds the pieces
both sides of a comparison share (the model, the optimizer, the scheduler),
so that flexgraph's config and the hand-written loop cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from _tiny import CLASSES, FEATURES
from torch import nn

__all__ = ["SHAPES", "Shape", "mlp", "optimizer_cfg", "scheduler_cfg", "shape_named"]


@dataclasses.dataclass(frozen=True)
class Shape:
    """One config shape, and the comparisons ``loop_overhead.py`` runs on it by default.

    Attributes
    ----------
    name:
        What the report calls it (``--shapes`` selects by it).
    iters:
        Iterations per epoch (the dataset holds ``iters * batch`` samples).
    batch:
        Samples per batch.
    width:
        The MLP's hidden width (two hidden layers of ``width``): the model's size.
    optimizer:
        ``'sgd'`` (momentum 0.9) or ``'adamw'``.
    scheduler:
        A ``LinearLR`` warm-up stepped every iteration (``by_epoch=False``) over
        the whole run, as MMEngine's ``ParamSchedulerHook`` steps it.
    epochs:
        The two epoch counts of a process's timed runs (their difference is the slope).
    comparisons:
        What ``loop_overhead.py`` runs on this shape unless ``--only`` says otherwise.
    """

    name: str
    iters: int
    batch: int
    width: int
    optimizer: str
    scheduler: bool
    epochs: tuple[int, int]
    comparisons: tuple[str, ...]

    def describe(self) -> str:
        optimizer = {"sgd": "SGD", "adamw": "AdamW"}[self.optimizer]
        scheduler = ", LinearLR by iteration" if self.scheduler else ""
        return (f"{self.iters} iterations per epoch, batch {self.batch}, MLP width "
                f"{self.width} ({parameter_count(self.width):,} parameters), "
                f"{optimizer}{scheduler}")


SHAPES = {
    # The original workload: long epochs, SGD, nothing stepped per iteration but the optimizer.
    "tiny": Shape("tiny", iters=200, batch=32, width=128, optimizer="sgd", scheduler=False,
                  epochs=(1, 7),
                  comparisons=("plain", "api", "terminal", "calibrate", "calibrate-api")),
    # The shape of a config people write for a small dataset: 512 samples in batches of
    # 16 (32 iterations an epoch), AdamW, a LinearLR warm-up by iteration, many epochs.
    "short-epochs": Shape("short-epochs", iters=32, batch=16, width=128, optimizer="adamw",
                          scheduler=True, epochs=(3, 23),
                          comparisons=("api", "calibrate-api")),
    # A wider model: 4 MiB weight matrices (1024 x 1024 floats), so that the step's
    # tensors and temporaries are megabytes, allocated and freed every iteration.
    "wide": Shape("wide", iters=20, batch=32, width=1024, optimizer="adamw", scheduler=True,
                  epochs=(1, 5), comparisons=("api", "calibrate-api")),
}


def shape_named(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise SystemExit(f"no shape {name!r}; the shapes are {', '.join(SHAPES)}") from None


def mlp(width: int) -> nn.Module:
    """``_tiny.mlp()`` with a hidden width of ``width`` (128 is ``_tiny``'s own)."""
    return nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, CLASSES))


def parameter_count(width: int) -> int:
    return FEATURES * width + width + width * width + width + width * CLASSES + CLASSES


def optimizer_cfg(shape: Shape) -> dict[str, Any]:
    """The ``optim_wrapper.optimizer`` of the config; the hand loops build the same."""
    if shape.optimizer == "sgd":
        return dict(type="SGD", lr=0.01, momentum=0.9)
    return dict(type="AdamW", lr=1e-3, weight_decay=0.01)


def build_optimizer(shape: Shape, params: Any) -> torch.optim.Optimizer:
    """What the hand loops train with: ``optimizer_cfg(shape)``, built by hand."""
    args = optimizer_cfg(shape)
    kind = {"SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}[args.pop("type")]
    return kind(params, **args)


def scheduler_cfg(shape: Shape, epochs: int) -> list[dict[str, Any]]:
    """``param_scheduler`` of a run of ``epochs`` epochs: a warm-up over all its iterations."""
    if not shape.scheduler:
        return []
    return [dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0,
                 end=shape.iters * epochs)]


def build_schedulers(shape: Shape, optimizer: Any, epochs: int) -> list[Any]:
    """MMEngine's schedulers of ``scheduler_cfg`` on ``optimizer`` (a torch optimizer or an
    ``OptimWrapper``), for a hand loop to step every iteration as the hook does."""
    from mmengine.optim.scheduler import LinearLR

    schedulers = []
    for args in scheduler_cfg(shape, epochs):
        args = dict(args)
        assert args.pop("type") == "LinearLR"
        schedulers.append(LinearLR(optimizer, **args))
    return schedulers
