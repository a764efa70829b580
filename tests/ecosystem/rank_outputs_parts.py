"""The probe of ``test_openmmlab_hooks.py``: what each rank validates, for both runners.

Imported through ``custom_imports`` by ``flexgraph run`` and by MMEngine's ``Runner``
(this folder on PYTHONPATH).
"""

from __future__ import annotations

import json
import os

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class RankOutputs(Hook):
    """Writes ``probe/val-rank<R>.json``: this rank's prediction scores of each validation."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.scores: list[list[float]] = []
        self.validations: list[list[list[float]]] = []

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.scores += [sample.pred_score.tolist() for sample in outputs]

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.validations.append(self.scores)
        self.scores = []
        folder = os.path.join(runner.work_dir, "probe")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"val-rank{runner.rank}.json"), "w") as f:
            json.dump(self.validations, f)
