"""MMEngine's Runner's defaults on 2 CPU processes (gloo): DDP keeps each rank's buffers,
and a model's SyncBatchNorm layers become BatchNorm, with one warning."""

from __future__ import annotations

import json

import pytest

from tests.cli.cli_helpers import launch_two, train_losses, write_config

pytestmark = pytest.mark.slow

SYNC_BN_MODEL = '''
from digits import DigitsMLP
from mmengine.registry import MODELS
from torch import nn


@MODELS.register_module(force=True)
class SyncBNDigits(DigitsMLP):
    """The quickstart's MLP with a SyncBatchNorm layer, as self-supervised configs have."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net.insert(1, nn.SyncBatchNorm(self.net[0].out_features))
'''


@pytest.mark.parametrize("strategy", ["DDPStrategy", "FSDPStrategy"])
def test_sync_bn_layers_on_a_cpu_group_train_as_batchnorm_with_one_warning(tmp_path, strategy):
    folder = tmp_path / "cfg"
    config = write_config(folder, inspect=True, extra=(
        "custom_imports = dict(imports=['digits', 'killer', 'sync_bn_model'])\n"
        "model = dict(type='SyncBNDigits')\n"
        f"strategy = dict(type='{strategy}')\n"
        "train_cfg = dict(by_epoch=False, max_iters=4, val_interval=4)\n"))
    (folder / "sync_bn_model.py").write_text(SYNC_BN_MODEL)
    done = launch_two(config, "work", tmp_path)
    warned = [line for line in done.stderr.splitlines() if "SyncBatchNorm layers" in line]
    assert len(warned) == 1, done.stderr[-3000:]
    assert "('net.1') cannot sync on a CPU process group: converted to BatchNorm" in warned[0]
    assert sorted(train_losses(tmp_path / "work")) == [1, 2, 3, 4]
    if strategy == "DDPStrategy":  # as MMEngine's Runner wraps without model_wrapper_cfg
        info = json.loads((tmp_path / "work" / "inspect-rank1.json").read_text())
        assert info["broadcast_buffers"] is False


SHARED_MODEL = '''
import json
import os

from digits import DigitsMLP
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, MODELS
from torch import nn


@MODELS.register_module(force=True)
class SharedLayer(DigitsMLP):
    """One layer applied twice, under two names, as MMDetection's heads share convolutions
    across levels."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        shared = nn.Linear(10, 10)
        self.net.extend([shared, shared])


@HOOKS.register_module(force=True)
class SavedKeys(Hook):
    def before_save_checkpoint(self, runner, checkpoint):
        with open(os.path.join(runner.work_dir, f"keys-rank{runner.rank}.json"), "w") as f:
            json.dump(sorted(checkpoint["state_dict"]), f)
'''


def test_every_strategy_s_checkpoint_hooks_see_ddp_s_keys_shared_layers_included(tmp_path):
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "shared_model.py").write_text(SHARED_MODEL)
    keys = {}
    for work, strategy in (("ddp", "'DDPStrategy'"), ("fsdp", "'FSDPStrategy'"),
                           ("zero2", "'DeepSpeedStrategy', zero_optimization=dict(stage=2)"),
                           ("zero3", "'DeepSpeedStrategy', zero_optimization=dict(stage=3)")):
        config = write_config(folder, extra=(
            "custom_imports = dict(imports=['digits', 'killer', 'shared_model'])\n"
            "model = dict(type='SharedLayer')\n"
            f"strategy = dict(type={strategy})\n"
            "custom_hooks = [dict(type='SavedKeys')]\n"
            "default_hooks = dict(checkpoint=dict(interval=2, by_epoch=False))\n"
            "train_cfg = dict(by_epoch=False, max_iters=2, val_interval=2)\n"))
        launch_two(config, work, tmp_path)
        keys[work] = [json.loads((tmp_path / work / f"keys-rank{rank}.json").read_text())
                      for rank in (0, 1)]
    assert {"net.4.weight", "net.5.weight"} <= set(keys["ddp"][0])
    for work, seen in keys.items():
        assert seen == [keys["ddp"][0]] * 2, work


UNUSED_MODEL = '''
from digits import DigitsMLP
from mmengine.registry import MODELS
from torch import nn


@MODELS.register_module(force=True)
class UnusedLayer(DigitsMLP):
    """A layer the forward never calls: it gets no gradient, which DDP refuses unless told."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.unused = nn.Linear(10, 10)
'''


def test_the_top_level_find_unused_parameters_reaches_ddp_as_under_the_runner(tmp_path):
    """MMEngine's Runner wraps with the config's top-level key (25 of MMPreTrain's configs
    set it): without it, DDP stops at the second iteration."""
    folder = tmp_path / "cfg"
    config = write_config(folder, inspect=True, extra=(
        "custom_imports = dict(imports=['digits', 'killer', 'unused_model'])\n"
        "model = dict(type='UnusedLayer')\nstrategy = dict(type='DDPStrategy')\n"
        "find_unused_parameters = True\n"
        "train_cfg = dict(by_epoch=False, max_iters=4, val_interval=4)\n"))
    (folder / "unused_model.py").write_text(UNUSED_MODEL)
    done = launch_two(config, "work", tmp_path)
    assert "find_unused_parameters" not in done.stderr, "acted on, not warned of"
    assert sorted(train_losses(tmp_path / "work")) == [1, 2, 3, 4]
    info = json.loads((tmp_path / "work" / "inspect-rank1.json").read_text())
    assert info["find_unused_parameters"] is True
