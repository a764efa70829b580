"""The tiny training workload the benchmarks share, and its hand-written script.

An MLP on fixed random data, small enough (about a millisecond per step on one
CPU thread) that what a runtime adds around the step shows. This module imports
torch and nothing else, so that the hand-written side of a comparison pays for
torch alone: the mmengine side (registering these classes, hooks) lives in the
benchmarks that need it.

Run as a script, it *is* the hand-written training script that
``startup.py`` times: it builds the model, the data and the optimizer, trains
one iteration, prints ``first-iteration <time.time()>`` and exits at once::

    python benchmarks/_tiny.py
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BATCH, FEATURES, CLASSES = 32, 32, 10
STAMP = "first-iteration"  # a startup child prints it, its time.time() and process_time()


class TinyData(torch.utils.data.Dataset):
    """``n`` fixed random (features, label) pairs, the same in every process."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.metainfo: dict[str, Any] = {}  # MMEngine's loops warn when it is missing

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, CLASSES))


class TinyMLP(nn.Module):
    """The plain model: ``forward(x, y)`` returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)


def config(work_dir: str, iters: int, *, model: str = "TinyMLP",
           custom_hooks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The MMEngine-style config of the workload: one epoch of ``iters`` iterations.

    ``TinyMLP`` and ``TinyData`` must be registered (``MODELS`` / ``DATASETS``) by
    whoever uses it. Checkpointing is off and the log level is WARNING: log lines
    are still composed every 50 iterations, just not printed.
    """
    return dict(
        model=dict(type=model),
        train_dataloader=dict(batch_size=BATCH, num_workers=0,
                              dataset=dict(type="TinyData", n=iters * BATCH),
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
        # One epoch: MMEngine's iteration loop sleeps 2 s at every pass over the
        # data ("prevent possible deadlock"), which would swamp any comparison.
        train_cfg=dict(by_epoch=True, max_epochs=1, val_interval=10**9),
        default_hooks=dict(checkpoint=None, logger=dict(type="LoggerHook", interval=50)),
        custom_hooks=list(custom_hooks or []),
        randomness=dict(seed=0),
        work_dir=work_dir,
        log_level="WARNING",
    )


def stamp() -> None:
    """Print the wall-clock and CPU times and end the process now (no teardown is timed)."""
    print(STAMP, repr(time.time()), repr(time.process_time()), flush=True)
    os._exit(0)


def main(iters: int = 1000) -> None:
    """The hand-written script: what ``flexgraph run`` of :func:`config` does, by hand."""
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(TinyData(iters * BATCH), batch_size=BATCH,
                                         shuffle=True)
    for x, y in loader:
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        loss.item()  # the value a real script logs (and the wait for it)
        stamp()


if __name__ == "__main__":
    main()
