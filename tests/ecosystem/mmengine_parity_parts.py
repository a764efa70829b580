"""What both runners of ``test_mmpretrain_mmengine_parity.py`` run: a probe, and MMEngine's side.

Imported through ``custom_imports=dict(imports=['mmengine_parity_parts'])`` by
``flexgraph run`` and by MMEngine's ``Runner`` alike (this folder on
PYTHONPATH), so both record through the same hook. Run as a script, it is
MMEngine's side of the test, what MMPreTrain's ``tools/train.py`` does on one
device::

    python mmengine_parity_parts.py CONFIG WORK_DIR --cfg-options KEY=VALUE ...

(MMEngine reads its own checkpoints only with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
under current torch.)
"""

from __future__ import annotations

import json
import os

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class FirstEpochProbe(Hook):
    """Writes ``probe/``: ``initial.pt`` (the weights training starts from),
    ``losses.json`` (every iteration's losses, as floats) and ``epoch1.pt`` (the
    weights after the first epoch). VERY_HIGH, so that it records each
    iteration before any other hook acts on it."""

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self.losses: list[dict[str, float]] = []

    def before_train(self, runner) -> None:
        self._save(runner, "initial.pt", self._weights(runner))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses.append({key: float(value) for key, value in outputs.items()})

    def after_train_epoch(self, runner) -> None:
        if runner.epoch == 0:
            self._save(runner, "epoch1.pt", self._weights(runner))
            with open(os.path.join(runner.work_dir, "probe", "losses.json"), "w") as f:
                json.dump(self.losses, f)

    @staticmethod
    def _weights(runner) -> dict[str, torch.Tensor]:
        model = getattr(runner.model, "module", runner.model)
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    @staticmethod
    def _save(runner, name: str, value: object) -> None:
        folder = os.path.join(runner.work_dir, "probe")
        os.makedirs(folder, exist_ok=True)
        torch.save(value, os.path.join(folder, name))


def runner_config():
    """The config ``CONFIG WORK_DIR --cfg-options ...`` on the command line names, as
    MMEngine's ``tools/train.py`` reads it: the file, the options merged, the work dir."""
    import argparse

    from mmengine.config import Config, DictAction

    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("work_dir")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default={})
    args = parser.parse_args()
    cfg = Config.fromfile(args.config)
    cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir
    return cfg


def main() -> None:
    """Train CONFIG with MMEngine's Runner into WORK_DIR, with the ``--cfg-options``."""
    from mmengine.runner import Runner

    Runner.from_cfg(runner_config()).train()
    end_runner_rank()


def end_runner_rank() -> None:
    """Leave a finished launched rank without torch's C++ teardown, which can abort it
    ("terminate called without an active exception") as the other ranks exit, as
    flexgraph's own ranks leave."""
    import os
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
