"""Two ranks: flexgraph's logged values equal MMEngine's ``Runner`` under DDP.

The same config trains under ``flexgraph run --nproc-per-node 2`` and under
MMEngine's ``Runner`` launched by ``torch.distributed.run`` (2 CPU processes,
gloo), each writing its log file and ``scalars.json`` in its timestamped run
folder. Every value each writes (rank 0's losses through a window of 4, a
custom per-epoch maximum, the learning rate, the validation metrics, one of
them a loss averaged over the validations) must be
the Runner's. The Runner, under a launcher on the CPU, still calls
``torch.cuda.set_device`` and hands DDP device ids: the first is neutralised
in its process, and ``model_wrapper_cfg`` gives DDP no device ids.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.training.training_helpers import REPO, assert_same_logged_values, scalars_json

HERE = Path(__file__).resolve().parent

CONFIG = textwrap.dedent("""
    custom_imports = dict(imports=['mmengine_parts'], allow_failed_imports=False)
    model = dict(type='MigrationNet')
    train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='PairsDataset', n=48),
                            sampler=dict(type='DefaultSampler', shuffle=True))
    val_dataloader = dict(batch_size=4, num_workers=0,
                          dataset=dict(type='PairsDataset', n=16, seed=1),
                          sampler=dict(type='DefaultSampler', shuffle=False))
    val_evaluator = dict(type='PairsAccuracy')
    val_cfg = dict()
    optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
    param_scheduler = [dict(type='LinearLR', start_factor=0.25, by_epoch=False, end=8)]
    train_cfg = dict(by_epoch=True, max_epochs=3, val_interval=1)
    default_hooks = dict(checkpoint=None, logger=dict(type='LoggerHook', interval=2))
    log_processor = dict(window_size=4, custom_cfg=[
        dict(data_src='loss', method_name='max', window_size='epoch', log_name='loss_max')])
    randomness = dict(seed=2024)
    env_cfg = dict(dist_cfg=dict(backend='gloo'))
""")

# MMEngine's side: the Runner as a launched rank on the CPU.
RUNNER = textwrap.dedent("""
    import sys

    import torch

    torch.cuda.set_device = lambda device: None  # what init_dist calls, on the CPU too
    torch.set_num_threads(1)
    from mmengine.config import Config
    from mmengine.runner import Runner

    cfg = Config.fromfile(sys.argv[1])
    cfg.merge_from_dict(dict(work_dir=sys.argv[2], launcher='pytorch',
                             model_wrapper_cfg=dict(type='MMDistributedDataParallel',
                                                    device_ids=None)))
    Runner.from_cfg(cfg).train()
    # a finished rank leaves without torch's C++ teardown, which can abort it ("terminate
    # called without an active exception") as the other rank exits: flexgraph's ranks too
    import os, torch.distributed as dist
    dist.barrier(); dist.destroy_process_group(); sys.stdout.flush(); os._exit(0)
""")


def _run(argv: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def _log_lines(work_dir: Path) -> list[str]:
    (log,) = work_dir.glob("*/*.log")  # {timestamp}/{timestamp}.log, both runners
    return [line for line in log.read_text().splitlines()
            if "Epoch(train)" in line or "Epoch(val)" in line]


@pytest.mark.slow
def test_two_ranks_log_what_the_runner_under_ddp_logs(tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text(CONFIG)
    (tmp_path / "runner.py").write_text(RUNNER)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
          "--standalone", str(tmp_path / "runner.py"), str(config), str(tmp_path / "mm")],
         cwd=tmp_path)
    _run([sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
          str(tmp_path / "fg"), "--nproc-per-node", "2"], cwd=tmp_path)
    mm_scalars, fg_scalars = scalars_json(tmp_path / "mm"), scalars_json(tmp_path / "fg")
    assert_same_logged_values(mm_scalars, fg_scalars, _log_lines(tmp_path / "mm"),
                              _log_lines(tmp_path / "fg"))
    assert {"loss", "loss_max", "lr", "epoch", "iter", "step"} <= set(fg_scalars[0])
    assert sum("pairs_loss" in record for record in fg_scalars) == 3  # each validation's
