"""Validation and test passes, shared by the training loop and the entry points.

With an evaluator the predictions go through MMEngine's ``Evaluator``; without
one, the pass reports the mean loss over batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mmengine.evaluator import Evaluator
from mmengine.registry import EVALUATOR, METRICS

from flexgraph.training.components import make_eval_step
from flexgraph.training.config import build_from_cfg
from flexgraph.training.errors import EmptyDatasetError
from flexgraph.training.loop._hooks import Hooks
from flexgraph.training.runtime import Env, world_size


def build_evaluator(cfg: Any, *, what: str = "val_evaluator") -> Evaluator | None:
    """An Evaluator from a metric dict, a list of them, or ``dict(metrics=[...])``."""
    if cfg is None or (isinstance(cfg, (Mapping, list, tuple)) and not cfg):
        return None
    if isinstance(cfg, Evaluator):
        return cfg
    if isinstance(cfg, Mapping) and "metrics" in cfg:
        args = dict(cfg)
        args.setdefault("type", "Evaluator")
        metrics = args["metrics"]
        metrics = metrics if isinstance(metrics, (list, tuple)) else [metrics]
        args["metrics"] = [build_from_cfg(m, METRICS, what=f"{what}.metrics[{i}]")
                           for i, m in enumerate(metrics)]
        return build_from_cfg(args, EVALUATOR, what=what)
    metrics = cfg if isinstance(cfg, (list, tuple)) else [cfg]
    return Evaluator([build_from_cfg(m, METRICS, what=f"{what}[{i}]")
                      for i, m in enumerate(metrics)])


def _mean_across_ranks(total: torch.Tensor, count: int) -> float:
    if world_size() > 1:
        packed = torch.stack([total.float(), torch.tensor(float(count), device=total.device)])
        torch.distributed.all_reduce(packed)
        total, count = packed[0], int(packed[1].item())
    return float(total.item()) / count


def run_evaluation(*, mode: str, model: torch.nn.Module, dataloader: Any,
                   evaluator: Evaluator | None, hooks: Hooks, env: Env) -> dict[str, Any]:
    """One pass over ``dataloader`` in eval mode; returns the metrics.

    Fires ``before_{mode}``, ``before_{mode}_epoch``, the per-iteration hooks,
    ``after_{mode}_epoch(metrics=...)`` and ``after_{mode}``, as MMEngine's loops
    do, and puts the model back in the mode it was in.
    """
    runner = hooks.runner
    before_iter = getattr(hooks, f"before_{mode}_iter")
    after_iter = getattr(hooks, f"after_{mode}_iter")
    if evaluator is not None and hasattr(dataloader.dataset, "metainfo"):
        evaluator.dataset_meta = dataloader.dataset.metainfo
    step = make_eval_step(model, env.device, mode=mode, with_evaluator=evaluator is not None)
    hooks.call(f"before_{mode}")
    hooks.call(f"before_{mode}_epoch")
    was_training = model.training
    model.eval()
    total: torch.Tensor | None = None
    count = 0
    try:
        with torch.no_grad():
            for idx, batch in enumerate(dataloader):
                for fn in before_iter:
                    fn(runner, batch_idx=idx, data_batch=batch)
                outputs = step(batch)
                if evaluator is not None:
                    evaluator.process(data_samples=outputs, data_batch=batch)
                else:
                    total = outputs.detach() if total is None else total + outputs.detach()
                count += 1
                for fn in after_iter:
                    fn(runner, batch_idx=idx, data_batch=batch, outputs=outputs)
    finally:
        model.train(was_training)
    if count == 0:
        raise EmptyDatasetError(
            f"{mode}_dataloader yielded no batch; check its dataset (and sampler)")
    if evaluator is not None:
        metrics = evaluator.evaluate(len(dataloader.dataset))
    else:
        metrics = {"loss": _mean_across_ranks(total, count)}
    hooks.call(f"after_{mode}_epoch", metrics=metrics)
    hooks.call(f"after_{mode}")
    return metrics
