"""For ``test_openmmlab_model_hooks.py``'s retriever: NumPy's ``in1d`` and a probe.

MMPreTrain 1.2's retrieval metrics call ``numpy.in1d``, which NumPy 2.4 removed;
``numpy.isin`` is its successor. Imported through ``custom_imports`` (this folder
on PYTHONPATH).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

if not hasattr(numpy, "in1d"):
    numpy.in1d = numpy.isin


@HOOKS.register_module()
class PrototypeProbe(Hook):
    """Appends the sum of the retriever's gallery features after each validation (rank 0)."""

    def after_val_epoch(self, runner, metrics=None) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if runner.rank == 0:
            path = Path(runner.work_dir) / "prototype.json"
            sums = json.loads(path.read_text()) if path.exists() else []
            path.write_text(json.dumps([*sums, float(model.prototype_vecs.sum())]))
