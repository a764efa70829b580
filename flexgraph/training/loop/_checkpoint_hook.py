"""MMEngine's ``CheckpointHook``, in its place in the hook order, saving through flexgraph.

A real hook at ``VERY_LOW``, since other hooks observe a save. It decides *when*
and *under which name* as MMEngine's does, and keeps the best scores in the
message hub under MMEngine's names, where a resumed run finds them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from mmengine.hooks import Hook

from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.errors import ConfigError

#: Runtime-info keys (MMEngine's) that carry the best checkpoints across a resume.
BEST_INFO_PREFIXES = ("best_score", "best_ckpt")

_BETTER = {"greater": lambda x, y: x > y, "less": lambda x, y: x < y}
_WORST = {"greater": -math.inf, "less": math.inf}


class CheckpointTarget(Protocol):
    """What the hook saves through: the running training loop."""

    checkpointer: Any

    def save_checkpoint(self, stem: str, *, epoch: int, iteration: int,
                        best: bool = False) -> Path:
        """Save the run's state (``best``: weights only, kept out of pruning) as ``stem``."""
        ...


class BuiltinCheckpointHook(Hook):
    """Stands in for ``default_hooks.checkpoint``; saves nothing until a training loop
    :meth:`attach`-es itself (an evaluation entry point writes no checkpoint)."""

    priority = "VERY_LOW"

    def __init__(self, policy: CheckpointPolicy) -> None:
        self.policy = policy
        self.target: CheckpointTarget | None = None
        self.last_ckpt: Path | None = None
        self.best_ckpts: dict[str, str | None] = {}  # by runtime-info key (best_ckpt...)

    # -- the loop plugs in ------------------------------------------------------------
    def attach(self, target: CheckpointTarget) -> None:
        """Save through ``target`` from now on (a new run: no checkpoint saved yet)."""
        self.target = target
        self.last_ckpt = None

    def detach(self) -> None:
        self.target = None

    # -- hook points ------------------------------------------------------------------
    def before_train(self, runner: Any) -> None:
        """Pick up the best checkpoints a resumed run recorded (MMEngine's runtime info)."""
        hub = runner.message_hub
        names = [self._info_key("best_ckpt", key) for key in self.policy.save_best]
        self.best_ckpts = {name: hub.get_info(name) for name in names}

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if self.target is not None and self.policy.due_after_iter(runner.iter + 1,
                                                                  runner.max_iters):
            self._save(runner, f"iter_{runner.iter + 1}", epoch=runner.epoch,
                       iteration=runner.iter + 1)

    def after_train_epoch(self, runner: Any) -> None:
        if self.target is not None and self.policy.due_after_epoch(runner.epoch + 1,
                                                                   runner.max_epochs):
            self._save(runner, f"epoch_{runner.epoch + 1}", epoch=runner.epoch + 1,
                       iteration=runner.iter)

    def after_val_epoch(self, runner: Any, metrics: dict[str, Any] | None = None) -> None:
        if self.target is None or not self.policy.save_best:
            return
        if not metrics:
            runner.logger.warning("save_best: the validation returned no metrics, so no "
                                  "best checkpoint is kept for this evaluation")
            return
        by_epoch = self.policy.by_epoch
        stem = f"epoch_{runner.epoch}" if by_epoch else f"iter_{runner.iter}"
        updated = False
        for key, rule in self._indicators(metrics):
            if key not in metrics:
                raise ConfigError(
                    f"default_hooks.checkpoint.save_best={key!r}, but the validation "
                    f"metrics are {sorted(metrics)}; name one of those")
            score = metrics[key]
            hub = runner.message_hub
            best = hub.get_info(self._info_key("best_score", key), _WORST[rule])
            if score is None or not _BETTER[rule](score, best):
                continue
            updated = True
            hub.update_info(self._info_key("best_score", key), _number(score))
            name = f"best_{key}_{stem}".replace("/", "_")
            path = self.target.save_checkpoint(name, epoch=runner.epoch,
                                               iteration=runner.iter, best=True)
            ckpt_key = self._info_key("best_ckpt", key)
            previous = self.best_ckpts.get(ckpt_key)
            if previous and Path(previous) != path:
                self.target.checkpointer.remove(Path(previous))
            self.best_ckpts[ckpt_key] = str(path)
            hub.update_info(ckpt_key, str(path))
            runner.logger.info(f"The best checkpoint with {float(score):0.4f} {key} at "
                               f"{stem.replace('_', ' ')} is saved to {path.name}.")
        if updated and self.last_ckpt is not None:
            self._save(runner, stem, epoch=runner.epoch, iteration=runner.iter)

    def after_train(self, runner: Any) -> None:
        keys = self.policy.published_keys
        if self.target is None or keys is None:
            return
        checkpointer = self.target.checkpointer
        if self.policy.save_last and self.last_ckpt is not None:
            checkpointer.publish(self.last_ckpt, keys, logger=runner.logger)
        for path in self.best_ckpts.values():
            if path:
                checkpointer.publish(Path(path), keys, logger=runner.logger)

    # -- helpers ------------------------------------------------------------------------
    def _save(self, runner: Any, stem: str, *, epoch: int, iteration: int) -> None:
        self.last_ckpt = self.target.save_checkpoint(stem, epoch=epoch, iteration=iteration)
        runner.message_hub.update_info("last_ckpt", str(self.last_ckpt))

    def _indicators(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        """(metric, rule) pairs; ``'auto'`` is the first metric, as in MMEngine."""
        pairs = []
        for key, rule in zip(self.policy.save_best, self.policy.rules, strict=True):
            if key == "auto":
                key = next(iter(metrics))
                rule = self.policy.rule_for(key, rule)
            pairs.append((key, rule))
        return pairs

    def _info_key(self, kind: str, key: str) -> str:
        """MMEngine's names: ``best_score`` for one metric, ``best_score_{key}`` for several."""
        return kind if len(self.policy.save_best) == 1 else f"{kind}_{key}"


def _number(value: Any) -> Any:
    """A tensor or numpy score as a Python number (checkpoints hold plain data)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
