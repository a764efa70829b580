"""The memory benchmark's workload as MMEngine components, for ``flexgraph run``.

``memory.py`` writes one MMEngine-style config per row whose
``custom_imports`` loads this module in every rank. It registers:

* ``MemoryBenchModel`` (``MODELS``): the residual MLP of ``_memory_workload``
  behind MMEngine's ``BaseModel`` contract (data preprocessor,
  ``forward(mode='loss')`` returning a dict of losses, ``init_weights``);
* ``SyntheticRows`` (``DATASETS``): the seeded random rows;
* ``MemoryBenchRecorder`` (``HOOKS``): each rank's :class:`RankRecorder`, fed
  from ``after_train_iter`` and written at ``after_train``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _memory_workload import CLASSES, RankRecorder, ResidualMLP, SyntheticRows, bench_device
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS

DATASETS.register_module(module=SyntheticRows, force=True)


def _stack(x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """MMEngine's ``pseudo_collate`` hands lists of samples; stack them into a batch."""
    return torch.stack(list(x)) if isinstance(x, (list, tuple)) else x


@MODELS.register_module(force=True)
class MemoryBenchModel(BaseModel):
    """The residual MLP as an MMEngine model; ``mode='loss'`` gives the cross-entropy."""

    def __init__(self, blocks: int, width: int, classes: int = CLASSES,
                 data_preprocessor: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.net = ResidualMLP(blocks, width, classes)

    def init_weights(self) -> None:
        """Every layer's own initialisation, so weights materialised from the meta
        device (FSDP) hold the same kind of values as eagerly built ones."""
        self.net.reset_parameters()

    def forward(self, inputs: Any, labels: Any = None, mode: str = "tensor") -> Any:
        logits = self.net(_stack(inputs))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, _stack(labels))}
        return logits


@HOOKS.register_module(force=True)
class MemoryBenchRecorder(Hook):
    """Feeds this rank's :class:`RankRecorder`; the lowest priority, so that the stamp
    of an iteration comes after every other hook's work on it."""

    priority = "LOWEST"

    def before_train(self, runner) -> None:
        local_rank = torch.cuda.current_device() if torch.cuda.is_available() else 0
        self.recorder = RankRecorder(runner.work_dir, runner.rank, runner.world_size,
                                     bench_device(local_rank))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.recorder.iteration_done()

    def after_train(self, runner) -> None:
        self.recorder.write()
