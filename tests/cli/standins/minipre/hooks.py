"""What a run's weights and learning rates were, written by rank 0 for tests to compare."""

import os

import torch
from mmengine.hooks import Hook

from minipre.registry import HOOKS


def full_weights(model):
    """Every parameter whole, under any strategy (a collective: every rank calls it)."""
    engine = getattr(model, "engine", None)
    if engine is not None:  # DeepSpeed: under ZeRO-3 the partitions are gathered
        import deepspeed

        named = list(engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {n: p.detach().float().clone() for n, p in named}
    module = getattr(model, "module", model)  # DDP wraps, FSDP2 shards in place
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().clone()
            for n, p in module.named_parameters()}


@HOOKS.register_module()
class Snapshot(Hook):
    """``initial.pt`` (weights before training), ``epoch1.pt``, ``lrs.pt``: (lr, weight
    decay) by parameter name, at each of the first iterations."""

    priority = "LOWEST"

    def __init__(self, lr_iters=4):
        self.lr_iters, self.lrs = lr_iters, []

    def _save(self, runner, name, value):
        if runner.rank == 0:
            os.makedirs(runner.work_dir, exist_ok=True)
            torch.save(value, os.path.join(runner.work_dir, name))

    def before_train(self, runner):
        self._save(runner, "initial.pt", full_weights(runner.model))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter < self.lr_iters:
            groups = runner.optim_wrapper.optimizer.param_groups
            self.lrs.append({g["param_name"]: (g["lr"], g["weight_decay"]) for g in groups})

    def after_train_epoch(self, runner):
        if runner.epoch == 0:
            self._save(runner, "epoch1.pt", full_weights(runner.model))
            self._save(runner, "lrs.pt", self.lrs)
