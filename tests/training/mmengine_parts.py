"""Pieces that flexgraph and MMEngine's own ``Runner`` both run, for the MMEngine tests.

Imported through ``custom_imports=['tests.training.mmengine_parts']`` (the repository
on PYTHONPATH) by ``flexgraph run`` and by MMEngine alike, so both build the same registered
components. Run as a script, it is MMEngine's side of a test: a run of CFG
that stops after epoch N (in ROOT/half), and MMEngine's own resume of its
checkpoint, trained to the end (in ROOT/mm)::

    python mmengine_parts.py CFG ROOT --stop-after N

(MMEngine's resume needs ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` under current torch.)
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS
from torch import nn


@MODELS.register_module(force=True)
class MigrationNet(BaseModel):
    """A BaseModel without dropout, so no random draw can change its training.

    Its ``init_cfg`` and the ``paramwise_cfg`` of the configs that use it make
    MMEngine log one line per parameter (the console tests count them).
    """

    def __init__(self, hidden: int = 16, init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.body = nn.Linear(8, hidden)
        self.head = nn.Linear(hidden, 3)

    def forward(self, inputs, labels=None, mode: str = "tensor"):
        logits = self.head(torch.relu(self.body(torch.stack(inputs))))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, torch.stack(labels))}
        return logits


@DATASETS.register_module(force=True)
class PairsDataset(torch.utils.data.Dataset):
    """``n`` seeded samples as MMEngine datasets give them: dicts of inputs and labels."""

    def __init__(self, n: int = 24, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()
        self.metainfo: dict = {}

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"inputs": self.x[i], "labels": self.y[i]}


@METRICS.register_module(force=True)
class PairsAccuracy(BaseMetric):
    """``accuracy`` of MigrationNet's logits on PairsDataset, and their ``pairs_loss``
    (a name MMEngine's LogProcessor averages over its window, as it does losses)."""

    def process(self, data_batch, data_samples) -> None:
        for logits, label in zip(data_samples, data_batch["labels"], strict=True):
            self.results.append((float(logits.argmax() == label),
                                 float(F.cross_entropy(logits[None], label[None]))))

    def compute_metrics(self, results) -> dict[str, float]:
        return {"accuracy": sum(r[0] for r in results) / len(results),
                "pairs_loss": sum(r[1] for r in results) / len(results)}


@HOOKS.register_module(force=True)
class LrRecorder(Hook):
    """Appends ``{"iter", "epoch", "lr"}`` to ``work_dir/lrs.jsonl`` before every iteration.

    The lr read before an iteration is the one its optimizer step uses, under
    MMEngine's scheduler hook and flexgraph's loop alike.
    """

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        lr = runner.optim_wrapper.optimizer.param_groups[0]["lr"]
        os.makedirs(runner.work_dir, exist_ok=True)
        with open(os.path.join(runner.work_dir, "lrs.jsonl"), "a") as f:
            f.write(json.dumps({"iter": runner.iter, "epoch": runner.epoch, "lr": lr}) + "\n")


@HOOKS.register_module(force=True)
class StopAfterEpochs(Hook):
    """Ends MMEngine's epoch loop after ``epochs`` epochs: a half-trained run."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def after_train_epoch(self, runner) -> None:
        if runner.epoch + 1 >= self.epochs:
            runner.train_loop.stop_training = True


def _train(cfg, work_dir: str, **changes) -> None:
    from mmengine.runner import Runner

    cfg = cfg.copy()
    cfg.merge_from_dict(dict(work_dir=work_dir, experiment_name=os.path.basename(work_dir),
                             **changes))
    Runner.from_cfg(cfg).train()


def main() -> None:
    """Train ``--stop-after`` epochs into ROOT/half, then resume that into ROOT/mm."""
    import argparse

    from mmengine.config import Config

    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("root")
    parser.add_argument("--stop-after", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = Config.fromfile(args.config)
    half, resumed = os.path.join(args.root, "half"), os.path.join(args.root, "mm")
    stop = dict(type="StopAfterEpochs", epochs=args.stop_after)
    _train(cfg, half, custom_hooks=[*cfg.get("custom_hooks", []), stop])
    checkpoint = os.path.join(half, f"epoch_{args.stop_after}.pth")
    _train(cfg, resumed, resume=True, load_from=checkpoint)


if __name__ == "__main__":
    main()
